//! Operation ids and reconciliation through a running kvd: a write whose response the
//! server drops after commit (the `KVD_TEST_DROP_RESPONSE_AFTER_COMMIT` failpoint) is
//! retried with the same `kvd-operation-id` and gets the dropped response, applied once
//! (one revision, version 1, one charge), also across a restart between the attempts, for
//! Put, Txn, LeaseGrant and the operator API's ALLOCATE; the same id with another request
//! is refused and changes nothing; a refused write records nothing; bad ids; the agent
//! calls (MARK_AGENT_UNREACHABLE, MARK_AGENT_GONE, GET_AGENTS, RECOVERED after a restart,
//! the re-registration timeout), RECONCILE_OPERATIONS and RECONCILE over HTTP for a few
//! branches (the engine's tests cover them all); the flags, the periodic consumption check
//! and `kvd reconcile`. No timing assertions: waits are bounded and only wait for a state.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::etcdserverpb as pb;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
use kvd_server::pb::etcdserverpb::request_op::Request as Op;
use kvd_server::{DROP_RESPONSE_AFTER_COMMIT_ENV, DROPPED_MESSAGE, OPERATION_ID_METADATA};
use prost::Message;
use serde_json::{Value, json};
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// The longest a state this module waits for may take to show.
const PATIENCE: Duration = Duration::from_secs(20);

/// The message of a refused reuse of `id`.
fn reused(id: &str) -> String {
    format!("kvd: operation id '{id}' was already used for a different request")
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Starts kvd on `data_dir` with the failpoint armed to drop `drops` responses.
fn start_dropping(data_dir: &Path, drops: u64, args: &[&str]) -> common::Server {
    let drops = drops.to_string();
    common::start_kvd_with_env(
        data_dir,
        args,
        &[(DROP_RESPONSE_AFTER_COMMIT_ENV, drops.as_str())],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

async fn channel(server: &common::Server) -> Channel {
    tokio::time::timeout(
        PATIENCE,
        Channel::from_shared(server.endpoint.clone())
            .unwrap()
            .connect(),
    )
    .await
    .expect("connect within the patience")
    .unwrap()
}

/// Returns `message` as a request carrying operation id `id`.
fn with_id<T>(message: T, id: &str) -> tonic::Request<T> {
    with_raw_id(message, id.as_bytes())
}

/// Returns `message` as a request whose operation id metadata holds the bytes `id`.
fn with_raw_id<T>(message: T, id: &[u8]) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert(OPERATION_ID_METADATA, MetadataValue::try_from(id).unwrap());
    request
}

/// Returns the response the failpoint dropped, from the details of its status.
fn dropped<M: Message + Default + std::fmt::Debug>(
    result: Result<tonic::Response<M>, tonic::Status>,
) -> M {
    let status = result.expect_err("the failpoint drops this response");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, DROPPED_MESSAGE),
        "{status:?}"
    );
    M::decode(status.details()).unwrap()
}

fn put(key: &str, value: &str) -> pb::PutRequest {
    pb::PutRequest {
        key: Bytes::from(key.to_owned()),
        value: Bytes::from(value.to_owned()),
        ..pb::PutRequest::default()
    }
}

/// A Txn that creates `key` if it does not exist: applied twice, the second one fails.
fn create_if_absent(key: &str, value: &str) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![pb::Compare {
            key: Bytes::from(key.to_owned()),
            result: pb::compare::CompareResult::Equal as i32,
            target: pb::compare::CompareTarget::Version as i32,
            target_union: Some(pb::compare::TargetUnion::Version(0)),
            ..pb::Compare::default()
        }],
        success: vec![pb::RequestOp {
            request: Some(Op::RequestPut(put(key, value))),
        }],
        failure: vec![],
    }
}

/// Returns the store's revision and the version of `key` (0 if absent).
async fn revision_and_version(kv: &mut KvClient<Channel>, key: &str) -> (i64, i64) {
    let range = pb::RangeRequest {
        key: Bytes::from(key.to_owned()),
        ..pb::RangeRequest::default()
    };
    let resp = kv.range(range).await.unwrap().into_inner();
    let version = resp.kvs.first().map_or(0, |kv| kv.version);
    (resp.header.unwrap().revision, version)
}

