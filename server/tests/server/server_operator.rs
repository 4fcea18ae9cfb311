//! The quota operator API of a running kvd over HTTP (`POST /api/v1`, `GET /roles`,
//! `/metrics`), and its enforcement on the etcd API: UPDATE_QUOTA and GET_QUOTA in Mesos's
//! shapes with Mesos's messages, all-or-nothing batches, `force`, default quota as deletion,
//! agents, reservations and allocations with the `/roles` figures, a gRPC write over a
//! `kv_keys` limit, the per-role gauges appearing and disappearing, consumption
//! reconciliation, and malformed requests. No timing assertions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::request_op::Request;
use kvd_server::pb::etcdserverpb::{DeleteRangeRequest, PutRequest, RequestOp, TxnRequest};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    code: u16,
    content_type: String,
    body: String,
}

/// Sends one HTTP/1.1 request with `headers` and `body` and reads the whole answer.
fn http(endpoint: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    let header = |name: &str| {
        head.lines()
            .find_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    assert!(
        !header("transfer-encoding").contains("chunked"),
        "answers have a known length"
    );
    Answer {
        code,
        content_type: header("content-type"),
        body: body.to_owned(),
    }
}

/// Posts a JSON call to `/api/v1`.
fn call(endpoint: &str, body: &Value) -> Answer {
    http(
        endpoint,
        "POST",
        "/api/v1",
        &[("Content-Type", "application/json")],
        &body.to_string(),
    )
}

/// Posts a call that must succeed with an empty body.
fn accepted(endpoint: &str, body: &Value) {
    let answer = call(endpoint, body);
    assert_eq!((answer.code, answer.body.as_str()), (200, ""), "{body}");
}

/// Posts a call that must be refused with 400; returns the plain-text message.
fn refused(endpoint: &str, body: &Value) -> String {
    let answer = call(endpoint, body);
    assert_eq!(answer.code, 400, "{body}: {answer:?}");
    assert!(answer.content_type.starts_with("text/plain"), "{answer:?}");
    answer.body
}

fn update_quota(force: bool, configs: Value) -> Value {
    json!({"type": "UPDATE_QUOTA", "update_quota": {"force": force, "quota_configs": configs}})
}

/// Returns the GET_QUOTA answer's body text.
fn get_quota(endpoint: &str) -> String {
    let answer = call(endpoint, &json!({"type": "GET_QUOTA"}));
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.content_type, "application/json");
    answer.body
}

const NO_QUOTA: &str = r#"{"type":"GET_QUOTA","get_quota":{"status":{}}}"#;

fn register_agent(endpoint: &str, id: &str, state: &str, resources: Value) {
    accepted(
        endpoint,
        &json!({"type": "REGISTER_AGENT",
                "register_agent": {"agent_id": id, "state": state, "resources": resources}}),
    );
}

/// Returns a call of type `kind` whose arguments object (named after the type) is `arguments`.
fn call_of(kind: &str, arguments: Value) -> Value {
    let mut call = serde_json::Map::new();
    call.insert("type".to_owned(), json!(kind));
    call.insert(kind.to_ascii_lowercase(), arguments);
    Value::Object(call)
}

fn record(kind: &str, id: &str, role: &str, agent: &str, resources: Value) -> Value {
    call_of(
        kind,
        json!({"id": id, "role": role, "agent_id": agent, "resources": resources}),
    )
}

fn by_id(kind: &str, id: &str) -> Value {
    call_of(kind, json!({"id": id}))
}

/// Returns the `/roles` answer, parsed.
fn roles(endpoint: &str) -> Value {
    let answer = http(endpoint, "GET", "/roles", &[], "");
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.content_type, "application/json");
    serde_json::from_str(&answer.body).unwrap()
}

