//! etcd's gRPC JSON gateway on the client port: `POST /v3/<service>/<method>` (and 3.4's
//! `/v3beta/` alias) with a JSON body, answered by the same service implementations the
//! gRPC server uses.
//!
//! Owns: the gateway's paths, the JSON decoding of requests, the JSON answers and errors,
//! and the HTTP status of each gRPC code.
//!
//! Invariants:
//! - GW-1: every gateway call goes to the gRPC service object of its method, so its
//!   semantics, errors and messages are the gRPC ones; the gateway only decodes and encodes.
//! - GW-2: JSON is etcd's gateway mapping, generated from the protobuf descriptors
//!   (BUILD-3): proto field names, bytes as base64, 64-bit integers as strings, enum names,
//!   zero values left out. Requests may send 64-bit integers as strings or numbers, enums as
//!   names or numbers, and leave fields out (zero); unknown fields are ignored; a body with
//!   no `Content-Type` is read as JSON; an empty or `null` body is the all-zero request; what follows
//!   the first JSON value is ignored; a `null` field is absent; an enum number etcd does
//!   not define reaches the service as that number, as etcd's gateway passes it on
//!   (`enums.rs`); a base64 bytes field is read as etcd's gateway reads it (Go's
//!   `StdEncoding`: `\r` and `\n` skipped, the last symbol's extra bits ignored), and also
//!   unpadded or URL-safe (`base64.rs`).
//! - GW-3: an error is `{"error":M,"message":M,"code":N}` with the gRPC code N and the HTTP
//!   status etcd 3.4's gateway gives that code ([`http_status`]); a body that is not JSON
//!   of the request type is code 3 (InvalidArgument), HTTP 400.
//! - GW-4: every gateway call is counted in the gRPC metrics under its gRPC method, as
//!   etcd's gateway calls are (etcd's gateway is a gRPC client of its own server).
//! - GW-5: the streaming methods (`/v3/watch`, `/v3/lease/keepalive`,
//!   `/v3/maintenance/snapshot`, `/v3/election/observe`) answer one JSON object per message,
//!   each followed by a newline, wrapped as `{"result":{...}}` (`stream.rs`).
//! - GW-6: a unary call's `Grpc-Timeout` header is its deadline, as etcd's gateway reads it
//!   (HTTP-7): past it, 504 with code 4 `context deadline exceeded`.
//!
//! Contact points: `server::http` merges [`router`] into the client port's router; the
//! services in `kv.rs`, `lease.rs`, `watch.rs`, `maintenance.rs`, `cluster.rs`, `auth.rs`,
//! `lock.rs`, `election.rs`.

mod base64;
mod enums;
mod stream;

use std::future::Future;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Code, Status};

use crate::auth::AuthService;
use crate::cluster::ClusterService;
use crate::election::ElectionService;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::lock::LockService;
use crate::maintenance::MaintenanceService;
use crate::metrics::Metrics;
use crate::node::Node;
use crate::pb::etcdserverpb::auth_server::Auth;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::v3electionpb::election_server::Election;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::snapshot::Snapshots;
use crate::watch::WatchService;
use kvd::sync::Arc;

/// The path prefixes the gateway answers under: etcd 3.4 serves both.
pub const GATEWAY_PREFIXES: [&str; 2] = ["/v3", "/v3beta"];
/// JSON takes more room than protobuf (base64 adds a third to bytes, names and quotes
/// the rest), so a request body may be this many times the gRPC receive limit.
pub const JSON_BODY_FACTOR: usize = 2;

/// What the gateway's handlers share: the services and the metrics.
#[derive(Debug, Clone)]
pub struct Gateway {
    kv: KvService,
    lease: LeaseService,
    watch: WatchService,
    maintenance: MaintenanceService,
    cluster: ClusterService,
    auth: AuthService,
    lock: LockService,
    election: ElectionService,
    metrics: Arc<Metrics>,
    max_receive_bytes: usize,
}