/// Sends one HTTP/1.1 request and returns the code and body.
fn http(endpoint: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

/// Posts a call to `/api/v1`.
fn call(endpoint: &str, body: &Value) -> (u16, String) {
    http(endpoint, "POST", "/api/v1", &body.to_string())
}

/// Posts a call that must succeed with an empty body.
fn accepted(endpoint: &str, body: &Value) {
    assert_eq!(call(endpoint, body), (200, String::new()), "{body}");
}

/// Posts a call that must answer 200 with JSON, and returns it.
fn answer(endpoint: &str, body: &Value) -> Value {
    let (code, text) = call(endpoint, body);
    assert_eq!(code, 200, "{body}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// Returns a call of type `kind` with `arguments` in the object named after it, and the
/// operation id `id` if given.
fn call_of(kind: &str, arguments: Value, id: Option<&str>) -> Value {
    let mut call = serde_json::Map::new();
    call.insert("type".to_owned(), json!(kind));
    if let Some(id) = id {
        call.insert("operation_id".to_owned(), json!(id));
    }
    call.insert(kind.to_ascii_lowercase(), arguments);
    Value::Object(call)
}

fn register(endpoint: &str, agent: &str, cpus: u64) {
    accepted(
        endpoint,
        &call_of(
            "REGISTER_AGENT",
            json!({"agent_id": agent, "resources": {"cpus": {"value": cpus}}}),
            None,
        ),
    );
}

fn allocate(id: &str, role: &str, agent: &str, cpus: u64, operation_id: Option<&str>) -> Value {
    call_of(
        "ALLOCATE",
        json!({"id": id, "role": role, "agent_id": agent,
               "resources": {"cpus": {"value": cpus}}}),
        operation_id,
    )
}

fn quota(role: &str, resource: &str, limit: u64) -> Value {
    call_of(
        "UPDATE_QUOTA",
        json!({"force": true, "quota_configs": [
            {"role": role, "limits": {resource: {"value": limit}}}
        ]}),
        None,
    )
}

/// Returns the `/roles` answer, parsed.
fn roles(endpoint: &str) -> Value {
    let (code, body) = http(endpoint, "GET", "/roles", "");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
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

/// Returns GET_AGENTS's agents by id.
fn agents(endpoint: &str) -> serde_json::Map<String, Value> {
    let got = answer(endpoint, &json!({"type": "GET_AGENTS"}));
    assert_eq!(got["type"], "GET_AGENTS");
    got["get_agents"]["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["agent_id"].as_str().unwrap().to_owned(), a.clone()))
        .collect()
}

fn reconcile_operations(endpoint: &str, operations: Value, prefix: &str) -> Value {
    let got = answer(
        endpoint,
        &call_of(
            "RECONCILE_OPERATIONS",
            json!({"operations": operations, "prefix": prefix}),
            None,
        ),
    );
    got["reconcile_operations"]["operation_statuses"].clone()
}

fn reconcile(endpoint: &str, tasks: Value, partition_aware: bool) -> Value {
    let got = answer(
        endpoint,
        &call_of(
            "RECONCILE",
            json!({"tasks": tasks, "partition_aware": partition_aware}),
            None,
        ),
    );
    got["reconcile"]["statuses"].clone()
}

/// Returns the value of the metric line `series` (name and labels), if present.
fn metric(endpoint: &str, series: &str) -> Option<String> {
    let (_, body) = common::http_get(endpoint, "/metrics").unwrap();
    body.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')
            .map(str::to_owned)
    })
}

/// Stops `server` with SIGTERM and checks it exited cleanly.
fn stop(mut server: common::Server) {
    assert_eq!(server.signal_and_wait("-TERM"), Some(0), "{}", server.log());
}

// ---------------------------------------------------------------------------------------------
// Exactly-once writes over gRPC
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_put_retried_after_its_response_was_dropped_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_dropping(&dir.path().join("data"), 1, &[]);
    let ep = server.endpoint.clone();
    accepted(&ep, &quota("dev", "kv_keys", 10));
    let mut kv = KvClient::new(channel(&server).await);

    let request = put("/dev/a", "v");
    let first: pb::PutResponse = dropped(kv.put(with_id(request.clone(), "c1/put")).await);
    let committed = first.header.unwrap().revision;
    assert_eq!(
        revision_and_version(&mut kv, "/dev/a").await,
        (committed, 1),
        "the dropped write was committed"
    );
    let retry = kv
        .put(with_id(request.clone(), "c1/put"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retry, first, "the retry gets the dropped response");
    let again = kv
        .put(with_id(request, "c1/put"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, first);
    assert_eq!(
        revision_and_version(&mut kv, "/dev/a").await,
        (committed, 1),
        "one revision, version 1"
    );
    let put_cost = 256 + "/dev/a".len() + 1;
    assert_eq!(
        role(&ep, "dev")["quota"]["consumed"],
        json!({"kv_bytes": put_cost, "kv_keys": 1}),
        "charged once"
    );
    // Without an id the same Put is a new write, as in etcd.
    let plain = kv.put(put("/dev/a", "v")).await.unwrap().into_inner();
    assert_eq!(plain.header.unwrap().revision, committed + 1);
}

#[tokio::test]
async fn a_txn_and_a_lease_grant_retried_after_dropped_responses_are_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_dropping(&dir.path().join("data"), 2, &[]);
    let mut kv = KvClient::new(channel(&server).await);
    let mut lease = LeaseClient::new(channel(&server).await);

    // Both first attempts are dropped (the failpoint drops the next two answers of writes
    // with an id, retries included), then both are retried.
    let txn = create_if_absent("lock", "me");
    let txn_first: pb::TxnResponse = dropped(kv.txn(with_id(txn.clone(), "c1/txn")).await);
    assert!(txn_first.succeeded);
    let grant = pb::LeaseGrantRequest { ttl: 60, id: 0 };
    let grant_first: pb::LeaseGrantResponse =
        dropped(lease.lease_grant(with_id(grant, "c1/lease")).await);
    assert_ne!(grant_first.id, 0, "the server picked a lease id");

    let retry = kv.txn(with_id(txn, "c1/txn")).await.unwrap();
    assert_eq!(
        retry.into_inner(),
        txn_first,
        "applied again the compare would fail; the retry gets the recorded success"
    );
    let committed = txn_first.header.unwrap().revision;
    assert_eq!(revision_and_version(&mut kv, "lock").await, (committed, 1));
    let retry = lease.lease_grant(with_id(grant, "c1/lease")).await.unwrap();
    assert_eq!(
        retry.into_inner(),
        grant_first,
        "the same lease, not a second one"
    );
    let leases = lease
        .lease_leases(pb::LeaseLeasesRequest {})
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<i64> = leases.leases.iter().map(|l| l.id).collect();
    assert_eq!(ids, vec![grant_first.id], "one lease granted");
}

#[tokio::test]
async fn retries_across_a_restart_get_the_recorded_responses() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start_dropping(&data_dir, 3, &[]);
    let (put_first, txn_first, grant_first) = {
        let mut kv = KvClient::new(channel(&server).await);
        let mut lease = LeaseClient::new(channel(&server).await);
        let p: pb::PutResponse = dropped(kv.put(with_id(put("k", "v"), "r/put")).await);
        let t: pb::TxnResponse = dropped(
            kv.txn(with_id(create_if_absent("lock", "me"), "r/txn"))
                .await,
        );
        let grant = pb::LeaseGrantRequest { ttl: 600, id: 0 };
        let g: pb::LeaseGrantResponse = dropped(lease.lease_grant(with_id(grant, "r/lease")).await);
        (p, t, g)
    };
    stop(server);

    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let mut kv = KvClient::new(channel(&server).await);
    let mut lease = LeaseClient::new(channel(&server).await);
    let put_retry = kv.put(with_id(put("k", "v"), "r/put")).await.unwrap();
    assert_eq!(put_retry.into_inner(), put_first);
    let txn_retry = kv
        .txn(with_id(create_if_absent("lock", "me"), "r/txn"))
        .await
        .unwrap();
    assert_eq!(txn_retry.into_inner(), txn_first);
    let grant = pb::LeaseGrantRequest { ttl: 600, id: 0 };
    let grant_retry = lease.lease_grant(with_id(grant, "r/lease")).await.unwrap();
    assert_eq!(grant_retry.into_inner(), grant_first);

    let last = grant_first.header.unwrap().revision;
    assert_eq!(revision_and_version(&mut kv, "k").await, (last, 1));
    assert_eq!(revision_and_version(&mut kv, "lock").await.1, 1);
    let leases = lease.lease_leases(pb::LeaseLeasesRequest {}).await.unwrap();
    assert_eq!(leases.into_inner().leases.len(), 1);
}

#[tokio::test]
async fn every_write_rpc_takes_an_operation_id() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(channel(&server).await);
    let mut lease = LeaseClient::new(channel(&server).await);
    kv.put(put("a", "1")).await.unwrap();
    kv.put(put("b", "1")).await.unwrap();

    let delete = pb::DeleteRangeRequest {
        key: Bytes::from_static(b"a"),
        ..pb::DeleteRangeRequest::default()
    };
    let first = kv.delete_range(with_id(delete.clone(), "d")).await.unwrap();
    let first = first.into_inner();
    assert_eq!(first.deleted, 1);
    let retry = kv.delete_range(with_id(delete, "d")).await.unwrap();
    assert_eq!(retry.into_inner(), first, "deleted 1 again, not 0");

    let compact = pb::CompactionRequest {
        revision: 3,
        physical: true,
    };
    let first = kv.compact(with_id(compact, "c")).await.unwrap();
    let retry = kv.compact(with_id(compact, "c")).await.unwrap();
    assert_eq!(retry.into_inner(), first.into_inner());

    let granted = lease
        .lease_grant(pb::LeaseGrantRequest { ttl: 60, id: 7 })
        .await
        .unwrap();
    assert_eq!(granted.into_inner().id, 7);
    let revoke = pb::LeaseRevokeRequest { id: 7 };
    let first = lease.lease_revoke(with_id(revoke, "l")).await.unwrap();
    let retry = lease.lease_revoke(with_id(revoke, "l")).await.unwrap();
    assert_eq!(
        retry.into_inner(),
        first.into_inner(),
        "applied again it would be 'lease not found'"
    );
    let (revision, _) = revision_and_version(&mut kv, "b").await;
    assert_eq!(
        revision, 4,
        "two puts, one delete; compact and revoke add none"
    );
}

#[tokio::test]
async fn the_same_id_with_another_request_is_refused_and_changes_nothing() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.clone();
    let mut kv = KvClient::new(channel(&server).await);
    kv.put(with_id(put("k", "v1"), "o/1")).await.unwrap();
    let status = kv.put(with_id(put("k", "v2"), "o/1")).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::FailedPrecondition, reused("o/1").as_str())
    );
    let txn = kv
        .txn(with_id(create_if_absent("other", "x"), "o/1"))
        .await
        .unwrap_err();
    assert_eq!(txn.code(), Code::FailedPrecondition, "{txn:?}");
    let range = pb::RangeRequest {
        key: Bytes::from_static(b"k"),
        ..pb::RangeRequest::default()
    };
    let got = kv.range(range).await.unwrap().into_inner();
    assert_eq!(
        (got.header.unwrap().revision, got.kvs[0].value.as_ref()),
        (2, &b"v1"[..])
    );
    assert_eq!(revision_and_version(&mut kv, "other").await, (2, 0));

    register(&ep, "a1", 8);
    accepted(&ep, &allocate("x1", "ml", "a1", 2, Some("s/1")));
    let before = roles(&ep);
    let release = call_of("RELEASE", json!({"id": "x1"}), Some("s/1"));
    assert_eq!(call(&ep, &release), (409, reused("s/1")));
    assert_eq!(
        call(&ep, &allocate("x1", "ml", "a1", 3, Some("s/1"))),
        (409, reused("s/1"))
    );
    assert_eq!(roles(&ep), before, "nothing changed");
    assert_eq!(
        role(&ep, "ml")["allocated"],
        json!({"cpus": 2}),
        "still allocated"
    );
}

