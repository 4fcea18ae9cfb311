//! `/metrics` parsed by a Prometheus text-format parser of its own (`prometheus-parse`, not
//! kvd's encoder): every etcd series kvd publishes has the name, type, label names and (for
//! histograms) buckets of etcd 3.4.23's, read from a real etcd's scrape; and the values
//! follow the store (revision, sizes, quota, alarms, requests, disk histograms).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use prometheus_parse::{Scrape, Value};

use crate::common;

/// The etcd series kvd publishes (`docs/operations.md`, "Metrics"), each also in etcd 3.4.23.
const ETCD_SERIES: &[&str] = &[
    "etcd_server_has_leader",
    "etcd_server_is_leader",
    "etcd_server_is_learner",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_id",
    "etcd_server_version",
    "etcd_cluster_version",
    "etcd_server_quota_backend_bytes",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_debugging_mvcc_db_total_size_in_bytes",
    "etcd_debugging_mvcc_current_revision",
    "etcd_debugging_mvcc_compact_revision",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_applied_total",
    "etcd_server_proposals_pending",
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
    "grpc_server_started_total",
    "grpc_server_handled_total",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_max_fds",
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
];

fn scrape(endpoint: &str) -> Scrape {
    let (code, body) = common::http_get(endpoint, "/metrics").unwrap();
    assert_eq!(code, 200);
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

/// The type of a sample's value.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Counter(_) => "counter",
        Value::Gauge(_) => "gauge",
        Value::Histogram(_) => "histogram",
        Value::Summary(_) => "summary",
        Value::Untyped(_) => "untyped",
    }
}

/// What a family looks like without its values: type, label names, histogram bounds.
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    kind: &'static str,
    labels: BTreeSet<String>,
    buckets: Vec<String>,
}

/// Returns the shape of every family of `scrape`, from its first sample.
fn shapes(scrape: &Scrape) -> BTreeMap<String, Shape> {
    let mut out = BTreeMap::new();
    for sample in &scrape.samples {
        out.entry(sample.metric.clone()).or_insert_with(|| Shape {
            kind: kind(&sample.value),
            labels: sample.labels.keys().cloned().collect(),
            buckets: match &sample.value {
                Value::Histogram(counts) => {
                    counts.iter().map(|c| format!("{}", c.less_than)).collect()
                }
                _ => Vec::new(),
            },
        });
    }
    out
}

/// Returns the value of the sample of `name` whose labels include `labels`.
fn sample(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(counts) => counts.last().map_or(0.0, |c| c.count),
            Value::Summary(_) => f64::NAN,
        })
}

fn value(scrape: &Scrape, name: &str) -> f64 {
    sample(scrape, name, &[]).unwrap_or_else(|| panic!("{name} missing"))
}

fn put(endpoint: &str, key: &str) {
    let run = common::etcdctl(endpoint, &["put", key, "value"], None);
    assert_eq!(run.code, 0, "{run:?}");
}

#[test]
fn etcd_series_have_etcds_names_types_labels_and_buckets() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    for endpoint in [&etcd.endpoint, &kvd.endpoint] {
        put(endpoint, "k");
    }
    let etcd_shapes = shapes(&scrape(&etcd.endpoint));
    let kvd_shapes = shapes(&scrape(&kvd.endpoint));
    let mut differences = Vec::new();
    for name in ETCD_SERIES {
        match (etcd_shapes.get(*name), kvd_shapes.get(*name)) {
            (Some(want), Some(have)) if want == have => {}
            (want, have) => differences.push(format!("{name}: etcd {want:?}, kvd {have:?}")),
        }
    }
    eprintln!(
        "metrics differential: {} of {} etcd series equal in type, labels and buckets",
        ETCD_SERIES.len() - differences.len(),
        ETCD_SERIES.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // kvd's own series stay beside etcd's.
    for name in [
        "kvd_engine_up",
        "kvd_current_revision",
        "kvd_db_size_bytes",
        "kvd_grpc_requests_total",
        "kvd_grpc_request_duration_seconds",
        "kvd_grpc_streams_open",
    ] {
        assert!(kvd_shapes.contains_key(name), "{name} missing");
    }
}