/// Returns the gateway's routes, to merge into the client port's router. `max_receive_bytes`
/// is the gRPC receive limit (SRV-2).
pub fn router(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    snapshots: Arc<Snapshots>,
    max_receive_bytes: usize,
) -> axum::Router {
    let gateway = Gateway {
        kv: KvService::new(node.clone()),
        lease: LeaseService::new(node.clone()),
        watch: WatchService::new(node.clone()),
        maintenance: MaintenanceService::new(node.clone(), snapshots),
        cluster: ClusterService::new(node.clone()),
        auth: AuthService::new(node.clone()),
        lock: LockService::new(node.clone()),
        election: ElectionService::new(node),
        metrics,
        max_receive_bytes,
    };
    let mut router = axum::Router::new();
    for (path, route) in routes(&gateway) {
        for prefix in GATEWAY_PREFIXES {
            router = router.route(&format!("{prefix}{path}"), route.clone());
        }
    }
    router.layer(DefaultBodyLimit::max(
        max_receive_bytes.saturating_mul(JSON_BODY_FACTOR),
    ))
}

/// Declares the route of a unary method: `service` is a field of [`Gateway`], `method` the
/// method of its tonic trait, `grpc` its gRPC path (GW-1, GW-4).
macro_rules! unary {
    ($gateway:expr, $service:ident . $method:ident, $grpc:literal) => {{
        let gateway = $gateway.clone();
        post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let gateway = gateway.clone();
            async move {
                let service = gateway.$service.clone();
                unary(&gateway, $grpc, &headers, body, |request| {
                    let request = with_token(&headers, request);
                    async move { service.$method(request).await }
                })
                .await
            }
        })
    }};
}

/// Returns the gRPC request of a gateway call, with the HTTP `Authorization` header as
/// `authorization` metadata, as etcd's gateway forwards it (`server::auth` reads it).
fn with_token<T>(headers: &axum::http::HeaderMap, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| tonic::metadata::MetadataValue::try_from(v).ok());
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token);
    }
    request
}