#[tokio::test]
async fn a_refused_write_with_an_id_records_nothing() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.clone();
    accepted(&ep, &quota("dev", "kv_keys", 1));
    let mut kv = KvClient::new(channel(&server).await);
    kv.put(put("/dev/a", "v")).await.unwrap();
    let refused = kv
        .put(with_id(put("/dev/b", "v"), "q/1"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let statuses = reconcile_operations(&ep, json!([{"operation_id": "q/1"}]), "");
    assert_eq!(
        statuses,
        json!([{"operation_id": "q/1", "state": "OPERATION_UNKNOWN",
                "message": "Reconciliation: Operation is unknown and no 'agent_id' was provided"}])
    );
    accepted(&ep, &quota("dev", "kv_keys", 2));
    let applied = kv.put(with_id(put("/dev/b", "v"), "q/1")).await.unwrap();
    assert_eq!(applied.into_inner().header.unwrap().revision, 3);
    assert_eq!(revision_and_version(&mut kv, "/dev/b").await, (3, 1));

    // The same through the operator API: a refusal for quota, then success.
    register(&ep, "a1", 8);
    accepted(&ep, &quota("ml", "cpus", 1));
    let (code, message) = call(&ep, &allocate("x1", "ml", "a1", 2, Some("q/2")));
    assert_eq!(code, 400, "{message}");
    assert!(
        message.starts_with("kvd: quota exceeded for role 'ml'"),
        "{message}"
    );
    accepted(&ep, &quota("ml", "cpus", 2));
    accepted(&ep, &allocate("x1", "ml", "a1", 2, Some("q/2")));
    assert_eq!(role(&ep, "ml")["allocated"], json!({"cpus": 2}));
}

#[tokio::test]
async fn bad_operation_ids_are_invalid_arguments() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.clone();
    let mut kv = KvClient::new(channel(&server).await);
    let long = vec![b'x'; 257];
    for (id, message) in [
        (
            &b""[..],
            "kvd: invalid argument: operation id must not be empty",
        ),
        (
            &long,
            "kvd: invalid argument: operation id is 257 bytes, more than 256",
        ),
        (
            b"\xff\xfe",
            "kvd: invalid argument: metadata 'kvd-operation-id' is not UTF-8",
        ),
    ] {
        let status = kv.put(with_raw_id(put("k", "v"), id)).await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::InvalidArgument, message)
        );
    }
    let at_most = vec![b'x'; 256];
    kv.put(with_raw_id(put("k", "v"), &at_most)).await.unwrap();
    assert_eq!(
        revision_and_version(&mut kv, "k").await,
        (2, 1),
        "only the good id wrote"
    );

    register(&ep, "a1", 8);
    assert_eq!(
        call(&ep, &allocate("x1", "ml", "a1", 1, Some(""))),
        (
            400,
            "Failed to validate master::Call: operation id must not be empty".to_owned()
        )
    );
    let (code, message) = call(&ep, &json!({"type": "GET_AGENTS", "operation_id": "o"}));
    assert_eq!(code, 400);
    assert!(message.contains("'operation_id' is only accepted on calls that change something"));
    assert_eq!(role(&ep, "ml"), Value::Null, "nothing allocated");
}

