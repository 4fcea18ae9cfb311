//! The accept loop and the life of each client connection: a cap on open connections,
//! timeouts for stalled and idle connections, HTTP/2 settings and keep-alive pings.
//!
//! Owns: the listener's accept loop, the count of open connections, each connection's
//! watchdog.
//!
//! Invariants:
//! - CONN-1: at most `max_connections` connections are served at once, over all listeners.
//!   A connection accepted beyond that gets an HTTP/2 `GOAWAY(ENHANCE_YOUR_CALM)` whose
//!   debug data says why, and is closed at once: it costs a descriptor for an instant, never
//!   a task or a buffer.
//! - CONN-2: a connection that holds an unfinished piece of input (the HTTP/2 preface, a
//!   frame or a header block, `server::authority` AUTH-5) for `header_timeout` is closed;
//!   so is an HTTP/1 connection that does not finish a request head within it (hyper's
//!   header read timeout). Slow or silent clients thus hold a slot for a bounded time.
//! - CONN-3: a connection with no request open for `idle_timeout` is shut down gracefully
//!   (HTTP/2 `GOAWAY(NO_ERROR)`, which gRPC clients follow by reconnecting). A Watch or
//!   LeaseKeepAlive stream is an open request, so long-lived streams never count as idle.
//! - CONN-4: the HTTP/2 server advertises `SETTINGS_MAX_CONCURRENT_STREAMS` 2^32-1, as etcd
//!   (gRPC-go's `math.MaxUint32`), so a client never waits for a stream slot; it pings an
//!   HTTP/2 peer after `keepalive_interval` without frames and drops it if no answer comes
//!   within `keepalive_timeout` (etcd's `--grpc-keepalive-interval`/`-timeout`).
//! - CONN-5: on shutdown the loop stops accepting and every connection starts a graceful
//!   shutdown: requests in flight finish (SRV-3).
//! - CONN-6: a connection of an `https://` listener is served only after its TLS handshake
//!   succeeded within `header_timeout` (`server::tls` TLS-3); HTTP/1.1 and HTTP/2 then run
//!   over the encrypted stream exactly as over a plain one, so gRPC and the HTTP routes
//!   share the port. A refused connection (CONN-1) of such a listener is closed without the
//!   plain-text GOAWAY, which a TLS client could not read. With `--client-cert-auth`, every
//!   request of the connection carries its [`ClientCertificate`] extension (TLS-4).
//! - CONN-7: a connection's unary calls run inside the connection's own task, a bounded
//!   number per turn (`server::fair_streams`), not as tasks of their own: the runtime serves
//!   connections in turn, so a client with many calls in flight delays another client's
//!   call by at most one turn per connection, not by all its calls. Watch, LeaseKeepAlive
//!   and Snapshot calls, which live long, run in a task of their own on the same thread
//!   (`STREAMED_PATHS`), whose response frames go to the connection through a channel of
//!   `STREAMED_FRAMES_AHEAD` (16) frames. After a turn the connection's task writes the
//!   turn's answers, then yields to the runtime unless it is alone on its thread
//!   (THREAD-4) and no call is left ready.
//! - CONN-8: each connection's task takes its turns within its role's fair share
//!   (`server::role_turns` TURN-1..3): a connection writing for a role that has had more
//!   of the RPC layer's time than another role with a connection waiting steps aside until
//!   that role has had its turn, so the turns of a greedy role's many connections do not
//!   stand between a polite role's call and the CPU.
//! - CONN-9: each accepted connection is served, from its TLS handshake to its end, on one
//!   of the server's connection threads (`server::connection_threads` THREAD-1..4), the one
//!   with the fewest open connections; the accept loops run on the main runtime.
//! - CONN-10: a streamed call (CONN-7's own task) refused before its first message answers
//!   gRPC's Trailers-Only form, as a unary call does: the status in one HEADERS frame that
//!   ends the stream, which is the only form grpc-go reads the status from.
//!
//! Contact points: `server::serve` runs one [`serve_listener`] per listener with a shared
//! [`Connections`] and `ConnectionThreads` (and the listener's `Tls` for `https://`);
//! `server::authority` reports unfinished input through [`Activity`]; `/metrics` shows [`Connections::open`] and
//! [`Connections::refused`].