/// Returns the `/roles` entry of `name`, or `Null`.
fn role(endpoint: &str, name: &str) -> Value {
    roles(endpoint)["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Returns the names `/roles` lists.
fn role_names(endpoint: &str) -> Vec<String> {
    roles(endpoint)["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Returns the `kvd_quota_*` series of `/metrics`.
fn quota_series(endpoint: &str) -> Vec<String> {
    let (code, body) = common::http_get(endpoint, "/metrics").unwrap();
    assert_eq!(code, 200);
    body.lines()
        .filter(|l| l.starts_with("kvd_quota_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn update_and_get_quota_round_trip_in_mesos_shapes() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    assert_eq!(get_quota(ep), NO_QUOTA);
    register_agent(ep, "a1", "REGISTERED", json!({"cpus": {"value": 16}}));
    accepted(
        ep,
        &update_quota(
            false,
            json!([
                {"role": "ops", "limits": {"mem": {"value": 0}, "cpus": {"value": 1.2345}}},
                {"role": "dev", "guarantees": {"cpus": {"value": 1}},
                 "limits": {"kv_bytes": {"value": 1048576}, "cpus": {"value": 10}}},
            ]),
        ),
    );
    // Sorted by role and by name; 1.2345 is kept as Mesos keeps it, in milli-units; the zero
    // limit stays; empty maps are left out; `infos` carries the guarantees (legacy).
    assert_eq!(
        get_quota(ep),
        concat!(
            r#"{"type":"GET_QUOTA","get_quota":{"status":{"#,
            r#""infos":[{"role":"dev","guarantee":[{"name":"cpus","type":"SCALAR","scalar":{"value":1}}]},{"role":"ops"}],"#,
            r#""configs":[{"role":"dev","guarantees":{"cpus":{"value":1}},"limits":{"cpus":{"value":10},"kv_bytes":{"value":1048576}}},"#,
            r#"{"role":"ops","limits":{"cpus":{"value":1.235},"mem":{"value":0}}}]}}}"#
        )
    );
    // Replacing one role leaves the other alone.
    accepted(
        ep,
        &update_quota(
            false,
            json!([{"role": "dev", "limits": {"cpus": {"value": 2}}}]),
        ),
    );
    let body: Value = serde_json::from_str(&get_quota(ep)).unwrap();
    assert_eq!(
        body["get_quota"]["status"]["configs"],
        json!([
            {"role": "dev", "limits": {"cpus": {"value": 2}}},
            {"role": "ops", "limits": {"cpus": {"value": 1.235}, "mem": {"value": 0}}},
        ])
    );
}

#[test]
fn update_quota_refusals_carry_mesos_messages_and_change_nothing() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    register_agent(ep, "a1", "REGISTERED", json!({"cpus": {"value": 16}}));
    let role = |name: &str| json!([{"role": name, "limits": {"cpus": {"value": 1}}}]);
    let guarantee =
        |value: Value| json!([{"role": "dev", "guarantees": {"cpus": {"value": value}}}]);
    let limit =
        |name: &str, value: Value| json!([{"role": "dev", "limits": {name: {"value": value}}}]);
    let cases: Vec<(Value, &str)> = vec![
        (
            role(""),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role names cannot be the empty string",
        ),
        (
            role("/dev"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role '/dev' cannot start with a slash",
        ),
        (
            role("dev/"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role 'dev/' cannot end with a slash",
        ),
        (
            role("a//b"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role 'a//b' cannot contain two adjacent slashes",
        ),
        (
            role("a/../b"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role 'a/../b' cannot include '..' as a component",
        ),
        (
            role("a/*"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role 'a/*' cannot include '*' as a component",
        ),
        (
            role("a/-b"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role component '-b' is invalid because it starts with a dash",
        ),
        (
            role("dev team"),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role component 'dev team' is invalid because it contains backspace or whitespace",
        ),
        (
            guarantee(json!(1000000000001u64)),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.guarantees': {'cpus': 1000000000001} is invalid: values greater than 1 trillion (1000000000000) are not supported",
        ),
        (
            limit("mem", json!(1099511627777u64)),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.limits': {'mem': 1099511627777} is invalid: values greater than 1 exabyte (1099511627776) are not supported",
        ),
        (
            // +inf fails the cap, not the scalar check (spec §10 Q11).
            limit("cpus", json!("inf")),
            "Invalid QuotaConfig: Invalid 'QuotaConfig.limits': {'cpus': inf} is invalid: values greater than 1 trillion (1000000000000) are not supported",
        ),
        (
            guarantee(json!(-1)),
            "Invalid QuotaConfig: Invalid guarantee configuration {'cpus': -1}: Negative values not supported",
        ),
        (
            guarantee(json!("1e-310")),
            "Invalid QuotaConfig: Invalid guarantee configuration {'cpus': 0}: Subnormal values not supported",
        ),
        (
            limit("cpus", json!("nan")),
            "Invalid QuotaConfig: Invalid limit configuration {'cpus': nan}: NaN not supported",
        ),
        (
            limit("cpus", json!("-inf")),
            "Invalid QuotaConfig: Invalid limit configuration {'cpus': -inf}: Infinite values not supported",
        ),
        (
            json!([{"role": "dev", "guarantees": {"cpus": {"value": 2}}, "limits": {"cpus": {"value": 1}}}]),
            "Invalid QuotaConfig: 'QuotaConfig.guarantees' { cpus: 2 } is not contained within the 'QuotaConfig.limits' { cpus: 1 }",
        ),
        (
            json!([{"role": "dev", "guarantees": {"cpus": {"value": 0.5}}, "limits": {"cpus": {"value": 0}, "mem": {"value": 9}}}]),
            "Invalid QuotaConfig: 'QuotaConfig.guarantees' { cpus: 0.5 } is not contained within the 'QuotaConfig.limits' { cpus: 0, mem: 9 }",
        ),
        (
            // Nested quota (kvd enables it): a parent's guarantees cover its children's.
            json!([
                {"role": "a", "guarantees": {"cpus": {"value": 1}}},
                {"role": "a/b", "guarantees": {"cpus": {"value": 2}}},
            ]),
            "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees (cpus:1) does not contain the sum of its children's guarantees (cpus:2)",
        ),
        (
            json!([{"role": "a/b", "guarantees": {"cpus": {"value": 2}}}]),
            "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with guarantees ({}) does not contain the sum of its children's guarantees (cpus:2)",
        ),
        (
            guarantee(json!(17)),
            "Invalid QuotaConfig: total quota guarantees 'cpus:17' exceed cluster capacity 'cpus:16; kv_bytes:2147483648' (use 'force' flag to bypass this check)",
        ),
    ];
    for (configs, message) in &cases {
        assert_eq!(
            refused(ep, &update_quota(false, configs.clone())),
            *message,
            "{configs}"
        );
    }
    assert_eq!(get_quota(ep), NO_QUOTA, "refusals change nothing");

    // `force` skips only the consumption and capacity checks.
    let hierarchy = json!([{"role": "a/b", "guarantees": {"cpus": {"value": 2}}}]);
    assert!(refused(ep, &update_quota(true, hierarchy)).contains("Parent role 'a'"));
    assert!(refused(ep, &update_quota(true, role("/dev"))).contains("cannot start with a slash"));
    accepted(ep, &update_quota(true, guarantee(json!(17))));

    // Phase B: a limit below what the role already consumes (a reservation here).
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r1",
            "ml",
            "a1",
            json!({"cpus": {"value": 4}}),
        ),
    );
    assert_eq!(
        refused(
            ep,
            &update_quota(
                false,
                json!([{"role": "ml", "limits": {"cpus": {"value": 3}}}])
            )
        ),
        "Invalid QuotaConfig: Role 'ml' is already consuming 'cpus:4'; this is more than the requested limits 'cpus:3' (use 'force' flag to bypass this check)"
    );
    // The capacity check sees the existing, forced overcommit even when the batch adds none.
    assert!(
        refused(ep, &update_quota(false, json!([]))).contains("total quota guarantees 'cpus:17'")
    );
    accepted(
        ep,
        &update_quota(
            true,
            json!([{"role": "ml", "limits": {"cpus": {"value": 3}}}]),
        ),
    );
    let body: Value = serde_json::from_str(&get_quota(ep)).unwrap();
    assert_eq!(
        body["get_quota"]["status"]["configs"],
        json!([
            {"role": "dev", "guarantees": {"cpus": {"value": 17}}},
            {"role": "ml", "limits": {"cpus": {"value": 3}}},
        ])
    );
}

#[test]
fn batches_are_all_or_nothing_and_default_quota_deletes() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    register_agent(ep, "a1", "REGISTERED", json!({"cpus": {"value": 16}}));
    let dev = json!({"role": "dev", "limits": {"cpus": {"value": 4}}});
    // One invalid configuration refuses the whole batch, wherever it is.
    let bad_role = json!({"role": "-x", "limits": {"cpus": {"value": 1}}});
    let too_big = json!({"role": "big", "guarantees": {"cpus": {"value": 100}}});
    for batch in [
        json!([dev, bad_role]),
        json!([bad_role, dev]),
        json!([dev, too_big]),
    ] {
        refused(ep, &update_quota(false, batch));
        assert_eq!(get_quota(ep), NO_QUOTA);
    }
    accepted(ep, &update_quota(true, json!([dev, too_big])));
    let listed = |ep: &str| -> Vec<Value> {
        let body: Value = serde_json::from_str(&get_quota(ep)).unwrap();
        body["get_quota"]["status"]["configs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(listed(ep).len(), 2);

    // The same role twice: the last one wins (spec §10 Q10).
    accepted(
        ep,
        &update_quota(
            true,
            json!([
                {"role": "dev", "limits": {"cpus": {"value": 1}}},
                {"role": "dev", "limits": {"cpus": {"value": 2}}},
            ]),
        ),
    );
    assert_eq!(
        listed(ep)[1],
        json!({"role": "dev", "limits": {"cpus": {"value": 2}}})
    );

    // The default quota (no limits, no guarantee above zero) deletes the entry.
    accepted(
        ep,
        &update_quota(
            false,
            json!([
                {"role": "dev"},
                {"role": "big", "guarantees": {"cpus": {"value": 0}}},
            ]),
        ),
    );
    assert_eq!(get_quota(ep), NO_QUOTA);
    assert_eq!(roles(ep)["roles"], json!([]), "no role left to show");
    // Deleting what does not exist is fine, as is an empty batch.
    accepted(ep, &update_quota(false, json!([{"role": "nobody"}])));
    accepted(ep, &update_quota(false, json!([])));
    assert_eq!(get_quota(ep), NO_QUOTA);
}

#[test]
fn agents_reservations_and_allocations_show_in_roles() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    assert_eq!(roles(ep)["roles"], json!([]));
    register_agent(
        ep,
        "a1",
        "REGISTERED",
        json!({"cpus": {"value": 16}, "mem": {"value": 4096}}),
    );
    register_agent(ep, "a2", "UNREACHABLE", json!({"cpus": {"value": 8}}));
    register_agent(ep, "a3", "GONE", json!({}));
    accepted(
        ep,
        &update_quota(
            false,
            json!([{"role": "ml", "guarantees": {"cpus": {"value": 2}}, "limits": {"cpus": {"value": 8}}}]),
        ),
    );
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r1",
            "ml",
            "a1",
            json!({"cpus": {"value": 4}}),
        ),
    );
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r2",
            "ml/team",
            "a1",
            json!({"cpus": {"value": 1}, "mem": {"value": 512}}),
        ),
    );
    // A child's reservation counts in its ancestors too.
    assert_eq!(role_names(ep), ["ml", "ml/team"]);
    assert_eq!(
        role(ep, "ml/team"),
        json!({"name": "ml/team", "weight": 1.0,
               "quota": {"role": "ml/team", "guarantee": {}, "limit": {},
                         "consumed": {"cpus": 1, "mem": 512}},
               "allocated": {}, "offered": {}, "reserved": {"cpus": 1, "mem": 512},
               "resources": {}, "frameworks": [],
               "prepare_queue": {"queued": 0, "refused": 0}})
    );
    // The allocation draws 4 cpus from r1 (same role and agent), so consumption grows by 2:
    // consumed = allocated + unallocated reservations.
    accepted(
        ep,
        &record("ALLOCATE", "x1", "ml", "a1", json!({"cpus": {"value": 6}})),
    );
    assert_eq!(
        role(ep, "ml"),
        json!({"name": "ml", "weight": 1.0,
               "quota": {"role": "ml", "guarantee": {"cpus": 2}, "limit": {"cpus": 8},
                         "consumed": {"cpus": 7, "mem": 512}},
               "allocated": {"cpus": 6}, "offered": {}, "reserved": {"cpus": 5, "mem": 512},
               "resources": {"cpus": 6}, "frameworks": [],
               "prepare_queue": {"queued": 0, "refused": 0}})
    );
    assert_eq!(
        refused(
            ep,
            &record("ALLOCATE", "x2", "ml", "a1", json!({"cpus": {"value": 2}}))
        ),
        "kvd: quota exceeded for role 'ml': cpus consumption 7 + request 2 > limit 8"
    );
    // The child's allocation draws on the child's reservation first; the rest counts
    // against the parent's limit.
    assert_eq!(
        refused(
            ep,
            &record(
                "ALLOCATE",
                "x2",
                "ml/team",
                "a1",
                json!({"cpus": {"value": 2.5}})
            )
        ),
        "kvd: quota exceeded for role 'ml': cpus consumption 7 + request 1.5 > limit 8"
    );
    accepted(
        ep,
        &record("ALLOCATE", "x2", "ml", "a1", json!({"cpus": {"value": 1}})),
    );
    assert_eq!(
        role(ep, "ml")["quota"]["consumed"],
        json!({"cpus": 8, "mem": 512})
    );
    accepted(ep, &by_id("RELEASE", "x2"));

    let refusals: Vec<(Value, &str)> = vec![
        (
            by_id("UNRESERVE_RESOURCES", "r1"),
            "Reservation 'r1' is in use by allocations",
        ),
        (
            by_id("UNRESERVE_RESOURCES", "zz"),
            "Unknown reservation 'zz'",
        ),
        (by_id("RELEASE", "zz"), "Unknown allocation 'zz'"),
        (
            record("ALLOCATE", "x9", "ml", "a2", json!({"cpus": {"value": 1}})),
            "Agent 'a2' is not registered",
        ),
        (
            record(
                "RESERVE_RESOURCES",
                "r9",
                "ml",
                "a3",
                json!({"cpus": {"value": 1}}),
            ),
            "Agent 'a3' is not registered",
        ),
        (
            record(
                "ALLOCATE",
                "x9",
                "ml",
                "nowhere",
                json!({"cpus": {"value": 1}}),
            ),
            "Unknown agent 'nowhere'",
        ),
        (
            record(
                "RESERVE_RESOURCES",
                "r9",
                "*",
                "a1",
                json!({"cpus": {"value": 1}}),
            ),
            "Resources cannot be reserved or allocated to role '*'",
        ),
        (
            record(
                "RESERVE_RESOURCES",
                "r1",
                "ml",
                "a1",
                json!({"cpus": {"value": 1}}),
            ),
            "Record 'r1' already exists",
        ),
        (
            record(
                "RESERVE_RESOURCES",
                "",
                "ml",
                "a1",
                json!({"cpus": {"value": 1}}),
            ),
            "Record id must be set",
        ),
        (
            record(
                "ALLOCATE",
                "x9",
                "ml/-x",
                "a1",
                json!({"cpus": {"value": 1}}),
            ),
            "Role component '-x' is invalid because it starts with a dash",
        ),
        (
            record("ALLOCATE", "x9", "ml", "a1", json!({"cpus": {"value": -2}})),
            "Invalid value for resource 'cpus': Negative values not supported",
        ),
        (
            json!({"type": "REGISTER_AGENT", "register_agent": {"agent_id": ""}}),
            "Agent id must be set",
        ),
    ];
    let before = roles(ep);
    for (request, message) in &refusals {
        assert_eq!(refused(ep, request), *message, "{request}");
    }
    assert_eq!(roles(ep), before, "refusals change nothing");

    accepted(ep, &by_id("RELEASE", "x1"));
    assert_eq!(role(ep, "ml")["allocated"], json!({}));
    assert_eq!(
        role(ep, "ml")["quota"]["consumed"],
        json!({"cpus": 5, "mem": 512})
    );
    accepted(ep, &by_id("UNRESERVE_RESOURCES", "r1"));
    accepted(ep, &by_id("UNRESERVE_RESOURCES", "r2"));
    assert_eq!(role_names(ep), ["ml"], "only the quota is left");
    assert_eq!(role(ep, "ml")["quota"]["consumed"], json!({}));
    accepted(ep, &update_quota(false, json!([{"role": "ml"}])));
    assert_eq!(roles(ep)["roles"], json!([]));
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: Bytes::from(key.to_owned()),
        value: Bytes::from(value.to_owned()),
        ..PutRequest::default()
    }
}

#[tokio::test]
async fn grpc_writes_over_a_kv_keys_limit_are_refused_with_resource_exhausted() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.clone();
    let channel = Channel::from_shared(ep.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel);
    kv.put(put("/team/a", "1")).await.unwrap();
    kv.put(put("/team/b", "1")).await.unwrap();
    // Before the role has an entry its keys are charged to `*`.
    let put_cost = 256 + "/team/a".len() + 1;
    assert_eq!(
        role(&ep, "*")["quota"]["consumed"],
        json!({"kv_bytes": 2 * put_cost, "kv_keys": 2})
    );
    // The first entry takes the keys of the namespace with it, and the limit sees them.
    assert_eq!(
        refused(
            &ep,
            &update_quota(
                false,
                json!([{"role": "team", "limits": {"kv_keys": {"value": 1}}}])
            )
        ),
        format!(
            "Invalid QuotaConfig: Role 'team' is already consuming 'kv_bytes:{}; kv_keys:2'; this is more than the requested limits 'kv_keys:1' (use 'force' flag to bypass this check)",
            2 * put_cost
        )
    );
    accepted(
        &ep,
        &update_quota(
            false,
            json!([{"role": "team", "limits": {"kv_keys": {"value": 3}}}]),
        ),
    );
    assert_eq!(role_names(&ep), ["team"], "nothing is left on `*`");
    assert_eq!(
        role(&ep, "team")["quota"]["consumed"],
        json!({"kv_bytes": 2 * put_cost, "kv_keys": 2})
    );

    kv.put(put("/team/c", "1")).await.unwrap();
    let status = kv.put(put("/team/d", "1")).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::ResourceExhausted,
            "kvd: quota exceeded for role 'team': kv_keys consumption 3 + request 1 > limit 3"
        )
    );
    // A Txn that would add a key is refused the same way, and changes nothing.
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(Request::RequestPut(put("/team/e", "1"))),
        }],
        ..TxnRequest::default()
    };
    let status = kv.txn(txn.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status
            .message()
            .starts_with("kvd: quota exceeded for role 'team': kv_keys"),
        "{status:?}"
    );
    // Overwrites add no key; other namespaces are not affected.
    kv.put(put("/team/a", "2")).await.unwrap();
    kv.put(put("/elsewhere", "1")).await.unwrap();
    assert_eq!(role(&ep, "team")["quota"]["consumed"]["kv_keys"], json!(3));
    // Deletes are never refused, and free a key.
    kv.delete_range(DeleteRangeRequest {
        key: Bytes::from_static(b"/team/a"),
        ..DeleteRangeRequest::default()
    })
    .await
    .unwrap();
    assert!(kv.txn(txn).await.unwrap().into_inner().succeeded);
    assert_eq!(role(&ep, "team")["quota"]["consumed"]["kv_keys"], json!(3));
    // The refusals did not raise the NOSPACE alarm.
    let (code, _) = common::http_get(&ep, "/health").unwrap();
    assert_eq!(code, 200);
}