// ---------------------------------------------------------------------------------------------
// The operator API: exactly-once, agents and reconciliation
// ---------------------------------------------------------------------------------------------

#[test]
fn an_allocate_retried_after_its_answer_was_dropped_is_applied_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = start_dropping(&data_dir, 1, &[]);
    let ep = server.endpoint.clone();
    register(&ep, "a1", 8);
    let request = allocate("x1", "ml", "a1", 2, Some("sched/x1"));
    assert_eq!(call(&ep, &request), (503, DROPPED_MESSAGE.to_owned()));
    assert_eq!(
        role(&ep, "ml")["allocated"],
        json!({"cpus": 2}),
        "the dropped call was applied"
    );
    accepted(&ep, &request);
    assert_eq!(role(&ep, "ml")["allocated"], json!({"cpus": 2}), "once");
    stop(server);

    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let ep = server.endpoint.clone();
    assert_eq!(agents(&ep)["a1"]["state"], "RECOVERED");
    accepted(&ep, &request);
    assert_eq!(
        role(&ep, "ml")["quota"]["consumed"],
        json!({"cpus": 2}),
        "one allocation charged"
    );
    assert_eq!(
        reconcile_operations(
            &ep,
            json!([{"operation_id": "sched/x1", "agent_id": "a1"},
                   {"operation_id": "sched/x2", "agent_id": "a1"}]),
            ""
        ),
        json!([
            {"operation_id": "sched/x1", "agent_id": "a1", "state": "OPERATION_FINISHED",
             "revision": 1},
            {"operation_id": "sched/x2", "agent_id": "a1", "state": "OPERATION_RECOVERING",
             "message": "Reconciliation: Agent is recovered but has not re-registered"},
        ])
    );
    // Branch 2: an unknown task on a recovered agent gets no answer at all.
    let statuses = reconcile(
        &ep,
        json!([{"task_id": "x1", "agent_id": "a1"}, {"task_id": "x9", "agent_id": "a1"}]),
        true,
    );
    assert_eq!(
        statuses,
        json!([{"task_id": "x1", "agent_id": "a1", "state": "TASK_RUNNING",
                "message": "Reconciliation: Latest task state",
                "reason": "REASON_RECONCILIATION", "source": "SOURCE_MASTER"}])
    );
    register(&ep, "a1", 8);
    assert_eq!(agents(&ep)["a1"]["state"], "REGISTERED");
    assert_eq!(
        reconcile(&ep, json!([{"task_id": "x9", "agent_id": "a1"}]), true),
        json!([{"task_id": "x9", "agent_id": "a1", "state": "TASK_GONE",
                "message": "Reconciliation: Task is unknown to the agent",
                "reason": "REASON_RECONCILIATION", "source": "SOURCE_MASTER"}])
    );
}

