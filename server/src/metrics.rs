//! The server's metrics and the Prometheus text exposition of `/metrics`: etcd's series for
//! everything kvd has an equivalent of (`etcd_*`, `grpc_server_*`, `process_*`), and kvd's
//! own `kvd_*` series beside them.
//!
//! Owns: the metric names, labels and help texts, and the request counters per gRPC
//! method. The exposition is the `prometheus` crate's: every family is built at scrape time
//! as the crate's metric families and written by its `TextEncoder` (format 0.0.4); the
//! `process_*` family comes from its process collector (read from `/proc`).
//!
//! Invariants:
//! - MET-1: the number of per-method series is bounded by [`METHOD_SERIES_MAX`]; requests to
//!   further method paths are counted under `grpc_method="other"`, so a client inventing
//!   method names cannot grow the server's memory. The `grpc_server_*` families show only
//!   the methods of etcd's API ([`ETCD_METHODS`]), each from the start (at 0), as etcd's
//!   go-grpc-prometheus does, and the Lock and Election methods ([`RECIPE_METHODS`]) once
//!   called, as etcd 3.4 shows them (it registers those services after go-grpc-prometheus
//!   has set up the others).
//! - MET-2: histogram buckets are cumulative in the output and `_count` equals the `+Inf`
//!   bucket. Disk histograms have etcd's buckets (1 ms doubling to 8.192 s), so dashboards'
//!   quantiles over etcd's series work on kvd's.
//! - MET-3: engine gauges are read at scrape time from the engine, never cached.
//! - MET-4: the per-role quota gauges (`kvd_quota_*`) exist only for roles with a non-default
//!   quota, as Mesos's allocator metrics: they appear with the
//!   registry entry and are gone once the role is reset to the default quota. The root role
//!   `""` never has one.
//! - MET-5: an etcd series means in kvd what it means in etcd, or is not published: a
//!   single member is always the leader, raft indexes are the applied index counted from
//!   etcd's bootstrap entries (CONV-5), and etcd's proposal and network counters, which
//!   have no equivalent, are absent (`docs/operations.md`, "Metrics").
//!
//! Contact points: `server::http` records every gRPC request here (start and end) and
//! serves `/metrics`; `server::gateway` records its calls under their gRPC methods.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};
use tonic::Code;

use crate::convert::RAFT_BOOTSTRAP_ENTRIES;
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

const _: () = assert!(METHOD_SERIES_MAX >= ETCD_METHODS.len() + RECIPE_METHODS.len());

