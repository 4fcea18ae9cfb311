//! The JSON gateway (`/v3/...`) through plain HTTP requests, as curl sends them (no
//! `Content-Type`), differential against Debian's etcd 3.4.23: every endpoint kvd and etcd
//! both serve, errors included, a watch stream and a keep-alive stream. What legitimately
//! differs is masked (ids, raft term and indexes, sizes, versions, hashes, remaining TTLs,
//! the text of JSON syntax errors, which come from another parser); what kvd answers
//! differently by design is checked against kvd's own answer and listed in
//! `docs/operations.md` ("JSON gateway").
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common;

/// How long one gateway request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a stream test waits for the answers it expects.
const STREAM_WAIT: Duration = Duration::from_secs(10);

/// An HTTP answer: status and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// Sends `method path` over HTTP/1.0 with `body` and the extra `headers` (each ending in
/// CRLF) and returns the whole answer, head and body, as the server wrote it before closing.
fn exchange(endpoint: &str, method: &str, path: &str, body: &str, headers: &str) -> String {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(REQUEST_TIMEOUT)).unwrap();
    // One write: a body sent after the head may reach a server that has already answered
    // (a 404 or 405 needs no body) and closed, and the unread bytes make it reset the
    // connection, which can throw away the answer before it is read.
    let message = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    stream.write_all(message.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Sends `method path` with `body` (no `Content-Type` unless given in `headers`) and returns
/// the status and the body, parsed as JSON when it is JSON.
fn request(endpoint: &str, method: &str, path: &str, body: &str, headers: &str) -> Answer {
    let response = exchange(endpoint, method, path, body, headers);
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.trim().into()));
    Answer { status, body }
}

/// POSTs `body` to `path` as curl does (no `Content-Type`); `server_lock` uses it too.
pub fn post(endpoint: &str, path: &str, body: &str) -> Answer {
    request(endpoint, "POST", path, body, "")
}

/// POSTs `body` to `path` with the extra `headers` (each ending in CRLF).
pub fn post_with(endpoint: &str, path: &str, body: &str, headers: &str) -> Answer {
    request(endpoint, "POST", path, body, headers)
}

/// Returns `value` with the fields named in `keys` replaced by "<masked>", at any depth;
/// `differential` uses it too.
pub fn mask_keys(value: &mut Value, keys: &[&str]) {
    match value {
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if keys.contains(&key.as_str()) {
                    *field = json!("<masked>");
                } else {
                    mask_keys(field, keys);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| mask_keys(item, keys)),
        _ => {}
    }
}

/// Removes the fields named in `keys` (answers etcd 3.4 does not have), at any depth.
fn drop_keys(value: &mut Value, keys: &[&str]) {
    match value {
        Value::Object(map) => {
            map.retain(|key, _| !keys.contains(&key.as_str()));
            map.values_mut().for_each(|field| drop_keys(field, keys));
        }
        Value::Array(items) => items.iter_mut().for_each(|item| drop_keys(item, keys)),
        _ => {}
    }
}

/// Fields that differ between any two servers: identity and raft term.
pub const IDENTITY: &[&str] = &["cluster_id", "member_id", "raft_term"];

/// One step of the scenario: a request and what to mask in its answer.
struct Step {
    path: &'static str,
    body: String,
    /// Fields masked besides [`IDENTITY`].
    mask: &'static [&'static str],
    /// Fields only kvd sends (etcd 3.5+ additions), dropped before comparing.
    kvd_only: &'static [&'static str],
    /// The error text comes from the JSON parser (Go's or serde's): mask the messages.
    parser_error: bool,
}

fn step(path: &'static str, body: impl Into<String>) -> Step {
    Step {
        path,
        body: body.into(),
        mask: &[],
        kvd_only: &[],
        parser_error: false,
    }
}

impl Step {
    fn mask(mut self, keys: &'static [&'static str]) -> Step {
        self.mask = keys;
        self
    }
    fn kvd_only(mut self, keys: &'static [&'static str]) -> Step {
        self.kvd_only = keys;
        self
    }
    fn parser_error(mut self) -> Step {
        self.parser_error = true;
        self
    }
}