#[test]
fn unreachable_and_gone_agents_answer_reconciliation_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let ep = server.endpoint.clone();
    for agent in ["a1", "a2", "a3"] {
        register(&ep, agent, 4);
    }
    accepted(&ep, &allocate("x2", "ml", "a2", 1, None));
    accepted(&ep, &allocate("x3", "ml", "a3", 2, None));
    accepted(
        &ep,
        &call_of(
            "MARK_AGENT_UNREACHABLE",
            json!({"agent_id": "a2"}),
            Some("ops/unreach-a2"),
        ),
    );
    accepted(
        &ep,
        &call_of("MARK_AGENT_GONE", json!({"agent_id": "a3"}), None),
    );
    let listed = agents(&ep);
    let since = listed["a2"]["unreachable_time"]["nanoseconds"]
        .as_u64()
        .unwrap();
    assert!(since > 0, "{listed:?}");
    assert_eq!(
        (
            &listed["a1"]["state"],
            &listed["a2"]["state"],
            &listed["a3"]["state"]
        ),
        (&json!("REGISTERED"), &json!("UNREACHABLE"), &json!("GONE"))
    );
    assert_eq!(listed["a1"]["resources"], json!({"cpus": {"value": 4}}));
    assert_eq!(
        role(&ep, "ml")["quota"]["consumed"],
        json!({"cpus": 1}),
        "the gone agent's allocation was released"
    );
    assert_eq!(
        metric(&ep, "kvd_agents{state=\"UNREACHABLE\"}").as_deref(),
        Some("1")
    );
    assert_eq!(
        metric(&ep, "kvd_agents{state=\"GONE\"}").as_deref(),
        Some("1")
    );
    let roles_agents = &roles(&ep)["agents"];
    assert_eq!(roles_agents[1]["agent_id"], "a2");
    assert_eq!(roles_agents[1]["state"], "UNREACHABLE");

    let check = |ep: &str| {
        let tasks = json!([
            {"task_id": "x2", "agent_id": "a2"},
            {"task_id": "x7", "agent_id": "a2"},
            {"task_id": "x3", "agent_id": "a3"},
            {"task_id": "x8"},
        ]);
        let reason = json!({"reason": "REASON_RECONCILIATION", "source": "SOURCE_MASTER"});
        let with = |mut status: Value| {
            for (k, v) in reason.as_object().unwrap() {
                status[k] = v.clone();
            }
            status
        };
        let time = json!({"nanoseconds": since});
        assert_eq!(
            reconcile(ep, tasks.clone(), true),
            json!([
                with(
                    json!({"task_id": "x2", "agent_id": "a2", "state": "TASK_UNREACHABLE",
                            "message": "Reconciliation: Latest task state",
                            "unreachable_time": time})
                ),
                with(
                    json!({"task_id": "x7", "agent_id": "a2", "state": "TASK_UNREACHABLE",
                            "message": "Reconciliation: Task is unreachable",
                            "unreachable_time": time})
                ),
                with(json!({"task_id": "x3", "agent_id": "a3",
                            "state": "TASK_GONE_BY_OPERATOR",
                            "message": "Reconciliation: Task is gone"})),
                with(json!({"task_id": "x8", "state": "TASK_UNKNOWN",
                            "message": "Reconciliation: Task is unknown"})),
            ])
        );
        let states: Vec<Value> = reconcile(ep, tasks, false)
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["state"].clone())
            .collect();
        assert_eq!(states, vec![json!("TASK_LOST"); 4], "not partition-aware");
        assert_eq!(
            reconcile_operations(
                ep,
                json!([
                    {"operation_id": "o/x", "agent_id": "a2"},
                    {"operation_id": "o/y", "agent_id": "a3"},
                    {"operation_id": "o/z", "agent_id": "a9"},
                ]),
                "",
            ),
            json!([
                {"operation_id": "o/x", "agent_id": "a2", "state": "OPERATION_UNREACHABLE",
                 "message": "Reconciliation: Agent is unreachable"},
                {"operation_id": "o/y", "agent_id": "a3", "state": "OPERATION_GONE_BY_OPERATOR",
                 "message": "Reconciliation: Agent marked gone by operator"},
                {"operation_id": "o/z", "agent_id": "a9", "state": "OPERATION_UNKNOWN",
                 "message": "Reconciliation: Both operation and agent are unknown"},
            ])
        );
        // Implicit, with a prefix: the one operation recorded under `ops/`.
        let implicit = reconcile_operations(ep, json!([]), "ops/");
        assert_eq!(implicit.as_array().unwrap().len(), 1, "{implicit}");
        assert_eq!(implicit[0]["operation_id"], "ops/unreach-a2");
        assert_eq!(implicit[0]["state"], "OPERATION_FINISHED");
    };
    // Before the restart a1 is registered, so `x8` (no agent) gets branch 6.
    check(&ep);
    stop(server);

    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let ep = server.endpoint.clone();
    let listed = agents(&ep);
    assert_eq!(listed["a1"]["state"], "RECOVERED");
    assert_eq!(listed["a2"]["state"], "UNREACHABLE");
    assert_eq!(
        listed["a2"]["unreachable_time"]["nanoseconds"].as_u64(),
        Some(since),
        "persisted with its time"
    );
    assert_eq!(listed["a3"]["state"], "GONE");
    assert_eq!(
        metric(&ep, "kvd_agents{state=\"RECOVERED\"}").as_deref(),
        Some("1")
    );
    // A gone agent cannot come back.
    let (code, _) = call(
        &ep,
        &call_of(
            "REGISTER_AGENT",
            json!({"agent_id": "a3", "resources": {"cpus": {"value": 4}}}),
            None,
        ),
    );
    assert_eq!(code, 400);
    // Once a1 registers again, no agent is recovered, and the answers are those from
    // before the restart.
    register(&ep, "a1", 4);
    check(&ep);
}