#[test]
fn quota_gauges_exist_only_while_a_role_has_a_quota() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    assert!(quota_series(ep).is_empty());
    register_agent(ep, "a1", "REGISTERED", json!({"cpus": {"value": 16}}));
    // A role with a reservation but no quota has no gauges.
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r0",
            "ops",
            "a1",
            json!({"cpus": {"value": 1}}),
        ),
    );
    assert!(quota_series(ep).is_empty());
    accepted(
        ep,
        &update_quota(
            false,
            json!([{"role": "dev", "guarantees": {"cpus": {"value": 1}},
                    "limits": {"cpus": {"value": 10}, "kv_keys": {"value": 5}, "mem": {"value": 0}}}]),
        ),
    );
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r1",
            "dev",
            "a1",
            json!({"cpus": {"value": 2}}),
        ),
    );
    assert_eq!(
        quota_series(ep),
        [
            r#"kvd_quota_guarantee{role="dev",resource="cpus"} 1"#,
            r#"kvd_quota_limit{role="dev",resource="cpus"} 10"#,
            r#"kvd_quota_limit{role="dev",resource="kv_keys"} 5"#,
            r#"kvd_quota_limit{role="dev",resource="mem"} 0"#,
            r#"kvd_quota_consumed{role="dev",resource="cpus"} 2"#,
            r#"kvd_quota_offered_or_allocated{role="dev",resource="cpus"} 0"#,
            r#"kvd_quota_offered_or_allocated{role="dev",resource="kv_keys"} 0"#,
            r#"kvd_quota_offered_or_allocated{role="dev",resource="mem"} 0"#,
        ]
    );
    accepted(
        ep,
        &record(
            "ALLOCATE",
            "x1",
            "dev",
            "a1",
            json!({"cpus": {"value": 2.5}}),
        ),
    );
    let series = quota_series(ep);
    assert!(
        series.contains(&r#"kvd_quota_consumed{role="dev",resource="cpus"} 2.5"#.to_owned()),
        "{series:?}"
    );
    assert!(
        series.contains(
            &r#"kvd_quota_offered_or_allocated{role="dev",resource="cpus"} 2.5"#.to_owned()
        ),
        "{series:?}"
    );
    // Reset to the default quota: every gauge of the role is gone, though it still consumes.
    accepted(ep, &update_quota(false, json!([{"role": "dev"}])));
    assert!(quota_series(ep).is_empty());
    assert_eq!(role(ep, "dev")["quota"]["consumed"], json!({"cpus": 2.5}));
    let (_, metrics) = common::http_get(ep, "/metrics").unwrap();
    assert!(metrics.contains("# TYPE kvd_quota_limit gauge"));
}