/// Returns every gateway path (after the prefix) with its route.
fn routes(g: &Gateway) -> Vec<(&'static str, MethodRouter)> {
    vec![
        ("/kv/range", unary!(g, kv.range, "/etcdserverpb.KV/Range")),
        ("/kv/put", unary!(g, kv.put, "/etcdserverpb.KV/Put")),
        (
            "/kv/deleterange",
            unary!(g, kv.delete_range, "/etcdserverpb.KV/DeleteRange"),
        ),
        ("/kv/txn", unary!(g, kv.txn, "/etcdserverpb.KV/Txn")),
        (
            "/kv/compaction",
            unary!(g, kv.compact, "/etcdserverpb.KV/Compact"),
        ),
        ("/watch", stream::watch_route(g)),
        (
            "/lease/grant",
            unary!(g, lease.lease_grant, "/etcdserverpb.Lease/LeaseGrant"),
        ),
        (
            "/lease/revoke",
            unary!(g, lease.lease_revoke, "/etcdserverpb.Lease/LeaseRevoke"),
        ),
        (
            "/kv/lease/revoke",
            unary!(g, lease.lease_revoke, "/etcdserverpb.Lease/LeaseRevoke"),
        ),
        ("/lease/keepalive", stream::keep_alive_route(g)),
        (
            "/lease/timetolive",
            unary!(
                g,
                lease.lease_time_to_live,
                "/etcdserverpb.Lease/LeaseTimeToLive"
            ),
        ),
        (
            "/kv/lease/timetolive",
            unary!(
                g,
                lease.lease_time_to_live,
                "/etcdserverpb.Lease/LeaseTimeToLive"
            ),
        ),
        (
            "/lease/leases",
            unary!(g, lease.lease_leases, "/etcdserverpb.Lease/LeaseLeases"),
        ),
        (
            "/kv/lease/leases",
            unary!(g, lease.lease_leases, "/etcdserverpb.Lease/LeaseLeases"),
        ),
        (
            "/cluster/member/add",
            unary!(g, cluster.member_add, "/etcdserverpb.Cluster/MemberAdd"),
        ),
        (
            "/cluster/member/remove",
            unary!(
                g,
                cluster.member_remove,
                "/etcdserverpb.Cluster/MemberRemove"
            ),
        ),
        (
            "/cluster/member/update",
            unary!(
                g,
                cluster.member_update,
                "/etcdserverpb.Cluster/MemberUpdate"
            ),
        ),
        (
            "/cluster/member/list",
            unary!(g, cluster.member_list, "/etcdserverpb.Cluster/MemberList"),
        ),
        (
            "/cluster/member/promote",
            unary!(
                g,
                cluster.member_promote,
                "/etcdserverpb.Cluster/MemberPromote"
            ),
        ),
        (
            "/maintenance/alarm",
            unary!(g, maintenance.alarm, "/etcdserverpb.Maintenance/Alarm"),
        ),
        (
            "/maintenance/status",
            unary!(g, maintenance.status, "/etcdserverpb.Maintenance/Status"),
        ),
        (
            "/maintenance/defragment",
            unary!(
                g,
                maintenance.defragment,
                "/etcdserverpb.Maintenance/Defragment"
            ),
        ),
        (
            "/maintenance/hash",
            unary!(g, maintenance.hash, "/etcdserverpb.Maintenance/Hash"),
        ),
        (
            "/maintenance/hashkv",
            unary!(g, maintenance.hash_kv, "/etcdserverpb.Maintenance/HashKV"),
        ),
        ("/maintenance/snapshot", stream::snapshot_route(g)),
        (
            "/maintenance/transfer-leadership",
            unary!(
                g,
                maintenance.move_leader,
                "/etcdserverpb.Maintenance/MoveLeader"
            ),
        ),
        (
            "/maintenance/downgrade",
            unary!(
                g,
                maintenance.downgrade,
                "/etcdserverpb.Maintenance/Downgrade"
            ),
        ),
        (
            "/auth/enable",
            unary!(g, auth.auth_enable, "/etcdserverpb.Auth/AuthEnable"),
        ),
        (
            "/auth/disable",
            unary!(g, auth.auth_disable, "/etcdserverpb.Auth/AuthDisable"),
        ),
        (
            "/auth/status",
            unary!(g, auth.auth_status, "/etcdserverpb.Auth/AuthStatus"),
        ),
        (
            "/auth/authenticate",
            unary!(g, auth.authenticate, "/etcdserverpb.Auth/Authenticate"),
        ),
        (
            "/auth/user/add",
            unary!(g, auth.user_add, "/etcdserverpb.Auth/UserAdd"),
        ),
        (
            "/auth/user/get",
            unary!(g, auth.user_get, "/etcdserverpb.Auth/UserGet"),
        ),
        (
            "/auth/user/list",
            unary!(g, auth.user_list, "/etcdserverpb.Auth/UserList"),
        ),
        (
            "/auth/user/delete",
            unary!(g, auth.user_delete, "/etcdserverpb.Auth/UserDelete"),
        ),
        (
            "/auth/user/changepw",
            unary!(
                g,
                auth.user_change_password,
                "/etcdserverpb.Auth/UserChangePassword"
            ),
        ),
        (
            "/auth/user/grant",
            unary!(g, auth.user_grant_role, "/etcdserverpb.Auth/UserGrantRole"),
        ),
        (
            "/auth/user/revoke",
            unary!(
                g,
                auth.user_revoke_role,
                "/etcdserverpb.Auth/UserRevokeRole"
            ),
        ),
        (
            "/auth/role/add",
            unary!(g, auth.role_add, "/etcdserverpb.Auth/RoleAdd"),
        ),
        (
            "/auth/role/get",
            unary!(g, auth.role_get, "/etcdserverpb.Auth/RoleGet"),
        ),
        (
            "/auth/role/list",
            unary!(g, auth.role_list, "/etcdserverpb.Auth/RoleList"),
        ),
        (
            "/auth/role/delete",
            unary!(g, auth.role_delete, "/etcdserverpb.Auth/RoleDelete"),
        ),
        (
            "/auth/role/grant",
            unary!(
                g,
                auth.role_grant_permission,
                "/etcdserverpb.Auth/RoleGrantPermission"
            ),
        ),
        (
            "/auth/role/revoke",
            unary!(
                g,
                auth.role_revoke_permission,
                "/etcdserverpb.Auth/RoleRevokePermission"
            ),
        ),
        ("/lock/lock", unary!(g, lock.lock, "/v3lockpb.Lock/Lock")),
        (
            "/lock/unlock",
            unary!(g, lock.unlock, "/v3lockpb.Lock/Unlock"),
        ),
        (
            "/election/campaign",
            unary!(g, election.campaign, "/v3electionpb.Election/Campaign"),
        ),
        (
            "/election/proclaim",
            unary!(g, election.proclaim, "/v3electionpb.Election/Proclaim"),
        ),
        (
            "/election/leader",
            unary!(g, election.leader, "/v3electionpb.Election/Leader"),
        ),
        ("/election/observe", stream::observe_route(g)),
        (
            "/election/resign",
            unary!(g, election.resign, "/v3electionpb.Election/Resign"),
        ),
    ]
}

