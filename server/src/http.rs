//! The client port's router: etcd's gRPC services (h2c), its JSON gateway (`/v3/...`,
//! `server::gateway`) and the HTTP routes `/health`, `/version` and `/metrics` (HTTP/1.1
//! or h2c) on one listener, as etcd serves them.
//!
//! Owns: routing, the per-request metrics and log line, and the HTTP answers.
//!
//! Invariants:
//! - HTTP-1: every gRPC request is counted and timed once (`server::metrics`), whatever its
//!   outcome, including requests to unknown methods.
//! - HTTP-2: a gRPC message over the receive limit is answered as etcd's gRPC-go server
//!   answers it: `ResourceExhausted "grpc: received message larger than max (N vs. M)"`.
//!   tonic says the same thing with another code and text; [`etcd_oversize_status`]
//!   rewrites it.
//! - HTTP-3: `/health` answers 200 only when the engine answers a status request and no
//!   alarm is active other than those named by `?exclude=<TYPE>`; otherwise 503 with
//!   `ALARM <TYPE>` or the engine's error as the reason (etcd 3.5+), or
//!   `STORAGE POISONED: ...` while the store waits for its reopen (RECOVERY-1).
//! - HTTP-4: a path no route knows gets gRPC `Unimplemented` if the request is gRPC, else a
//!   plain 404.
//! - HTTP-5: the body of a gRPC request to a method that takes one message passes through
//!   `server::single_message` (ONE-1), so a second message is an `INTERNAL` error.
//! - HTTP-6: a request with a gRPC content type goes straight to the gRPC service its path
//!   names ([`ClientPort::answer`], [`GrpcServices::call`]): counted, timed and wrapped by
//!   [`track`] and nothing else, with no router and no body conversion on the way in.
//!   Every other request goes to the router of the HTTP routes, behind the CORS layer; its
//!   routes include the gRPC services too, so a gRPC path asked without the gRPC content
//!   type is refused by tonic as before. (axum's middleware on every gRPC call cost about
//!   7 % of the server's CPU per put under etcd's 64-client benchmark:
//!   docs/benchmarks-server.md.)
//! - HTTP-7: a gRPC request's `grpc-timeout` is its deadline, counted from the arrival of its
//!   headers: a call still running then is dropped and answered `DeadlineExceeded "context
//!   deadline exceeded"`, and one whose deadline has passed before it is called (a timeout
//!   of zero, or a few nanoseconds) is not called at all, so it changes nothing. A write the
//!   engine has already taken in is applied all the same, as etcd applies a proposal whose
//!   caller gave up. A malformed `grpc-timeout` gets `Internal` and nothing runs.
//!
//! Contact points: `server::run` serves this router; the gRPC services live in `kv.rs`,
//! `lease.rs`, `watch.rs`, `maintenance.rs`, `cluster.rs`, `auth.rs`, `health.rs`, `lock.rs`
//! and `election.rs`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::service::TowerToHyperService;
use tonic::codegen::Service as _;
use tonic::service::Routes;
use tonic::{Code, Status};

use crate::auth::AuthService;
use crate::cluster::ClusterService;
use crate::connection_threads;
use crate::connections::Connections;
use crate::cors::{self, Cors};
use crate::election::ElectionService;
use crate::gateway;
use crate::health::HealthService;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::lock::LockService;
use crate::maintenance::MaintenanceService;
use crate::metrics::{EngineGauges, Metrics, ServerGauges, StreamGauges};
use crate::node::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION, Node};
use crate::operator;
use crate::pb::etcdserverpb::auth_server::AuthServer;
use crate::pb::etcdserverpb::cluster_server::ClusterServer;
use crate::pb::etcdserverpb::kv_server::KvServer;
use crate::pb::etcdserverpb::lease_server::LeaseServer;
use crate::pb::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::pb::etcdserverpb::watch_server::WatchServer;
use crate::pb::grpc_health_v1::health_server::HealthServer;
use crate::pb::v3electionpb::election_server::ElectionServer;
use crate::pb::v3lockpb::lock_server::LockServer;
use crate::single_message::{self, SingleMessage};
use crate::snapshot::Snapshots;
use crate::watch::WatchService;
use kvd::sync::{Arc, Ordering};