use std::convert::Infallible;
use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::authority::AuthorityFix;
use crate::connection_threads::{self, ConnectionThreads};
use crate::fair_streams::{self, StreamExecutor};
use crate::http::{Answer, ClientPort};
use crate::pong::PongHold;
use crate::role_turns::{self, RoleTurns};
use crate::tls::{ClientCertificate, Tls};
use crate::write_gather::WriteGather;
use kvd::sync::{Arc, AtomicU64, AtomicUsize, Ordering};

/// Default of `--max-connections`.
pub const MAX_CONNECTIONS_DEFAULT: usize = 10_000;
/// Default of `--connection-header-timeout` (CONN-2).
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `--connection-idle-timeout` (CONN-3).
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// etcd's default `--grpc-keepalive-interval` (CONN-4).
pub const KEEPALIVE_INTERVAL_DEFAULT: Duration = Duration::from_secs(2 * 60 * 60);
/// etcd's default `--grpc-keepalive-timeout` (CONN-4).
pub const KEEPALIVE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(20);
/// The concurrent-stream limit advertised (CONN-4): gRPC-go's default, `math.MaxUint32`.
pub const MAX_CONCURRENT_STREAMS: u32 = u32::MAX;
/// Descriptors kept for everything but client connections (the database, the log, the
/// blocking pool's files, listeners) when the descriptor limit caps `--max-connections`.
pub const DESCRIPTORS_RESERVED: u64 = 128;
/// Longest pause between two looks of a connection's watchdog.
const WATCHDOG_TICK_MAX: Duration = Duration::from_secs(1);
/// Shortest pause between two looks of a connection's watchdog.
const WATCHDOG_TICK_MIN: Duration = Duration::from_millis(50);
/// How long the accept loop pauses when the process is out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Least time between two log lines about refused connections.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// HTTP/2's `ENHANCE_YOUR_CALM` error code.
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// Marks "no unfinished input" in [`Activity`].
const NONE: u64 = u64::MAX;

const _: () = assert!(WATCHDOG_TICK_MIN.as_millis() < WATCHDOG_TICK_MAX.as_millis());

/// The connection limits and timeouts (flags of `kvd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections served at once (CONN-1); at least 1.
    pub max_connections: usize,
    /// How long a connection may hold an unfinished preface, frame or header (CONN-2).
    pub header_timeout: Duration,
    /// How long a connection may stay without a request open (CONN-3).
    pub idle_timeout: Duration,
    /// Frameless time after which an HTTP/2 peer is pinged (CONN-4).
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered (CONN-4).
    pub keepalive_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: MAX_CONNECTIONS_DEFAULT,
            header_timeout: HEADER_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            keepalive_interval: KEEPALIVE_INTERVAL_DEFAULT,
            keepalive_timeout: KEEPALIVE_TIMEOUT_DEFAULT,
        }
    }
}

/// What every listener's connections share: the limits, the HTTP server settings and the
/// counts.
#[derive(Debug)]
pub struct Connections {
    limits: ConnectionLimits,
    open: AtomicUsize,
    refused: AtomicU64,
    started: Instant,
    /// Milliseconds since `started` of the last refusal log line, or [`NONE`].
    refusal_logged_ms: AtomicU64,
    /// The connections' turns, fair between the roles they write for (CONN-8).
    turns: Arc<RoleTurns>,
}

impl Connections {
    /// Returns the shared state for `limits`.
    pub fn new(limits: ConnectionLimits) -> Connections {
        Connections {
            limits,
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            started: Instant::now(),
            refusal_logged_ms: AtomicU64::new(NONE),
            turns: RoleTurns::new(),
        }
    }

    /// Returns the HTTP server settings for one connection whose calls run on `executor`
    /// (CONN-7).
    fn http_builder(&self, executor: StreamExecutor) -> Builder<StreamExecutor> {
        let mut builder = Builder::new(executor);
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
            .keep_alive_interval(self.limits.keepalive_interval)
            .keep_alive_timeout(self.limits.keepalive_timeout);
        builder
    }