/// Decodes `body` as a `Req`, calls the service within the deadline the `Grpc-Timeout`
/// header sets (HTTP-7, as etcd's gateway reads it) and answers its response or error as
/// JSON (GW-2, GW-3), counted under `grpc_method` (GW-4).
async fn unary<Req, Resp, F, Fut>(
    gateway: &Gateway,
    grpc_method: &str,
    headers: &axum::http::HeaderMap,
    body: Bytes,
    call: F,
) -> Response
where
    Req: DeserializeOwned + Default + GatewayRequest,
    Resp: Serialize,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    gateway.metrics.start(grpc_method);
    let started = Instant::now();
    let called = match (
        decode::<Req>(&body),
        crate::http::deadline(headers, started),
    ) {
        (Err(status), _) | (_, Err(status)) => Err(status),
        (Ok(request), Ok(deadline)) => crate::http::before(deadline, || call(request))
            .await
            .and_then(|answer| answer),
    };
    let (code, response) = match called {
        Err(status) => (status.code(), error_response(&status)),
        Ok(answer) => match serde_json::to_vec(answer.get_ref()) {
            Ok(json) => (Code::Ok, json_response(StatusCode::OK, json)),
            Err(e) => {
                let status = Status::internal(format!("kvd: gateway: encode the answer: {e}"));
                (status.code(), error_response(&status))
            }
        },
    };
    gateway.metrics.record(grpc_method, code, started.elapsed());
    crate::connection_threads::note_answer(code);
    response
}

/// What the gateway knows of a request beyond its generated JSON mapping.
pub trait GatewayRequest {
    /// The JSON names of its bytes fields, read as Go reads base64 (GW-B64-1, GW-B64-2).
    const BYTES_FIELDS: &'static [&'static str] = &base64::BYTES_FIELDS;

    /// Puts back the enum numbers of `json`, the request as sent (GW-ENUM-1).
    fn restore(&mut self, _json: &serde_json::Value) {}
}

/// Decodes a request body (GW-2): an empty body (whitespace only) is the all-zero request.
fn decode<Req: DeserializeOwned + Default + GatewayRequest>(body: &[u8]) -> Result<Req, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Req::default());
    }
    // etcd's gateway reads the first JSON value of the body and ignores what follows it.
    let value = match serde_json::Deserializer::from_slice(body)
        .into_iter::<serde_json::Value>()
        .next()
    {
        // A `null` body leaves every field at zero, as Go's JSON decoding of it does.
        Some(Ok(serde_json::Value::Null)) | None => return Ok(Req::default()),
        Some(Ok(value)) => value,
        Some(Err(e)) => return Err(Status::invalid_argument(e.to_string())),
    };
    decode_value(value).map_err(Status::invalid_argument)
}

