//! The standalone `kvd` server: etcd's v3 gRPC API over the engine, plus `/health`,
//! `/version` and `/metrics`, on one client port.
//!
//! Owns: the network surface. This is the only module that names tonic, prost, axum, tokio
//! or hyper (style rule 6). It translates and validates; it holds no state of its own.
//!
//! Invariants:
//! - SRV-1: an engine call that may block for long runs on a blocking pool, never on a thread
//!   that serves connections (NODE-1); a lone write's apply and sync (APPLY-5), the
//!   exception NODE-1 names, runs on the connection's thread.
//! - SRV-2: the gRPC receive limit is `--max-request-bytes` + 512 KiB, as etcd's; requests
//!   between the two limits reach the engine, which refuses them with
//!   `etcdserver: request is too large`.
//! - SRV-3: on SIGINT or SIGTERM the server stops accepting connections, ends its Watch and
//!   LeaseKeepAlive streams (NODE-3), lets unary requests in flight finish (at most
//!   [`SHUTDOWN_GRACE`]), and then closes the engine, which drains its apply queue and
//!   closes the database.
//! - SRV-4: the member and cluster ids come from the data directory (ID-1) and are read only
//!   after the engine holds its lock (ID-4).
//! - SRV-5: every `--listen-client-urls` listener is bound (its host resolved, its port
//!   taken) before anything under the data directory is created, opened or written (the
//!   engine, the ids, `--auto-tls`'s files), as etcd binds its client listeners before it
//!   opens its backend: a listen address kvd cannot use stops the start with `kvd: listen on
//!   HOST:PORT: ...` and leaves the data directory as it was, or absent. The listening URLs
//!   are announced (BIN-3) and the serving line logged only once the engine is open.
//!
//! Contact points: `server/src/bin/kvd.rs` parses flags into [`ServerConfig`] and calls [`run`];
//! tests drive the server through the `kvd` binary and the generated clients in [`pb`].
//! Module map: `authority` (repairs the HTTP/2 authority of etcd 3.4 clients), `pong` (a
//! PING acknowledgement leaves with the answer it came with), `http`
//! (router, metrics layer, HTTP routes), `gateway` (etcd's JSON gateway, `/v3/...`), `kv`, `lease`, `watch`, `maintenance`, `cluster`,
//! `lock` and `election` (etcd's Lock and Election services, over `concurrency`: etcd's
//! client-side lock and election recipes run as the caller),
//! `auth` (etcd's Auth service: users, roles, permissions, tokens), `connections` (accept
//! loop, connection limits),
//! `connection_threads` (the threads connections are served on, one runtime per CPU),
//! `tls` (`https://` listeners: etcd's TLS flags, handshakes, client certificates),
//! `single_message` (one request message per unary call), `snapshot` (Snapshot streaming), `operator` (the quota operator API: `POST /api/v1`,
//! `GET /roles`), `convert` (pb ↔ api), `status` (errors → gRPC),
//! `cors` (`--cors`), `identity` (ids on disk), `hash` (Maintenance.Hash of the logical store), `metrics`, `node` (shared state), `loadgen` (the load generator
//! of `kvd bench`, a client of any etcd endpoint).

mod auth;
mod authority;
mod cluster;
mod concurrency;
mod connection_threads;
pub mod connections;
mod convert;
mod cors;
mod drift;
mod election;
mod fair_streams;
#[doc(hidden)]
pub mod fuzzing;
mod gateway;
mod grpc_codec;
mod hash;
mod health;
mod http;
mod identity;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod metrics;
mod node;
mod operation;
mod operator;
pub mod pb;
mod pong;
mod range_wire;
mod recovery;
mod role_turns;
mod scrub;
mod single_message;
pub mod snapshot;
pub mod snapshot_tool;
mod status;
mod tls;
mod watch;
mod write_gather;

pub mod loadgen;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::connection_threads::ConnectionThreads;
use crate::connections::{Connections, serve_listener};
use crate::convert::HeaderIds;
use crate::metrics::Metrics;
use crate::node::{Node, NodeSettings};
use crate::recovery::{EngineSlot, Recovery};
use crate::snapshot::Snapshots;
use kvd::sync::Arc;
use kvd::{Config, Engine};