    /// Returns the number of connections served now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Returns the number of connections refused since start (CONN-1).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Takes a connection slot, or returns `None` at the limit (CONN-1).
    fn admit(self: &Arc<Self>) -> Option<Slot> {
        let admitted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.limits.max_connections).then_some(open + 1)
            })
            .is_ok();
        admitted.then(|| Slot {
            connections: self.clone(),
        })
    }

    /// Counts and logs (at most every [`REFUSAL_LOG_INTERVAL`]) a refused connection.
    fn note_refusal(&self) {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let now = millis(self.started.elapsed());
        let last = self.refusal_logged_ms.load(Ordering::Relaxed);
        let due = last == NONE || now.saturating_sub(last) >= millis(REFUSAL_LOG_INTERVAL);
        if due
            && self
                .refusal_logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                refused_total = refused,
                "refusing connections: the open-connection limit is reached (--max-connections)"
            );
        }
    }

    fn watchdog_tick(&self) -> Duration {
        let shortest = self.limits.header_timeout.min(self.limits.idle_timeout) / 4;
        shortest.clamp(WATCHDOG_TICK_MIN, WATCHDOG_TICK_MAX)
    }
}

/// One counted connection (CONN-1); dropping it frees the slot.
#[derive(Debug)]
struct Slot {
    connections: Arc<Connections>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What a connection's watchdog reads: requests open, and since when the connection has
/// been idle or has held unfinished input. Times are milliseconds since the connection was
/// accepted.
#[derive(Debug)]
pub struct Activity {
    started: Instant,
    requests_open: AtomicUsize,
    idle_since_ms: AtomicU64,
    unfinished_since_ms: AtomicU64,
}

impl Activity {
    /// Returns the activity of a connection accepted now, which owes its preface (CONN-2).
    pub fn new() -> Activity {
        Activity {
            started: Instant::now(),
            requests_open: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            unfinished_since_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        millis(self.started.elapsed())
    }

    /// Records that the connection waits for more input while holding an unfinished piece;
    /// the first such wait starts the clock.
    pub fn unfinished(&self) {
        let now = self.now_ms();
        let _ = self.unfinished_since_ms.compare_exchange(
            NONE,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Records that the connection waits for input holding nothing unfinished.
    pub fn finished(&self) {
        self.unfinished_since_ms.store(NONE, Ordering::Relaxed);
    }

    fn request_started(&self) {
        self.requests_open.fetch_add(1, Ordering::AcqRel);
    }

    fn request_ended(&self) {
        let now = self.now_ms();
        if self.requests_open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle_since_ms.store(now, Ordering::Relaxed);
        }
    }

    /// Returns what the watchdog should do now.
    fn verdict(&self, limits: &ConnectionLimits) -> Verdict {
        let now = self.now_ms();
        let unfinished = self.unfinished_since_ms.load(Ordering::Relaxed);
        if unfinished != NONE && now.saturating_sub(unfinished) >= millis(limits.header_timeout) {
            return Verdict::Stalled;
        }
        let idle_since = self.idle_since_ms.load(Ordering::Relaxed);
        if self.requests_open.load(Ordering::Acquire) == 0
            && now.saturating_sub(idle_since) >= millis(limits.idle_timeout)
        {
            return Verdict::Idle;
        }
        Verdict::Healthy
    }
}

impl Default for Activity {
    fn default() -> Activity {
        Activity::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Healthy,
    /// CONN-2: close now.
    Stalled,
    /// CONN-3: shut down gracefully.
    Idle,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(NONE - 1)
}

/// Accepts connections on `listener` and serves each on one of `threads` (CONN-9) until
/// `stopped` turns true, then waits for the connections to finish (CONN-5). The caller
/// bounds that wait. With `tls`, every connection starts with a TLS handshake (CONN-6).
pub async fn serve_listener(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    port: ClientPort,
    connections: Arc<Connections>,
    threads: Arc<ConnectionThreads>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopped.wait_for(|stop| *stop) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                accept_failed(&e).await;
                continue;
            }
        };
        let Some(slot) = connections.admit() else {
            connections.note_refusal();
            if tls.is_none() {
                refuse(&stream, connections.limits.max_connections);
            }
            continue;
        };
        // The socket leaves this runtime's reactor here and joins its thread's in the
        // task, which runs there from its first poll (THREAD-1).
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "could not hand a connection to its thread");
                continue;
            }
        };
        let (tls, port, served, stopped) = (
            tls.clone(),
            port.clone(),
            connections.clone(),
            stopped.clone(),
        );
        let task = async move {
            match TcpStream::from_std(stream) {
                Ok(stream) => serve_accepted(stream, tls, port, served, slot, stopped).await,
                Err(e) => tracing::debug!(error = %e, "could not register a connection"),
            }
        };
        threads.spawn(&mut tasks, role_turns::gated(&connections.turns, task));
    }
    while tasks.join_next().await.is_some() {}
}