/// The text tonic gives a message over the receive limit, before the numbers.
const TONIC_OVERSIZE_PREFIX: &str = "Error, decoded message length too large: found ";

/// State the middleware and the HTTP routes share.
#[derive(Debug, Clone)]
struct Shared {
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    connections: Arc<Connections>,
}

/// The client port's two ways in (HTTP-6): the gRPC services alone, for requests with a
/// gRPC content type, and the router of everything, behind the CORS layer, for the rest.
#[derive(Debug, Clone)]
pub struct ClientPort {
    grpc: GrpcServices,
    http: TowerToHyperService<axum::Router>,
    shared: Arc<Shared>,
}

/// A request's answer on the client port.
pub type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// A gRPC request's body: hyper's, held to one message where the method takes one (HTTP-5).
type GrpcBody = SingleMessage<Incoming>;

/// A gRPC answer before it becomes the client port's response.
type GrpcAnswer = Pin<
    Box<dyn Future<Output = Result<axum::http::Response<tonic::body::Body>, Infallible>> + Send>,
>;

/// etcd's gRPC services (the six of `etcdserverpb`, Lock, Election) and the standard health
/// service, called by the service name in the request's path (HTTP-6).
/// tonic's generated services are always ready (their `poll_ready` returns `Ready`), so
/// `call` goes to them without asking.
#[derive(Debug, Clone)]
struct GrpcServices {
    kv: KvServer<KvService>,
    watch: WatchServer<WatchService>,
    lease: LeaseServer<LeaseService>,
    maintenance: MaintenanceServer<MaintenanceService>,
    cluster: ClusterServer<ClusterService>,
    auth: AuthServer<AuthService>,
    health: HealthServer<HealthService>,
    lock: LockServer<LockService>,
    election: ElectionServer<ElectionService>,
}

impl GrpcServices {
    /// Calls the service `request`'s path names (`/etcdserverpb.<Service>/<Method>`,
    /// `/v3lockpb.Lock/...`, `/v3electionpb.Election/...`, `/grpc.health.v1.Health/...`); a
    /// path naming no service gets `Unimplemented` (HTTP-4), and a method its service does
    /// not have gets tonic's `Unimplemented`.
    fn call(&self, request: Request<GrpcBody>) -> GrpcAnswer {
        let path = request.uri().path();
        if path.starts_with("/grpc.health.v1.Health/") {
            return self.health.clone().call(request);
        }
        if path.starts_with("/v3lockpb.Lock/") {
            return self.lock.clone().call(request);
        }
        if path.starts_with("/v3electionpb.Election/") {
            return self.election.clone().call(request);
        }
        let service = request
            .uri()
            .path()
            .strip_prefix("/etcdserverpb.")
            .and_then(|rest| rest.split_once('/'))
            .map(|(service, _)| service);
        match service {
            Some("KV") => self.kv.clone().call(request),
            Some("Watch") => self.watch.clone().call(request),
            Some("Lease") => self.lease.clone().call(request),
            Some("Maintenance") => self.maintenance.clone().call(request),
            Some("Cluster") => self.cluster.clone().call(request),
            Some("Auth") => self.auth.clone().call(request),
            _ => {
                let answer = unknown_grpc_method(request.uri().path()).into_http();
                Box::pin(std::future::ready(Ok(answer)))
            }
        }
    }
}

impl ClientPort {
    /// Answers `request`: one with a gRPC content type is counted, timed and logged, its
    /// body held to one message where the method takes one, and tonic's oversize status
    /// rewritten as etcd's (HTTP-1, HTTP-2, HTTP-5); any other goes to the HTTP routes.
    pub fn answer(&self, request: Request<Incoming>) -> Answer {
        if !has_grpc_content_type(request.headers()) {
            return Box::pin(self.http.call(request));
        }
        let shared = self.shared.clone();
        let grpc = self.grpc.clone();
        Box::pin(async move { Ok(track(&shared, &grpc, request).await) })
    }
}