pub use crate::auth::AUTH_TOKEN_TTL_DEFAULT;
pub use crate::connections::ConnectionLimits;
pub use crate::cors::CORS_DEFAULT;
pub use crate::node::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION, QUOTA_BACKEND_BYTES_DEFAULT};
pub use crate::operation::{
    DROP_RESPONSE_AFTER_COMMIT_ENV, DROPPED_MESSAGE, OPERATION_ID_METADATA,
};
pub use crate::tls::{ClientCertificate, TlsFlags};
pub use crate::watch::WATCH_STREAMS_MAX_DEFAULT;

/// Bytes etcd adds to `--max-request-bytes` for the gRPC receive limit (SRV-2).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// How long requests in flight may take to finish after a shutdown signal (SRV-3).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long engine calls still running on the blocking pool may take after the grace.
pub const SHUTDOWN_BLOCKING_MAX: Duration = Duration::from_secs(5);
/// Most threads the blocking pool runs engine calls on at once; further calls queue.
pub const BLOCKING_THREADS_MAX: usize = 64;

/// Scheduler ticks between the runtime's looks at its I/O driver (sockets that became ready)
/// and at its global queue (tasks woken from other threads, such as the answers the engine's
/// commit thread completes), when a worker is busy. Tokio's defaults are 61 and 31; with
/// every worker busy, a connection whose socket became ready waited behind up to 61 other
/// connections' turns before its readiness was even seen. 8 (2026-12-02, drafts, load
/// 0.7-0.8) beat the defaults: etcd's benchmark, 64 clients, three interleaved pairs, 15,556 /
/// 16,129 / 21,128 puts/s against 14,239 / 14,387 / 16,205; the polite tenant beside the
/// fairness bench's flood, four pairs, p50 3.9-6.7 ms against 6.1-9.1 ms. 2 beat 8
/// (2026-12-06, drafts, load 1.3-3.7): the polite p50 beside the flood 4.74-5.05 ms against
/// 5.38-5.76 ms in three interleaved pairs, with no change to measure in 64-client puts
/// (four pairs, 53.9-62.7 against 54.2-64.6 us of CPU per put) or the watch benchmark
/// (three pairs, 278-300 against 295-302 ticks per 2,000,000 events). 1 gave little more
/// (three pairs against 2: polite p50 3.81-4.16 against 4.06-4.35 ms, p99 16.0-16.6 against
/// 15.4-16.9 ms; 64-client puts the same) for a driver poll after every task.
pub const RUNTIME_POLL_INTERVAL: u32 = 2;
/// etcd's MaxQuotaBytes: a larger quota is accepted with a warning.
const QUOTA_BYTES_WARN: u64 = 8 << 30;
/// The peer URL MemberList shows. kvd has no peer port; etcd's clients only print it.
pub const PEER_URL_PLACEHOLDER: &str = "http://127.0.0.1:2380";

/// What `kvd` serves and how.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The data directory (`--data-dir`).
    pub data_dir: PathBuf,
    /// The member name (`--name`).
    pub name: String,
    /// URLs to listen on for clients, `http://host:port` or `https://host:port`
    /// (`--listen-client-urls`).
    pub listen_client_urls: Vec<String>,
    /// URLs to advertise in MemberList; empty means the listening URLs.
    pub advertise_client_urls: Vec<String>,
    /// The space quota in bytes: 0 means etcd's default (2 GiB), negative disables
    /// (`--quota-backend-bytes`).
    pub quota_backend_bytes: i64,
    /// Automatic compaction (`--auto-compaction-mode`, `--auto-compaction-retention`).
    pub auto_compaction: Option<kvd::AutoCompaction>,
    /// Largest request accepted (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Largest number of operations in one Txn level (`--max-txn-ops`).
    pub max_txn_ops: usize,
    /// The bound of the write prepare queue (`--prepare-queue-length`); at least 1.
    pub prepare_queue_length: i64,
    /// The `SCHED_FIFO` priority of the engine's apply and commit threads
    /// (`--pipeline-priority`, `Config::pipeline_priority`); `None` leaves them under the
    /// normal scheduler.
    pub pipeline_priority: Option<u8>,
    /// Bytes of write-ahead log between checkpoints (`--wal-file-bytes`,
    /// `Config::wal_file_bytes`).
    pub wal_file_bytes: u64,
    /// How often an idle watch with `progress_notify` gets a progress response
    /// (`--experimental-watch-progress-notify-interval`, etcd's default 10 minutes).
    pub watch_progress_notify_interval: Duration,
    /// The allocation prepare queue length (`--allocation-prepare-queue-length`): `Some`
    /// replaces the persisted one, `None` keeps it.
    pub allocation_prepare_queue_length: Option<u64>,
    /// How many outcomes of writes with an operation id are kept, and for how long
    /// (`--operation-retention-count`, `--operation-retention`).
    pub operation_retention: kvd::Retention,
    /// How long a recovered agent may take to register again before it becomes
    /// unreachable (`--agent-reregister-timeout`).
    pub agent_reregister_timeout: Duration,
    /// How often the consumption counters are checked against a recount
    /// (`--consumption-check-interval`); `None` is off.
    pub consumption_check_interval: Option<Duration>,
    /// How often every stored checksum is checked (`--scrub-interval`); `None` is off.
    pub scrub_interval: Option<Duration>,
    /// Responses of committed writes with an operation id to drop (tests only, from
    /// `KVD_TEST_DROP_RESPONSE_AFTER_COMMIT`; 0 in production).
    pub drop_responses_after_commit: u64,
    /// The connection limits and timeouts (`--max-connections`, `--connection-*-timeout`,
    /// `--grpc-keepalive-*`).
    pub connections: ConnectionLimits,
    /// Most Watch streams open at once (`--max-watch-streams`).
    pub max_watch_streams: usize,
    /// How long an idle auth token stays valid (`--auth-token-ttl`, etcd's default 300 s).
    pub auth_token_ttl: Duration,
    /// Most Snapshot streams at once (`--max-snapshots`).
    pub max_snapshots: usize,
    /// How long a Snapshot stream may wait for its client to read (`--snapshot-stall-timeout`).
    pub snapshot_stall_timeout: Duration,
    /// Origins allowed by CORS on the HTTP answers (`--cors`); empty or `*` allows all.
    pub cors: Vec<String>,
    /// TLS of the `https://` listeners (`--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth`, `--auto-tls`).
    pub tls: TlsFlags,
}