#[test]
fn a_recovered_agent_becomes_unreachable_after_the_reregister_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    register(&server.endpoint, "a1", 4);
    stop(server);
    // With the default timeout (10 minutes) the restart leaves the agent recovered...
    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    assert_eq!(agents(&server.endpoint)["a1"]["state"], "RECOVERED");
    stop(server);
    // ... and with a 1 s timeout it becomes unreachable once the timeout has passed.
    let server = common::start_kvd_in(&data_dir, &["--agent-reregister-timeout", "1s"]).unwrap();
    let ep = server.endpoint.clone();
    let became = common::wait_until(PATIENCE, || agents(&ep)["a1"]["state"] == "UNREACHABLE");
    assert!(became, "still {:?}", agents(&ep));
    assert!(agents(&ep)["a1"]["unreachable_time"]["nanoseconds"].as_u64() > Some(0));
}

// ---------------------------------------------------------------------------------------------
// Flags and the command line
// ---------------------------------------------------------------------------------------------

/// Flags, environment, and the name the refusal must mention.
type StartCase = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn invalid_values_are_refused_at_start_naming_the_flag() {
    let cases: [StartCase; 10] = [
        (&["--max-watch-streams", "0"], &[], "--max-watch-streams"),
        (&["--max-snapshots", "0"], &[], "--max-snapshots"),
        (
            // The log file is eight times this: a huge value would fill the disk.
            &["--wal-file-bytes", "99999999999999999"],
            &[],
            "--wal-file-bytes",
        ),
        (
            &["--operation-retention-count", "0"],
            &[],
            "--operation-retention-count",
        ),
        (
            &["--operation-retention", "0"],
            &[],
            "--operation-retention",
        ),
        (
            &["--operation-retention", "1x"],
            &[],
            "--operation-retention",
        ),
        (
            &["--agent-reregister-timeout", "soon"],
            &[],
            "--agent-reregister-timeout",
        ),
        (
            // A bare number is not a duration (etcd's flags want a unit too), except 0.
            &["--consumption-check-interval", "5"],
            &[],
            "--consumption-check-interval",
        ),
        (&["--scrub-interval", "daily"], &[], "--scrub-interval"),
        (
            &[],
            &[(DROP_RESPONSE_AFTER_COMMIT_ENV, "lots")],
            DROP_RESPONSE_AFTER_COMMIT_ENV,
        ),
    ];
    for (args, env, named) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(common::kvd_binary());
        command
            .envs(env.iter().copied())
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", "http://127.0.0.1:0"])
            .args(args);
        let (status, stderr) = common::run_refused(command);
        assert!(!status.success(), "{args:?} {env:?} was accepted");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(
            !dir.path().join("data").join("kvd.redb").exists(),
            "nothing opened"
        );
    }
}

