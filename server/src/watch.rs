//! etcd's Watch service: one bidirectional stream carries many watches, created, canceled
//! and asked for progress by the client's requests, with the engine's responses sent back in
//! the engine's order.
//!
//! Each gRPC stream has two halves:
//! - a task that reads the client's requests and applies each to the engine's
//!   [`WatchStream`] on the blocking pool (create and cancel take the engine's locks), one at
//!   a time and in order;
//! - a dedicated thread that waits on the engine's stream (a blocking receive) and forwards
//!   each response, translated, into a bounded channel that tonic sends from.
//!
//! Invariants:
//! - WATCH-SRV-1: no reactor thread ever blocks on the engine: receiving runs on the stream's
//!   own thread, requests on the blocking pool (NODE-1). The blocking pool is not used for
//!   the receive loop, because a long-lived watch would hold one of its threads for good.
//! - WATCH-SRV-2: responses reach the client in the order the engine produced them; the
//!   created (or refused) response of a watch precedes its events because the engine puts
//!   both on the same stream in that order.
//! - WATCH-SRV-3: at most `--max-watch-streams` ([`WATCH_STREAMS_MAX_DEFAULT`]) streams,
//!   and so threads, are open at once; a further Watch call is refused with `Unavailable`.
//!   A stream's thread reserves [`WATCH_THREAD_STACK_BYTES`] of stack, of which it touches
//!   little (it only receives, translates and sends), so the bound is memory: about the
//!   touched stack plus [`WATCH_RESPONSES_BUFFERED`] responses per stream.
//! - WATCH-SRV-4: the stream's thread ends within [`STREAM_POLL`] of the client going away,
//!   the server shutting down (NODE-3) or the engine being reopened (REC-3); dropping the engine's stream cancels its watches.
//!   The client closing only its sending side ends nothing: watches keep delivering, as in
//!   etcd.
//! - WATCH-SRV-5: at most [`WATCH_RESPONSES_BUFFERED`] translated responses wait for a slow
//!   client; past that the thread waits, the engine's per-watch buffers fill, and the engine
//!   moves the watch to catch-up from history (WATCH-3) instead of growing memory.
//! - WATCH-SRV-6: a request that cannot be decoded ends the whole stream with the
//!   decoder's status (`INTERNAL`, as gRPC-go ends it); no request after it is read, and
//!   the stream is never left open without its request reader.
//! - WATCH-SRV-7: while auth is enabled a create needs read on the watch's whole range,
//!   from-key ones included (PERM-1, etcd 3.6); a refused create gets one response with
//!   watch id -1, `created` and `canceled` set and etcd's reason text, and the stream goes on.
//!
//! Contact points: `server::convert` (messages), `server::node` (engine, shutdown, gauges);
//! the engine's [`WatchStream`].

use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;

use crate::tls::ClientCertificate;
use tonic::{Request, Response, Status, Streaming};

use crate::auth;
use crate::convert;
use crate::node::{self, Node, SERVER_STOPPED, STREAM_POLL, StreamGuard};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::watch_request::RequestUnion;
use crate::pb::etcdserverpb::watch_server::Watch;
use crate::status;
use kvd::WatchStream;
use kvd::sync::{Arc, Ordering};

/// Default of `--max-watch-streams` (WATCH-SRV-3).
pub const WATCH_STREAMS_MAX_DEFAULT: usize = 4_096;
/// Stack reserved for each stream's thread (WATCH-SRV-3); the receive loop is shallow.
pub const WATCH_THREAD_STACK_BYTES: usize = 256 * 1024;
/// The status a stream ends with when recovery reopened the database (REC-3).
const DATABASE_REOPENED: &str =
    "kvd: the database was reopened after a storage error; watch again from your last revision";
/// Translated responses buffered per stream for a slow client (WATCH-SRV-5).
pub const WATCH_RESPONSES_BUFFERED: usize = 128;

type ResponseSender = tokio::sync::mpsc::Sender<Result<pb::WatchResponse, Status>>;

/// The Watch service.
#[derive(Debug, Clone)]
pub struct WatchService {
    node: Arc<Node>,
}

