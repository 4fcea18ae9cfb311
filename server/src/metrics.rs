//! Request counters and latency histograms per gRPC method, and the Prometheus text
//! exposition of `/metrics`.
//!
//! Owns: the metric names and their rendering (Prometheus text format 0.0.4, written by hand:
//! the set of series is small and fixed, so a metrics library would add a dependency and a
//! registry for a few dozen lines of formatting).
//!
//! Invariants:
//! - MET-1: the number of per-method series is bounded by [`METHOD_SERIES_MAX`]; requests to
//!   further method paths are counted under `grpc_method="other"`, so a client inventing
//!   method names cannot grow the server's memory.
//! - MET-2: histogram buckets are cumulative in the output and `_count` equals the `+Inf`
//!   bucket.
//! - MET-3: engine gauges are read at scrape time from the engine's status, never cached.
//! - MET-4: the per-role quota gauges (`kvd_quota_*`) exist only for roles with a non-default
//!   quota, as Mesos's allocator metrics: they appear with the
//!   registry entry and are gone once the role is reset to the default quota. The root role
//!   `""` never has one.
//!
//! Contact points: `server::http` records every gRPC request here and serves `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use tonic::Code;

use kvd as api;
use kvd::RoleUsage;
use kvd::quota::{QuotaConfig, Scalar};
use kvd::sync::{Mutex, lock};

/// Upper bounds of the latency buckets in microseconds (etcd's gRPC handling buckets,
/// 5 ms to 10 s).
pub const LATENCY_BUCKETS_MICROS: [u64; 11] = [
    5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000,
];
/// Most distinct method paths tracked (MET-1). etcd's API has 41 methods.
pub const METHOD_SERIES_MAX: usize = 64;

const _: () = assert!(METHOD_SERIES_MAX >= 41);

/// What one gRPC method has seen.
#[derive(Debug, Default, Clone)]
struct MethodStats {
    /// Requests per gRPC status code.
    codes: BTreeMap<i32, u64>,
    /// Requests per latency bucket, not cumulative; the last slot is `+Inf`.
    buckets: [u64; LATENCY_BUCKETS_MICROS.len() + 1],
    /// Total latency in microseconds.
    sum_micros: u64,
    /// Number of requests.
    count: u64,
}

/// The server's request metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    methods: Mutex<BTreeMap<String, MethodStats>>,
}

impl Metrics {
    /// Returns empty metrics.
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Records one request to the gRPC method at `path` that ended with `code` after
    /// `elapsed`.
    pub fn record(&self, path: &str, code: Code, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_MICROS
            .iter()
            .position(|bound| micros <= *bound)
            .unwrap_or(LATENCY_BUCKETS_MICROS.len());
        let mut methods = lock(&self.methods);
        let key = if methods.contains_key(path) || methods.len() < METHOD_SERIES_MAX {
            path
        } else {
            "/other/other"
        };
        let stats = methods.entry(key.to_owned()).or_default();
        *stats.codes.entry(code as i32).or_default() += 1;
        stats.buckets[bucket] += 1;
        stats.sum_micros = stats.sum_micros.saturating_add(micros);
        stats.count += 1;
    }

    /// Returns the Prometheus text exposition: the engine gauges (or `kvd_engine_up 0` if
    /// the engine did not answer), the open streams and the per-method series.
    pub fn render(&self, engine: Option<&EngineGauges>, streams: &StreamGauges) -> String {
        let mut out = String::new();
        render_engine(&mut out, engine);
        render_streams(&mut out, streams);
        if let Some(engine) = engine {
            render_quota(&mut out, &engine.roles);
        }
        let methods = lock(&self.methods).clone();
        render_requests(&mut out, &methods);
        out
    }
}