#[tokio::test]
async fn the_retention_count_flag_bounds_the_recorded_outcomes() {
    let server = common::start_kvd(&["--operation-retention-count", "1"]);
    let mut kv = KvClient::new(channel(&server).await);
    kv.put(with_id(put("k", "v"), "first")).await.unwrap();
    kv.put(with_id(put("j", "v"), "second")).await.unwrap();
    // `first` was evicted by `second`: its retry is a new write.
    let again = kv.put(with_id(put("k", "v"), "first")).await.unwrap();
    assert_eq!(again.into_inner().header.unwrap().revision, 4);
    assert_eq!(revision_and_version(&mut kv, "k").await, (4, 2));
}

#[test]
fn the_periodic_consumption_check_publishes_its_drift_rows() {
    let server = common::start_kvd(&["--consumption-check-interval", "100ms"]);
    let ep = server.endpoint.clone();
    let published = common::wait_until(PATIENCE, || {
        metric(&ep, "kvd_consumption_drift_rows").is_some()
    });
    assert!(published, "no check ran");
    assert_eq!(
        metric(&ep, "kvd_consumption_drift_rows").as_deref(),
        Some("0")
    );

    let off = common::start_kvd(&["--consumption-check-interval", "0"]);
    assert_eq!(metric(&off.endpoint, "kvd_consumption_drift_rows"), None);
}

