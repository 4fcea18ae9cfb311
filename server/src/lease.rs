//! etcd's Lease service: LeaseGrant, LeaseRevoke, LeaseTimeToLive and LeaseLeases as unary
//! calls into the engine, and LeaseKeepAlive as a bidirectional stream.
//!
//! Owns: the keep-alive stream's loop.
//!
//! Invariants:
//! - LEASE-SRV-1: every keep-alive request gets exactly one response, in request order, with
//!   the lease id and the renewed TTL (0 for an unknown or expired lease, never an error,
//!   as etcd answers).
//! - LEASE-SRV-2: the keep-alive stream ends when the client closes its side (OK, as etcd),
//!   when the client goes away, or when the server shuts down (NODE-3); it holds no engine
//!   call between requests.
//! - LEASE-SRV-3: at most [`KEEP_ALIVE_RESPONSES_MAX`] responses wait for a slow client
//!   (plus the frames the streamed call's task reads ahead, CONN-7); the
//!   loop waits for room before it reads the next request, so a client that sends without
//!   reading is slowed down rather than buffered without bound.
//! - LEASE-SRV-4: a request that cannot be decoded ends the stream with the decoder's status
//!   (`INTERNAL`, as gRPC-go), never with OK.
//! - LEASE-SRV-5: while auth is enabled LeaseRevoke needs write on every key attached to
//!   the lease (PERM-3), checked by the engine as the caller it is submitted with, at
//!   admission and in apply order; grant, keep-alive, time-to-live and list are unchecked
//!   (etcd 3.4).
//! - LEASE-SRV-6: LeaseGrant and LeaseRevoke take a `kvd-operation-id` as the KV writes do
//!   (KV-2, OPID-1).
//! - LEASE-SRV-7: a keep-alive is answered in the stream's own task on the connection's
//!   thread (`Node::quick`: the lessor's lock, no disk), never through the blocking pool.
//!
//! Contact points: `server::convert` (messages), `server::node` (engine calls, shutdown),
//! `server::operation` (operation ids).

use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth;
use crate::node::{Node, SERVER_STOPPED, StreamGuard};
use crate::operation;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::lease_server::Lease;
use kvd as api;
use kvd::sync::Arc;

/// Keep-alive responses buffered for one stream (LEASE-SRV-3).
pub const KEEP_ALIVE_RESPONSES_MAX: usize = 16;

/// The Lease service.
#[derive(Debug, Clone)]
pub struct LeaseService {
    node: Arc<Node>,
}

impl LeaseService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> LeaseService {
        LeaseService { node }
    }
}

type KeepAliveSender = tokio::sync::mpsc::Sender<Result<pb::LeaseKeepAliveResponse, Status>>;

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<pb::LeaseGrantRequest>,
    ) -> Result<Response<pb::LeaseGrantResponse>, Status> {
        // AUTHN-6: no permission needed, but a token presented must be live, as in etcd.
        auth::authenticated_user(&self.node, &request)?;
        let options = operation::write_options(request.metadata())?;
        let req = request.into_inner();
        let req = api::LeaseGrantRequest {
            ttl: req.ttl,
            id: req.id,
        };
        let with = options.clone();
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_lease_grant_with(req, &with, done))
            .await?;
        let resp = self.node.ids.lease_grant(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        request: Request<pb::LeaseRevokeRequest>,
    ) -> Result<Response<pb::LeaseRevokeResponse>, Status> {
        let options = operation::write_options(request.metadata())?;
        let id = request.get_ref().id;
        // AUTH: write on every key attached to the lease (PERM-3), checked at submission
        // and again in apply order.
        let user = auth::authenticated_user(&self.node, &request)?;
        let with = kvd::WriteOptions {
            caller: Some(user),
            ..options.clone()
        };
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_lease_revoke_with(id, &with, done))
            .await?;
        let resp = self.node.ids.lease_revoke(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = BoxStream<pb::LeaseKeepAliveResponse>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<pb::LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let requests = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(KEEP_ALIVE_RESPONSES_MAX);
        let node = self.node.clone();
        let guard = StreamGuard::new(node.clone(), |streams| &streams.keep_alive);
        tokio::spawn(async move {
            keep_alive_loop(&node, requests, &sender).await;
            drop(guard);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<pb::LeaseTimeToLiveRequest>,
    ) -> Result<Response<pb::LeaseTimeToLiveResponse>, Status> {
        let pb::LeaseTimeToLiveRequest { id, keys } = request.into_inner();
        // NODE-1: without its keys the answer is a few numbers read under the lessor's
        // lock; a lease's keys can be many, so listing them goes to the blocking pool.
        let resp = if keys {
            self.node
                .call(move |engine| engine.lease_time_to_live(id, keys))
                .await?
        } else {
            self.node
                .quick(|engine| engine.lease_time_to_live(id, keys))?
        };
        Ok(Response::new(self.node.ids.lease_time_to_live(resp)))
    }

    async fn lease_leases(
        &self,
        _request: Request<pb::LeaseLeasesRequest>,
    ) -> Result<Response<pb::LeaseLeasesResponse>, Status> {
        let resp = self.node.call(|engine| engine.lease_leases()).await?;
        Ok(Response::new(self.node.ids.lease_leases(resp)))
    }
}

/// Answers each keep-alive request of one stream (LEASE-SRV-1) until the stream ends
/// (LEASE-SRV-2).
async fn keep_alive_loop(
    node: &Node,
    mut requests: Streaming<pb::LeaseKeepAliveRequest>,
    sender: &KeepAliveSender,
) {
    loop {
        let next = tokio::select! {
            next = requests.message() => next,
            () = node.stopping() => {
                let _ = sender.send(Err(Status::unavailable(SERVER_STOPPED))).await;
                return;
            }
            () = sender.closed() => return,
        };
        let id = match next {
            Ok(Some(request)) => request.id,
            // The client closed its side: etcd ends the stream with OK.
            Ok(None) => return,
            // LEASE-SRV-4: an undecodable request ends the stream with the decoder's status.
            // A client that reset the stream never gets here (tonic reports a reset as the
            // end of the requests); if the connection broke, the send fails harmlessly.
            Err(status) => {
                let _ = sender.send(Err(status)).await;
                return;
            }
        };
        // LEASE-SRV-7: a renewal takes the lessor's lock for a moment and touches no disk,
        // so it runs here, not on the blocking pool (a hop there and back cost two thread
        // wake-ups per keep-alive).
        let answer = node
            .quick(|engine| engine.lease_keep_alive(id))
            .map(|resp| node.ids.lease_keep_alive(resp));
        let failed = answer.is_err();
        // LEASE-SRV-3: `send` waits for room before the next request is read.
        if sender.send(answer).await.is_err() || failed {
            return;
        }
    }
}