/// Pauses after an accept error: briefly if the process is out of descriptors (the
/// connection waits in the backlog meanwhile), not at all for a connection that failed.
async fn accept_failed(error: &io::Error) {
    match error.raw_os_error() {
        Some(code)
            if code == rustix::io::Errno::MFILE.raw_os_error()
                || code == rustix::io::Errno::NFILE.raw_os_error() =>
        {
            tracing::warn!(error = %error, "accept: out of file descriptors; pausing");
            tokio::time::sleep(ACCEPT_BACKOFF).await;
        }
        _ => tracing::debug!(error = %error, "accept failed"),
    }
}

/// Tells a connection over the limit why it is closed (CONN-1): the server's SETTINGS and
/// a GOAWAY with a message, written without waiting; then the socket is dropped.
fn refuse(stream: &TcpStream, max_connections: usize) {
    let message = format!("kvd: too many open connections (at most {max_connections})");
    let mut frames = Vec::with_capacity(9 + 9 + 8 + message.len());
    // An empty SETTINGS frame: the server preface.
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    let len = u32::try_from(8 + message.len()).unwrap_or(8).to_be_bytes();
    frames.extend_from_slice(&[len[1], len[2], len[3], 0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0u32.to_be_bytes()); // last stream id
    frames.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    frames.extend_from_slice(message.as_bytes());
    // Best effort: a full socket buffer only loses the explanation, not the refusal.
    let _ = stream.try_write(&frames);
}

/// Serves one accepted connection: over TLS after its handshake (CONN-6), or plain.
async fn serve_accepted(
    stream: TcpStream,
    tls: Option<Arc<Tls>>,
    port: ClientPort,
    connections: Arc<Connections>,
    slot: Slot,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        // Small gRPC answers must not wait for Nagle's algorithm, but a connection
        // without TCP_NODELAY still works.
        tracing::debug!(error = %e, "could not set TCP_NODELAY");
    }
    let Some(tls) = tls else {
        serve_connection(stream, None, port, connections, slot, stopped).await;
        return;
    };
    let peer = stream.peer_addr().ok();
    let timeout = connections.limits.header_timeout;
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(timeout, tls.handshake(stream)) => handshake,
        // CONN-5: a shutdown does not wait for handshakes.
        _ = stopped.wait_for(|stop| *stop) => return,
    };
    match handshake {
        Ok(Ok((stream, certificate))) => {
            if let Some(certificate) = &certificate {
                tracing::debug!(
                    peer = ?peer,
                    common_name = certificate.common_name.as_deref().unwrap_or(""),
                    "TLS client certificate verified"
                );
            }
            serve_connection(stream, certificate, port, connections, slot, stopped).await;
        }
        // A client refused at the handshake (no or a foreign certificate, plain text on
        // a TLS port) is routine; the log's debug level shows each one.
        Ok(Err(e)) => tracing::debug!(peer = ?peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(
            peer = ?peer,
            timeout_ms = millis(timeout),
            "closing a connection stalled in its TLS handshake"
        ),
    }
}

