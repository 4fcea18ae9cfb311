//! etcd's Election service (`v3electionpb.Election`): leader election per name, led by the
//! candidate whose key under the name's prefix was created first, as etcd 3.4's
//! `v3election` server serves it over the `concurrency` package's `Election` (here
//! `server::concurrency`).
//!
//! Invariants:
//! - ELECT-1: Campaign answers only when the caller's key (`name/<lease in hex>`, CONC-2 for
//!   lease 0) leads: every key under the prefix created before it has been deleted (CONC-3).
//!   A candidate whose key exists already (the same lease) keeps its place, and its value is
//!   proclaimed if it differs (on failure it resigns and the error is the answer). The
//!   answer's header is the Campaign Txn's, and its leader key names the key's create
//!   revision, which Proclaim and Resign compare against.
//! - ELECT-2: a Campaign whose wait ends without leading resigns its candidacy: the client
//!   went away, the server stopped (CONC-4) or the wait failed (a watch refused by
//!   `--max-watch-streams`, the engine reopened). etcd resigns only when the caller's
//!   context ended, and otherwise leaves a key that may lead later with nobody knowing.
//! - ELECT-3: Proclaim and Resign act only while the leader key is the generation created at
//!   `leader.rev` (one Txn each): Proclaim of another generation or of no key is
//!   `election: not leader`; Resign succeeds either way and deletes nothing then. Without a
//!   `leader` both are `"leader" field must be provided` (STATUS-4).
//! - ELECT-4: Leader answers the key-value created first under the prefix, or
//!   `election: no leader`; Observe sends that leader (or, when there is none, the first
//!   key put under the prefix), then each new value of its key, and after its delete the
//!   next leader, until the client goes away (its watch is dropped then) or the server stops
//!   (`Unavailable`, NODE-3). A failure after the stream started ends it with its status
//!   (etcd's ends it with none).
//! - ELECT-5: every operation is the caller's own (CONC-1): Campaign needs write and read on
//!   the prefix, Proclaim write and read on the leader key, Resign read and write on it,
//!   Leader and Observe read on the prefix; Observe's first Range runs before the stream
//!   starts, so a refusal is the call's error.
//!
//! Contact points: `server::concurrency` (the recipes); `server::http` routes
//! `/v3electionpb.Election/...` here and the gateway `/v3/election/...`.

use bytes::Bytes;
use tonic::codegen::BoxStream;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::concurrency::{self, Client, Undo};
use crate::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::mvccpb::event::EventType;
use crate::pb::v3electionpb::election_server::Election;
use crate::pb::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use crate::status;
use kvd::sync::Arc;

/// Answers waiting for a slow Observe client; past them the observer's watch waits, and
/// the engine's buffers for it fill and fall back to catch-up (WATCH-3).
pub const OBSERVE_RESPONSES_BUFFERED: usize = 16;

type ObserveSender = tokio::sync::mpsc::Sender<Result<LeaderResponse, Status>>;

/// The Election service.
#[derive(Debug, Clone)]
pub struct ElectionService {
    node: Arc<Node>,
}

impl ElectionService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> ElectionService {
        ElectionService { node }
    }
}

