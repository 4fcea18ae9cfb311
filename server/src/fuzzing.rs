//! Entry points for the fuzz targets in `fuzz/` and for the corpus replay test
//! (`server/tests/fuzz_corpus.rs`): each function takes arbitrary bytes, decodes them as the
//! server decodes a request, runs the conversion the handler runs, and checks what that
//! conversion promises.
//!
//! Not an API: hidden from the docs, outside any compatibility promise, and free to change
//! with the fuzz targets. The engine's decoders of stored bytes have the same kind of module
//! (`kvd::fuzzing`).
//!
//! Each function returns normally for every input; a panic is a bug found. The checks:
//! - gRPC ([`grpc_request`]): prost's decoding of every request message of every service is
//!   total and survives re-encoding; the handlers' conversions (`convert`, and the alarm
//!   mapping of `maintenance`) are total; a converted request, written back as the canonical
//!   wire message, converts to the same request (the translation loses nothing the engine
//!   uses) and its protobuf length is what the engine computes for the request-size limit
//!   (API-2); a Txn holding an empty operation or a compare with an empty key never
//!   converts, and every refusal is the error the engine's own checks find first once the
//!   dropped compares are kept and the empty operations are replaced by failing ones (CONV-3
//!   against VAL-1); every error maps to a non-OK gRPC status with
//!   the engine's message (STATUS-1).
//! - operator API ([`operator_call`]): decoding a `POST /api/v1` body is total (OPS-1); a
//!   refusal is a 400 with one of Mesos's message prefixes; a decoded call, written back as
//!   JSON, decodes to the same call; each UPDATE_QUOTA configuration goes through the
//!   engine's validation, and a valid one, printed as GET_QUOTA prints it (OPS-4) and sent
//!   back, validates to the same configuration whenever its amounts are below 10^12 units
//!   (fifteen significant digits then print every digit).
//!
//! Contact points: `convert`, `maintenance`, `operator`, `status`, `pb`; `kvd::fuzzing` for
//! the engine's checks and lengths; the targets `fuzz/fuzz_targets/{grpc,operator_json}.rs`.

use std::collections::BTreeMap;
use std::fmt::Debug;

use axum::http::StatusCode;
use bytes::Bytes;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::convert;
use crate::maintenance;
use crate::operator::{self, Call};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::watch_create_request::FilterType;
use crate::pb::etcdserverpb::watch_request::RequestUnion;
use crate::status;
use kvd::fuzzing as engine;
use kvd::quota::{self, QuotaConfig, RawQuotaConfig, Scalar};
use kvd::{AccountingRequest, Error, RecordKind, WriteRequest};

/// The `--max-txn-ops` the Txn conversion and checks run with: etcd's default.
const MAX_TXN_OPS: usize = 128;
/// How many request message types [`grpc_request`] chooses from.
const GRPC_REQUEST_KINDS: u8 = 41;
/// Amounts below this many milli-units (10^12 units) print with every digit (OPS-4).
const EXACT_PRINT_MILLI_MAX: i64 = 1_000_000_000_000_000;
/// Whole doubles below this are exact integers (2^53), so they can go into JSON as integers.
const WHOLE_F64_MAX: f64 = 9_007_199_254_740_992.0;
/// The key and value of the Put that replaces an empty operation (`refusal_position`).
const FILL_KEY: &[u8] = b"fill";