/// Default of `--prepare-queue-length` (etcd's gap between committed and applied entries).
pub const PREPARE_QUEUE_LENGTH_DEFAULT: i64 = 5_000;

/// Why the server could not start or stopped with an error.
#[derive(Debug)]
pub enum ServerError {
    /// A flag value is not usable.
    Config(String),
    /// The engine refused to open (for example, another kvd holds the data directory).
    Engine(kvd::Error),
    /// The member or cluster id file could not be read or written.
    Identity(io::Error),
    /// A listener or the runtime could not be set up.
    Io(String),
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerError::Config(what) => write!(f, "kvd: {what}"),
            // The engine's messages already start with "kvd:" or "etcdserver:".
            ServerError::Engine(err) => err.fmt(f),
            ServerError::Identity(err) => write!(f, "kvd: member identity: {err}"),
            ServerError::Io(what) => write!(f, "kvd: {what}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// Runs the server until SIGINT or SIGTERM, then shuts down cleanly (SRV-3). `on_ready` is
/// called once with the URLs the server listens on, after every listener is bound (before
/// the data directory is touched, SRV-5) and the engine is open.
pub fn run(config: ServerConfig, on_ready: impl FnOnce(&[String])) -> Result<(), ServerError> {
    let listen = config
        .listen_client_urls
        .iter()
        .map(|url| listen_address(url))
        .collect::<Result<Vec<_>, _>>()?;
    if listen.is_empty() {
        return Err(ServerError::Config("--listen-client-urls is empty".into()));
    }
    let prepare_queue_length = usize::try_from(config.prepare_queue_length)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            ServerError::Config(format!(
                "--prepare-queue-length must be at least 1, got {}",
                config.prepare_queue_length
            ))
        })?;
    let engine_config = Config {
        max_request_bytes: config.max_request_bytes,
        max_txn_ops: config.max_txn_ops,
        prepare_queue_length,
        quota_backend_bytes: config.quota_backend_bytes,
        auto_compaction: config.auto_compaction,
        allocation_prepare_queue_length: config.allocation_prepare_queue_length,
        operation_retention: config.operation_retention,
        agent_reregister_timeout: config.agent_reregister_timeout,
        fs_reserve_bytes: Some(fs_reserve(&config)),
        pipeline_priority: config.pipeline_priority,
        wal_file_bytes: config.wal_file_bytes,
        watch_progress_notify_interval: config.watch_progress_notify_interval,
        ..Config::default()
    };
    if kvd::space_quota_bytes(config.quota_backend_bytes).is_some_and(|q| q > QUOTA_BYTES_WARN) {
        // etcd warns the same way: above 8 GiB the database is slow to start and defrag.
        tracing::warn!(
            quota_backend_bytes = config.quota_backend_bytes,
            "quota exceeds the maximum value (8 GiB)"
        );
    }
    let mut config = config;
    config.connections = connection_limits(config.connections)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS_MAX)
        .thread_name("kvd-server")
        .event_interval(RUNTIME_POLL_INTERVAL)
        .global_queue_interval(RUNTIME_POLL_INTERVAL)
        .build()
        .map_err(|e| ServerError::Io(format!("start the async runtime: {e}")))?;
    // SRV-5: before anything under the data directory, so a listen address kvd cannot use
    // leaves it as it was.
    let listeners = runtime.block_on(bind_listeners(&listen))?;
    // Before the engine opens, so a bad TLS flag leaves no database behind (TLS-1);
    // --auto-tls only adds its certificate files under the data directory.
    let tls = tls::configure(&config.tls, &config.listen_client_urls, &config.data_dir)?;
    let engine =
        Engine::open(&config.data_dir, engine_config.clone()).map_err(ServerError::Engine)?;
    log_prepare_queue(&engine);
    if let Ok(Some(older)) = engine.schema_raised_from() {
        tracing::warn!(
            from = older,
            "raised the database schema version to this build's: older builds now refuse the \
             data directory"
        );
    }
    // SRV-4: the engine holds the directory's lock from here on.
    let identity = identity::load_or_create(&config.data_dir).map_err(ServerError::Identity)?;
    let recovery = Recovery {
        data_dir: config.data_dir.clone(),
        reserve_bytes: engine_config.fs_reserve_bytes.unwrap_or_default(),
        engine_config,
    };
    let engines = Arc::new(EngineSlot::new(Arc::new(engine)));
    let ids = HeaderIds {
        cluster_id: identity.cluster_id,
        member_id: identity.member_id,
    };
    let threads = ConnectionThreads::start(ConnectionThreads::per_cpu())
        .map_err(|e| ServerError::Io(format!("start the connection threads: {e}")))?;
    let threads = Arc::new(threads);
    let served = runtime.block_on(serve(
        &config,
        engines.clone(),
        recovery,
        ids,
        Listen {
            listeners,
            tls,
            threads: threads.clone(),
        },
        on_ready,
    ));
    // Connections still open after serve's grace period end here (THREAD-3), before the
    // engine is closed.
    threads.stop();
    runtime.shutdown_timeout(SHUTDOWN_BLOCKING_MAX);
    let closed = match engines.take() {
        Some(engine) => close_engine(engine),
        None => Ok(()),
    };
    served?;
    closed
}