#[test]
fn consumption_reconciliation_reports_drift_and_repairs_idempotently() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    register_agent(ep, "a1", "REGISTERED", json!({"cpus": {"value": 4}}));
    accepted(
        ep,
        &record(
            "RESERVE_RESOURCES",
            "r1",
            "dev",
            "a1",
            json!({"cpus": {"value": 1}}),
        ),
    );
    let report = call(ep, &json!({"type": "RECONCILE_CONSUMPTION"}));
    assert_eq!(
        (report.code, report.body.as_str()),
        (
            200,
            r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"drift":[]}}"#
        )
    );
    for _ in 0..2 {
        let repaired = call(
            ep,
            &json!({"type": "RECONCILE_CONSUMPTION", "reconcile_consumption": {"repair": true}}),
        );
        assert_eq!(
            repaired.body,
            r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"drift":[],"repaired":0}}"#
        );
    }
    assert_eq!(role(ep, "dev")["reserved"], json!({"cpus": 1}));
}

#[test]
fn malformed_requests_get_400_with_a_message() {
    let server = common::start_kvd(&[]);
    let ep = &server.endpoint;
    let convert = "Failed to convert JSON into Call protobuf: ";
    let cases: Vec<(&str, String)> = vec![
        (
            "{",
            "Failed to parse body into JSON: EOF while parsing an object at line 1 column 1".into(),
        ),
        (
            "",
            "Failed to parse body into JSON: EOF while parsing a value at line 1 column 0".into(),
        ),
        (
            "[1]",
            format!("{convert}Expecting a JSON object for field 'Call', found a JSON array"),
        ),
        (
            "{}",
            "Failed to validate master::Call: Expecting 'type' to be present".into(),
        ),
        (
            r#"{"type":"FOO"}"#,
            format!(
                "{convert}Unknown call type 'FOO'; kvd serves GET_QUOTA, UPDATE_QUOTA, \
                 REGISTER_AGENT, MARK_AGENT_UNREACHABLE, MARK_AGENT_GONE, GET_AGENTS, \
                 RESERVE_RESOURCES, UNRESERVE_RESOURCES, ALLOCATE, START, RELEASE, \
                 UPDATE_PREPARE_QUEUE, RECONCILE_OPERATIONS, RECONCILE, RECONCILE_CONSUMPTION"
            ),
        ),
        (
            r#"{"type":["GET_QUOTA"]}"#,
            format!("{convert}Expecting a JSON string for field 'type', found a JSON array"),
        ),
        (
            r#"{"type":"UPDATE_QUOTA"}"#,
            "Failed to validate master::Call: Expecting 'update_quota' to be present".into(),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":[]}"#,
            format!(
                "{convert}Expecting a JSON object for field 'update_quota', found a JSON array"
            ),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"force":"yes"}}"#,
            format!(
                "{convert}Expecting a JSON boolean for field 'update_quota.force', found a JSON string"
            ),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":{}}}"#,
            format!(
                "{convert}Expecting a JSON array for field 'update_quota.quota_configs', found a JSON object"
            ),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"limits":{}}]}}"#,
            format!("{convert}Missing required fields: update_quota.quota_configs[0].role"),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":5}]}}"#,
            format!(
                "{convert}Expecting a JSON string for field 'update_quota.quota_configs[0].role', found a JSON number"
            ),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":"r","limits":{"cpus":1}}]}}"#,
            format!(
                "{convert}Expecting a JSON object for field 'update_quota.quota_configs[0].limits[cpus]', found a JSON number"
            ),
        ),
        (
            r#"{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[{"role":"r","guarantees":{"cpus":{"value":true}}}]}}"#,
            format!(
                "{convert}Expecting a JSON number for field 'update_quota.quota_configs[0].guarantees[cpus].value', found a JSON boolean"
            ),
        ),
        (
            r#"{"type":"REGISTER_AGENT","register_agent":{"agent_id":"a","state":"LOST"}}"#,
            format!(
                "{convert}Unknown agent state 'LOST' for field 'register_agent.state'; expected REGISTERED, UNREACHABLE or GONE"
            ),
        ),
        (
            r#"{"type":"RESERVE_RESOURCES","reserve_resources":{"id":"r","role":"dev"}}"#,
            format!("{convert}Missing required fields: reserve_resources.agent_id"),
        ),
        (
            r#"{"type":"RELEASE","release":{}}"#,
            format!("{convert}Missing required fields: release.id"),
        ),
        (
            r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"repair":1}}"#,
            format!(
                "{convert}Expecting a JSON boolean for field 'reconcile_consumption.repair', found a JSON number"
            ),
        ),
    ];
    for (body, message) in &cases {
        let answer = http(
            ep,
            "POST",
            "/api/v1",
            &[("Content-Type", "application/json")],
            body,
        );
        assert_eq!((answer.code, &answer.body), (400, message), "{body}");
    }
    let get_quota_body = r#"{"type":"GET_QUOTA"}"#;
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let headers: [(Headers, u16, &str); 3] = [
        (&[], 400, "Expecting 'Content-Type' to be present"),
        (
            &[("Content-Type", "text/plain")],
            415,
            "Expecting 'Content-Type' of application/json",
        ),
        (
            &[
                ("Content-Type", "application/json"),
                ("Accept", "text/html"),
            ],
            406,
            "Expecting 'Accept' to allow application/json",
        ),
    ];
    for (headers, code, message) in headers {
        let answer = http(ep, "POST", "/api/v1", headers, get_quota_body);
        assert_eq!(
            (answer.code, answer.body.as_str()),
            (code, message),
            "{headers:?}"
        );
    }
    let charset = http(
        ep,
        "POST",
        "/api/v1",
        &[
            ("Content-Type", "application/json; charset=utf-8"),
            ("Accept", "application/json"),
        ],
        get_quota_body,
    );
    assert_eq!(charset.body, NO_QUOTA);
    for method in ["GET", "PUT", "DELETE"] {
        let answer = http(
            ep,
            method,
            "/api/v1",
            &[("Content-Type", "application/json")],
            "",
        );
        assert_eq!(answer.code, 405, "{method}");
    }
    assert_eq!(http(ep, "POST", "/roles", &[], "").code, 405);
    // The server kept serving, and nothing changed.
    assert_eq!(get_quota(ep), NO_QUOTA);
}