/// Decodes `data[1..]` as the request message that `data[0]` picks among every service's
/// request types (KV, Watch, Lease, Cluster, Maintenance, Auth), then runs the handler's
/// conversion and the checks in the module doc.
pub fn grpc_request(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % GRPC_REQUEST_KINDS {
        0 => decode::<pb::RangeRequest>(bytes).map_or((), range),
        1 => decode::<pb::PutRequest>(bytes).map_or((), put),
        2 => decode::<pb::DeleteRangeRequest>(bytes).map_or((), delete_range),
        3 => decode::<pb::TxnRequest>(bytes).map_or((), txn),
        4 => decode::<pb::CompactionRequest>(bytes).map_or((), compaction),
        5 => decode::<pb::WatchRequest>(bytes).map_or((), watch),
        6 => decode::<pb::LeaseGrantRequest>(bytes).map_or((), lease_grant),
        7 => decode::<pb::LeaseRevokeRequest>(bytes).map_or((), lease_revoke),
        8 => decode::<pb::AlarmRequest>(bytes).map_or((), alarm),
        // The rest reach the engine as plain integers or flags, or not at all (kvd answers
        // Cluster and Auth calls itself): decoding them is the whole conversion.
        9 => decode_only::<pb::LeaseKeepAliveRequest>(bytes),
        10 => decode_only::<pb::LeaseTimeToLiveRequest>(bytes),
        11 => decode_only::<pb::LeaseLeasesRequest>(bytes),
        12 => decode_only::<pb::StatusRequest>(bytes),
        13 => decode_only::<pb::DefragmentRequest>(bytes),
        14 => decode_only::<pb::HashRequest>(bytes),
        15 => decode_only::<pb::HashKvRequest>(bytes),
        16 => decode_only::<pb::SnapshotRequest>(bytes),
        17 => decode_only::<pb::MoveLeaderRequest>(bytes),
        18 => decode_only::<pb::DowngradeRequest>(bytes),
        19 => decode_only::<pb::MemberAddRequest>(bytes),
        20 => decode_only::<pb::MemberRemoveRequest>(bytes),
        21 => decode_only::<pb::MemberUpdateRequest>(bytes),
        22 => decode_only::<pb::MemberListRequest>(bytes),
        23 => decode_only::<pb::MemberPromoteRequest>(bytes),
        24 => decode_only::<pb::AuthEnableRequest>(bytes),
        25 => decode_only::<pb::AuthDisableRequest>(bytes),
        26 => decode_only::<pb::AuthStatusRequest>(bytes),
        27 => decode_only::<pb::AuthenticateRequest>(bytes),
        28 => decode_only::<pb::AuthUserAddRequest>(bytes),
        29 => decode_only::<pb::AuthUserGetRequest>(bytes),
        30 => decode_only::<pb::AuthUserListRequest>(bytes),
        31 => decode_only::<pb::AuthUserDeleteRequest>(bytes),
        32 => decode_only::<pb::AuthUserChangePasswordRequest>(bytes),
        33 => decode_only::<pb::AuthUserGrantRoleRequest>(bytes),
        34 => decode_only::<pb::AuthUserRevokeRoleRequest>(bytes),
        35 => decode_only::<pb::AuthRoleAddRequest>(bytes),
        36 => decode_only::<pb::AuthRoleGetRequest>(bytes),
        37 => decode_only::<pb::AuthRoleListRequest>(bytes),
        38 => decode_only::<pb::AuthRoleDeleteRequest>(bytes),
        39 => decode_only::<pb::AuthRoleGrantPermissionRequest>(bytes),
        _ => decode_only::<pb::AuthRoleRevokePermissionRequest>(bytes),
    }
}

/// Decodes a message as tonic's codec does; one that decodes must re-encode to bytes of
/// its `encoded_len` that decode to the same message.
fn decode<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let encoded = message.encode_to_vec();
    assert_eq!(
        encoded.len(),
        message.encoded_len(),
        "encoded_len of {message:?}"
    );
    let again = M::decode(encoded.as_slice()).ok();
    assert_eq!(
        again.as_ref(),
        Some(&message),
        "re-encoding changed the message"
    );
    Some(message)
}

fn decode_only<M: Message + Default + PartialEq + Debug>(bytes: &[u8]) {
    decode::<M>(bytes);
}

fn range(message: pb::RangeRequest) {
    let req = convert::range_request(message);
    if let Err(err) = engine::check_range(&req) {
        error_status(&err);
    }
    let wire = wire_range(&req);
    assert_eq!(
        engine::range_message_len(&req),
        wire.encoded_len(),
        "API-2: Range length"
    );
    assert_eq!(convert::range_request(wire), req, "Range round trip");
}

fn put(message: pb::PutRequest) {
    let req = convert::put_request(message);
    let wire = wire_put(&req);
    assert_eq!(convert::put_request(wire.clone()), req, "Put round trip");
    write_checks(WriteRequest::Put(req), wire.encoded_len());
}

fn delete_range(message: pb::DeleteRangeRequest) {
    let req = convert::delete_range_request(message);
    let wire = wire_delete_range(&req);
    assert_eq!(
        convert::delete_range_request(wire.clone()),
        req,
        "DeleteRange round trip"
    );
    write_checks(WriteRequest::DeleteRange(req), wire.encoded_len());
}