/// Returns the filesystem reserve (RECOVERY-4): the engine's default for the quota, capped at a
/// share of the data directory's filesystem, and logs it.
fn fs_reserve(config: &ServerConfig) -> u64 {
    let engine_default =
        kvd::default_fs_reserve_bytes(kvd::space_quota_bytes(config.quota_backend_bytes));
    let total = recovery::fs_total_bytes(&config.data_dir);
    let reserve = recovery::scaled_reserve_bytes(engine_default, total);
    tracing::info!(
        fs_reserve_bytes = reserve,
        fs_total_bytes = ?total,
        "writes that need space stop while the filesystem has less than the reserve free"
    );
    reserve
}

/// Raises the descriptor limit and caps `--max-connections` by it (CONN-1).
fn connection_limits(limits: ConnectionLimits) -> Result<ConnectionLimits, ServerError> {
    if limits.max_connections == 0 {
        return Err(ServerError::Config(
            "--max-connections must be at least 1".into(),
        ));
    }
    let descriptors = connections::raise_descriptor_limit();
    let max_connections = connections::cap_to_descriptors(limits.max_connections, descriptors);
    if max_connections < limits.max_connections {
        tracing::warn!(
            requested = limits.max_connections,
            max_connections,
            open_file_limit = ?descriptors,
            "--max-connections lowered to fit the open-file limit"
        );
    }
    Ok(ConnectionLimits {
        max_connections,
        ..limits
    })
}

/// Logs the allocation prepare queue length in force, and whether the flag replaced the
/// persisted one.
fn log_prepare_queue(engine: &Engine) {
    let length = engine
        .allocation_prepare_queue()
        .map(|q| q.length)
        .unwrap_or(0);
    match engine.allocation_prepare_queue_replaced() {
        Ok(Some(replaced)) => tracing::info!(
            previous = ?replaced.previous,
            allocation_prepare_queue_length = replaced.length,
            "--allocation-prepare-queue-length replaced the persisted allocation prepare queue length"
        ),
        _ => tracing::info!(
            allocation_prepare_queue_length = length,
            "allocation prepare queue length kept from the data directory (0 is off)"
        ),
    }
}