impl WatchService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> WatchService {
        WatchService { node }
    }
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = BoxStream<pb::WatchResponse>;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let guard = StreamGuard::new(self.node.clone(), |streams| &streams.watch);
        // WATCH-SRV-3: the guard has counted this stream already.
        let most = self.node.settings.max_watch_streams;
        if self.node.streams.watch.load(Ordering::Relaxed) > most {
            return Err(Status::unavailable(format!(
                "kvd: too many watch streams (at most {most}, --max-watch-streams); retry later"
            )));
        }
        let generation = self.node.engines.generation();
        let stream = Arc::new(self.node.call(|engine| engine.watch_stream()).await?);
        let (sender, receiver) = tokio::sync::mpsc::channel(WATCH_RESPONSES_BUFFERED);
        let node = self.node.clone();
        let forwarded = stream.clone();
        let forward_sender = sender.clone();
        std::thread::Builder::new()
            .name("kvd-watch".to_owned())
            .stack_size(WATCH_THREAD_STACK_BYTES)
            .spawn(move || {
                forward(&node, &forwarded, &forward_sender, generation);
                drop(guard);
            })
            .map_err(|e| {
                tracing::error!(error = %e, "cannot start a watch stream thread");
                Status::unavailable("kvd: cannot start a watch stream thread; retry later")
            })?;
        let node = self.node.clone();
        // The caller is resolved again at each create, so a dropped token stops new watches.
        let caller = Caller {
            metadata: request.metadata().clone(),
            certificate: request.extensions().get::<ClientCertificate>().cloned(),
        };
        let requests = request.into_inner();
        tokio::spawn(async move {
            read_requests(&node, &caller, requests, stream, &sender).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// Forwards the engine's responses of one stream to the client until the client goes away
/// or the server stops (WATCH-SRV-4). Runs on the stream's own thread (WATCH-SRV-1).
fn forward(node: &Node, stream: &WatchStream, sender: &ResponseSender, generation: u64) {
    loop {
        if node.is_stopping() {
            let _ = sender.blocking_send(Err(Status::unavailable(SERVER_STOPPED)));
            return;
        }
        if node.engines.generation() != generation {
            // REC-3: the engine this stream watched was replaced; its hub is gone.
            let _ = sender.blocking_send(Err(Status::unavailable(DATABASE_REOPENED)));
            return;
        }
        if sender.is_closed() {
            return;
        }
        match stream.recv_timeout(STREAM_POLL) {
            Ok(Some(response)) => {
                // WATCH-SRV-5: waits while the client is slow; fails once it is gone.
                if sender.blocking_send(Ok(node.ids.watch(response))).is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(err) => {
                let _ = sender.blocking_send(Err(status::from_error(&err)));
                return;
            }
        }
    }
}

/// What names a Watch stream's caller, kept for the stream's life: its metadata (a token)
/// and its verified client certificate, if any.
struct Caller {
    metadata: MetadataMap,
    certificate: Option<ClientCertificate>,
}

/// Applies the client's requests to the engine's stream, one at a time and in order, until
/// the client closes its side or goes away, or the server stops.
async fn read_requests(
    node: &Node,
    caller: &Caller,
    mut requests: Streaming<pb::WatchRequest>,
    stream: Arc<WatchStream>,
    sender: &ResponseSender,
) {
    loop {
        let next = tokio::select! {
            next = requests.message() => next,
            () = node.stopping() => return,
            () = sender.closed() => return,
        };
        let request = match next {
            Ok(Some(request)) => request,
            // The client closed its sending side: its watches go on (WATCH-SRV-4).
            Ok(None) => return,
            // WATCH-SRV-6: an undecodable message (or a broken connection) ends the stream
            // with the decoder's status; a client that reset the stream never gets here
            // (tonic reports a reset as the end of the requests).
            Err(status) => {
                end_with(sender, status).await;
                return;
            }
        };
        // etcd ignores a request with no known variant and keeps the stream.
        let Some(request) = request.request_union else {
            continue;
        };
        if let RequestUnion::CreateRequest(create) = &request
            && let Err(denied) = authorize(node, caller, create)
        {
            if !refuse_watch(node, sender, &denied).await {
                return;
            }
            continue;
        }
        let stream = stream.clone();
        let applied = node::blocking(move || apply(&stream, request)).await;
        if let Err(status) = applied {
            end_with(sender, status).await;
            return;
        }
    }
}

/// Checks that the caller may read the whole range of a watch (WATCH-SRV-7).
fn authorize(node: &Node, caller: &Caller, create: &pb::WatchCreateRequest) -> Result<(), Status> {
    let user = auth::authenticated_user_of(node, &caller.metadata, caller.certificate.as_ref())?;
    node.quick(|e| {
        e.auth_check(
            user.as_deref(),
            &create.key,
            &create.range_end,
            kvd::Access::Read,
        )
    })
}

/// Answers a refused create as etcd does: one canceled response with watch id -1 whose
/// reason is the gRPC error's Go text; the stream stays open (WATCH-SRV-7). Returns false
/// if the client is gone.
async fn refuse_watch(node: &Node, sender: &ResponseSender, denied: &Status) -> bool {
    let header = match node.current_header().await {
        Ok(header) => header,
        Err(_) => node.ids.header(0),
    };
    let response = pb::WatchResponse {
        header: Some(header),
        watch_id: -1,
        created: true,
        canceled: true,
        cancel_reason: format!(
            "rpc error: code = {:?} desc = {}",
            denied.code(),
            denied.message()
        ),
        ..pb::WatchResponse::default()
    };
    sender.send(Ok(response)).await.is_ok()
}

/// Ends the response stream with `status`: tonic sends it as the trailers and drops the
/// receiver, which stops the stream's thread (WATCH-SRV-4, WATCH-SRV-6).
async fn end_with(sender: &ResponseSender, status: Status) {
    tracing::debug!(code = ?status.code(), message = status.message(), "watch stream ends with an error");
    // Fails only if the client is gone already; nobody is left to tell then.
    let _ = sender.send(Err(status)).await;
}

/// Applies one request to the engine's stream; its answer (if any) arrives on the stream.
fn apply(stream: &WatchStream, request: RequestUnion) -> kvd::Result<()> {
    match request {
        RequestUnion::CreateRequest(create) => {
            let id = stream.create(convert::watch_create_request(create))?;
            tracing::debug!(watch_id = id, "watch created");
        }
        RequestUnion::CancelRequest(cancel) => stream.cancel(cancel.watch_id),
        RequestUnion::ProgressRequest(_) => stream.request_progress(),
    }
    Ok(())
}