fn txn(message: pb::TxnRequest) {
    let empty = convert::contains_empty_op(&message);
    match convert::txn_request(message.clone(), MAX_TXN_OPS) {
        Ok(req) => {
            assert!(!empty, "CONV-3: a Txn holding an empty operation converted");
            assert!(
                !has_compare_with_empty_key(&message),
                "CONV-3: a Txn with an empty compare key converted"
            );
            let wire = wire_txn(&req);
            let again = convert::txn_request(wire.clone(), MAX_TXN_OPS);
            assert_eq!(again.as_ref(), Ok(&req), "Txn round trip");
            let _ = req.is_read_only();
            write_checks(WriteRequest::Txn(req), wire.encoded_len());
        }
        Err(err) => {
            error_status(&err);
            refusal_position(&message, &err);
        }
    }
}

/// Checks CONV-3 against the engine's own checks (VAL-1), which walk a Txn in the same order
/// but know no empty operation and never see a compare the conversion drops (CONV-2): with
/// every dropped compare replaced by a kept one with the same key (so the engine counts it
/// and checks its key) and every empty operation by one that fails with a known error, the
/// engine's first error must be that one if the server refused for the empty operation, and
/// the server's own error otherwise (etcd found it first). Two replacements with different
/// errors tell a true refusal from an earlier error of the same kind.
fn refusal_position(message: &pb::TxnRequest, err: &Error) {
    let markers = [
        (
            Request::RequestRange(pb::RangeRequest::default()),
            Error::KeyNotProvided,
        ),
        (
            Request::RequestPut(pb::PutRequest {
                key: Bytes::from_static(FILL_KEY),
                value: Bytes::from_static(FILL_KEY),
                ignore_value: true,
                ..pb::PutRequest::default()
            }),
            Error::ValueProvided,
        ),
    ];
    for (marker, marker_error) in markers {
        let filled = convert::txn_level(fill_empty_ops(keep_dropped_compares(message), &marker));
        let verdict = filled.map(|req| engine::check_write(&WriteRequest::Txn(req), MAX_TXN_OPS));
        let expected = if *err == Error::KeyNotFound {
            marker_error
        } else {
            err.clone()
        };
        assert_eq!(
            verdict,
            Ok(Err(expected)),
            "CONV-3 and VAL-1 disagree: the server refused with {err:?}"
        );
    }
}

fn compaction(message: pb::CompactionRequest) {
    let req = convert::compaction_request(&message);
    let wire = pb::CompactionRequest {
        revision: req.revision,
        physical: req.physical,
    };
    assert_eq!(
        convert::compaction_request(&wire),
        req,
        "Compaction round trip"
    );
    write_checks(WriteRequest::Compaction(req), wire.encoded_len());
}

fn watch(message: pb::WatchRequest) {
    let Some(RequestUnion::CreateRequest(create)) = message.request_union else {
        // A cancel carries a watch id, a progress request nothing: no conversion.
        return;
    };
    let req = convert::watch_create_request(create);
    let mut filters = Vec::new();
    if req.no_put {
        filters.push(FilterType::Noput as i32);
    }
    if req.no_delete {
        filters.push(FilterType::Nodelete as i32);
    }
    let wire = pb::WatchCreateRequest {
        key: req.key.clone(),
        range_end: req.range_end.clone(),
        start_revision: req.start_revision,
        progress_notify: req.progress_notify,
        filters,
        prev_kv: req.prev_kv,
        watch_id: req.watch_id,
        fragment: false,
    };
    assert_eq!(
        convert::watch_create_request(wire),
        req,
        "WatchCreate round trip"
    );
}

fn lease_grant(message: pb::LeaseGrantRequest) {
    // As the Lease service's handler builds it.
    let req = kvd::LeaseGrantRequest {
        ttl: message.ttl,
        id: message.id,
    };
    write_checks(WriteRequest::LeaseGrant(req), message.encoded_len());
}

fn lease_revoke(message: pb::LeaseRevokeRequest) {
    let req = kvd::LeaseRevokeRequest { id: message.id };
    write_checks(WriteRequest::LeaseRevoke(req), message.encoded_len());
}

