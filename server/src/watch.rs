//! etcd's Watch service: one bidirectional stream carries many watches, created, canceled
//! and asked for progress by the client's requests, with the engine's responses sent back in
//! the engine's order.
//!
//! Each gRPC stream has two halves, and neither holds a thread:
//! - a task that reads the client's requests and applies each to the engine's
//!   [`WatchStream`] on the blocking pool (create and cancel take the engine's locks), one at
//!   a time and in order;
//! - the response stream tonic sends from ([`Responses`]): each poll takes the engine's next
//!   response with the asynchronous receive ([`WatchStream::poll_recv`]) and translates it.
//!
//! Invariants:
//! - WATCH-SRV-1: no reactor thread ever blocks on the engine: responses are received
//!   asynchronously, requests run on the blocking pool (NODE-1); a stream holds no thread.
//! - WATCH-SRV-2: responses reach the client in the order the engine produced them; the
//!   created (or refused) response of a watch precedes its events because the engine puts
//!   both on the same stream in that order.
//! - WATCH-SRV-3: at most `--max-watch-streams` ([`WATCH_STREAMS_MAX_DEFAULT`]) streams are
//!   open at once, the engine streams the Lock and Election services wait on included
//!   ([`open_stream`]); a further Watch call is refused with `Unavailable`. A stream costs its
//!   request task, its engine stream and what the engine buffers for it (WATCH-3).
//! - WATCH-SRV-4: a stream ends as soon as the client goes away (tonic drops [`Responses`])
//!   or the server shuts down (NODE-3), and within [`STREAM_POLL`] of the engine being
//!   reopened (RECOVERY-3); dropping the engine's stream cancels its watches. The client closing
//!   only its sending side ends nothing: watches keep delivering, as in etcd.
//! - WATCH-SRV-5: a response is translated only when tonic asks for the next one, which it
//!   does as the connection's flow control allows, plus the frames the streamed call's task
//!   reads ahead (CONN-7); a slow client leaves the responses in the
//!   engine's per-watch buffers, which fill, and the engine moves the watch to catch-up from
//!   history (WATCH-3) instead of growing memory. At most [`WATCH_CONTROL_BUFFERED`] of the
//!   server's own answers (refused creates, an ending status) wait beside them.
//! - WATCH-SRV-6: a request that cannot be decoded ends the whole stream with the
//!   decoder's status (`INTERNAL`, as gRPC-go ends it); no request after it is read, and
//!   the stream is never left open without its request reader.
//! - WATCH-SRV-7: while auth is enabled a create needs read on the watch's whole range,
//!   from-key ones included (PERM-1, etcd 3.6); a refused create gets one response with
//!   watch id -1, `created` and `canceled` set and etcd's reason text, and the stream goes on.
//!
//! Contact points: `server::convert` (messages), `server::node` (engine, shutdown, gauges);
//! the engine's [`WatchStream`]; `server::concurrency` opens its in-process watches with
//! [`open_stream`] and checks them with [`authorize`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Caller;
use crate::convert;
use crate::node::{self, Node, SERVER_STOPPED, STREAM_POLL, StreamGuard};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::watch_request::RequestUnion;
use crate::pb::etcdserverpb::watch_server::Watch;
use crate::status;
use kvd::WatchStream;
use kvd::sync::{Arc, Ordering};

/// Default of `--max-watch-streams` (WATCH-SRV-3).
pub const WATCH_STREAMS_MAX_DEFAULT: usize = 65_536;
/// The status a stream ends with when recovery reopened the database (RECOVERY-3).
const DATABASE_REOPENED: &str =
    "kvd: the database was reopened after a storage error; watch again from your last revision";
