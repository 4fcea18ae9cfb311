//! Smoke test of `kvd bench`: tiny bounded workloads against a test kvd; the JSON report
//! parses and its counts add up (no timing assertions).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::process::Command;

use serde_json::Value;

/// Runs `kvd bench ARGS --json --quiet` and returns the exit code and the parsed report.
fn bench(args: &[&str]) -> (Option<i32>, Value) {
    let output = Command::new(common::kvd_binary())
        .arg("bench")
        .args(args)
        .args(["--json", "--quiet", "--duration", "60s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "report is not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code(), report)
}

fn number(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing in {report}"))
}

/// Asserts the counts of `report` add up (BENCH-2) and returns `succeeded`.
fn assert_counts(report: &Value, requests: u64) -> u64 {
    let succeeded = number(report, "succeeded");
    assert_eq!(number(report, "requests"), requests, "{report}");
    assert_eq!(succeeded + number(report, "errors"), requests, "{report}");
    let histogram: u64 = report["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|bucket| bucket["count"].as_u64().unwrap())
        .sum();
    assert_eq!(histogram, succeeded, "{report}");
    let latency = &report["latency_ms"];
    for name in ["min", "p50", "p90", "p99", "p999", "max"] {
        assert!(latency[name].as_f64().is_some(), "{name} in {report}");
    }
    assert!(latency["p50"].as_f64() <= latency["max"].as_f64());
    assert!(report["throughput_rps"].as_f64().unwrap() > 0.0);
    succeeded
}

fn current_revision(endpoint: &str) -> u64 {
    let (_, metrics) = common::http_get(endpoint, "/metrics").unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("kvd_current_revision "))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn put_range_and_txn_workloads_report_consistent_counts() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.as_str();

    let (code, put) = bench(&[
        "put",
        "--endpoints",
        ep,
        "--clients",
        "4",
        "--conns",
        "2",
        "--total",
        "200",
        "--key-space",
        "50",
        "--value-size",
        "16",
    ]);
    assert_eq!(code, Some(0), "{put}");
    assert_eq!(assert_counts(&put, 200), 200);
    assert_eq!(put["workload"], "put");
    assert_eq!(
        (put["clients"].as_u64(), put["connections"].as_u64()),
        (Some(4), Some(2))
    );
    assert!(put["preload"].is_null() && put["first_error"].is_null());
    assert_eq!(current_revision(ep), 1 + 200, "one revision per put");

    let (code, range) = bench(&[
        "range",
        "--endpoints",
        ep,
        "--clients",
        "3",
        "--conns",
        "1",
        "--total",
        "30",
        "--key-space",
        "100",
        "--range-keys",
        "10",
        "--key-prefix",
        "r/",
    ]);
    assert_eq!(code, Some(0), "{range}");
    assert_eq!(assert_counts(&range, 30), 30);
    assert_eq!(number(&range, "keys_returned"), 30 * 10, "{range}");
    assert_eq!(range["preload"]["keys"].as_u64(), Some(100));

    let before = current_revision(ep);
    let (code, txn) = bench(&[
        "txn",
        "--endpoints",
        ep,
        "--clients",
        "2",
        "--conns",
        "2",
        "--total",
        "20",
        "--key-space",
        "40",
        "--txn-ops",
        "3",
        "--key-prefix",
        "t/",
    ]);
    assert_eq!(code, Some(0), "{txn}");
    assert_eq!(assert_counts(&txn, 20), 20);
    assert_eq!(current_revision(ep), before + 20, "one revision per txn");
}

#[test]
fn a_paced_run_sends_no_more_than_its_schedule() {
    let server = common::start_kvd(&[]);
    // 4 requests per second for at most 5 s: tickets 0..=19 are due before the deadline,
    // later ones are not sent, whatever --total says (BENCH-1).
    let output = Command::new(common::kvd_binary())
        .args(["bench", "put", "--endpoints", &server.endpoint])
        .args([
            "--rate",
            "4",
            "--duration",
            "5s",
            "--total",
            "1000",
            "--clients",
            "2",
        ])
        .args(["--conns", "1", "--json", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let requests = number(&report, "requests");
    assert!(
        (1..=20).contains(&requests),
        "{requests} requests in {report}"
    );
    assert_counts(&report, requests);
}

#[test]
fn an_unreachable_endpoint_is_a_clear_error() {
    let [port, _] = common::free_ports();
    let output = Command::new(common::kvd_binary())
        .args(["bench", "put", "--quiet", "--total", "1"])
        .args(["--endpoints", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with("kvd bench: cannot connect"), "{stderr}");
}

#[test]
fn bench_flags_are_checked() {
    let output = Command::new(common::kvd_binary())
        .args(["bench", "range", "--key-space", "5", "--range-keys", "6"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--range-keys must be"), "{stderr}");
    // Serving flags and bench do not mix.
    let output = Command::new(common::kvd_binary())
        .args(["--data-dir", "x", "bench", "put"])
        .output()
        .unwrap();
    // A usage error is bad configuration (BIN-2): 1, not the 2 of failed requests.
    assert_eq!(output.status.code(), Some(1), "a usage error");
}