fn alarm(message: pb::AlarmRequest) {
    // The Maintenance service's mapping; the member id is the wire's (the handler then swaps
    // 0 and this member's id, MAINT-2, a mapping that is its own inverse).
    let this_member = message.member_id.rotate_left(1) | 1;
    for id in [0, message.member_id, this_member] {
        let there = maintenance::swap_member(id, this_member);
        assert_eq!(maintenance::swap_member(there, this_member), id, "MAINT-2");
    }
    let action = match message.action {
        1 => kvd::AlarmAction::Activate,
        2 => kvd::AlarmAction::Deactivate,
        _ => kvd::AlarmAction::Get,
    };
    let req = kvd::AlarmRequest {
        action,
        member_id: message.member_id,
        alarm: maintenance::alarm_type(message.alarm),
    };
    let wire = pb::AlarmRequest {
        action: match req.action {
            kvd::AlarmAction::Get => pb::alarm_request::AlarmAction::Get,
            kvd::AlarmAction::Activate => pb::alarm_request::AlarmAction::Activate,
            kvd::AlarmAction::Deactivate => pb::alarm_request::AlarmAction::Deactivate,
        } as i32,
        member_id: req.member_id,
        alarm: match req.alarm {
            kvd::AlarmType::None => pb::AlarmType::None,
            kvd::AlarmType::NoSpace => pb::AlarmType::Nospace,
            kvd::AlarmType::Corrupt => pb::AlarmType::Corrupt,
        } as i32,
    };
    write_checks(WriteRequest::Alarm(req), wire.encoded_len());
}

/// Runs the engine's admission checks and its size and cost functions on a converted write;
/// `wire_len` is the protobuf length of the request's canonical wire message (API-2).
fn write_checks(req: WriteRequest, wire_len: usize) {
    assert_eq!(engine::message_len(&req), wire_len, "API-2: {req:?}");
    assert!(
        req.encoded_len() > wire_len,
        "the raft entry adds its framing"
    );
    let _ = req.cost();
    if let Err(err) = engine::check_write(&req, MAX_TXN_OPS) {
        error_status(&err);
    }
}

/// Checks STATUS-1 on an error a request got: a non-OK status carrying the engine's message.
fn error_status(err: &Error) {
    let status = status::from_error(err);
    assert_ne!(status.code(), tonic::Code::Ok, "{err:?} maps to OK");
    assert_eq!(status.message(), err.to_string(), "STATUS-1: {err:?}");
}

/// Returns true if `req` (nested Txns included) has a compare with an empty key.
fn has_compare_with_empty_key(req: &pb::TxnRequest) -> bool {
    req.compare.iter().any(|c| c.key.is_empty())
        || req.success.iter().chain(&req.failure).any(|op| {
            matches!(&op.request, Some(Request::RequestTxn(t)) if has_compare_with_empty_key(t))
        })
}

/// Returns true if the conversion drops `c` as always true (an unknown target or result,
/// CONV-2).
fn is_dropped(c: &pb::Compare) -> bool {
    let target = CompareTarget::try_from(c.target).ok();
    let result = CompareResult::try_from(c.result).ok();
    match (target, result) {
        (Some(CompareTarget::Value), None) | (Some(_), Some(_)) => false,
        (None, Some(result)) => result == CompareResult::Equal,
        (Some(_), None) | (None, None) => true,
    }
}

/// Returns `req` (nested Txns included) with every compare the conversion drops replaced by
/// a kept compare on the same key, so the engine's checks see its key and count it.
fn keep_dropped_compares(req: &pb::TxnRequest) -> pb::TxnRequest {
    let keep = |c: &pb::Compare| {
        if is_dropped(c) {
            pb::Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                target_union: Some(TargetUnion::Version(0)),
                ..c.clone()
            }
        } else {
            c.clone()
        }
    };
    let ops = |ops: &[pb::RequestOp]| -> Vec<pb::RequestOp> {
        ops.iter()
            .map(|op| pb::RequestOp {
                request: match &op.request {
                    Some(Request::RequestTxn(t)) => {
                        Some(Request::RequestTxn(keep_dropped_compares(t)))
                    }
                    other => other.clone(),
                },
            })
            .collect()
    };
    pb::TxnRequest {
        compare: req.compare.iter().map(keep).collect(),
        success: ops(&req.success),
        failure: ops(&req.failure),
    }
}