/// Serves one connection until it ends, is closed by its watchdog (CONN-2, CONN-3) or the
/// server stops (CONN-5).
async fn serve_connection<S>(
    stream: S,
    certificate: Option<ClientCertificate>,
    port: ClientPort,
    connections: Arc<Connections>,
    slot: Slot,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(AuthorityFix::watched(
        PongHold::new(WriteGather::new(stream)),
        activity.clone(),
    ));
    let service = Tracked {
        port,
        activity: activity.clone(),
        certificate,
    };
    let (executor, mut calls) = fair_streams::streams();
    let builder = connections.http_builder(executor);
    let mut connection = pin!(builder.serve_connection_with_upgrades(io, service));
    let mut tick = tokio::time::interval(connections.watchdog_tick());
    let mut closing = false;
    loop {
        // After a turn: whether woken calls still wait for the next one.
        let mut turned = None;
        tokio::select! {
            result = connection.as_mut() => {
                log_end(result);
                break;
            }
            more_ready = calls.turn() => turned = Some(more_ready),
            _ = stopped.wait_for(|stop| *stop), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tick.tick() => match activity.verdict(&connections.limits) {
                Verdict::Stalled => {
                    tracing::debug!(
                        timeout_ms = millis(connections.limits.header_timeout),
                        "closing a connection stalled in its preface, a frame or a header"
                    );
                    break;
                }
                Verdict::Idle if !closing => {
                    tracing::debug!("closing an idle connection");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                Verdict::Idle | Verdict::Healthy => {}
            },
        }
        if let Some(more_ready) = turned
            && (more_ready || !connection_threads::alone_here())
        {
            // CONN-7: the turn polled some calls; let other connections have theirs, but
            // only once the answers it made are written, or each would wait for every
            // other connection's turn. A connection alone on its thread with no call left
            // ready has none to let ahead: the loop goes on to write the answers without
            // first sending the runtime through its I/O driver (one `epoll_wait` per lone
            // call).
            let polled = std::future::poll_fn(|cx| Poll::Ready(connection.as_mut().poll(cx)));
            if let Poll::Ready(result) = polled.await {
                log_end(result);
                break;
            }
            // THREAD-5: under overload, let the pipeline threads have the CPU too.
            connection_threads::share_cpu();
            tokio::task::yield_now().await;
        }
    }
    drop(slot);
}

/// Logs how a connection's HTTP server ended, if with an error.
fn log_end<E: std::fmt::Display>(result: Result<(), E>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// The client port, counting each request as open until its response body is done
/// (CONN-3), and giving each request the connection's client certificate (CONN-6). A
/// request with a gRPC content type goes straight to the gRPC services (HTTP-6).
#[derive(Debug, Clone)]
struct Tracked {
    port: ClientPort,
    activity: Arc<Activity>,
    certificate: Option<ClientCertificate>,
}

impl Service<Request<Incoming>> for Tracked {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        if let Some(certificate) = &self.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        let open = OpenRequest::new(self.activity.clone());
        let streamed = STREAMED_PATHS.contains(&request.uri().path());
        let answer = self.port.answer(request);
        if streamed {
            return Box::pin(streamed_call(answer, open));
        }
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| Body::new(CountedBody { inner: body, open })))
        })
    }
}

/// The long-lived streaming calls, whose handler and response body run in a task of their
/// own (CONN-7): a watch stream's events are then encoded beside its connection's turns, in
/// parallel with them, and one busy stream does not take the turns of its connection's
/// other calls.
const STREAMED_PATHS: [&str; 3] = [
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
    "/etcdserverpb.Maintenance/Snapshot",
];

/// Response frames a streamed call's task may make ahead of the connection's sending.
const STREAMED_FRAMES_AHEAD: usize = 16;

type Frames = tokio::sync::mpsc::Receiver<Result<http_body::Frame<bytes::Bytes>, axum::Error>>;