#[test]
fn the_periodic_scrub_counts_its_passes() {
    let server = common::start_kvd(&["--scrub-interval", "100ms"]);
    let ep = server.endpoint.clone();
    let passes = |result: &str| {
        metric(&ep, &format!("kvd_scrub_runs_total{{result=\"{result}\"}}"))
            .and_then(|n| n.parse::<u64>().ok())
    };
    let sound = common::wait_until(PATIENCE, || passes("sound") >= Some(2));
    assert!(sound, "no two passes ran: {:?}", passes("sound"));
    assert_eq!(passes("damaged"), Some(0));
    assert_eq!(passes("failed"), Some(0));
}

#[test]
fn kvd_reconcile_asks_a_running_kvd() {
    let server = common::start_kvd(&[]);
    let run = |args: &[&str]| {
        Command::new(common::kvd_binary())
            .arg("reconcile")
            .args(args)
            .output()
            .unwrap()
    };
    let checked = run(&["--endpoints", &server.endpoint]);
    assert_eq!(checked.status.code(), Some(0), "{checked:?}");
    let body: Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(
        body,
        json!({"type": "RECONCILE_CONSUMPTION", "reconcile_consumption": {"drift": []}})
    );
    let repaired = run(&["--repair", "--endpoints", &server.endpoint]);
    assert_eq!(repaired.status.code(), Some(0), "{repaired:?}");
    let body: Value = serde_json::from_slice(&repaired.stdout).unwrap();
    assert_eq!(body["reconcile_consumption"]["repaired"], 0);

    // No kvd there: a port that was free a moment ago.
    let [port, _] = common::free_ports();
    let nobody = run(&["--endpoints", &format!("127.0.0.1:{port}")]);
    assert_eq!(nobody.status.code(), Some(1), "{nobody:?}");
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("no endpoint answered"));
}