/// Returns `req` with every empty operation, nested ones included, replaced by `marker`.
fn fill_empty_ops(req: pb::TxnRequest, marker: &Request) -> pb::TxnRequest {
    let fill = |ops: Vec<pb::RequestOp>| -> Vec<pb::RequestOp> {
        ops.into_iter()
            .map(|op| pb::RequestOp {
                request: Some(match op.request {
                    None => marker.clone(),
                    Some(Request::RequestTxn(t)) => Request::RequestTxn(fill_empty_ops(t, marker)),
                    Some(other) => other,
                }),
            })
            .collect()
    };
    pb::TxnRequest {
        compare: req.compare,
        success: fill(req.success),
        failure: fill(req.failure),
    }
}

// ---------------------------------------------------------------------------------------------
// The canonical wire message of an engine request: what a client sends for it, with every
// enum written as etcd numbers it and a compare's operand in the field matching its target.
// ---------------------------------------------------------------------------------------------

fn wire_range(r: &kvd::RangeRequest) -> pb::RangeRequest {
    pb::RangeRequest {
        key: r.key.clone(),
        range_end: r.range_end.clone(),
        limit: r.limit,
        revision: r.revision,
        sort_order: match r.sort_order {
            kvd::SortOrder::None => SortOrder::None,
            kvd::SortOrder::Ascend => SortOrder::Ascend,
            kvd::SortOrder::Descend => SortOrder::Descend,
        } as i32,
        sort_target: match r.sort_target {
            kvd::SortTarget::Key => SortTarget::Key,
            kvd::SortTarget::Version => SortTarget::Version,
            kvd::SortTarget::Create => SortTarget::Create,
            kvd::SortTarget::Mod => SortTarget::Mod,
            kvd::SortTarget::Value => SortTarget::Value,
        } as i32,
        serializable: r.serializable,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: r.min_mod_revision,
        max_mod_revision: r.max_mod_revision,
        min_create_revision: r.min_create_revision,
        max_create_revision: r.max_create_revision,
    }
}

fn wire_put(p: &kvd::PutRequest) -> pb::PutRequest {
    pb::PutRequest {
        key: p.key.clone(),
        value: p.value.clone(),
        lease: p.lease,
        prev_kv: p.prev_kv,
        ignore_value: p.ignore_value,
        ignore_lease: p.ignore_lease,
    }
}

fn wire_delete_range(d: &kvd::DeleteRangeRequest) -> pb::DeleteRangeRequest {
    pb::DeleteRangeRequest {
        key: d.key.clone(),
        range_end: d.range_end.clone(),
        prev_kv: d.prev_kv,
    }
}

fn wire_txn(t: &kvd::TxnRequest) -> pb::TxnRequest {
    let ops = |ops: &[kvd::RequestOp]| -> Vec<pb::RequestOp> {
        ops.iter()
            .map(|op| pb::RequestOp {
                request: Some(match op {
                    kvd::RequestOp::Range(r) => Request::RequestRange(wire_range(r)),
                    kvd::RequestOp::Put(p) => Request::RequestPut(wire_put(p)),
                    kvd::RequestOp::DeleteRange(d) => {
                        Request::RequestDeleteRange(wire_delete_range(d))
                    }
                    kvd::RequestOp::Txn(t) => Request::RequestTxn(wire_txn(t)),
                }),
            })
            .collect()
    };
    pb::TxnRequest {
        compare: t.compare.iter().map(wire_compare).collect(),
        success: ops(&t.success),
        failure: ops(&t.failure),
    }
}

/// A compare as a client writes it: the operand in the oneof field matching its target, set
/// even when it is zero (protobuf then still writes it, and API-2 counts it).
fn wire_compare(c: &kvd::Compare) -> pb::Compare {
    let (target, target_union) = match &c.target {
        kvd::CompareTarget::Version(v) => (CompareTarget::Version, TargetUnion::Version(*v)),
        kvd::CompareTarget::Create(v) => (CompareTarget::Create, TargetUnion::CreateRevision(*v)),
        kvd::CompareTarget::Mod(v) => (CompareTarget::Mod, TargetUnion::ModRevision(*v)),
        kvd::CompareTarget::Value(v) => (CompareTarget::Value, TargetUnion::Value(v.clone())),
        kvd::CompareTarget::Lease(v) => (CompareTarget::Lease, TargetUnion::Lease(*v)),
    };
    pb::Compare {
        result: match c.result {
            kvd::CompareResult::Equal => CompareResult::Equal,
            kvd::CompareResult::Greater => CompareResult::Greater,
            kvd::CompareResult::Less => CompareResult::Less,
            kvd::CompareResult::NotEqual => CompareResult::NotEqual,
        } as i32,
        target: target as i32,
        key: c.key.clone(),
        range_end: c.range_end.clone(),
        target_union: Some(target_union),
    }
}