/// Runs `answer` and its response body in a task of its own; returns the response, whose
/// body takes the frames that task makes.
async fn streamed_call(
    answer: impl std::future::Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
    open: OpenRequest,
) -> Result<Response<Body>, Infallible> {
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let (frames_tx, frames_rx) = tokio::sync::mpsc::channel(STREAMED_FRAMES_AHEAD);
    tokio::spawn(async move {
        let Ok(response) = answer.await;
        let (parts, mut body) = response.into_parts();
        use http_body::Body as _;
        // A call refused before its first message (tonic's Trailers-Only answer: the status
        // in the head, an empty body) must leave as one HEADERS frame with END_STREAM, or
        // grpc-go reports "server closed the stream without sending trailers" (CONN-10).
        let ended = body.is_end_stream();
        if head_tx.send((parts, ended)).is_err() || ended {
            return;
        }
        loop {
            // A closed channel means the connection dropped the response (the client went
            // or reset the stream): the call ends at once, as it would in the connection.
            let frame = tokio::select! {
                frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)) => frame,
                () = frames_tx.closed() => return,
            };
            let Some(frame) = frame else {
                return;
            };
            if frames_tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let Ok((parts, ended)) = head_rx.await else {
        // The call's task ended without an answer (its handler panicked).
        let mut failed = Response::new(Body::empty());
        *failed.status_mut() = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(failed);
    };
    let body = if ended {
        Body::empty()
    } else {
        Body::new(ChannelBody { frames: frames_rx })
    };
    let counted = Body::new(CountedBody { inner: body, open });
    Ok(Response::from_parts(parts, counted))
}

/// A response body fed by a streamed call's task.
struct ChannelBody {
    frames: Frames,
}

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.frames.poll_recv(cx)
    }
}

/// A request counted as open (CONN-3) until dropped.
#[derive(Debug)]
struct OpenRequest {
    activity: Arc<Activity>,
}

impl OpenRequest {
    fn new(activity: Arc<Activity>) -> OpenRequest {
        activity.request_started();
        OpenRequest { activity }
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.activity.request_ended();
    }
}

/// A response body that keeps its request counted as open until it is dropped.
struct CountedBody {
    inner: Body,
    #[allow(dead_code)] // held for its Drop
    open: OpenRequest,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raises the soft limit on open descriptors to the hard limit where the OS allows, and
/// returns the limit in force (`None` if it cannot be read or is unlimited).
pub fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let (current, maximum) = (limit.current, limit.maximum);
    if current != maximum {
        let raised = Rlimit {
            current: maximum,
            maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = ?current, to = ?maximum, "raised the open-file limit");
                return maximum;
            }
            Err(e) => tracing::warn!(error = %e, soft = ?current, hard = ?maximum,
                "could not raise the open-file limit"),
        }
    }
    current
}

/// Returns `max_connections` capped so that connections leave [`DESCRIPTORS_RESERVED`]
/// descriptors of `descriptor_limit` free.
pub fn cap_to_descriptors(max_connections: usize, descriptor_limit: Option<u64>) -> usize {
    let Some(limit) = descriptor_limit else {
        return max_connections;
    };
    let room = usize::try_from(limit.saturating_sub(DESCRIPTORS_RESERVED)).unwrap_or(usize::MAX);
    max_connections.min(room.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_by_descriptors() {
        assert_eq!(cap_to_descriptors(10_000, None), 10_000);
        assert_eq!(cap_to_descriptors(10_000, Some(1_048_576)), 10_000);
        assert_eq!(cap_to_descriptors(10_000, Some(1_024)), 1_024 - 128);
        assert_eq!(cap_to_descriptors(10_000, Some(100)), 1);
    }

    #[test]
    fn slots_are_counted_and_refused_beyond_the_limit() {
        let connections = Arc::new(Connections::new(ConnectionLimits {
            max_connections: 2,
            ..ConnectionLimits::default()
        }));
        let first = connections.admit();
        let second = connections.admit();
        assert!(first.is_some() && second.is_some());
        assert!(connections.admit().is_none());
        assert_eq!(connections.open(), 2);
        drop(first);
        assert_eq!(connections.open(), 1);
        assert!(connections.admit().is_some());
    }

    #[test]
    fn verdicts_follow_the_timeouts() {
        let limits = ConnectionLimits {
            header_timeout: Duration::ZERO,
            idle_timeout: Duration::from_secs(3600),
            ..ConnectionLimits::default()
        };
        let activity = Activity::new();
        // The preface is owed from the start.
        assert_eq!(activity.verdict(&limits), Verdict::Stalled);
        activity.finished();
        assert_eq!(activity.verdict(&limits), Verdict::Healthy);
        let idle = ConnectionLimits {
            idle_timeout: Duration::ZERO,
            ..limits
        };
        assert_eq!(activity.verdict(&idle), Verdict::Idle);
        activity.request_started();
        assert_eq!(activity.verdict(&idle), Verdict::Healthy);
        activity.request_ended();
        assert_eq!(activity.verdict(&idle), Verdict::Idle);
    }
}