/// Returns the client port. `max_receive_bytes` is the gRPC receive limit (etcd:
/// `--max-request-bytes` + 512 KiB); `cors` the origins `--cors` allows.
pub fn router(
    node: Arc<Node>,
    metrics: Arc<Metrics>,
    connections: Arc<Connections>,
    snapshots: Arc<Snapshots>,
    max_receive_bytes: usize,
    cors: Cors,
) -> ClientPort {
    let shared = Shared {
        node: node.clone(),
        metrics: metrics.clone(),
        connections,
    };
    let gateway = gateway::router(node.clone(), metrics, snapshots.clone(), max_receive_bytes);
    let grpc = GrpcServices {
        kv: KvServer::new(KvService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        maintenance: MaintenanceServer::new(MaintenanceService::new(node.clone(), snapshots))
            .max_decoding_message_size(max_receive_bytes),
        cluster: ClusterServer::new(ClusterService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        auth: AuthServer::new(AuthService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        watch: WatchServer::new(WatchService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        lease: LeaseServer::new(LeaseService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        health: HealthServer::new(HealthService),
        lock: LockServer::new(LockService::new(node.clone()))
            .max_decoding_message_size(max_receive_bytes),
        election: ElectionServer::new(ElectionService::new(node))
            .max_decoding_message_size(max_receive_bytes),
    };
    let routes = Routes::new(grpc.kv.clone())
        .add_service(grpc.maintenance.clone())
        .add_service(grpc.cluster.clone())
        .add_service(grpc.auth.clone())
        .add_service(grpc.watch.clone())
        .add_service(grpc.lease.clone())
        .add_service(grpc.health.clone())
        .add_service(grpc.lock.clone())
        .add_service(grpc.election.clone());
    let http = routes
        .into_axum_router()
        .route("/health", get(health).with_state(shared.clone()))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text).with_state(shared.clone()))
        .route(
            "/api/v1",
            axum::routing::post(operator::api).with_state(shared.node.clone()),
        )
        .route(
            "/roles",
            get(operator::roles).with_state(shared.node.clone()),
        )
        .merge(gateway)
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(Arc::new(cors), cors::cors));
    ClientPort {
        grpc,
        http: TowerToHyperService::new(http),
        shared: Arc::new(shared),
    }
}

/// Returns true if `headers` name a gRPC content type (`application/grpc` or a subtype).
fn has_grpc_content_type(headers: &header::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Runs a gRPC request through `grpc` (the gRPC services), counting, timing and logging it
/// (HTTP-1), and gives an oversized message etcd's answer (HTTP-2).
async fn track(shared: &Shared, grpc: &GrpcServices, request: Request<Incoming>) -> Response {
    let path = request.uri().path().to_owned();
    // ONE-1: a method that takes one request message refuses a second.
    let request = if single_message::is_client_streaming(&path) {
        request.map(SingleMessage::passing)
    } else {
        request.map(SingleMessage::wrap)
    };
    shared.metrics.start(&path);
    let started = Instant::now();
    // HTTP-7.
    let answered = match deadline(request.headers(), started) {
        Err(malformed) => Ok(malformed.into_http()),
        Ok(deadline) => match before(deadline, || grpc.call(request)).await {
            Ok(answer) => answer,
            Err(late) => Ok(late.into_http()),
        },
    };
    let response = match answered {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    };
    let response = match Status::from_header_map(response.headers()) {
        Some(status) => match etcd_oversize_status(&status) {
            Some(rewritten) => rewritten.into_http::<Body>(),
            None => response,
        },
        None => response,
    };
    let elapsed = started.elapsed();
    // A unary answer that succeeded carries its status in the trailers, which this layer
    // does not wait for; an answer without a status in its head succeeded.
    let code = Status::from_header_map(response.headers()).map_or(Code::Ok, |s| s.code());
    shared.metrics.record(&path, code, elapsed);
    connection_threads::note_answer(code);
    let elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    match code {
        Code::Internal | Code::DataLoss | Code::Unavailable | Code::Unknown => {
            tracing::warn!(method = %path, code = ?code, elapsed_us, "grpc request failed");
        }
        _ => tracing::debug!(method = %path, code = ?code, elapsed_us, "grpc request"),
    }
    response
}

/// Returns the deadline of a request that arrived at `arrived` (HTTP-7): its `grpc-timeout`
/// after that, or `None` without one; a malformed `grpc-timeout` is an `Internal` status.
/// etcd's JSON gateway reads the same header, so `server::gateway` calls this too.
pub(crate) fn deadline(
    headers: &axum::http::HeaderMap,
    arrived: Instant,
) -> Result<Option<tokio::time::Instant>, Status> {
    let timeout = grpc_timeout(headers)?;
    Ok(timeout.map(|timeout| tokio::time::Instant::from_std(arrived) + timeout))
}

/// Runs the call `start` makes, unless `deadline` has passed already; drops it if it is
/// still running at `deadline` (HTTP-7). Either way the answer is gRPC-go's status for a
/// passed deadline, which etcd passes on.
pub(crate) async fn before<F: Future>(
    deadline: Option<tokio::time::Instant>,
    start: impl FnOnce() -> F,
) -> Result<F::Output, Status> {
    let late = || Status::deadline_exceeded("context deadline exceeded");
    match deadline {
        None => Ok(start().await),
        Some(deadline) if tokio::time::Instant::now() >= deadline => Err(late()),
        Some(deadline) => tokio::time::timeout_at(deadline, start())
            .await
            .map_err(|_| late()),
    }
}

/// Reads a request's `grpc-timeout` (HTTP-7): at most eight digits and a unit (`H`, `M`,
/// `S`, `m`, `u`, `n`); `None` when the header is absent.
fn grpc_timeout(headers: &axum::http::HeaderMap) -> Result<Option<Duration>, Status> {
    let Some(value) = headers.get("grpc-timeout") else {
        return Ok(None);
    };
    let malformed = || Status::internal(format!("malformed grpc-timeout: {value:?}"));
    let text = value.to_str().map_err(|_| malformed())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let amount: u64 = digits.parse().map_err(|_| malformed())?;
    let timeout = match unit {
        "H" => Duration::from_secs(amount * 3_600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    };
    Ok(Some(timeout))
}

/// Returns etcd's status for tonic's "message too large" status, or `None` for any other
/// status (HTTP-2).
fn etcd_oversize_status(status: &Status) -> Option<Status> {
    if status.code() != Code::OutOfRange {
        return None;
    }
    let rest = status.message().strip_prefix(TONIC_OVERSIZE_PREFIX)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    let found: u64 = found.parse().ok()?;
    let limit: u64 = limit.parse().ok()?;
    Some(Status::resource_exhausted(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    )))
}

/// `GET /health` (HTTP-3), etcd 3.5+'s body shape: 503 with `ALARM <TYPE>` while an alarm
/// not named by `?exclude=<TYPE>` is active, or when the engine does not answer.
async fn health(State(shared): State<Shared>, RawQuery(query): RawQuery) -> Response {
    let excluded: Vec<String> = query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.strip_prefix("exclude="))
        .map(str::to_owned)
        .collect();
    if let Some(refusal) = shared.node.engines.refusal() {
        // RECOVERY-1: a poisoned store outranks the alarms; the reason says what kvd waits for.
        let reason = json_escape(&format!("STORAGE POISONED: {refusal}"));
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{{\"health\":\"false\",\"reason\":\"{reason}\"}}"),
        );
    }
    match shared.node.status() {
        Ok(status) => {
            let active = status
                .alarms
                .iter()
                .find(|a| !excluded.iter().any(|e| e == a.alarm.name()));
            match active {
                None => json(
                    StatusCode::OK,
                    "{\"health\":\"true\",\"reason\":\"\"}".to_owned(),
                ),
                Some(alarm) => json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "{{\"health\":\"false\",\"reason\":\"ALARM {}\"}}",
                        alarm.alarm.name()
                    ),
                ),
            }
        }
        Err(status) => {
            let reason = json_escape(status.message());
            json(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{{\"health\":\"false\",\"reason\":\"{reason}\"}}"),
            )
        }
    }
}

/// `GET /version`.
async fn version() -> Response {
    json(
        StatusCode::OK,
        format!(
            "{{\"etcdserver\":\"{ETCD_SERVER_VERSION}\",\"etcdcluster\":\"{ETCD_CLUSTER_VERSION}\"}}"
        ),
    )
}

/// `GET /metrics`: Prometheus text format (MET-3: the engine is asked now).
async fn metrics_text(State(shared): State<Shared>) -> Response {
    let engine = shared
        .node
        .call(|engine| {
            Ok(EngineGauges {
                status: engine.status()?,
                watchers: engine.watchers()?,
                leases: engine.lease_leases()?.leases.len(),
                roles: engine.roles()?,
                apply: engine.apply_stats()?,
                allocation_prepare_queue: engine.allocation_prepare_queue()?,
                agents: EngineGauges::count_agents(engine.agents()?.values()),
                consumption_drift_rows: None,
                disk: engine.disk_timings()?,
            })
        })
        .await
        .ok()
        .map(|gauges| EngineGauges {
            consumption_drift_rows: shared.node.consumption_drift_rows.get(),
            ..gauges
        });
    let streams = StreamGauges {
        watch: shared.node.streams.watch.load(Ordering::Relaxed),
        keep_alive: shared.node.streams.keep_alive.load(Ordering::Relaxed),
        connections_open: shared.connections.open(),
        connections_refused: shared.connections.refused(),
        storage_poisoned: shared.node.engines.state().poisoned.is_some(),
        scrub_runs: shared.node.scrub_runs.counts(),
    };
    let server = ServerGauges {
        member_id: shared.node.ids.member_id,
        server_version: ETCD_SERVER_VERSION,
        cluster_version: major_minor(ETCD_CLUSTER_VERSION),
        quota_bytes: shared.node.settings.quota_bytes,
    };
    let body = shared.metrics.render(engine.as_ref(), &streams, &server);
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// Returns `major.minor` of a version `major.minor.patch`.
fn major_minor(version: &'static str) -> &'static str {
    match version.match_indices('.').nth(1) {
        Some((at, _)) => &version[..at],
        None => version,
    }
}

/// Answers paths no route knows (HTTP-4).
async fn fallback(request: Request) -> Response {
    if has_grpc_content_type(request.headers()) {
        unknown_grpc_method(request.uri().path()).into_http::<Body>()
    } else {
        // Read what the client sent before answering: a connection closed after the answer
        // with request bytes still unread is reset by the kernel, and the client may lose
        // the 404 (an HTTP/1.0 POST to an unknown path did, in the gateway tests). Bounded:
        // a larger body is left, as before.
        let _ = axum::body::to_bytes(request.into_body(), UNKNOWN_PATH_BODY_MAX_BYTES).await;
        (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
    }
}

/// The status of a gRPC call to a path that names no service of kvd's (HTTP-4).
fn unknown_grpc_method(path: &str) -> Status {
    Status::unimplemented(format!("kvd: unknown gRPC method {path}"))
}

/// The most request body read (and dropped) before answering an unknown path with 404.
const UNKNOWN_PATH_BODY_MAX_BYTES: usize = 64 * 1024;

fn json(code: StatusCode, body: String) -> Response {
    let mut response = (code, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Escapes `text` for a JSON string.
fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonic_oversize_becomes_etcds_status() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 2150410 bytes, the limit is: 2097152 bytes",
        );
        let etcd = etcd_oversize_status(&tonic).map(|s| (s.code(), s.message().to_owned()));
        assert_eq!(
            etcd,
            Some((
                Code::ResourceExhausted,
                "grpc: received message larger than max (2150410 vs. 2097152)".to_owned()
            ))
        );
        let other =
            Status::out_of_range("etcdserver: mvcc: required revision is a future revision");
        assert!(etcd_oversize_status(&other).is_none());
    }

    #[test]
    fn cluster_version_is_major_minor() {
        assert_eq!(major_minor("3.6.0"), "3.6");
        assert_eq!(major_minor("3"), "3");
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_escape("a \"b\"\n"), "a \\\"b\\\"\\u000a");
    }
}