/// What to serve: one bound listener per `--listen-client-urls` entry (SRV-5), and the TLS
/// of the `https://` ones; and where to serve what is accepted.
struct Listen {
    listeners: Vec<BoundListener>,
    tls: Option<Arc<tls::Tls>>,
    /// Where the accepted connections are served (CONN-9).
    threads: Arc<ConnectionThreads>,
}

/// One client URL to bind.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ListenAddress {
    /// `host:port`.
    host_port: String,
    /// An `https://` URL: TLS on this listener.
    https: bool,
}

/// Returns the `host:port` to bind for a client URL; `http://` and `https://` are served.
fn listen_address(url: &str) -> Result<ListenAddress, ServerError> {
    let (rest, https) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        (None, None) => {
            return Err(ServerError::Config(format!(
                "client URL {url:?} is not supported: only http:// and https:// URLs are \
                 served (unix sockets are not implemented)"
            )));
        }
    };
    let host_port = rest.trim_end_matches('/');
    if host_port.is_empty() || host_port.contains('/') {
        return Err(ServerError::Config(format!(
            "client URL {url:?} is not http://host:port or https://host:port"
        )));
    }
    Ok(ListenAddress {
        host_port: host_port.to_owned(),
        https,
    })
}

/// A client listener, bound before the data directory is touched (SRV-5).
struct BoundListener {
    listener: TcpListener,
    /// The URL clients reach it at (with the port the system chose for port 0).
    url: String,
    /// An `https://` URL: TLS on this listener.
    https: bool,
}

/// Binds one listener per address, in the order given (SRV-5); the error names the
/// `host:port` that could not be resolved or bound.
async fn bind_listeners(addresses: &[ListenAddress]) -> Result<Vec<BoundListener>, ServerError> {
    let mut bound = Vec::with_capacity(addresses.len());
    for address in addresses {
        let host_port = &address.host_port;
        let listener = TcpListener::bind(host_port)
            .await
            .map_err(|e| ServerError::Io(format!("listen on {host_port}: {e}")))?;
        let local = listener
            .local_addr()
            .map_err(|e| ServerError::Io(format!("listen on {host_port}: {e}")))?;
        bound.push(BoundListener {
            listener,
            url: url_of(local, address.https),
            https: address.https,
        });
    }
    Ok(bound)
}