// ---------------------------------------------------------------------------------------------
// The operator API
// ---------------------------------------------------------------------------------------------

/// Decodes `body` as a `POST /api/v1` request body and runs the checks in the module doc.
pub fn operator_call(body: &[u8]) {
    let call = match operator::decode_call(body) {
        Ok(call) => call,
        Err(refusal) => {
            assert_eq!(refusal.code, StatusCode::BAD_REQUEST, "{refusal:?}");
            assert!(
                refusal.message.starts_with("Failed to "),
                "OPS-1: a refusal without Mesos's prefix: {refusal:?}"
            );
            return;
        }
    };
    if let Some(json) = call_json(&call) {
        let again = operator::decode_call(json.to_string().as_bytes()).map(|c| format!("{c:?}"));
        // Compared as text: a NaN amount is not equal to itself.
        assert_eq!(again, Ok(format!("{call:?}")), "written back as {json}");
    }
    if let Call::Write(request, options) = &call {
        if let Some(id) = &options.operation_id {
            assert!(
                kvd::validate_operation_id(id).is_ok(),
                "OPID-1: a bad id decoded: {id:?}"
            );
        }
        engine_checks(request);
    }
}

/// Runs the engine's pure checks on the values of a decoded call.
fn engine_checks(request: &AccountingRequest) {
    match request {
        AccountingRequest::UpdateQuota { configs, .. } => {
            for raw in configs {
                if let Ok(config) = quota::validate_config(raw) {
                    get_quota_round_trip(&config);
                }
            }
        }
        AccountingRequest::RegisterAgent { resources, .. } => scalars(resources),
        AccountingRequest::Record {
            role, resources, ..
        } => {
            let _ = quota::validate_role(role);
            scalars(resources);
        }
        AccountingRequest::Start { .. }
        | AccountingRequest::UpdatePrepareQueue { .. }
        | AccountingRequest::Remove { .. }
        | AccountingRequest::Repair
        | AccountingRequest::MarkAgentUnreachable { .. }
        | AccountingRequest::MarkAgentGone { .. }
        | AccountingRequest::RecoveredTimedOut => {}
    }
}

fn scalars(values: &BTreeMap<String, f64>) {
    for value in values.values() {
        let _ = Scalar::from_f64(*value);
        let _ = quota::format_input(*value);
    }
}

/// Prints `config` as GET_QUOTA does, sends the printed configuration back in an
/// UPDATE_QUOTA, and checks it validates to `config` (OPS-4) when every amount prints exactly.
fn get_quota_round_trip(config: &QuotaConfig) {
    let amounts = config.guarantees.iter().chain(config.limits.iter());
    if amounts
        .map(|(_, v)| v.milli())
        .any(|m| m >= EXACT_PRINT_MILLI_MAX)
    {
        return;
    }
    let printed = operator::get_quota_json(std::slice::from_ref(config));
    let printed_config = printed.pointer("/get_quota/status/configs/0").cloned();
    assert!(
        printed_config.is_some(),
        "GET_QUOTA printed no config: {printed}"
    );
    let body = json!({
        "type": "UPDATE_QUOTA",
        "update_quota": { "quota_configs": [printed_config] },
    });
    let decoded = operator::decode_call(body.to_string().as_bytes());
    let revalidated = match &decoded {
        Ok(Call::Write(AccountingRequest::UpdateQuota { configs, .. }, _)) => {
            configs.first().map(quota::validate_config)
        }
        _ => None,
    };
    assert_eq!(
        revalidated,
        Some(Ok(config.clone())),
        "OPS-4: {printed} does not read back (decoded {decoded:?})"
    );
}