/// The server's own answers (refused creates, an ending status) buffered per stream beside
/// the engine's responses (WATCH-SRV-5).
pub const WATCH_CONTROL_BUFFERED: usize = 16;

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
        let opened = open_stream(&self.node).await?;
        let stream = Arc::new(opened.stream);
        let (sender, control) = tokio::sync::mpsc::channel(WATCH_CONTROL_BUFFERED);
        let responses = Responses::new(
            self.node.clone(),
            stream.clone(),
            control,
            opened.generation,
            opened.guard,
        );
        let node = self.node.clone();
        // The caller is resolved again at each create, so a dropped token stops new watches.
        let caller = Caller::of(&request);
        let requests = request.into_inner();
        tokio::spawn(async move {
            read_requests(&node, &caller, requests, stream, &sender).await;
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// An engine watch stream, counted in the open streams while it lives (WATCH-SRV-3).
pub struct OpenStream {
    /// The engine's stream.
    pub stream: WatchStream,
    /// The engine's generation when the stream was opened (RECOVERY-3).
    pub generation: u64,
    /// Counts the stream until dropped.
    pub guard: StreamGuard,
}

/// Opens an engine watch stream, or refuses with `Unavailable` when `--max-watch-streams`
/// are open already (WATCH-SRV-3): a Watch RPC's, or one the Lock and Election services
/// wait on (CONC-1).
pub async fn open_stream(node: &Arc<Node>) -> Result<OpenStream, Status> {
    let guard = StreamGuard::new(node.clone(), |streams| &streams.watch);
    // The guard has counted this stream already.
    let most = node.settings.max_watch_streams;
    if node.streams.watch.load(Ordering::Relaxed) > most {
        return Err(Status::unavailable(format!(
            "kvd: too many watch streams (at most {most}, --max-watch-streams); retry later"
        )));
    }
    let generation = node.engines.generation();
    let stream = node.call(|engine| engine.watch_stream()).await?;
    Ok(OpenStream {
        stream,
        generation,
        guard,
    })
}

/// The responses of one stream, as tonic sends them: the server's own answers first, then
/// the engine's, translated one at a time as tonic asks (WATCH-SRV-1, WATCH-SRV-5), until
/// the server stops or the engine is reopened (WATCH-SRV-4).
struct Responses {
    node: Arc<Node>,
    stream: Arc<WatchStream>,
    control: tokio::sync::mpsc::Receiver<Result<pb::WatchResponse, Status>>,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Looks at the engine's generation every [`STREAM_POLL`] (RECOVERY-3).
    tick: tokio::time::Interval,
    generation: u64,
    ended: bool,
    /// Counts this stream while it is open (WATCH-SRV-3).
    _guard: StreamGuard,
}

impl Responses {
    fn new(
        node: Arc<Node>,
        stream: Arc<WatchStream>,
        control: tokio::sync::mpsc::Receiver<Result<pb::WatchResponse, Status>>,
        generation: u64,
        guard: StreamGuard,
    ) -> Responses {
        let stopping = {
            let node = node.clone();
            Box::pin(async move { node.stopping().await })
        };
        let mut tick = tokio::time::interval(STREAM_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Responses {
            node,
            stream,
            control,
            stopping,
            tick,
            generation,
            ended: false,
            _guard: guard,
        }
    }

    /// The status to end with once the engine behind the stream is replaced (RECOVERY-3).
    fn reopened(&self) -> Option<Status> {
        (self.node.engines.generation() != self.generation)
            .then(|| Status::unavailable(DATABASE_REOPENED))
    }
}

impl Stream for Responses {
    type Item = Result<pb::WatchResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let ending = |this: &mut Responses, status: Status| {
            this.ended = true;
            Poll::Ready(Some(Err(status)))
        };
        // While responses are ready, each poll looks at the server's answers, the shutdown
        // signal and the engine's generation without registering a waker for any of them:
        // a busy stream pays a few atomic loads per response, not three registrations.
        if let Ok(answer) = this.control.try_recv() {
            this.ended = answer.is_err();
            return Poll::Ready(Some(answer));
        }
        if this.node.is_stopping() {
            return ending(this, Status::unavailable(SERVER_STOPPED));
        }
        if let Some(status) = this.reopened() {
            return ending(this, status);
        }
        match this.stream.poll_recv(cx) {
            Poll::Ready(Ok(response)) => {
                return Poll::Ready(Some(Ok(this.node.ids.watch(response))));
            }
            Poll::Ready(Err(err)) => {
                let status = this.reopened().unwrap_or_else(|| status::from_error(&err));
                return ending(this, status);
            }
            Poll::Pending => {}
        }
        // Nothing to send: wait for whichever comes first. The request task's answers;
        // `None` means only that it ended (the client closed its sending side), which ends
        // nothing here (WATCH-SRV-4).
        if let Poll::Ready(Some(answer)) = this.control.poll_recv(cx) {
            this.ended = answer.is_err();
            return Poll::Ready(Some(answer));
        }
        if this.stopping.as_mut().poll(cx).is_ready() {
            return ending(this, Status::unavailable(SERVER_STOPPED));
        }
        while this.tick.poll_tick(cx).is_ready() {
            if let Some(status) = this.reopened() {
                return ending(this, status);
            }
        }
        Poll::Pending
    }
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
pub fn authorize(
    node: &Node,
    caller: &Caller,
    create: &pb::WatchCreateRequest,
) -> Result<(), Status> {
    let user = caller.user(node)?;
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
    let header = match node.current_header() {
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
/// stream, which drops the engine's stream (WATCH-SRV-4, WATCH-SRV-6).
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