/// Decodes one JSON value as a `Req` (GW-2, GW-ENUM-1, GW-B64-1), or returns the decoder's
/// error.
fn decode_value<Req: DeserializeOwned + GatewayRequest>(
    value: serde_json::Value,
) -> Result<Req, String> {
    let mut value = without_nulls(value);
    base64::as_go_reads_bytes(&mut value, Req::BYTES_FIELDS);
    let mut request: Req =
        serde_json::from_value(enums::without_enum_numbers(&value)).map_err(|e| e.to_string())?;
    request.restore(&value);
    Ok(request)
}

/// Returns `value` without the object fields that are `null`: proto3's JSON mapping reads a
/// null as the field's default, which pbjson accepts for messages only.
fn without_nulls(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// Returns a 200 or error answer with a JSON body, with the headers etcd's gateway sends.
fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    let mut response = (code, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // grpc-gateway passes the gRPC answer's metadata on as `Grpc-Metadata-*`.
    headers.insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The JSON of an error answer (GW-3).
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
    code: i32,
}

/// Returns etcd's gateway answer for `status` (GW-3).
fn error_response(status: &Status) -> Response {
    let body = ErrorBody {
        error: status.message(),
        message: status.message(),
        code: status.code() as i32,
    };
    // Three plain fields always serialize; the fallback only keeps the function total.
    let json = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
    json_response(http_status(status.code()), json)
}

/// Returns the HTTP status etcd 3.4's gateway (grpc-gateway 1.9) answers for a gRPC code
/// (GW-3; no `_` arm, so every code is decided).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb as pb;

    #[test]
    fn requests_accept_what_gateway_clients_send() {
        let range: pb::RangeRequest = decode(
            br#"{"key":"YQ==","limit":"5","revision":7,"sort_order":"DESCEND","sort_target":2,"bogus":1}"#,
        )
        .unwrap();
        assert_eq!(range.key.as_ref(), b"a");
        assert_eq!((range.limit, range.revision), (5, 7));
        assert_eq!((range.sort_order, range.sort_target), (2, 2));
        let empty: pb::RangeRequest = decode(b" \n").unwrap();
        assert_eq!(empty, pb::RangeRequest::default());
        let compare: pb::TxnRequest =
            decode(br#"{"compare":[{"key":"YQ==","target":"VALUE","value":"Yg=="}]}"#).unwrap();
        assert_eq!(compare.compare[0].result, 0, "an absent result is EQUAL");
        let trailing: pb::RangeRequest = decode(br#"{"key":"YQ=="} trailing"#).unwrap();
        assert_eq!(trailing.key.as_ref(), b"a");
        let null: pb::RangeRequest = decode(br#"{"key":"YQ==","limit":null}"#).unwrap();
        assert_eq!(null.limit, 0);
        let null_body: pb::RangeRequest = decode(b" null ").unwrap();
        assert_eq!(null_body, pb::RangeRequest::default());
        let bad = decode::<pb::RangeRequest>(b"{bad").unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument);
    }

    #[test]
    fn answers_use_etcds_json_mapping() {
        let answer = pb::RangeResponse {
            header: Some(pb::ResponseHeader {
                cluster_id: u64::MAX,
                member_id: 1,
                revision: 2,
                raft_term: 0,
            }),
            kvs: vec![crate::pb::mvccpb::KeyValue {
                key: bytes::Bytes::from_static(b"a"),
                create_revision: 2,
                ..Default::default()
            }],
            more: false,
            count: 1,
            encoded_kvs: bytes::Bytes::new(),
        };
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"header":{"cluster_id":"18446744073709551615","member_id":"1","revision":"2"},"kvs":[{"key":"YQ==","create_revision":"2"}],"count":"1"}"#
        );
    }

    #[test]
    fn errors_get_etcds_http_status() {
        assert_eq!(
            http_status(Code::FailedPrecondition),
            StatusCode::PRECONDITION_FAILED
        );
        assert_eq!(http_status(Code::OutOfRange), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
    }
}