/// What the engine reports at scrape time (MET-3).
#[derive(Debug, Clone)]
pub struct EngineGauges {
    /// Revisions, sizes and the applied index.
    pub status: api::Status,
    /// Watches open on all streams.
    pub watchers: usize,
    /// Leases granted and not yet revoked or expired.
    pub leases: usize,
    /// Every role with a quota, consumption or a reservation (MET-4 picks the quota roles).
    pub roles: Vec<RoleUsage>,
    /// The write queue and the group-commit batch sizes.
    pub apply: kvd::ApplyStats,
    /// The allocation prepare queue: its length and the allocations preparing.
    pub allocation_prepare_queue: kvd::AllocationPrepareQueue,
    /// Agents by Mesos state name, every state present (0 when none).
    pub agents: [(&'static str, usize); 4],
    /// Rows the last periodic consumption check found drifted; `None` before the first
    /// check or when the check is off.
    pub consumption_drift_rows: Option<u64>,
}

impl EngineGauges {
    /// Returns the agent counts by state of `agents`, in the order of [`EngineGauges::agents`].
    pub fn count_agents<'a>(
        agents: impl IntoIterator<Item = &'a kvd::Agent>,
    ) -> [(&'static str, usize); 4] {
        use kvd::AgentState::{Gone, Recovered, Registered, Unreachable};
        let mut counts = [Registered, Recovered, Unreachable, Gone].map(|s| (s.name(), 0));
        for agent in agents {
            if let Some(entry) = counts.iter_mut().find(|(n, _)| *n == agent.state.name()) {
                entry.1 += 1;
            }
        }
        counts
    }
}

/// The long-lived gRPC streams open at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamGauges {
    /// Watch streams.
    pub watch: usize,
    /// LeaseKeepAlive streams.
    pub keep_alive: usize,
    /// Client connections served now (CONN-1).
    pub connections_open: usize,
    /// Client connections refused at the limit since start (CONN-1).
    pub connections_refused: u64,
    /// The store is poisoned and waits for its reopen (REC-1).
    pub storage_poisoned: bool,
}

fn render_engine(out: &mut String, engine: Option<&EngineGauges>) {
    gauge(
        out,
        "kvd_engine_up",
        "1 if the engine answered the scrape, else 0.",
        engine.is_some(),
    );
    let Some(engine) = engine else {
        return;
    };
    let status = &engine.status;
    let alarm = |kind| count(status.alarms.iter().filter(|a| a.alarm == kind).count());
    let gauges: [(&str, &str, i128); 10] = [
        (
            "kvd_db_size_quota_bytes",
            "The space quota in bytes (0 when disabled).",
            status.db_size_quota.into(),
        ),
        (
            "kvd_alarm_nospace",
            "1 while the NOSPACE alarm is active.",
            alarm(kvd::AlarmType::NoSpace),
        ),
        (
            "kvd_alarm_corrupt",
            "1 while the CORRUPT alarm is active.",
            alarm(kvd::AlarmType::Corrupt),
        ),
        (
            "kvd_db_size_bytes",
            "Length of the database file in bytes.",
            status.db_size.into(),
        ),
        (
            "kvd_db_size_in_use_bytes",
            "Bytes the database occupies inside its file.",
            status.db_size_in_use.into(),
        ),
        (
            "kvd_current_revision",
            "The current store revision.",
            status.header.revision.into(),
        ),
        (
            "kvd_compact_revision",
            "The compaction revision (-1 if never compacted).",
            status.compact_revision.into(),
        ),
        (
            "kvd_applied_index",
            "Write requests applied since creation.",
            status.applied_index.into(),
        ),
        (
            "kvd_watchers",
            "Watches open on all watch streams.",
            count(engine.watchers),
        ),
        (
            "kvd_leases",
            "Leases granted and not yet revoked or expired.",
            count(engine.leases),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    render_apply(out, &engine.apply);
    render_allocation_prepare_queue(out, &engine.allocation_prepare_queue);
    render_agents(out, engine);
}

/// Agents by state, and the last consumption check's drift when one has run.
fn render_agents(out: &mut String, engine: &EngineGauges) {
    let name = "kvd_agents";
    let _ = writeln!(
        out,
        "# HELP {name} Agents by state (REGISTERED, RECOVERED, UNREACHABLE, GONE).\n# TYPE {name} gauge"
    );
    for (state, n) in engine.agents {
        let _ = writeln!(out, "{name}{{state=\"{state}\"}} {n}");
    }
    if let Some(rows) = engine.consumption_drift_rows {
        let name = "kvd_consumption_drift_rows";
        let _ = writeln!(
            out,
            "# HELP {name} Consumption rows that differed from a recount at the last periodic check.\n# TYPE {name} gauge\n{name} {rows}"
        );
    }
}

/// The allocation prepare queue: allocations preparing and the queue length.
fn render_allocation_prepare_queue(out: &mut String, queue: &kvd::AllocationPrepareQueue) {
    for (name, help, value) in [
        (
            "kvd_allocation_prepare_queue_depth",
            "Allocations preparing (admitted with prepare, not yet started or released).",
            queue.preparing,
        ),
        (
            "kvd_allocation_prepare_queue_capacity",
            "The allocation prepare queue length (0 when the queue is off).",
            queue.length,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
}

/// The writes in flight (admitted, not yet answered) and the commits by batch size.
fn render_apply(out: &mut String, apply: &kvd::ApplyStats) {
    for (name, help, value) in [
        (
            "kvd_apply_queue_depth",
            "Writes admitted and not yet answered (queued, being applied, or waiting for their log sync).",
            apply.queue_depth,
        ),
        (
            "kvd_apply_queue_capacity",
            "The bound of the apply queue.",
            apply.queue_capacity,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let name = "kvd_prepare_queue_capacity";
    let _ = writeln!(
        out,
        "# HELP {name} The bound of the write prepare queue (--prepare-queue-length).\n# TYPE {name} gauge\n{name} {}",
        apply.queue_capacity
    );
    for (name, help, kind, value) in [
        (
            "kvd_prepare_queue_depth",
            "Writes of the role in the prepare queue (admitted, not yet answered).",
            "gauge",
            (|q: &kvd::RoleQueue| q.queued as u64) as fn(&kvd::RoleQueue) -> u64,
        ),
        (
            "kvd_too_many_requests_total",
            "Writes of the role refused with too many requests since the server started.",
            "counter",
            |q: &kvd::RoleQueue| q.refused,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for role in &apply.roles {
            let _ = writeln!(
                out,
                "{name}{{role=\"{}\"}} {}",
                escape(&role.role),
                value(role)
            );
        }
    }
    let name = "kvd_group_commit_batches_total";
    let _ = writeln!(
        out,
        "# HELP {name} Commits of write batches, by the most requests a batch of that bucket held.\n# TYPE {name} counter"
    );
    let last = apply.batch_sizes.len().saturating_sub(1);
    for (i, (at_most, commits)) in apply.batch_sizes.iter().enumerate() {
        let bucket = if i == last {
            "+Inf".to_owned()
        } else {
            at_most.to_string()
        };
        let _ = writeln!(out, "{name}{{requests_at_most=\"{bucket}\"}} {commits}");
    }
}

fn render_streams(out: &mut String, streams: &StreamGauges) {
    let name = "kvd_grpc_streams_open";
    let _ = writeln!(
        out,
        "# HELP {name} Long-lived gRPC streams open, by kind.\n# TYPE {name} gauge"
    );
    let _ = writeln!(out, "{name}{{stream=\"watch\"}} {}", streams.watch);
    let _ = writeln!(
        out,
        "{name}{{stream=\"lease_keep_alive\"}} {}",
        streams.keep_alive
    );
    let name = "kvd_connections_open";
    let _ = writeln!(
        out,
        "# HELP {name} Client connections served now.\n# TYPE {name} gauge\n{name} {}",
        streams.connections_open
    );
    let name = "kvd_storage_poisoned";
    let _ = writeln!(
        out,
        "# HELP {name} 1 while the store is poisoned after an I/O error and waits for kvd to reopen it.\n# TYPE {name} gauge\n{name} {}",
        u8::from(streams.storage_poisoned)
    );
    let name = "kvd_connections_refused_total";
    let _ = writeln!(
        out,
        "# HELP {name} Client connections refused at --max-connections since start.\n# TYPE {name} counter\n{name} {}",
        streams.connections_refused
    );
}

/// One per-role quota gauge family: its name, help text, and the series of one role as
/// (resource, milli-units).
type QuotaFamily = (
    &'static str,
    &'static str,
    fn(&RoleUsage, &QuotaConfig) -> Vec<(String, i64)>,
);

/// The per-role quota gauge families (MET-4), in Mesos's order.
const QUOTA_FAMILIES: [QuotaFamily; 4] = [
    (
        "kvd_quota_guarantee",
        "Quota guarantee of a role, in units of the resource.",
        guarantee_series,
    ),
    (
        "kvd_quota_limit",
        "Quota limit of a role, in units of the resource (0 is a limit).",
        limit_series,
    ),
    (
        "kvd_quota_consumed",
        "Quota consumption of a role and its subtree: allocations plus unallocated reservations.",
        consumed_series,
    ),
    (
        "kvd_quota_offered_or_allocated",
        "Offered plus allocated amount of each resource the role's quota names.",
        offered_or_allocated_series,
    ),
];

/// Renders the per-role quota gauges of the roles with a registry entry (MET-4), in units.
fn render_quota(out: &mut String, roles: &[RoleUsage]) {
    let with_quota: Vec<(&RoleUsage, &QuotaConfig)> = roles
        .iter()
        .filter_map(|role| role.quota.as_ref().map(|config| (role, config)))
        .collect();
    for (name, help, series) in QUOTA_FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (role, config) in &with_quota {
            let label = escape(&role.role);
            for (resource, milli) in series(role, config) {
                let _ = writeln!(
                    out,
                    "{name}{{role=\"{label}\",resource=\"{}\"}} {}",
                    escape(&resource),
                    units(milli)
                );
            }
        }
    }
}

/// One series per guaranteed resource (guarantees never hold zeros).
fn guarantee_series(_: &RoleUsage, config: &QuotaConfig) -> Vec<(String, i64)> {
    config
        .guarantees
        .iter()
        .map(|(name, value)| (name.to_owned(), value.milli()))
        .collect()
}

/// One series per limited resource, a zero limit included.
fn limit_series(_: &RoleUsage, config: &QuotaConfig) -> Vec<(String, i64)> {
    config
        .limits
        .iter()
        .map(|(name, value)| (name.to_owned(), value.milli()))
        .collect()
}

/// One series per resource the role (with its subtree) consumes, as Mesos publishes
/// `consumed` only while it is not zero.
fn consumed_series(role: &RoleUsage, _: &QuotaConfig) -> Vec<(String, i64)> {
    role.resources
        .iter()
        .map(|(name, counters)| (name.clone(), counters.consumed()))
        .filter(|(_, milli)| *milli != 0)
        .collect()
}

/// One series per resource the quota names (guarantees and limits), zero when unused.
fn offered_or_allocated_series(role: &RoleUsage, config: &QuotaConfig) -> Vec<(String, i64)> {
    let names: BTreeSet<&str> = config
        .guarantees
        .iter()
        .chain(config.limits.iter())
        .map(|(name, _)| name)
        .collect();
    names
        .into_iter()
        .map(|name| {
            let counters = role.resources.get(name).copied().unwrap_or_default();
            (
                name.to_owned(),
                counters.allocated.saturating_add(counters.offered),
            )
        })
        .collect()
}

/// Returns milli-units as a number of units, printed as Mesos prints scalars.
fn units(milli: i64) -> String {
    let magnitude = Scalar::from_milli(milli.saturating_abs()).unwrap_or(Scalar::MAX);
    if milli < 0 {
        format!("-{magnitude}")
    } else {
        magnitude.to_string()
    }
}

/// Converts a count to the gauge's integer type (a `usize` always fits in an `i128`).
fn count(n: usize) -> i128 {
    i128::try_from(n).unwrap_or(i128::MAX)
}

fn gauge(out: &mut String, name: &str, help: &str, value: bool) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
        u8::from(value)
    );
}

fn render_requests(out: &mut String, methods: &BTreeMap<String, MethodStats>) {
    let total = "kvd_grpc_requests_total";
    let _ = writeln!(
        out,
        "# HELP {total} gRPC requests handled, by method and status code."
    );
    let _ = writeln!(out, "# TYPE {total} counter");
    for (path, stats) in methods {
        let labels = method_labels(path);
        for (code, count) in &stats.codes {
            let code = code_name(*code);
            let _ = writeln!(out, "{total}{{{labels},grpc_code=\"{code}\"}} {count}");
        }
    }
    let hist = "kvd_grpc_request_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {hist} Time to answer a gRPC request (to the response head)."
    );
    let _ = writeln!(out, "# TYPE {hist} histogram");
    for (path, stats) in methods {
        let labels = method_labels(path);
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS_MICROS.iter().zip(&stats.buckets) {
            cumulative += count;
            let le = seconds(*bound);
            let _ = writeln!(out, "{hist}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        cumulative += stats.buckets[LATENCY_BUCKETS_MICROS.len()];
        debug_assert_eq!(cumulative, stats.count, "MET-2");
        let _ = writeln!(out, "{hist}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{hist}_sum{{{labels}}} {}", seconds(stats.sum_micros));
        let _ = writeln!(out, "{hist}_count{{{labels}}} {}", stats.count);
    }
}

/// Returns `grpc_service="…",grpc_method="…"` for a path `/service/method`.
fn method_labels(path: &str) -> String {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    let (service, method) = trimmed.split_once('/').unwrap_or((trimmed, ""));
    format!(
        "grpc_service=\"{}\",grpc_method=\"{}\"",
        escape(service),
        escape(method)
    )
}

/// Escapes a label value as the text format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Returns the name gRPC and go-grpc-prometheus use for a status code.
fn code_name(code: i32) -> String {
    match Code::from(code) {
        Code::Ok => "OK".to_owned(),
        other => format!("{other:?}"),
    }
}

/// Returns `micros` as seconds with up to six decimals, trailing zeros dropped.
fn seconds(micros: u64) -> String {
    let whole = micros / 1_000_000;
    let fraction = micros % 1_000_000;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_render_as_counters_and_cumulative_histograms() {
        let metrics = Metrics::new();
        metrics.record("/etcdserverpb.KV/Range", Code::Ok, Duration::from_millis(1));
        metrics.record(
            "/etcdserverpb.KV/Range",
            Code::OutOfRange,
            Duration::from_millis(30),
        );
        let text = metrics.render(None, &StreamGauges::default());
        assert!(text.contains("kvd_engine_up 0"));
        assert!(text.contains("kvd_grpc_streams_open{stream=\"watch\"} 0"));
        assert!(text.contains(
            "kvd_grpc_requests_total{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\",grpc_code=\"OK\"} 1"
        ));
        assert!(text.contains("grpc_code=\"OutOfRange\"} 1"));
        assert!(text.contains("grpc_method=\"Range\",le=\"0.005\"} 1"));
        assert!(text.contains("grpc_method=\"Range\",le=\"0.05\"} 2"));
        assert!(text.contains("grpc_method=\"Range\",le=\"+Inf\"} 2"));
        assert!(text.contains("kvd_grpc_request_duration_seconds_sum{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\"} 0.031"));
    }

    #[test]
    fn method_series_are_bounded() {
        let metrics = Metrics::new();
        for i in 0..METHOD_SERIES_MAX + 10 {
            metrics.record(
                &format!("/etcdserverpb.KV/M{i}"),
                Code::Unimplemented,
                Duration::ZERO,
            );
        }
        let methods = lock(&metrics.methods);
        assert_eq!(methods.len(), METHOD_SERIES_MAX + 1);
        assert_eq!(methods.get("/other/other").map(|s| s.count), Some(10));
    }

    #[test]
    fn engine_gauges_render() {
        let status = api::Status {
            header: api::ResponseHeader { revision: 7 },
            compact_revision: -1,
            db_size: 4096,
            db_size_in_use: 1024,
            applied_index: 6,
            ..api::Status::default()
        };
        let engine = EngineGauges {
            status,
            watchers: 3,
            leases: 2,
            roles: Vec::new(),
            apply: kvd::ApplyStats {
                queue_depth: 7,
                queue_capacity: 5000,
                batch_sizes: vec![(1, 3), (2, 1)],
                roles: vec![kvd::RoleQueue {
                    role: "greedy".into(),
                    queued: 5,
                    refused: 9,
                }],
            },
            allocation_prepare_queue: kvd::AllocationPrepareQueue {
                length: 8,
                preparing: 3,
                by_role: BTreeMap::new(),
            },
            agents: EngineGauges::count_agents(&[
                kvd::Agent::default(),
                kvd::Agent {
                    state: kvd::AgentState::Gone,
                    ..kvd::Agent::default()
                },
            ]),
            consumption_drift_rows: Some(0),
        };
        let streams = StreamGauges {
            watch: 1,
            keep_alive: 4,
            ..StreamGauges::default()
        };
        let text = Metrics::new().render(Some(&engine), &streams);
        for line in [
            "kvd_engine_up 1",
            "kvd_watchers 3",
            "kvd_leases 2",
            "kvd_grpc_streams_open{stream=\"watch\"} 1",
            "kvd_grpc_streams_open{stream=\"lease_keep_alive\"} 4",
            "kvd_db_size_bytes 4096",
            "kvd_db_size_in_use_bytes 1024",
            "kvd_current_revision 7",
            "kvd_compact_revision -1",
            "kvd_apply_queue_depth 7",
            "kvd_prepare_queue_capacity 5000",
            "kvd_prepare_queue_depth{role=\"greedy\"} 5",
            "kvd_too_many_requests_total{role=\"greedy\"} 9",
            "kvd_allocation_prepare_queue_depth 3",
            "kvd_allocation_prepare_queue_capacity 8",
            "kvd_group_commit_batches_total{requests_at_most=\"1\"} 3",
            "kvd_group_commit_batches_total{requests_at_most=\"+Inf\"} 1",
            "kvd_agents{state=\"REGISTERED\"} 1",
            "kvd_agents{state=\"RECOVERED\"} 0",
            "kvd_agents{state=\"GONE\"} 1",
            "kvd_consumption_drift_rows 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }

    #[test]
    fn quota_gauges_exist_only_for_roles_with_a_quota() {
        use kvd::Counters;
        use kvd::quota::{ResourceLimits, ResourceQuantities};
        let mut guarantees = ResourceQuantities::default();
        guarantees.add_resource("cpus", Scalar::from_units(1));
        let mut limits = ResourceLimits::default();
        limits.set("cpus", Scalar::from_units(10));
        limits.set("mem", Scalar::ZERO);
        let counters = Counters {
            allocated: 1500,
            reserved: 2000,
            reserved_in_use: 500,
            offered: 0,
        };
        let dev = RoleUsage {
            role: "dev".into(),
            quota: Some(QuotaConfig {
                role: "dev".into(),
                guarantees,
                limits,
            }),
            resources: [("cpus".to_owned(), counters)].into(),
        };
        let star = RoleUsage {
            role: "*".into(),
            quota: None,
            resources: [("kv_keys".to_owned(), counters)].into(),
        };
        let mut out = String::new();
        render_quota(&mut out, &[star, dev]);
        let series: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            series,
            [
                "kvd_quota_guarantee{role=\"dev\",resource=\"cpus\"} 1",
                "kvd_quota_limit{role=\"dev\",resource=\"cpus\"} 10",
                "kvd_quota_limit{role=\"dev\",resource=\"mem\"} 0",
                "kvd_quota_consumed{role=\"dev\",resource=\"cpus\"} 3",
                "kvd_quota_offered_or_allocated{role=\"dev\",resource=\"cpus\"} 1.5",
                "kvd_quota_offered_or_allocated{role=\"dev\",resource=\"mem\"} 0",
            ]
        );
        assert_eq!(out.lines().filter(|l| l.starts_with("# TYPE")).count(), 4);
    }

    #[test]
    fn seconds_are_exact() {
        assert_eq!(seconds(5_000), "0.005");
        assert_eq!(seconds(2_500_000), "2.5");
        assert_eq!(seconds(10_000_000), "10");
    }
}