/// Returns the URL clients reach a listener bound to `addr` at.
fn url_of(addr: SocketAddr, https: bool) -> String {
    let scheme = if https { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

async fn serve(
    config: &ServerConfig,
    engines: Arc<EngineSlot>,
    recovery: Recovery,
    ids: HeaderIds,
    listen: Listen,
    on_ready: impl FnOnce(&[String]),
) -> Result<(), ServerError> {
    let mut listeners = Vec::with_capacity(listen.listeners.len());
    let mut urls = Vec::with_capacity(listen.listeners.len());
    for bound in listen.listeners {
        urls.push(bound.url);
        // tls::configure gave a configuration whenever a URL is https:// (TLS-1).
        let tls = listen.tls.clone().filter(|_| bound.https);
        listeners.push((bound.listener, tls));
    }
    let advertise = if config.advertise_client_urls.is_empty() {
        urls.clone()
    } else {
        config.advertise_client_urls.clone()
    };
    let settings = NodeSettings {
        name: config.name.clone(),
        advertise_client_urls: advertise,
        peer_url: PEER_URL_PLACEHOLDER.to_owned(),
        quota_bytes: quota_reported(config.quota_backend_bytes),
        max_txn_ops: config.max_txn_ops,
        drop_responses_after_commit: config.drop_responses_after_commit,
        max_watch_streams: config.max_watch_streams,
        auth_token_ttl: config.auth_token_ttl,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let node = Arc::new(Node::new(engines.clone(), ids, settings, stopped.clone()));
    let mut recovery_stopped = stopped.clone();
    let recovering = tokio::spawn(recovery::run(engines, recovery, async move {
        // An error means the sender is gone, which also means stop.
        let _ = recovery_stopped.wait_for(|stop| *stop).await;
    }));
    let max_receive_bytes = config.max_request_bytes.saturating_add(GRPC_OVERHEAD_BYTES);
    if let Some(interval) = config.consumption_check_interval {
        tokio::spawn(drift::check_periodically(node.clone(), interval));
    }
    if let Some(interval) = config.scrub_interval {
        tokio::spawn(scrub::scrub_periodically(node.clone(), interval));
    }
    let connections = Arc::new(Connections::new(config.connections));
    let port = http::router(
        node,
        Arc::new(Metrics::new()),
        connections.clone(),
        Arc::new(Snapshots::new(
            config.max_snapshots,
            config.snapshot_stall_timeout,
        )),
        max_receive_bytes,
        cors::Cors::new(&config.cors),
    );

    let mut servers = tokio::task::JoinSet::new();
    for ((listener, tls), url) in listeners.into_iter().zip(&urls) {
        let task = serve_listener(
            listener,
            tls,
            port.clone(),
            connections.clone(),
            listen.threads.clone(),
            stopped.clone(),
        );
        let url = url.clone();
        servers.spawn(async move {
            task.await;
            url
        });
    }
    tracing::info!(
        data_dir = %config.data_dir.display(),
        member_id = %format!("{:016x}", ids.member_id),
        cluster_id = %format!("{:016x}", ids.cluster_id),
        urls = %urls.join(","),
        "kvd serving client requests"
    );
    on_ready(&urls);

    tokio::select! {
        signal = shutdown_signal() => {
            let signal = signal.map_err(|e| ServerError::Io(format!("install signal handlers: {e}")))?;
            tracing::info!(signal, "shutting down: no new connections, finishing requests in flight");
        }
        Some(joined) = servers.join_next() => {
            tracing::error!(result = ?joined, "a listener stopped unexpectedly; shutting down");
        }
    }
    // The receivers may all be gone already; nothing is left to tell then.
    let _ = stop.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(joined) = servers.join_next().await {
            match joined {
                Ok(url) => tracing::info!(url, "listener closed"),
                Err(e) => tracing::error!(error = %e, "listener task failed"),
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            grace_s = SHUTDOWN_GRACE.as_secs(),
            "requests still in flight after the grace period; closing their connections"
        );
        servers.abort_all();
    }
    // The recovery task saw the stop signal; a reopen in progress finishes first.
    if let Err(e) = recovering.await {
        tracing::error!(error = %e, "the recovery task failed");
    }
    Ok(())
}

/// Returns the quota Status reports: etcd's default for 0, none (0) when disabled.
fn quota_reported(quota_backend_bytes: i64) -> i64 {
    match quota_backend_bytes {
        0 => QUOTA_BACKEND_BYTES_DEFAULT,
        q if q < 0 => 0,
        q => q,
    }
}

/// Waits for SIGINT or SIGTERM and returns its name.
async fn shutdown_signal() -> io::Result<&'static str> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted.map(|()| "SIGINT"),
        _ = terminate.recv() => Ok("SIGTERM"),
    }
}

/// Closes the engine once no request holds it any more. If an engine call outlived the
/// shutdown limits and still holds it, the engine is left to be dropped with that call (its
/// `Drop` stops the apply thread after the queued writes); the log says so. Either way,
/// every acknowledged write was durable when it was acknowledged.
fn close_engine(engine: Arc<Engine>) -> Result<(), ServerError> {
    match Arc::try_unwrap(engine) {
        Ok(engine) => {
            engine.close().map_err(ServerError::Engine)?;
            tracing::info!("engine closed");
            Ok(())
        }
        Err(_still_shared) => {
            tracing::warn!("an engine call was still running at exit; the engine was not closed");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_and_https_urls_are_served() {
        let address = |host_port: &str, https| ListenAddress {
            host_port: host_port.into(),
            https,
        };
        assert_eq!(
            listen_address("http://127.0.0.1:2379").ok(),
            Some(address("127.0.0.1:2379", false))
        );
        assert_eq!(
            listen_address("http://localhost:0/").ok(),
            Some(address("localhost:0", false))
        );
        assert_eq!(
            listen_address("https://127.0.0.1:2379").ok(),
            Some(address("127.0.0.1:2379", true))
        );
        let unix = listen_address("unix:///tmp/kvd.sock")
            .unwrap_err()
            .to_string();
        assert!(unix.contains("only http:// and https://"), "{unix}");
        assert!(listen_address("http://host:1/path").is_err());
        assert!(listen_address("https://").is_err());
    }

    #[test]
    fn quota_follows_etcds_conventions() {
        assert_eq!(quota_reported(0), 2 << 30);
        assert_eq!(quota_reported(-1), 0);
        assert_eq!(quota_reported(1000), 1000);
    }
}
