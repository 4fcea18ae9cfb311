//! The allocation prepare queue through a running kvd: ALLOCATE with `prepare`, START and
//! RELEASE over `POST /api/v1`, `offered` in `/roles` and in the limit check, the full queue
//! answered 429 with `Retry-After: 5`, UPDATE_PREPARE_QUEUE at run time, the
//! `--allocation-prepare-queue-length` flag (persisted, replaced and logged, a negative value
//! refused), and the `kvd_allocation_prepare_queue_*` gauges. No timing assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};

/// An HTTP answer: the code, the header lines and the body.
#[derive(Debug)]
struct Answer {
    code: u16,
    head: String,
    body: String,
}

impl Answer {
    /// Returns the value of header `name`, if present.
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// Posts a JSON call to `/api/v1` and reads the whole answer.
fn call(endpoint: &str, body: &Value) -> Answer {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let body = body.to_string();
    let request = format!(
        "POST /api/v1 HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    Answer {
        code: head.split(' ').nth(1).unwrap().parse().unwrap(),
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// Posts a call that must succeed with an empty body.
fn accepted(endpoint: &str, body: &Value) {
    let answer = call(endpoint, body);
    assert_eq!((answer.code, answer.body.as_str()), (200, ""), "{body}");
}

fn allocate(id: &str, role: &str, cpus: f64, prepare: bool) -> Value {
    json!({"type": "ALLOCATE", "allocate": {"id": id, "role": role, "agent_id": "a1",
           "resources": {"cpus": {"value": cpus}}, "prepare": prepare}})
}

fn start(id: &str) -> Value {
    json!({"type": "START", "start": {"id": id}})
}

fn update_prepare_queue(length: Value) -> Value {
    json!({"type": "UPDATE_PREPARE_QUEUE",
           "update_prepare_queue": {"allocation_prepare_queue_length": length}})
}

fn register_agent(endpoint: &str) {
    accepted(
        endpoint,
        &json!({"type": "REGISTER_AGENT", "register_agent": {"agent_id": "a1",
                "resources": {"cpus": {"value": 64}}}}),
    );
}

/// Returns the `/roles` entry of `name`.
fn role(endpoint: &str, name: &str) -> Value {
    let (code, body) = common::http_get(endpoint, "/roles").unwrap();
    assert_eq!(code, 200, "{body}");
    let roles: Value = serde_json::from_str(&body).unwrap();
    roles["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Returns the (depth, capacity) of the allocation prepare queue gauges.
fn queue_gauges(endpoint: &str) -> (String, String) {
    let (code, body) = common::http_get(endpoint, "/metrics").unwrap();
    assert_eq!(code, 200);
    let value = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing in\n{body}"))
            .to_owned()
    };
    (
        value("kvd_allocation_prepare_queue_depth"),
        value("kvd_allocation_prepare_queue_capacity"),
    )
}

#[test]
fn preparing_allocations_show_as_offered_and_a_full_queue_is_429_with_retry_after() {
    let server = common::start_kvd(&["--allocation-prepare-queue-length", "2"]);
    let e = &server.endpoint;
    register_agent(e);
    accepted(
        e,
        &json!({"type": "UPDATE_QUOTA", "update_quota": {"quota_configs": [
            {"role": "ml", "limits": {"cpus": {"value": 8}}}]}}),
    );
    accepted(e, &allocate("x1", "ml", 6.0, true));
    let ml = role(e, "ml");
    assert_eq!(ml["offered"], json!({"cpus": 6}), "{ml}");
    assert_eq!(ml["allocated"], json!({}), "{ml}");
    assert_eq!(ml["resources"], json!({"cpus": 6}), "{ml}");
    assert_eq!(ml["quota"]["consumed"], json!({}), "{ml}");
    // What a preparing allocation holds is checked with the consumption.
    let over = call(e, &allocate("x2", "ml", 3.0, false));
    assert_eq!(
        (over.code, over.body.as_str()),
        (
            400,
            "kvd: quota exceeded for role 'ml': cpus consumption 0 + offered 6 + request 3 > limit 8"
        )
    );
    accepted(e, &allocate("y1", "other", 1.0, true));
    assert_eq!(queue_gauges(e), ("2".to_owned(), "2".to_owned()));
    let full = call(e, &allocate("z1", "third", 1.0, true));
    assert_eq!(
        (full.code, full.body.as_str()),
        (
            429,
            "kvd: prepare queue is full: 2 allocations preparing, limit 2"
        ),
        "{full:?}"
    );
    assert_eq!(full.header("retry-after").as_deref(), Some("5"), "{full:?}");
    assert!(
        role(e, "third").is_null(),
        "a refused ALLOCATE changed nothing"
    );
    // START moves offered to allocated and frees the slot.
    accepted(e, &start("x1"));
    let ml = role(e, "ml");
    assert_eq!(ml["allocated"], json!({"cpus": 6}), "{ml}");
    assert_eq!(ml["offered"], json!({}), "{ml}");
    assert_eq!(ml["quota"]["consumed"], json!({"cpus": 6}), "{ml}");
    let again = call(e, &start("x1"));
    assert_eq!(
        (again.code, again.body.as_str()),
        (400, "Allocation 'x1' is not preparing")
    );
    accepted(e, &allocate("z1", "third", 1.0, true));
    // RELEASE ends a preparing allocation too, and frees its slot.
    accepted(e, &json!({"type": "RELEASE", "release": {"id": "z1"}}));
    assert_eq!(queue_gauges(e), ("1".to_owned(), "2".to_owned()));
    assert!(role(e, "third").is_null());
}

#[test]
fn the_queue_length_changes_at_run_time_persists_and_a_start_flag_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let flag = "--allocation-prepare-queue-length";
    let mut server = common::start_kvd_in(&data_dir, &[flag, "3"]).unwrap();
    assert_eq!(queue_gauges(&server.endpoint).1, "3");
    register_agent(&server.endpoint);
    accepted(&server.endpoint, &allocate("x1", "a", 1.0, true));
    accepted(&server.endpoint, &update_prepare_queue(json!(1)));
    assert_eq!(
        queue_gauges(&server.endpoint),
        ("1".to_owned(), "1".to_owned())
    );
    // Lowered to the count: no new entry, nothing cancelled.
    assert_eq!(
        call(&server.endpoint, &allocate("y1", "b", 1.0, true)).code,
        429
    );
    let negative = call(&server.endpoint, &update_prepare_queue(json!(-1)));
    assert_eq!(
        (negative.code, negative.body.as_str()),
        (
            400,
            "Failed to convert JSON into Call protobuf: Failed to parse -1 as a non-negative \
             integer for field 'update_prepare_queue.allocation_prepare_queue_length'"
        )
    );
    assert_eq!(server.signal_and_wait("-TERM"), Some(0));

    // Without the flag, the run-time value and the preparing allocation are kept.
    let mut server = common::start_kvd_in(&data_dir, &[]).unwrap();
    assert_eq!(
        queue_gauges(&server.endpoint),
        ("1".to_owned(), "1".to_owned())
    );
    assert!(
        !server.log().contains("replaced"),
        "no flag, nothing replaced:\n{}",
        server.log()
    );
    assert_eq!(server.signal_and_wait("-TERM"), Some(0));

    // With the flag, it replaces the persisted value and the log says so.
    let server = common::start_kvd_in(&data_dir, &[flag, "4"]).unwrap();
    assert_eq!(
        queue_gauges(&server.endpoint),
        ("1".to_owned(), "4".to_owned())
    );
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("--allocation-prepare-queue-length replaced"))
        .unwrap_or_else(|| panic!("no replacement logged:\n{log}"));
    assert!(
        line.contains("previous=Some(1)") && line.contains("allocation_prepare_queue_length=4"),
        "{line}"
    );
    // After a restart the agent is recovered and takes no new records until it registers
    // again, as in Mesos.
    register_agent(&server.endpoint);
    accepted(&server.endpoint, &allocate("y1", "b", 1.0, true));
}

#[test]
fn a_negative_queue_length_flag_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let refused = common::start_kvd_in(
        &dir.path().join("data"),
        &["--allocation-prepare-queue-length", "-1"],
    )
    .err()
    .expect("kvd started with a negative queue length");
    assert!(
        refused.contains("kvd: --allocation-prepare-queue-length must be 0 (off) or more, not -1"),
        "{refused}"
    );
}