/// base64 of `text`, as the gateway wants bytes.
pub fn b64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The unary scenario: every endpoint both servers serve, in an order whose revisions are
/// the same on both.
fn unary_steps() -> Vec<Step> {
    let (a, b, c) = (b64("a"), b64("b"), b64("c"));
    let (k1, k2, k3, zz) = (b64("k1"), b64("k2"), b64("k3"), b64("zz"));
    let status_fields: &[&str] = &[
        "version",
        "dbSize",
        "dbSizeInUse",
        "leader",
        "raftIndex",
        "raftAppliedIndex",
        "raftTerm",
    ];
    vec![
        step("/v3/kv/put", format!(r#"{{"key":"{a}","value":"{b}"}}"#)),
        step(
            "/v3/kv/put",
            format!(r#"{{"key":"{a}","value":"{c}","prev_kv":true}}"#),
        ),
        step("/v3/kv/put", format!(r#"{{"key":"{k1}","value":"{b}"}}"#)),
        step("/v3/kv/put", format!(r#"{{"key":"{k2}","value":"{c}"}}"#)),
        step("/v3/kv/range", format!(r#"{{"key":"{a}"}}"#)),
        step("/v3beta/kv/range", format!(r#"{{"key":"{a}"}}"#)),
        // A range with 64-bit integers as numbers and strings, enums as names and numbers.
        step(
            "/v3/kv/range",
            format!(
                r#"{{"key":"{k1}","range_end":"{zz}","limit":1,"sort_order":"DESCEND","sort_target":"KEY"}}"#
            ),
        ),
        step(
            "/v3/kv/range",
            format!(
                r#"{{"key":"{k1}","range_end":"{zz}","limit":"5","sort_order":1,"sort_target":4}}"#
            ),
        ),
        step(
            "/v3/kv/range",
            format!(r#"{{"key":"{k1}","range_end":"{zz}","count_only":true}}"#),
        ),
        step(
            "/v3/kv/range",
            format!(r#"{{"key":"{k1}","range_end":"{zz}","keys_only":true,"revision":"3"}}"#),
        ),
        // Unknown fields are ignored, a null is absent, what follows the object is ignored.
        step("/v3/kv/range", format!(r#"{{"key":"{a}","bogus":[1]}}"#)),
        step(
            "/v3/kv/range",
            format!(r#"{{"key":"{a}","limit":null,"range_end":null}}"#),
        ),
        step("/v3/kv/range", format!(r#"{{"key":"{a}"}} trailing"#)),
        step("/v3/kv/range", "{}"),
        step("/v3/kv/range", ""),
        step("/v3/kv/range", "{bad").parser_error(),
        step("/v3/kv/range", r#"{"key":"YQ==","limit":"abc"}"#).parser_error(),
        step("/v3/kv/range", r#"{"key":"YQ==","revision":"99"}"#),
        // A delete of a missing key: `deleted` is absent.
        step("/v3/kv/deleterange", format!(r#"{{"key":"{k3}"}}"#)),
        step(
            "/v3/kv/deleterange",
            format!(r#"{{"key":"{k2}","prev_kv":true}}"#),
        ),
        // A compare without `result` is EQUAL; a target by number.
        step(
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{a}","target":"VALUE","value":"{c}"}}],"success":[{{"request_put":{{"key":"{k3}","value":"{a}"}}}},{{"request_range":{{"key":"{k3}"}}}}],"failure":[{{"request_delete_range":{{"key":"{k3}"}}}}]}}"#
            ),
        ),
        step(
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{a}","target":1,"result":"GREATER","create_revision":"100"}}],"success":[{{"request_put":{{"key":"{k3}","value":"{a}"}}}}],"failure":[{{"request_delete_range":{{"key":"{k3}","prev_kv":true}}}},{{"request_txn":{{}}}}]}}"#
            ),
        ),
        step(
            "/v3/kv/txn",
            format!(r#"{{"compare":[{{"target":"VALUE","value":"{c}"}}]}}"#),
        ),
        // Enum numbers etcd does not define reach the service (target 8 compares "equal",
        // sort order 7 sorts nothing), names it does not define are refused.
        step(
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{a}","target":8}}],"success":[{{"request_range":{{"key":"{k1}","range_end":"{zz}","sort_order":7,"sort_target":9}}}}]}}"#
            ),
        ),
        step(
            "/v3/kv/txn",
            format!(r#"{{"compare":[{{"key":"{a}","target":8,"result":"LESS"}}]}}"#),
        ),
        step(
            "/v3/kv/range",
            format!(r#"{{"key":"{a}","sort_order":"SIDEWAYS"}}"#),
        )
        .parser_error(),
        step("/v3/kv/compaction", r#"{"revision":"100"}"#),
        step("/v3/kv/compaction", r#"{"revision":3,"physical":true}"#),
        step("/v3/kv/range", format!(r#"{{"key":"{a}","revision":2}}"#)),
        // Leases, with etcd's legacy `/v3/kv/lease/...` aliases.
        step("/v3/lease/grant", r#"{"TTL":"60","ID":"5"}"#),
        step("/v3/lease/grant", r#"{"TTL":60,"ID":5}"#),
        step("/v3/lease/grant", r#"{"TTL":"9999999999999","ID":6}"#),
        step(
            "/v3/kv/put",
            format!(r#"{{"key":"{k3}","value":"{a}","lease":"5"}}"#),
        ),
        step(
            "/v3/kv/put",
            format!(r#"{{"key":"{k3}","value":"{a}","lease":"77"}}"#),
        ),
        step("/v3/lease/timetolive", r#"{"ID":"5","keys":true}"#).mask(&["TTL"]),
        step("/v3/kv/lease/timetolive", r#"{"ID":5}"#).mask(&["TTL"]),
        step("/v3/lease/timetolive", r#"{"ID":"77"}"#),
        step("/v3/lease/leases", "{}"),
        step("/v3/kv/lease/leases", ""),
        step("/v3/kv/lease/revoke", r#"{"ID":"5"}"#),
        step("/v3/lease/revoke", r#"{"ID":5}"#),
        step("/v3/kv/range", format!(r#"{{"key":"{k3}"}}"#)),
        // Maintenance and Cluster.
        step("/v3/maintenance/status", "{}")
            .mask(status_fields)
            .kvd_only(&["storageVersion", "dbSizeQuota"]),
        step("/v3/maintenance/hash", "{}").mask(&["hash"]),
        step(
            "/v3/maintenance/alarm",
            r#"{"action":"ACTIVATE","memberID":"0","alarm":"NOSPACE"}"#,
        )
        .kvd_only(&["header"]),
        step("/v3/maintenance/alarm", r#"{"action":"GET"}"#).kvd_only(&["header"]),
        step("/v3/kv/put", format!(r#"{{"key":"{k3}","value":"{a}"}}"#)),
        step(
            "/v3/maintenance/alarm",
            r#"{"action":2,"memberID":0,"alarm":1}"#,
        )
        .kvd_only(&["header"]),
        step("/v3/maintenance/alarm", "{}").kvd_only(&["header"]),
        step("/v3/maintenance/defragment", "{}").kvd_only(&["header"]),
        step("/v3/cluster/member/list", "{}").mask(&["ID", "peerURLs", "clientURLs", "name"]),
        // Auth with auth disabled.
        step("/v3/auth/authenticate", r#"{"name":"root","password":"x"}"#),
        step("/v3/kv/range", format!(r#"{{"key":"{a}"}}"#)),
    ]
}

/// Runs `steps` on `endpoint` and returns each answer, masked.
fn run_steps(endpoint: &str, steps: &[Step], kvd: bool) -> Vec<Answer> {
    steps
        .iter()
        .map(|s| {
            let mut answer = post(endpoint, s.path, &s.body);
            mask_keys(&mut answer.body, IDENTITY);
            mask_keys(&mut answer.body, s.mask);
            if kvd {
                drop_keys(&mut answer.body, s.kvd_only);
            }
            if s.parser_error {
                mask_keys(&mut answer.body, &["error", "message"]);
            }
            answer
        })
        .collect()
}

#[test]
fn unary_endpoints_answer_as_etcds_gateway() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let steps = unary_steps();
    let expected = run_steps(&etcd.endpoint, &steps, false);
    let got = run_steps(&kvd.endpoint, &steps, true);
    let mut differences = Vec::new();
    for ((s, want), have) in steps.iter().zip(&expected).zip(&got) {
        if want != have {
            differences.push(format!(
                "POST {} {}\n  etcd: {} {}\n  kvd:  {} {}",
                s.path, s.body, want.status, want.body, have.status, have.body
            ));
        }
    }
    eprintln!(
        "gateway differential: {} of {} steps equal",
        steps.len() - differences.len(),
        steps.len()
    );
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // The scenario saw what it is about: errors with etcd's codes and statuses.
    let statuses: Vec<u16> = expected.iter().map(|a| a.status).collect();
    for status in [200, 400, 404, 412, 429] {
        assert!(statuses.contains(&status), "no {status} in {statuses:?}");
    }
}

#[test]
fn requests_without_json_content_type_and_wrong_methods() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    for endpoint in [&etcd.endpoint, &kvd.endpoint] {
        let typed = request(
            endpoint,
            "POST",
            "/v3/kv/put",
            r#"{"key":"YQ==","value":"Yg=="}"#,
            "Content-Type: text/plain\r\n",
        );
        assert_eq!(typed.status, 200, "{endpoint}: {typed:?}");
        let get = request(endpoint, "GET", "/v3/kv/range", "", "");
        assert_eq!(get.status, 405, "{endpoint}: {get:?}");
        let unknown = post(endpoint, "/v3/kv/nothing", "{}");
        assert_eq!(unknown.status, 404, "{endpoint}: {unknown:?}");
    }
}

#[test]
fn kvd_answers_what_its_grpc_services_answer_where_etcd_differs() {
    let kvd = common::start_kvd(&[]);
    let ep = &kvd.endpoint;
    // Auth is served (disabled on a fresh server); the auth revision starts at 1.
    let status = post(ep, "/v3/auth/status", "{}");
    assert_eq!(status.status, 200);
    assert_eq!(status.body["authRevision"], json!("1"), "{status:?}");
    let users = post(ep, "/v3/auth/user/list", "{}");
    assert_eq!(users.status, 200, "{users:?}");
    assert_eq!(users.body.get("users"), None, "no users yet: {users:?}");
    // What needs a second member is refused; member id 0 is not this member's (CLUSTER-3,
    // MAINT-7), answered as a one-member etcd answers an unknown id.
    let not_found = "etcdserver: member not found";
    for (path, status, code, message) in [
        (
            "/v3/cluster/member/add",
            501,
            12,
            "kvd: member reconfiguration",
        ),
        ("/v3/cluster/member/remove", 404, 5, not_found),
        ("/v3/cluster/member/update", 404, 5, not_found),
        ("/v3/cluster/member/promote", 404, 5, not_found),
        (
            "/v3/maintenance/transfer-leadership",
            412,
            9,
            "etcdserver: bad leader transferee",
        ),
        ("/v3/maintenance/downgrade", 501, 12, "kvd: downgrade"),
        (
            "/v3beta/cluster/member/add",
            501,
            12,
            "kvd: member reconfiguration",
        ),
    ] {
        let answer = post(ep, path, "{}");
        assert_eq!(
            (answer.status, &answer.body["code"]),
            (status, &json!(code)),
            "{path}: {answer:?}"
        );
        assert!(
            answer.body["message"]
                .as_str()
                .unwrap()
                .starts_with(message),
            "{path}: {answer:?}"
        );
    }
    // HashKV has its own path here (etcd 3.5's); 3.4 has none.
    post(ep, "/v3/kv/put", r#"{"key":"YQ==","value":"Yg=="}"#);
    let hash_kv = post(ep, "/v3/maintenance/hashkv", "{}");
    assert_eq!(hash_kv.status, 200);
    assert_eq!(hash_kv.body["hash_revision"], json!("2"), "{hash_kv:?}");
    // Snapshot streams the database in `result` objects with base64 blobs.
    let snapshot = raw_post(ep, "/v3/maintenance/snapshot", "{}");
    let lines: Vec<Value> = snapshot
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 2, "{snapshot}");
    assert!(lines.iter().all(|l| l["result"]["blob"].is_string()));
    assert!(
        lines.last().unwrap()["result"]
            .get("remaining_bytes")
            .is_none()
    );
}

/// Sends a POST and returns the whole body as text (the body ends when the server closes).
fn raw_post(endpoint: &str, path: &str, body: &str) -> String {
    exchange(endpoint, "POST", path, body, "")
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// An open gateway stream: the request was sent whole; the answer is read as it comes.
struct OpenStream {
    stream: TcpStream,
    pending: String,
    head_done: bool,
}

impl OpenStream {
    fn open(endpoint: &str, path: &str, body: &str) -> OpenStream {
        let host = endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        OpenStream {
            stream,
            pending: String::new(),
            head_done: false,
        }
    }

    /// Reads answer lines until `enough` says so, the server closes, or [`STREAM_WAIT`]
    /// passes; returns the lines parsed as JSON.
    fn read_until(&mut self, enough: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + STREAM_WAIT;
        let mut lines = Vec::new();
        let mut buffer = [0u8; 4096];
        while Instant::now() < deadline && !enough(&lines) {
            match self.stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => self
                    .pending
                    .push_str(std::str::from_utf8(&buffer[..n]).unwrap()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("read: {e}"),
            }
            if !self.head_done
                && let Some((head, rest)) = self.pending.split_once("\r\n\r\n")
            {
                assert!(
                    head.starts_with("HTTP/1.") && head.contains(" 200 "),
                    "{head}"
                );
                self.pending = rest.to_owned();
                self.head_done = true;
            }
            if self.head_done {
                while let Some((line, rest)) = self.pending.split_once('\n') {
                    lines.push(serde_json::from_str(line).unwrap());
                    self.pending = rest.to_owned();
                }
            }
        }
        lines
    }
}

/// Masks the identity of stream answers.
fn masked(mut lines: Vec<Value>) -> Vec<Value> {
    lines.iter_mut().for_each(|l| mask_keys(l, IDENTITY));
    lines
}

/// Watches `w` from revision 1 on `endpoint`, writes three changes, and returns the created
/// answer and the events seen (one watch answer may carry several events). The watch's key
/// is sent as `watched`, base64 text the gateway reads as `w`.
fn watch_scenario(endpoint: &str, watched: &str) -> (Vec<Value>, Vec<Value>) {
    let w = b64("w");
    post(
        endpoint,
        "/v3/kv/put",
        &format!(r#"{{"key":"{w}","value":"MA=="}}"#),
    );
    let mut watch = OpenStream::open(
        endpoint,
        "/v3/watch",
        &format!(
            r#"{{"create_request":{{"key":"{watched}","start_revision":"1","prev_kv":true}}}}"#
        ),
    );
    let created = watch.read_until(|lines| !lines.is_empty());
    post(
        endpoint,
        "/v3/kv/put",
        &format!(r#"{{"key":"{w}","value":"MQ=="}}"#),
    );
    post(
        endpoint,
        "/v3/kv/put",
        &format!(r#"{{"key":"{w}","value":"Mg=="}}"#),
    );
    post(
        endpoint,
        "/v3/kv/deleterange",
        &format!(r#"{{"key":"{w}"}}"#),
    );
    let count = |lines: &[Value]| -> usize {
        lines
            .iter()
            .map(|l| l["result"]["events"].as_array().map_or(0, Vec::len))
            .sum()
    };
    let mut lines = created.clone();
    lines.extend(watch.read_until(|more| count(more) + count(&created) >= 4));
    let events = lines
        .iter()
        .flat_map(|l| {
            l["result"]["events"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let created = lines
        .into_iter()
        .filter(|l| l["result"]["created"] == json!(true))
        .collect();
    (masked(created), events)
}

#[test]
fn watch_streams_one_result_object_per_message() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let w = b64("w");
    let expected = watch_scenario(&etcd.endpoint, &w);
    assert_eq!(
        expected.0.len(),
        1,
        "etcd: one created answer: {expected:?}"
    );
    assert_eq!(
        expected.1.len(),
        4,
        "etcd: the put before and three changes"
    );
    assert_eq!(watch_scenario(&kvd.endpoint, &w), expected);
}

/// `text` as `base64` prints it, as a JSON string's content: lines of 76 characters, each
/// ending in a newline (the `\n` escape).
fn b64_wrapped(text: &str) -> String {
    let encoded = b64(text);
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(76)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    format!("{}\\n", lines.join("\\n"))
}

/// Base64 that Go's decoder (etcd's gateway) reads and a strict one refuses: line breaks
/// anywhere, non-zero bits after the data in the last symbol. kvd reads it as etcd does
/// (GW-B64-1) and still refuses what etcd refuses (but unpadded and URL-safe base64, see
/// `docs/operations.md`).
#[test]
fn base64_is_read_as_etcds_gateway_reads_it() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let long = "0123456789".repeat(10);
    let wrapped = b64_wrapped(&long);
    assert_eq!(wrapped.matches("\\n").count(), 2, "{wrapped}");
    let (a, b) = (b64("a"), b64("b"));
    let steps = vec![
        // `YR==` is "a", `bGt=` is "lk": the last symbol's extra bits are not zero.
        step(
            "/v3/kv/put",
            format!(r#"{{"key":"YR==","value":"{wrapped}"}}"#),
        ),
        step("/v3/kv/put", r#"{"key":"bG\r\ns=","value":"bGt=\n"}"#),
        step("/v3/kv/range", format!(r#"{{"key":"{a}"}}"#)),
        step("/v3/kv/range", r#"{"key":"YR=="}"#),
        step("/v3/kv/range", r#"{"key":"bGs=\n"}"#),
        step("/v3/kv/range", r#"{"key":"\nbGt\r\n=\r\n"}"#),
        step("/v3/kv/range", r#"{"key":"YQ=\n=","range_end":"bG\nt="}"#),
        step(
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"YR\n==","target":"VALUE","value":"{wrapped}"}}],"success":[{{"request_put":{{"key":"{b}","value":"YR=="}}}},{{"request_range":{{"key":"Yh=\r\n="}}}}]}}"#
            ),
        ),
        step("/v3/kv/deleterange", r#"{"key":"bGt=\r\n","prev_kv":true}"#),
        // What Go refuses too: other characters, text after the padding, a lone symbol.
        step("/v3/kv/range", r#"{"key":"Y!=="}"#).parser_error(),
        step("/v3/kv/range", r#"{"key":"Y Q=="}"#).parser_error(),
        step("/v3/kv/range", r#"{"key":"Y\tQ=="}"#).parser_error(),
        step("/v3/kv/range", r#"{"key":"YQ==YQ=="}"#).parser_error(),
        step("/v3/kv/put", r#"{"key":"YQ==","value":"Y\n"}"#).parser_error(),
        step("/v3/kv/range", format!(r#"{{"key":"{a}"}}"#)),
    ];
    let expected = run_steps(&etcd.endpoint, &steps, false);
    let got = run_steps(&kvd.endpoint, &steps, true);
    for ((s, want), have) in steps.iter().zip(&expected).zip(&got) {
        assert_eq!(have, want, "POST {} {}", s.path, s.body);
    }
    // The scenario saw what it is about: the long value read back whole, the refusals.
    assert_eq!(expected[2].body["kvs"][0]["value"], json!(b64(&long)));
    assert_eq!(expected[4].body["kvs"][0]["value"], json!(b64("lk")));
    let statuses: Vec<u16> = expected.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 400).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        10,
        "{statuses:?}"
    );
    // A watch created with such a key: it used to end the stream on kvd.
    let watched = watch_scenario(&etcd.endpoint, "dx\\r\\n==");
    assert_eq!(watched.1.len(), 4, "etcd: the put before and three changes");
    assert_eq!(watch_scenario(&kvd.endpoint, "dx\\r\\n=="), watched);
}

/// Runs keep-alives on `endpoint` for a lease granted first and one that does not exist;
/// the answer ends when the request body does.
fn keep_alive_scenario(endpoint: &str) -> Vec<Value> {
    post(endpoint, "/v3/lease/grant", r#"{"TTL":60,"ID":7}"#);
    let mut stream = OpenStream::open(
        endpoint,
        "/v3/lease/keepalive",
        r#"{"ID":7} {"ID":"7"}
{"ID":"8"}"#,
    );
    masked(stream.read_until(|lines| lines.len() >= 4))
}

#[test]
fn lease_keepalive_streams_one_result_object_per_request() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let expected = keep_alive_scenario(&etcd.endpoint);
    assert_eq!(expected.len(), 3, "{expected:?}");
    assert_eq!(expected[0]["result"]["TTL"], json!("60"));
    assert_eq!(keep_alive_scenario(&kvd.endpoint), expected);
}

#[test]
fn stream_errors_answer_as_etcds_gateway() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let mut answers = Vec::new();
    for endpoint in [&etcd.endpoint, &kvd.endpoint] {
        let mut bad = post(endpoint, "/v3/watch", "{bad");
        mask_keys(&mut bad.body, &["error", "message"]);
        let mut bad_keep_alive = post(endpoint, "/v3/lease/keepalive", "[1]");
        mask_keys(&mut bad_keep_alive.body, &["error", "message"]);
        let empty = raw_post(endpoint, "/v3/lease/keepalive", "");
        answers.push((bad, bad_keep_alive, empty));
    }
    assert_eq!(answers[0].0.status, 500, "{:?}", answers[0]);
    assert_eq!(answers[1], answers[0]);
}

/// Sends `method path` with extra `headers` and returns the status and the CORS headers of
/// the answer, names lowercased and sorted.
fn cors_headers(endpoint: &str, method: &str, path: &str, headers: &str) -> (u16, Vec<String>) {
    let body = if method == "POST" { "{}" } else { "" };
    let response = exchange(endpoint, method, path, body, headers);
    let head = response
        .split_once("\r\n\r\n")
        .map_or(&*response, |(h, _)| h);
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut cors: Vec<String> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .filter(|(k, _)| k.starts_with("access-control-"))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    cors.sort();
    (status, cors)
}

#[test]
fn cors_headers_follow_etcds_default() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let cases = [
        ("POST", "/v3/kv/range", ""),
        ("POST", "/v3/kv/range", "Origin: http://app.example\r\n"),
        ("GET", "/health", "Origin: http://app.example\r\n"),
        ("GET", "/version", ""),
        ("OPTIONS", "/v3/kv/put", "Origin: http://app.example\r\n"),
    ];
    let run = |endpoint: &str| -> Vec<(u16, Vec<String>)> {
        cases
            .iter()
            .map(|(method, path, headers)| cors_headers(endpoint, method, path, headers))
            .collect()
    };
    let expected = run(&etcd.endpoint);
    assert_eq!(
        expected[0].1,
        [
            "access-control-allow-headers: accept, content-type, authorization",
            "access-control-allow-methods: POST, GET, OPTIONS, PUT, DELETE",
            "access-control-allow-origin: *",
        ],
        "etcd's default --cors"
    );
    assert_eq!(run(&kvd.endpoint), expected);
}

#[test]
fn cors_with_a_list_allows_only_its_origins() {
    let kvd = common::start_kvd(&["--cors", "http://a.example,http://b.example"]);
    let ep = &kvd.endpoint;
    let (status, allowed) =
        cors_headers(ep, "POST", "/v3/kv/range", "Origin: http://b.example\r\n");
    assert_eq!(status, 400, "the empty key is still refused");
    assert!(
        allowed.contains(&"access-control-allow-origin: http://b.example".to_owned()),
        "{allowed:?}"
    );
    assert_eq!(allowed.len(), 3);
    let (_, other) = cors_headers(ep, "GET", "/health", "Origin: http://c.example\r\n");
    assert!(other.is_empty(), "{other:?}");
    let (status, preflight) =
        cors_headers(ep, "OPTIONS", "/v3/kv/put", "Origin: http://a.example\r\n");
    assert_eq!((status, preflight.len()), (200, 3));
}

#[test]
fn a_gateway_watch_whose_client_went_away_releases_its_watch() {
    let kvd = common::start_kvd(&[]);
    let mut watch = OpenStream::open(
        &kvd.endpoint,
        "/v3/watch",
        r#"{"create_request":{"key":"dw=="}}"#,
    );
    let created = watch.read_until(|lines| !lines.is_empty());
    assert_eq!(created[0]["result"]["created"], json!(true));
    assert_eq!(common::watchers(&kvd.endpoint), Some(1));
    drop(watch);
    let released = common::wait_until(STREAM_WAIT, || {
        common::watchers(&kvd.endpoint) == Some(0)
            && scrape_line(&kvd.endpoint, "kvd_grpc_streams_open{stream=\"watch\"}").as_deref()
                == Some("0")
    });
    assert!(released, "the watch or its stream outlived its client");
}

/// Returns the value of the `/metrics` line starting with `series` and a space.
fn scrape_line(endpoint: &str, series: &str) -> Option<String> {
    let (_, body) = common::http_get(endpoint, "/metrics").unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .map(str::to_owned)
}

#[test]
fn a_stream_error_is_a_last_error_line() {
    let mut kvd = common::start_kvd(&[]);
    let mut watch = OpenStream::open(
        &kvd.endpoint,
        "/v3/watch",
        r#"{"create_request":{"key":"dw=="}}"#,
    );
    assert_eq!(watch.read_until(|lines| !lines.is_empty()).len(), 1);
    // Shutdown ends the Watch stream with Unavailable (SRV-3), which the gateway sends as
    // grpc-gateway's stream error object.
    let exit = std::thread::spawn(move || kvd.signal_and_wait("-TERM"));
    let lines = watch.read_until(|lines| !lines.is_empty());
    assert_eq!(exit.join().unwrap(), Some(0));
    let error = &lines[0]["error"];
    assert_eq!(
        (
            &error["grpc_code"],
            &error["http_code"],
            &error["http_status"]
        ),
        (&json!(14), &json!(503), &json!("Service Unavailable")),
        "{lines:?}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("etcdserver: "),
        "{lines:?}"
    );
}

/// The auth story through the gateway on etcd 3.4.23 and kvd: the token from
/// `/v3/auth/authenticate` goes in the `Authorization` header; allowed and denied calls
/// answer alike (status and JSON body, the header masked).
#[test]
fn auth_through_the_gateway_matches_etcd() {
    let etcd = common::start_etcd();
    let kvd = common::start_kvd(&[]);
    let (dev, dev_end, other) = (b64("/dev/"), b64("/dev0"), b64("/other"));
    let story = |ep: &str| -> Vec<(u16, Value)> {
        let mut answers = Vec::new();
        let mut record = |answer: Answer| {
            let mut body = answer.body;
            mask_keys(&mut body, &["header"]);
            answers.push((answer.status, body));
        };
        for (path, body) in [
            (
                "/v3/auth/user/add",
                r#"{"name":"root","password":"rootpw"}"#.to_owned(),
            ),
            (
                "/v3/auth/user/grant",
                r#"{"user":"root","role":"root"}"#.to_owned(),
            ),
            ("/v3/auth/role/add", r#"{"name":"dev"}"#.to_owned()),
            (
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":"dev","perm":{{"permType":"READWRITE","key":"{dev}","range_end":"{dev_end}"}}}}"#
                ),
            ),
            (
                "/v3/auth/user/add",
                r#"{"name":"alice","password":"alicepw"}"#.to_owned(),
            ),
            (
                "/v3/auth/user/grant",
                r#"{"user":"alice","role":"dev"}"#.to_owned(),
            ),
            ("/v3/auth/role/get", r#"{"role":"dev"}"#.to_owned()),
            ("/v3/auth/enable", "{}".to_owned()),
            ("/v3/auth/user/list", "{}".to_owned()),
        ] {
            record(post(ep, path, &body));
        }
        let login = |name: &str, password: &str| {
            let body = format!(r#"{{"name":"{name}","password":"{password}"}}"#);
            post(ep, "/v3/auth/authenticate", &body)
        };
        let wrong = login("alice", "wrong");
        record(wrong);
        let alice = login("alice", "alicepw").body["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let root = login("root", "rootpw").body["token"]
            .as_str()
            .unwrap()
            .to_owned();
        let as_user = |token: &str, path: &str, body: &str| {
            request(
                ep,
                "POST",
                path,
                body,
                &format!("Authorization: {token}\r\n"),
            )
        };
        let put = format!(r#"{{"key":"{}","value":"{}"}}"#, b64("/dev/a"), b64("1"));
        record(as_user(&alice, "/v3/kv/put", &put));
        let range = format!(r#"{{"key":"{dev}","range_end":"{dev_end}"}}"#);
        let mut got = as_user(&alice, "/v3/kv/range", &range);
        mask_keys(&mut got.body, &["create_revision", "mod_revision"]);
        record(got);
        record(as_user(
            &alice,
            "/v3/kv/range",
            &format!(r#"{{"key":"{other}"}}"#),
        ));
        record(as_user("forged.1", "/v3/kv/range", &range));
        record(post(ep, "/v3/kv/range", &range));
        record(as_user(&alice, "/v3/auth/user/list", "{}"));
        record(as_user(&root, "/v3/auth/disable", "{}"));
        answers
    };
    let theirs = story(&etcd.endpoint);
    let ours = story(&kvd.endpoint);
    assert_eq!(ours.len(), theirs.len());
    for (i, (ours, theirs)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(ours, theirs, "step {i}");
    }
}

/// An answer of megabytes over HTTP/1 (the connection gathers large writes, GATHER-1..4 in
/// `write_gather.rs`) arrives whole and in order.
#[test]
fn a_large_range_answer_arrives_whole() {
    let kvd = common::start_kvd(&[]);
    let ep = &kvd.endpoint;
    let value = |i: usize| -> String {
        (0..100_000)
            .map(|j| char::from(b'a' + ((i * 7 + j) % 26) as u8))
            .collect()
    };
    for i in 0..16 {
        let put = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64(&format!("large/{i:02}")),
            b64(&value(i))
        );
        assert_eq!(post(ep, "/v3/kv/put", &put).status, 200);
    }
    let range = format!(
        r#"{{"key":"{}","range_end":"{}"}}"#,
        b64("large/"),
        b64("large0")
    );
    let answer = post(ep, "/v3/kv/range", &range);
    assert_eq!(answer.status, 200);
    let kvs = answer.body["kvs"].as_array().expect("kvs");
    assert_eq!(kvs.len(), 16);
    for (i, kv) in kvs.iter().enumerate() {
        assert_eq!(kv["key"], json!(b64(&format!("large/{i:02}"))));
        assert!(kv["value"] == json!(b64(&value(i))), "value {i} differs");
    }
}