#[test]
fn metrics_follow_the_store() {
    let kvd = common::start_kvd(&["--quota-backend-bytes", "100000000"]);
    let ep = &kvd.endpoint;
    let before = scrape(ep);
    assert_eq!(value(&before, "etcd_server_has_leader"), 1.0);
    assert_eq!(value(&before, "etcd_server_quota_backend_bytes"), 1e8);
    assert_eq!(value(&before, "etcd_debugging_mvcc_current_revision"), 1.0);
    assert_eq!(value(&before, "etcd_server_proposals_applied_total"), 4.0);
    let put_ok = [("grpc_method", "Put"), ("grpc_code", "OK")];
    assert_eq!(sample(&before, "grpc_server_handled_total", &put_ok), None);
    for i in 0..3 {
        put(ep, &format!("key{i}"));
    }
    let after = scrape(ep);
    assert_eq!(value(&after, "etcd_debugging_mvcc_current_revision"), 4.0);
    assert_eq!(value(&after, "kvd_current_revision"), 4.0);
    assert_eq!(value(&after, "etcd_server_proposals_committed_total"), 7.0);
    assert_eq!(
        value(&after, "etcd_mvcc_db_total_size_in_bytes"),
        value(&after, "kvd_db_size_bytes")
    );
    let in_use = value(&after, "etcd_mvcc_db_total_size_in_use_in_bytes");
    assert!(in_use > 0.0 && in_use <= value(&after, "etcd_mvcc_db_total_size_in_bytes"));
    assert_eq!(
        sample(&after, "grpc_server_handled_total", &put_ok),
        Some(3.0)
    );
    // PREP-5: each put is counted once in its role's duration histogram (no registry entry:
    // every key belongs to `*`), in buckets from 0.1 ms to 10 s.
    let star = [("role", "*")];
    let writes = |s: &Scrape| sample(s, "kvd_write_duration_seconds", &star).unwrap_or(0.0);
    assert_eq!(writes(&after) - writes(&before), 3.0);
    let durations = &shapes(&after)["kvd_write_duration_seconds"];
    assert_eq!(durations.kind, "histogram");
    assert_eq!(
        durations.buckets.first().map(String::as_str),
        Some("0.0001")
    );
    assert_eq!(
        durations.buckets.len(),
        17,
        "16 bounds and +Inf: {durations:?}"
    );
    let started = [("grpc_method", "Put"), ("grpc_type", "unary")];
    assert_eq!(
        sample(&after, "grpc_server_started_total", &started),
        Some(3.0)
    );
    let fsyncs = value(&after, "etcd_disk_wal_fsync_duration_seconds");
    assert!(fsyncs >= 3.0, "one fsync per put at least: {fsyncs}");
    assert!(value(&after, "etcd_disk_backend_commit_duration_seconds") >= 3.0);
    // The process figures are this kvd's, read from /proc. The CPU time is the server's
    // utime + stime in whole seconds (the collector rounds down), read from /proc just before
    // and just after a scrape, and it never goes back.
    let ticks_before = cpu_ticks(kvd.pid());
    let cpu = value(&scrape(ep), "process_cpu_seconds_total");
    let ticks_after = cpu_ticks(kvd.pid());
    let per_second = clock_ticks_per_second();
    assert!(
        (ticks_before / per_second) as f64 <= cpu && cpu <= (ticks_after / per_second) as f64,
        "process_cpu_seconds_total {cpu}, /proc says {ticks_before}..{ticks_after} ticks of 1/{per_second} s"
    );
    assert!(value(&before, "process_cpu_seconds_total") <= cpu);
    assert!(value(&after, "process_resident_memory_bytes") > 1e6);
    assert!(value(&after, "process_open_fds") > 3.0);
    let started_at = value(&after, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started_at > now - 600.0 && started_at <= now + 1.0,
        "{started_at}"
    );

    // An alarm shows in kvd's gauge; the gateway's calls count under their gRPC methods.
    let (code, _) = post(
        ep,
        "/v3/maintenance/alarm",
        r#"{"action":"ACTIVATE","alarm":"NOSPACE"}"#,
    );
    assert_eq!(code, 200);
    let alarmed = scrape(ep);
    assert_eq!(value(&alarmed, "kvd_alarm_nospace"), 1.0);
    assert_eq!(
        sample(
            &alarmed,
            "grpc_server_handled_total",
            &[("grpc_method", "Alarm"), ("grpc_code", "OK")]
        ),
        Some(1.0)
    );
    let refused = common::etcdctl(ep, &["put", "k", "v"], None);
    assert_ne!(refused.code, 0);
    let refusals = scrape(ep);
    assert_eq!(
        sample(
            &refusals,
            "grpc_server_handled_total",
            &[("grpc_method", "Put"), ("grpc_code", "ResourceExhausted")]
        ),
        Some(1.0)
    );
}

/// Returns the CPU time `pid` has used, user and system, in clock ticks (fields 14 and 15
/// of `/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the name come the fields from the third (state) on.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let field = |n: usize| fields[n - 3].parse::<u64>().unwrap();
    field(14) + field(15)
}

/// Returns the clock ticks per second of `/proc` figures (`getconf CLK_TCK`).
fn clock_ticks_per_second() -> u64 {
    let output = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("run getconf");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Sends a POST with `body` and returns the status and body.
fn post(endpoint: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let host = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}