/// The methods of etcd's API with their go-grpc-prometheus `grpc_type` (MET-1).
pub const ETCD_METHODS: [(&str, &str, &str); 41] = [
    ("etcdserverpb.KV", "Range", "unary"),
    ("etcdserverpb.KV", "Put", "unary"),
    ("etcdserverpb.KV", "DeleteRange", "unary"),
    ("etcdserverpb.KV", "Txn", "unary"),
    ("etcdserverpb.KV", "Compact", "unary"),
    ("etcdserverpb.Watch", "Watch", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseGrant", "unary"),
    ("etcdserverpb.Lease", "LeaseRevoke", "unary"),
    ("etcdserverpb.Lease", "LeaseKeepAlive", "bidi_stream"),
    ("etcdserverpb.Lease", "LeaseTimeToLive", "unary"),
    ("etcdserverpb.Lease", "LeaseLeases", "unary"),
    ("etcdserverpb.Cluster", "MemberAdd", "unary"),
    ("etcdserverpb.Cluster", "MemberRemove", "unary"),
    ("etcdserverpb.Cluster", "MemberUpdate", "unary"),
    ("etcdserverpb.Cluster", "MemberList", "unary"),
    ("etcdserverpb.Cluster", "MemberPromote", "unary"),
    ("etcdserverpb.Maintenance", "Alarm", "unary"),
    ("etcdserverpb.Maintenance", "Status", "unary"),
    ("etcdserverpb.Maintenance", "Defragment", "unary"),
    ("etcdserverpb.Maintenance", "Hash", "unary"),
    ("etcdserverpb.Maintenance", "HashKV", "unary"),
    ("etcdserverpb.Maintenance", "Snapshot", "server_stream"),
    ("etcdserverpb.Maintenance", "MoveLeader", "unary"),
    ("etcdserverpb.Maintenance", "Downgrade", "unary"),
    ("etcdserverpb.Auth", "AuthEnable", "unary"),
    ("etcdserverpb.Auth", "AuthDisable", "unary"),
    ("etcdserverpb.Auth", "AuthStatus", "unary"),
    ("etcdserverpb.Auth", "Authenticate", "unary"),
    ("etcdserverpb.Auth", "UserAdd", "unary"),
    ("etcdserverpb.Auth", "UserGet", "unary"),
    ("etcdserverpb.Auth", "UserList", "unary"),
    ("etcdserverpb.Auth", "UserDelete", "unary"),
    ("etcdserverpb.Auth", "UserChangePassword", "unary"),
    ("etcdserverpb.Auth", "UserGrantRole", "unary"),
    ("etcdserverpb.Auth", "UserRevokeRole", "unary"),
    ("etcdserverpb.Auth", "RoleAdd", "unary"),
    ("etcdserverpb.Auth", "RoleGet", "unary"),
    ("etcdserverpb.Auth", "RoleList", "unary"),
    ("etcdserverpb.Auth", "RoleDelete", "unary"),
    ("etcdserverpb.Auth", "RoleGrantPermission", "unary"),
    ("etcdserverpb.Auth", "RoleRevokePermission", "unary"),
];

/// The methods of etcd's Lock and Election services, shown once called (MET-1).
pub const RECIPE_METHODS: [(&str, &str, &str); 7] = [
    ("v3lockpb.Lock", "Lock", "unary"),
    ("v3lockpb.Lock", "Unlock", "unary"),
    ("v3electionpb.Election", "Campaign", "unary"),
    ("v3electionpb.Election", "Proclaim", "unary"),
    ("v3electionpb.Election", "Leader", "unary"),
    ("v3electionpb.Election", "Observe", "server_stream"),
    ("v3electionpb.Election", "Resign", "unary"),
];

/// The key requests beyond [`METHOD_SERIES_MAX`] paths are counted under (MET-1).
const OTHER_METHOD: &str = "/other/other";

/// What one gRPC method has seen.
#[derive(Debug, Default, Clone)]
struct MethodStats {
    /// Requests started (`grpc_server_started_total`).
    started: u64,
    /// Requests per gRPC status code.
    codes: BTreeMap<i32, u64>,
    /// Requests per latency bucket, not cumulative; the last slot is `+Inf`.
    buckets: [u64; LATENCY_BUCKETS_MICROS.len() + 1],
    /// Total latency in microseconds.
    sum_micros: u64,
    /// Number of requests answered.
    count: u64,
}

/// The server's request metrics and its process collector.
pub struct Metrics {
    methods: Mutex<BTreeMap<String, MethodStats>>,
    process: Option<prometheus::process_collector::ProcessCollector>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics")
            .field("methods", &self.methods)
            .field("process", &self.process.is_some())
            .finish()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Returns empty metrics, with a collector of this process's `process_*` figures.
    pub fn new() -> Metrics {
        Metrics {
            methods: Mutex::new(BTreeMap::new()),
            process: Some(prometheus::process_collector::ProcessCollector::for_self()),
        }
    }

    /// Records the start of a request to the gRPC method at `path`.
    pub fn start(&self, path: &str) {
        update_stats(&mut lock(&self.methods), path, |stats| stats.started += 1);
    }

    /// Records one request to the gRPC method at `path` that ended with `code` after
    /// `elapsed`.
    pub fn record(&self, path: &str, code: Code, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_MICROS
            .iter()
            .position(|bound| micros <= *bound)
            .unwrap_or(LATENCY_BUCKETS_MICROS.len());
        update_stats(&mut lock(&self.methods), path, |stats| {
            *stats.codes.entry(code as i32).or_default() += 1;
            stats.buckets[bucket] += 1;
            stats.sum_micros = stats.sum_micros.saturating_add(micros);
            stats.count += 1;
        });
    }

    /// Returns the Prometheus text exposition: kvd's series (the engine's, or
    /// `kvd_engine_up 0` if the engine did not answer), etcd's and the process's.
    pub fn render(
        &self,
        engine: Option<&EngineGauges>,
        streams: &StreamGauges,
        server: &ServerGauges,
    ) -> String {
        let methods = lock(&self.methods).clone();
        let mut families = Vec::new();
        kvd_engine(&mut families, engine);
        kvd_streams(&mut families, streams);
        if let Some(engine) = engine {
            kvd_quota(&mut families, &engine.roles);
        }
        kvd_requests(&mut families, &methods);
        etcd_server(&mut families, server);
        if let Some(engine) = engine {
            etcd_engine(&mut families, engine, streams);
        }
        grpc_server(&mut families, &methods);
        if let Some(process) = &self.process {
            families.extend(process.collect());
        }
        encode(&families)
    }
}

/// Returns the text exposition of `families`. The encoder refuses a family without series,
/// so such a family (a per-role family before the first role) gets its `# HELP` and
/// `# TYPE` lines only, which tell a scraper its type before it has series.
fn encode(families: &[MetricFamily]) -> String {
    let encoder = TextEncoder::new();
    let mut out = Vec::new();
    for family in families {
        if family.get_metric().is_empty() {
            let kind = match family.get_field_type() {
                MetricType::COUNTER => "counter",
                MetricType::GAUGE => "gauge",
                MetricType::SUMMARY => "summary",
                MetricType::UNTYPED => "untyped",
                MetricType::HISTOGRAM => "histogram",
            };
            let name = family.name();
            let help = family.help().replace('\\', "\\\\").replace('\n', "\\n");
            out.extend_from_slice(
                format!("# HELP {name} {help}\n# TYPE {name} {kind}\n").as_bytes(),
            );
        } else if let Err(e) = encoder.encode(std::slice::from_ref(family), &mut out) {
            // Only a family the encoder cannot write fails; the others are still served.
            tracing::warn!(family = family.name(), error = %e, "metrics: encoding failed");
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Updates the stats of `path`, or of [`OTHER_METHOD`] once the bound is reached (MET-1).
fn update_stats(
    methods: &mut BTreeMap<String, MethodStats>,
    path: &str,
    update: impl FnOnce(&mut MethodStats),
) {
    let key = if methods.contains_key(path) || methods.len() < METHOD_SERIES_MAX {
        path
    } else {
        OTHER_METHOD
    };
    // A path seen before (every request after a method's first) is found without
    // allocating its key.
    match methods.get_mut(key) {
        Some(stats) => update(stats),
        None => update(methods.entry(key.to_owned()).or_default()),
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
    /// The disk histograms: log fsync and database commit.
    pub disk: kvd::DiskTimingsSnapshot,
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
    /// The store is poisoned and waits for its reopen (RECOVERY-1).
    pub storage_poisoned: bool,
    /// Passes of the periodic scrub by result label (`server::scrub`).
    pub scrub_runs: [(&'static str, u64); 3],
}

/// What the server knows without the engine.
#[derive(Debug, Clone, Default)]
pub struct ServerGauges {
    /// This member's id (`etcd_server_id`).
    pub member_id: u64,
    /// The etcd version kvd reports (`etcd_server_version`).
    pub server_version: &'static str,
    /// The cluster version kvd reports (`etcd_cluster_version`, major.minor).
    pub cluster_version: &'static str,
    /// The space quota Status reports (`etcd_server_quota_backend_bytes`).
    pub quota_bytes: i64,
}

// ---------------------------------------------------------------------------------------------
// Building metric families.
// ---------------------------------------------------------------------------------------------

fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
    pairs
        .iter()
        .map(|(name, value)| {
            let mut pair = LabelPair::default();
            pair.set_name((*name).to_owned());
            pair.set_value((*value).to_owned());
            pair
        })
        .collect()
}

fn family(name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

fn gauge(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut gauge = Gauge::default();
    gauge.set_value(value);
    let mut metric = Metric::default();
    metric.set_label(labels(pairs));
    metric.set_gauge(gauge);
    metric
}

fn counter(pairs: &[(&str, &str)], value: f64) -> Metric {
    let mut counter = Counter::default();
    counter.set_value(value);
    let mut metric = Metric::default();
    metric.set_label(labels(pairs));
    metric.set_counter(counter);
    metric
}

/// A histogram from per-bucket counts (not cumulative; one more than `bounds`, `+Inf`
/// last) and the sum in seconds (MET-2).
fn histogram(pairs: &[(&str, &str)], bounds: &[f64], counts: &[u64], sum: f64) -> Metric {
    let mut cumulative = 0;
    let mut buckets = Vec::with_capacity(bounds.len());
    for (bound, count) in bounds.iter().zip(counts) {
        cumulative += count;
        let mut bucket = Bucket::default();
        bucket.set_upper_bound(*bound);
        bucket.set_cumulative_count(cumulative);
        buckets.push(bucket);
    }
    let total: u64 = counts.iter().sum();
    let mut histogram = Histogram::default();
    histogram.set_bucket(buckets);
    histogram.set_sample_count(total);
    histogram.set_sample_sum(sum);
    let mut metric = Metric::default();
    metric.set_label(labels(pairs));
    metric.set_histogram(histogram);
    metric
}

fn one_gauge(families: &mut Vec<MetricFamily>, name: &str, help: &str, value: f64) {
    families.push(family(
        name,
        help,
        MetricType::GAUGE,
        vec![gauge(&[], value)],
    ));
}

/// Converts a count to a sample value (exact below 2^53, far above any count here).
fn value(n: impl TryInto<i64>) -> f64 {
    n.try_into().unwrap_or(i64::MAX) as f64
}

// ---------------------------------------------------------------------------------------------
// kvd's own series.
// ---------------------------------------------------------------------------------------------

fn kvd_engine(families: &mut Vec<MetricFamily>, engine: Option<&EngineGauges>) {
    one_gauge(
        families,
        "kvd_engine_up",
        "1 if the engine answered the scrape, else 0.",
        value(u8::from(engine.is_some())),
    );
    let Some(engine) = engine else {
        return;
    };
    let status = &engine.status;
    let alarm = |kind| value(status.alarms.iter().filter(|a| a.alarm == kind).count());
    let gauges: [(&str, &str, f64); 10] = [
        (
            "kvd_db_size_quota_bytes",
            "The space quota in bytes (0 when disabled).",
            value(status.db_size_quota),
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
            value(status.db_size),
        ),
        (
            "kvd_db_size_in_use_bytes",
            "Bytes the database occupies inside its file.",
            value(status.db_size_in_use),
        ),
        (
            "kvd_current_revision",
            "The current store revision.",
            value(status.header.revision),
        ),
        (
            "kvd_compact_revision",
            "The compaction revision (-1 if never compacted).",
            value(status.compact_revision),
        ),
        (
            "kvd_applied_index",
            "Write requests applied since creation.",
            value(status.applied_index),
        ),
        (
            "kvd_watchers",
            "Watches open on all watch streams.",
            value(engine.watchers),
        ),
        (
            "kvd_leases",
            "Leases granted and not yet revoked or expired.",
            value(engine.leases),
        ),
    ];
    for (name, help, v) in gauges {
        one_gauge(families, name, help, v);
    }
    let agents = engine
        .agents
        .iter()
        .map(|(state, n)| gauge(&[("state", state)], value(*n)));
    families.push(family(
        "kvd_agents",
        "Agents by state (REGISTERED, RECOVERED, UNREACHABLE, GONE).",
        MetricType::GAUGE,
        agents.collect(),
    ));
    if let Some(rows) = engine.consumption_drift_rows {
        one_gauge(
            families,
            "kvd_consumption_drift_rows",
            "Consumption rows that differed from a recount at the last periodic check.",
            value(rows),
        );
    }
    kvd_apply(families, &engine.apply);
    let queue = &engine.allocation_prepare_queue;
    one_gauge(
        families,
        "kvd_allocation_prepare_queue_depth",
        "Allocations preparing (admitted with prepare, not yet started or released).",
        value(queue.preparing),
    );
    one_gauge(
        families,
        "kvd_allocation_prepare_queue_capacity",
        "The allocation prepare queue length (0 when the queue is off).",
        value(queue.length),
    );
}

/// The writes in flight (admitted, not yet answered) and the commits by batch size.
fn kvd_apply(families: &mut Vec<MetricFamily>, apply: &kvd::ApplyStats) {
    one_gauge(
        families,
        "kvd_apply_queue_depth",
        "Writes admitted and not yet answered (queued, being applied, or waiting for their log sync).",
        value(apply.queue_depth),
    );
    one_gauge(
        families,
        "kvd_apply_queue_capacity",
        "The bound of the apply queue.",
        value(apply.queue_capacity),
    );
    one_gauge(
        families,
        "kvd_prepare_queue_capacity",
        "The bound of the write prepare queue (--prepare-queue-length).",
        value(apply.queue_capacity),
    );
    let depth = apply
        .roles
        .iter()
        .map(|q| gauge(&[("role", &q.role)], value(q.queued)))
        .collect();
    families.push(family(
        "kvd_prepare_queue_depth",
        "Writes of the role in the prepare queue (admitted, not yet answered).",
        MetricType::GAUGE,
        depth,
    ));
    let refused = apply
        .roles
        .iter()
        .map(|q| counter(&[("role", &q.role)], value(q.refused)))
        .collect();
    families.push(family(
        "kvd_too_many_requests_total",
        "Writes of the role refused with too many requests since the server started.",
        MetricType::COUNTER,
        refused,
    ));
    let bounds: Vec<f64> = kvd::WRITE_DURATION_BOUNDS_MICROS
        .iter()
        .map(|micros| seconds(*micros))
        .collect();
    let durations = apply
        .durations
        .iter()
        .map(|d| {
            histogram(
                &[("role", &d.role)],
                &bounds,
                &d.buckets,
                seconds(d.sum_micros),
            )
        })
        .collect();
    families.push(family(
        "kvd_write_duration_seconds",
        "Time from a write's admission into the prepare queue to its answer (queued, applied, made durable), by the role that owns it.",
        MetricType::HISTOGRAM,
        durations,
    ));
    let last = apply.batch_sizes.len().saturating_sub(1);
    let batches = apply
        .batch_sizes
        .iter()
        .enumerate()
        .map(|(i, (at_most, commits))| {
            let bucket = if i == last {
                "+Inf".to_owned()
            } else {
                at_most.to_string()
            };
            counter(&[("requests_at_most", &bucket)], value(*commits))
        })
        .collect();
    families.push(family(
        "kvd_group_commit_batches_total",
        "Commits of write batches, by the most requests a batch of that bucket held.",
        MetricType::COUNTER,
        batches,
    ));
    families.push(family(
        "kvd_inline_batches_total",
        "Write batches a lone write's caller applied and finished in its own thread.",
        MetricType::COUNTER,
        vec![counter(&[], value(apply.inline_batches))],
    ));
}

fn kvd_streams(families: &mut Vec<MetricFamily>, streams: &StreamGauges) {
    families.push(family(
        "kvd_grpc_streams_open",
        "Long-lived gRPC streams open, by kind.",
        MetricType::GAUGE,
        vec![
            gauge(&[("stream", "watch")], value(streams.watch)),
            gauge(&[("stream", "lease_keep_alive")], value(streams.keep_alive)),
        ],
    ));
    one_gauge(
        families,
        "kvd_connections_open",
        "Client connections served now.",
        value(streams.connections_open),
    );
    one_gauge(
        families,
        "kvd_storage_poisoned",
        "1 while the store is poisoned after an I/O error and waits for kvd to reopen it.",
        value(u8::from(streams.storage_poisoned)),
    );
    families.push(family(
        "kvd_connections_refused_total",
        "Client connections refused at --max-connections since start.",
        MetricType::COUNTER,
        vec![counter(&[], value(streams.connections_refused))],
    ));
    families.push(family(
        "kvd_scrub_runs_total",
        "Passes of the periodic checksum scrub (--scrub-interval) since start, by result: \
         sound, damaged (the CORRUPT alarm was raised), failed (could not run).",
        MetricType::COUNTER,
        streams
            .scrub_runs
            .iter()
            .map(|(result, runs)| counter(&[("result", result)], value(*runs)))
            .collect(),
    ));
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

/// The per-role quota gauges of the roles with a registry entry (MET-4), in units.
fn kvd_quota(families: &mut Vec<MetricFamily>, roles: &[RoleUsage]) {
    let with_quota: Vec<(&RoleUsage, &QuotaConfig)> = roles
        .iter()
        .filter_map(|role| role.quota.as_ref().map(|config| (role, config)))
        .collect();
    for (name, help, series) in QUOTA_FAMILIES {
        let mut metrics = Vec::new();
        for (role, config) in &with_quota {
            for (resource, milli) in series(role, config) {
                metrics.push(gauge(
                    &[("role", &role.role), ("resource", &resource)],
                    units(milli),
                ));
            }
        }
        families.push(family(name, help, MetricType::GAUGE, metrics));
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

/// Returns milli-units as a number of units: `1500` is 1.5, printed as Mesos prints the
/// scalar (the text format writes the shortest decimal that reads back the same).
fn units(milli: i64) -> f64 {
    let magnitude = Scalar::from_milli(milli.saturating_abs()).unwrap_or(Scalar::MAX);
    let units = magnitude.milli() as f64 / 1000.0;
    if milli < 0 { -units } else { units }
}

fn kvd_requests(families: &mut Vec<MetricFamily>, methods: &BTreeMap<String, MethodStats>) {
    let mut totals = Vec::new();
    let mut durations = Vec::new();
    let bounds: Vec<f64> = LATENCY_BUCKETS_MICROS
        .iter()
        .map(|micros| seconds(*micros))
        .collect();
    for (path, stats) in methods.iter().filter(|(_, s)| s.count > 0) {
        let (service, method) = split_method(path);
        for (code, count) in &stats.codes {
            let code = code_name(*code);
            totals.push(counter(
                &[
                    ("grpc_service", service),
                    ("grpc_method", method),
                    ("grpc_code", &code),
                ],
                value(*count),
            ));
        }
        debug_assert_eq!(stats.buckets.iter().sum::<u64>(), stats.count, "MET-2");
        durations.push(histogram(
            &[("grpc_service", service), ("grpc_method", method)],
            &bounds,
            &stats.buckets,
            seconds(stats.sum_micros),
        ));
    }
    families.push(family(
        "kvd_grpc_requests_total",
        "gRPC requests handled, by method and status code.",
        MetricType::COUNTER,
        totals,
    ));
    families.push(family(
        "kvd_grpc_request_duration_seconds",
        "Time to answer a gRPC request (to the response head).",
        MetricType::HISTOGRAM,
        durations,
    ));
}

// ---------------------------------------------------------------------------------------------
// etcd's series (MET-5).
// ---------------------------------------------------------------------------------------------

/// The series that need no engine: leadership, identity, versions, quota.
fn etcd_server(families: &mut Vec<MetricFamily>, server: &ServerGauges) {
    one_gauge(
        families,
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        1.0,
    );
    one_gauge(
        families,
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        1.0,
    );
    one_gauge(
        families,
        "etcd_server_is_learner",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        0.0,
    );
    families.push(family(
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
        MetricType::COUNTER,
        vec![counter(&[], 1.0)],
    ));
    let id = format!("{:x}", server.member_id);
    families.push(family(
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        MetricType::GAUGE,
        vec![gauge(&[("server_id", &id)], 1.0)],
    ));
    families.push(family(
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        MetricType::GAUGE,
        vec![gauge(&[("server_version", server.server_version)], 1.0)],
    ));
    families.push(family(
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        MetricType::GAUGE,
        vec![gauge(&[("cluster_version", server.cluster_version)], 1.0)],
    ));
    one_gauge(
        families,
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        value(server.quota_bytes),
    );
}

/// The series read from the engine at scrape time (MET-3).
fn etcd_engine(families: &mut Vec<MetricFamily>, engine: &EngineGauges, streams: &StreamGauges) {
    let status = &engine.status;
    let raft_index = value(status.applied_index.saturating_add(RAFT_BOOTSTRAP_ENTRIES));
    let gauges: [(&str, &str, f64); 10] = [
        (
            "etcd_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            value(status.db_size),
        ),
        (
            "etcd_mvcc_db_total_size_in_use_in_bytes",
            "Total size of the underlying database logically in use in bytes.",
            value(status.db_size_in_use),
        ),
        (
            "etcd_debugging_mvcc_db_total_size_in_bytes",
            "Total size of the underlying database physically allocated in bytes.",
            value(status.db_size),
        ),
        (
            "etcd_debugging_mvcc_current_revision",
            "The current revision of store.",
            value(status.header.revision),
        ),
        (
            "etcd_debugging_mvcc_compact_revision",
            "The revision of the last compaction in store.",
            value(status.compact_revision.max(0)),
        ),
        (
            "etcd_debugging_mvcc_watcher_total",
            "Total number of watchers.",
            value(engine.watchers),
        ),
        (
            "etcd_debugging_mvcc_watch_stream_total",
            "Total number of watch streams.",
            value(streams.watch),
        ),
        (
            "etcd_server_proposals_committed_total",
            "The total number of consensus proposals committed.",
            raft_index,
        ),
        (
            "etcd_server_proposals_applied_total",
            "The total number of consensus proposals applied.",
            raft_index,
        ),
        (
            "etcd_server_proposals_pending",
            "The current number of pending proposals to commit.",
            value(engine.apply.queue_depth),
        ),
    ];
    for (name, help, v) in gauges {
        one_gauge(families, name, help, v);
    }
    let bounds = kvd::disk_bucket_bounds_seconds();
    for (name, help, timings) in [
        (
            "etcd_disk_wal_fsync_duration_seconds",
            "The latency distributions of fsync called by WAL.",
            &engine.disk.wal_fsync,
        ),
        (
            "etcd_disk_backend_commit_duration_seconds",
            "The latency distributions of commit called by backend.",
            &engine.disk.backend_commit,
        ),
    ] {
        families.push(family(
            name,
            help,
            MetricType::HISTOGRAM,
            vec![histogram(
                &[],
                &bounds,
                &timings.buckets,
                seconds(timings.sum_micros),
            )],
        ));
    }
}

/// go-grpc-prometheus's server families, labels sorted by name as its output is (MET-1).
fn grpc_server(families: &mut Vec<MetricFamily>, methods: &BTreeMap<String, MethodStats>) {
    let mut started = Vec::new();
    let mut handled = Vec::new();
    let called = |(service, method, _): &(&str, &str, &str)| {
        methods.contains_key(&format!("/{service}/{method}"))
    };
    let shown = ETCD_METHODS
        .iter()
        .chain(RECIPE_METHODS.iter().filter(|m| called(m)));
    for &(service, method, kind) in shown {
        let stats = methods.get(&format!("/{service}/{method}"));
        started.push(counter(
            &[
                ("grpc_method", method),
                ("grpc_service", service),
                ("grpc_type", kind),
            ],
            value(stats.map_or(0, |s| s.started)),
        ));
        for (code, count) in stats.iter().flat_map(|s| &s.codes) {
            handled.push(counter(
                &[
                    ("grpc_code", go_code_name(Code::from(*code))),
                    ("grpc_method", method),
                    ("grpc_service", service),
                    ("grpc_type", kind),
                ],
                value(*count),
            ));
        }
    }
    families.push(family(
        "grpc_server_started_total",
        "Total number of RPCs started on the server.",
        MetricType::COUNTER,
        started,
    ));
    families.push(family(
        "grpc_server_handled_total",
        "Total number of RPCs completed on the server, regardless of success or failure.",
        MetricType::COUNTER,
        handled,
    ));
}

/// Returns (service, method) of a path `/service/method`.
fn split_method(path: &str) -> (&str, &str) {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    trimmed.split_once('/').unwrap_or((trimmed, ""))
}

/// Returns the name kvd's own series use for a status code (tonic's names).
fn code_name(code: i32) -> String {
    match Code::from(code) {
        Code::Ok => "OK".to_owned(),
        other => format!("{other:?}"),
    }
}

/// Returns the name gRPC-go gives a status code, as `grpc_code` of go-grpc-prometheus (no
/// `_` arm: every code is named).
fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Returns `micros` in seconds.
fn seconds(micros: u64) -> f64 {
    micros as f64 / 1e6
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
        let text = metrics.render(None, &StreamGauges::default(), &ServerGauges::default());
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
        assert_eq!(methods.get(OTHER_METHOD).map(|s| s.count), Some(10));
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
                inline_batches: 2,
                roles: vec![kvd::RoleQueue {
                    role: "greedy".into(),
                    queued: 5,
                    refused: 9,
                }],
                durations: vec![kvd::RoleDurations {
                    role: "polite".into(),
                    buckets: {
                        let mut b = [0; 17];
                        b[3] = 2; // at most 1 ms
                        b[16] = 1; // above 10 s
                        b
                    },
                    sum_micros: 12_001_500,
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
            disk: kvd::DiskTimingsSnapshot::default(),
        };
        let streams = StreamGauges {
            watch: 1,
            keep_alive: 4,
            ..StreamGauges::default()
        };
        let text = Metrics::new().render(Some(&engine), &streams, &ServerGauges::default());
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
            "kvd_write_duration_seconds_bucket{role=\"polite\",le=\"0.0005\"} 0",
            "kvd_write_duration_seconds_bucket{role=\"polite\",le=\"0.001\"} 2",
            "kvd_write_duration_seconds_bucket{role=\"polite\",le=\"10\"} 2",
            "kvd_write_duration_seconds_bucket{role=\"polite\",le=\"+Inf\"} 3",
            "kvd_write_duration_seconds_sum{role=\"polite\"} 12.0015",
            "kvd_write_duration_seconds_count{role=\"polite\"} 3",
            "kvd_allocation_prepare_queue_depth 3",
            "kvd_allocation_prepare_queue_capacity 8",
            "kvd_group_commit_batches_total{requests_at_most=\"1\"} 3",
            "kvd_group_commit_batches_total{requests_at_most=\"+Inf\"} 1",
            "kvd_inline_batches_total 2",
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
        let mut families = Vec::new();
        kvd_quota(&mut families, &[star, dev]);
        let out = encode(&families);
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
    fn grpc_server_series_start_at_zero_for_every_etcd_method() {
        let metrics = Metrics::new();
        metrics.start("/etcdserverpb.KV/Range");
        metrics.record(
            "/etcdserverpb.KV/Range",
            Code::Cancelled,
            Duration::from_millis(1),
        );
        let server = ServerGauges {
            member_id: 255,
            server_version: "3.6.0",
            cluster_version: "3.6",
            quota_bytes: 10,
        };
        let text = metrics.render(None, &StreamGauges::default(), &server);
        for line in [
            "grpc_server_started_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1",
            "grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 0",
            "grpc_server_handled_total{grpc_code=\"Canceled\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 1",
            "etcd_server_id{server_id=\"ff\"} 1",
            "etcd_server_quota_backend_bytes 10",
            "etcd_server_has_leader 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        let started = text
            .lines()
            .filter(|l| l.starts_with("grpc_server_started_total{"))
            .count();
        assert_eq!(started, ETCD_METHODS.len());
    }

    #[test]
    fn lock_and_election_series_appear_once_called() {
        let metrics = Metrics::new();
        let server = ServerGauges {
            member_id: 1,
            server_version: "3.6.0",
            cluster_version: "3.6",
            quota_bytes: 0,
        };
        let before = metrics.render(None, &StreamGauges::default(), &server);
        assert!(!before.contains("v3lockpb"), "MET-1: not before a call");
        metrics.start("/v3electionpb.Election/Observe");
        metrics.record("/v3electionpb.Election/Observe", Code::Ok, Duration::ZERO);
        let after = metrics.render(None, &StreamGauges::default(), &server);
        let line = "grpc_server_started_total{grpc_method=\"Observe\",grpc_service=\"v3electionpb.Election\",grpc_type=\"server_stream\"} 1";
        assert!(
            after.lines().any(|l| l == line),
            "{line} missing in\n{after}"
        );
        assert!(!after.contains("v3lockpb"), "only the methods called");
    }

    #[test]
    fn quota_units_are_exact() {
        assert_eq!(units(1500), 1.5);
        assert_eq!(units(-1), -0.001);
        assert_eq!(units(1_000_000_000), 1e6);
    }

    #[test]
    fn seconds_are_exact() {
        assert_eq!(seconds(5_000).to_string(), "0.005");
        assert_eq!(seconds(2_500_000).to_string(), "2.5");
        assert_eq!(seconds(10_000_000).to_string(), "10");
    }
}