/// Puts `value` at the leader key `key` created at `revision`, with `lease`, if it is still
/// that generation (ELECT-3); returns the Txn's header.
async fn proclaim(
    client: &Client,
    key: &Bytes,
    revision: i64,
    lease: i64,
    value: Bytes,
) -> Result<Option<pb::ResponseHeader>, Status> {
    let txn = pb::TxnRequest {
        compare: vec![concurrency::created_at(key, revision)],
        success: vec![concurrency::put_op(key, value, lease)],
        failure: Vec::new(),
    };
    let answer = client.txn(txn).await?;
    if !answer.succeeded {
        return Err(status::election(status::ELECTION_NOT_LEADER));
    }
    Ok(answer.header)
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let req = request.into_inner();
        let (lease, prefix, key) = client.place(&req.name, req.lease).await?;
        let txn = pb::TxnRequest {
            compare: vec![concurrency::created_at(&key, 0)],
            success: vec![concurrency::put_op(&key, req.value.clone(), lease)],
            failure: vec![concurrency::range_op(concurrency::get(&key))],
        };
        let campaigned = client.txn(txn).await?;
        let mut leader_revision = concurrency::revision(campaigned.header.as_ref());
        if !campaigned.succeeded {
            // The compare failed, so the key exists at the Txn's revision.
            let existing = concurrency::txn_range_kvs(&campaigned, 0)?
                .into_iter()
                .next()
                .ok_or_else(|| {
                    Status::internal("kvd: a candidate's key vanished inside its txn")
                })?;
            leader_revision = existing.create_revision;
            if existing.value != req.value {
                let proclaimed =
                    proclaim(&client, &key, leader_revision, lease, req.value.clone()).await;
                if let Err(status) = proclaimed {
                    Undo::resign(&client, key, leader_revision).run().await;
                    return Err(status);
                }
            }
        }
        // ELECT-2: armed until this candidate leads.
        let undo = Undo::resign(&client, key.clone(), leader_revision);
        match client.wait_deletes(&prefix, leader_revision - 1).await {
            Ok(_) => undo.disarm(),
            Err(status) => {
                // A Campaign that answers an error leaves no candidacy behind, whatever
                // ended its wait (etcd keeps it unless the caller's context ended; kvd's wait
                // can also fail on its own limits, as `--max-watch-streams`).
                undo.run().await;
                return Err(status);
            }
        }
        Ok(Response::new(CampaignResponse {
            header: campaigned.header,
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev: leader_revision,
                lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let req = request.into_inner();
        let leader = req
            .leader
            .ok_or_else(|| status::election(status::MISSING_LEADER_KEY))?;
        // The Txn refuses an empty key too; refused here, lease 0 grants no lease first.
        if leader.key.is_empty() {
            return Err(status::from_error(&kvd::Error::KeyNotProvided));
        }
        let lease = client.session_lease(leader.lease).await?;
        let header = proclaim(&client, &leader.key, leader.rev, lease, req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let prefix = concurrency::prefix(&request.get_ref().name);
        let range = client.range(concurrency::first_created(&prefix)).await?;
        let kv = concurrency::kvs(&range)?
            .into_iter()
            .next()
            .ok_or_else(|| status::election(status::ELECTION_NO_LEADER))?;
        Ok(Response::new(LeaderResponse {
            header: range.header,
            kv: Some(kv),
        }))
    }

    type ObserveStream = BoxStream<LeaderResponse>;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let prefix = concurrency::prefix(&request.get_ref().name);
        // ELECT-5: the first Range is the call's, so a refusal is the call's error.
        let first = client.range(concurrency::first_created(&prefix)).await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(OBSERVE_RESPONSES_BUFFERED);
        tokio::spawn(async move {
            // ELECT-4: a client that went away ends the observation and drops its watch.
            let ended = tokio::select! {
                ended = observe(&client, &prefix, first, &sender) => ended,
                () = sender.closed() => Ok(()),
            };
            if let Err(status) = ended {
                // Fails only if the client is gone already; nobody is left to tell then.
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let leader = request
            .into_inner()
            .leader
            .ok_or_else(|| status::election(status::MISSING_LEADER_KEY))?;
        let resigned = client
            .txn(concurrency::resign_txn(&leader.key, leader.rev))
            .await?;
        Ok(Response::new(ResignResponse {
            header: resigned.header,
        }))
    }
}

/// Sends the leaders of the election at `prefix` (ELECT-4), starting from `current`, the
/// first-created Range; returns only with an error.
async fn observe(
    client: &Client,
    prefix: &Bytes,
    mut current: pb::RangeResponse,
    sender: &ObserveSender,
) -> Result<(), Status> {
    loop {
        let leader = match concurrency::kvs(&current)?.into_iter().next() {
            Some(kv) => LeaderResponse {
                header: current.header,
                kv: Some(kv),
            },
            None => {
                let from = concurrency::revision(current.header.as_ref()) + 1;
                first_put(client, prefix, from).await?
            }
        };
        let key = leader
            .kv
            .as_ref()
            .map(|kv| kv.key.clone())
            .unwrap_or_default();
        let from = concurrency::revision(leader.header.as_ref()) + 1;
        send(sender, leader).await?;
        follow(client, key, from, sender).await?;
        current = client.range(concurrency::first_created(prefix)).await?;
    }
}

/// Waits for the first put under `prefix` at `from` or later: the leader of an election
/// that had none (ELECT-4). Its header's revision is the put's, as etcd's.
async fn first_put(client: &Client, prefix: &Bytes, from: i64) -> Result<LeaderResponse, Status> {
    let watcher = client
        .watch(pb::WatchCreateRequest {
            key: prefix.clone(),
            range_end: kvd::prefix_end(prefix),
            start_revision: from,
            ..pb::WatchCreateRequest::default()
        })
        .await?;
    loop {
        let response = watcher.next().await?;
        let put = response
            .events
            .into_iter()
            .find(|event| event.r#type == EventType::Put as i32)
            .and_then(|event| event.kv);
        if let Some(kv) = put {
            let header = response.header.map(|header| pb::ResponseHeader {
                revision: kv.mod_revision,
                ..header
            });
            return Ok(LeaderResponse {
                header,
                kv: Some(kv),
            });
        }
    }
}

/// Sends each new value of the leader key `key` from `from` on, until it is deleted
/// (ELECT-4).
async fn follow(
    client: &Client,
    key: Bytes,
    from: i64,
    sender: &ObserveSender,
) -> Result<(), Status> {
    let watcher = client.watch_key(key, from).await?;
    loop {
        let response = watcher.next().await?;
        for event in response.events {
            if event.r#type == EventType::Delete as i32 {
                return Ok(());
            }
            let answer = LeaderResponse {
                header: response.header,
                kv: event.kv,
            };
            send(sender, answer).await?;
        }
    }
}

/// Sends one answer to the observer; an observer that went away ends the observation.
async fn send(sender: &ObserveSender, answer: LeaderResponse) -> Result<(), Status> {
    sender
        .send(Ok(answer))
        .await
        .map_err(|_| Status::cancelled("kvd: the observer went away"))
}