/// Returns the JSON body of `call` as `docs/api.md` writes it, or `None` for a call no body
/// decodes to.
fn call_json(call: &Call) -> Option<Value> {
    Some(match call {
        Call::GetQuota => json!({ "type": "GET_QUOTA" }),
        Call::ReconcileConsumption { repair } => {
            call_body("RECONCILE_CONSUMPTION", json!({ "repair": repair }))
        }
        Call::GetAgents => json!({ "type": "GET_AGENTS" }),
        Call::ReconcileOperations { queries, prefix } => call_body(
            "RECONCILE_OPERATIONS",
            json!({
                "operations": queries
                    .iter()
                    .map(|q| json!({ "operation_id": q.operation_id, "agent_id": q.agent_id }))
                    .collect::<Vec<_>>(),
                "prefix": prefix,
            }),
        ),
        Call::Reconcile {
            tasks,
            partition_aware,
        } => call_body(
            "RECONCILE",
            json!({
                "tasks": tasks
                    .iter()
                    .map(|t| json!({ "task_id": t.task_id, "agent_id": t.agent_id }))
                    .collect::<Vec<_>>(),
                "partition_aware": partition_aware,
            }),
        ),
        Call::Write(request, options) => {
            let mut body = write_json(request)?;
            if let (Some(id), Value::Object(map)) = (&options.operation_id, &mut body) {
                map.insert("operation_id".to_owned(), Value::from(id.as_str()));
            }
            body
        }
    })
}

/// Returns the JSON body of a write call without its operation id, or `None` for a request
/// no body decodes to.
fn write_json(request: &AccountingRequest) -> Option<Value> {
    Some(match request {
        AccountingRequest::UpdateQuota { configs, force } => call_body(
            "UPDATE_QUOTA",
            json!({
                "force": force,
                "quota_configs": configs.iter().map(raw_config_json).collect::<Vec<_>>(),
            }),
        ),
        AccountingRequest::RegisterAgent {
            id,
            state,
            resources,
        } => call_body(
            "REGISTER_AGENT",
            json!({
                "agent_id": id,
                "state": state.name(),
                "resources": scalars_json(resources),
            }),
        ),
        AccountingRequest::Record {
            kind,
            id,
            role,
            agent,
            resources,
            prepare,
        } => call_body(
            match kind {
                RecordKind::Reservation => "RESERVE_RESOURCES",
                RecordKind::Allocation => "ALLOCATE",
            },
            // RESERVE_RESOURCES ignores `prepare`, and decodes to `false`.
            json!({
                "id": id,
                "role": role,
                "agent_id": agent,
                "resources": scalars_json(resources),
                "prepare": prepare,
            }),
        ),
        AccountingRequest::Start { id } => call_body("START", json!({ "id": id })),
        AccountingRequest::UpdatePrepareQueue {
            allocation_prepare_queue_length,
        } => call_body(
            "UPDATE_PREPARE_QUEUE",
            json!({ "allocation_prepare_queue_length": allocation_prepare_queue_length }),
        ),
        AccountingRequest::Remove { kind, id } => call_body(
            match kind {
                RecordKind::Reservation => "UNRESERVE_RESOURCES",
                RecordKind::Allocation => "RELEASE",
            },
            json!({ "id": id }),
        ),
        AccountingRequest::MarkAgentUnreachable { id } => {
            call_body("MARK_AGENT_UNREACHABLE", json!({ "agent_id": id }))
        }
        AccountingRequest::MarkAgentGone { id } => {
            call_body("MARK_AGENT_GONE", json!({ "agent_id": id }))
        }
        AccountingRequest::Repair | AccountingRequest::RecoveredTimedOut => return None,
    })
}

/// Returns a call of type `kind` whose arguments are `arguments`, in the object named after
/// the type in lower case.
fn call_body(kind: &str, arguments: Value) -> Value {
    let mut call = Map::new();
    call.insert("type".to_owned(), Value::from(kind));
    call.insert(kind.to_ascii_lowercase(), arguments);
    Value::Object(call)
}

fn raw_config_json(config: &RawQuotaConfig) -> Value {
    json!({
        "role": config.role,
        "guarantees": scalars_json(&config.guarantees),
        "limits": scalars_json(&config.limits),
    })
}

/// A `map<string, Value.Scalar>`: whole values as JSON integers, the rest (fractions, -0,
/// infinities, NaN) as strings, which read back exactly (Rust prints doubles round-trip).
fn scalars_json(values: &BTreeMap<String, f64>) -> Value {
    Value::Object(
        values
            .iter()
            .map(|(name, value)| {
                let whole = value.fract() == 0.0
                    && value.abs() < WHOLE_F64_MAX
                    && !(*value == 0.0 && value.is_sign_negative());
                let number = if whole {
                    // Exact: a whole double below 2^53 converts to i64 without loss.
                    Value::from(*value as i64)
                } else {
                    Value::from(value.to_string())
                };
                (name.clone(), json!({ "value": number }))
            })
            .collect(),
    )
}
