//! etcd's client-side `concurrency` recipes (its `Session`, `Mutex` and `Election` and
//! their `waitDeletes`), run inside the server as one caller: the Lock and Election services
//! are thin wrappers over them, as etcd 3.4's `v3lock` and `v3election` servers are thin
//! wrappers over the same recipes run through an in-process client.
//!
//! Definitions: the *prefix* of a lock or an election is its name followed by `/`; a
//! caller's *key* under it is the prefix followed by its lease in lowercase hexadecimal
//! ([`key`]); the key under the prefix created first (the smallest create revision) holds
//! the lock or leads the election; the others wait in create-revision order.
//!
//! Invariants:
//! - CONC-1: every operation a recipe makes is the caller's own: KV operations go through
//!   the KV service's methods (`KvService::txn`, `range`, `delete_range`) and a lease grant
//!   through `LeaseService::lease_grant`, each as a request of the caller's identity alone
//!   ([`Caller::request`]: its token and client certificate), so each is validated,
//!   permission-checked and applied as the caller's own Txn, Range, DeleteRange or
//!   LeaseGrant would be (AUTHZ-1, AUTHZ-2, AUTHN-6); a wait watches on an engine stream
//!   opened by `watch::open_stream` (counted against `--max-watch-streams`, WATCH-SRV-3)
//!   after the Watch service's own check (`watch::authorize`, WATCH-SRV-7).
//! - CONC-2: a session's lease is the request's; 0 grants a lease of
//!   [`SESSION_TTL_SECONDS`] (etcd's `concurrency.NewSession`). The server never keeps a
//!   lease alive: etcd's servers orphan the session.
//! - CONC-3: [`Client::wait_deletes`] returns only when a Range finds no key under the
//!   prefix created at or before its bound (etcd's `waitDeletes`); until then it waits for
//!   the delete of the last-created such key, watching from the revision after the Range
//!   that saw it, so a delete between the Range and the watch is not missed.
//! - CONC-4: a wait ends with `Unavailable "etcdserver: server stopped"` once the server
//!   stops (NODE-3), and within [`STREAM_POLL`] of the engine being reopened (RECOVERY-3);
//!   a client that goes away drops the wait and its watch with it. What a recipe must undo
//!   when its wait does not finish ([`Undo`]: a Lock's key, a Campaign's candidacy) is
//!   undone then, on a task of its own when the client is gone.
//!
//! Contact points: `server::lock` and `server::election` (the services over these
//! recipes); `server::kv`, `server::lease`, `server::watch` and `server::auth` (`Caller`).

use std::future::poll_fn;

use bytes::Bytes;
use tonic::Status;

use crate::auth::Caller;
use crate::convert;
use crate::kv::KvService;
use crate::lease::LeaseService;
use crate::node::{self, Node, SERVER_STOPPED, STREAM_POLL, StreamGuard};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::request_op::Request as Op;
use crate::pb::etcdserverpb::response_op::Response as OpResponse;
use crate::pb::mvccpb;
use crate::pb::mvccpb::event::EventType;
use crate::status;
use crate::watch;
use kvd::WatchStream;
use kvd::sync::Arc;

/// The TTL of the lease granted for a request with lease 0 (CONC-2): etcd's
/// `concurrency` default session TTL.
pub const SESSION_TTL_SECONDS: i64 = 60;

/// Returns the prefix of the lock or election `name`: the name and a `/`.
pub fn prefix(name: &[u8]) -> Bytes {
    let mut prefix = Vec::with_capacity(name.len() + 1);
    prefix.extend_from_slice(name);
    prefix.push(b'/');
    Bytes::from(prefix)
}

/// Returns the key of the session with `lease` under `prefix`: the lease in lowercase
/// hexadecimal without padding, as Go's `%x` prints it (a negative one with a `-`).
pub fn key(prefix: &[u8], lease: i64) -> Bytes {
    let sign = if lease < 0 { "-" } else { "" };
    let hex = format!("{sign}{:x}", lease.unsigned_abs());
    let mut key = Vec::with_capacity(prefix.len() + hex.len());
    key.extend_from_slice(prefix);
    key.extend_from_slice(hex.as_bytes());
    Bytes::from(key)
}

/// Returns the compare "`key` was created at `revision`" (0: `key` does not exist).
pub fn created_at(key: &Bytes, revision: i64) -> pb::Compare {
    pb::Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.clone(),
        range_end: Bytes::new(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
    }
}

/// Returns the operation that puts `value` at `key` with `lease`.
pub fn put_op(key: &Bytes, value: Bytes, lease: i64) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestPut(pb::PutRequest {
            key: key.clone(),
            value,
            lease,
            ..pb::PutRequest::default()
        })),
    }
}

/// Returns the operation that runs the Range `range`.
pub fn range_op(range: pb::RangeRequest) -> pb::RequestOp {
    pb::RequestOp {
        request: Some(Op::RequestRange(range)),
    }
}

/// Returns the Range of the one key `key`.
pub fn get(key: &Bytes) -> pb::RangeRequest {
    pb::RangeRequest {
        key: key.clone(),
        ..pb::RangeRequest::default()
    }
}

/// Returns the Range of the key created first under `prefix` (etcd's `WithFirstCreate`).
pub fn first_created(prefix: &Bytes) -> pb::RangeRequest {
    pb::RangeRequest {
        key: prefix.clone(),
        range_end: kvd::prefix_end(prefix),
        limit: 1,
        sort_order: SortOrder::Ascend as i32,
        sort_target: SortTarget::Create as i32,
        ..pb::RangeRequest::default()
    }
}

/// Returns the Range of the key created last under `prefix` at or before
/// `max_create_revision` (etcd's `WithLastCreate` and `WithMaxCreateRev`).
fn last_created_at_most(prefix: &Bytes, max_create_revision: i64) -> pb::RangeRequest {
    pb::RangeRequest {
        key: prefix.clone(),
        range_end: kvd::prefix_end(prefix),
        limit: 1,
        sort_order: SortOrder::Descend as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision,
        ..pb::RangeRequest::default()
    }
}

/// Returns the Txn that deletes `key` if it was created at `revision` (etcd's
/// `Election.Resign`).
pub fn resign_txn(key: &Bytes, revision: i64) -> pb::TxnRequest {
    pb::TxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![pb::RequestOp {
            request: Some(Op::RequestDeleteRange(pb::DeleteRangeRequest {
                key: key.clone(),
                ..pb::DeleteRangeRequest::default()
            })),
        }],
        failure: Vec::new(),
    }
}

/// Returns the key-values of a Range's answer.
pub fn kvs(range: &pb::RangeResponse) -> Result<Vec<mvccpb::KeyValue>, Status> {
    range
        .all_kvs()
        .map_err(|e| Status::internal(format!("kvd: decode a range's key-values: {e}")))
}

/// Returns the key-values of the Range at `index` of a Txn's answer; the Txn was built
/// with a Range there.
pub fn txn_range_kvs(txn: &pb::TxnResponse, index: usize) -> Result<Vec<mvccpb::KeyValue>, Status> {
    match txn.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(range)) => kvs(range),
        other => Err(Status::internal(format!(
            "kvd: the txn's operation {index} answered {other:?}, not a range"
        ))),
    }
}

/// Returns the revision of a header.
pub fn revision(header: Option<&pb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

/// The recipes' way to the services, as one caller (CONC-1).
#[derive(Debug, Clone)]
pub struct Client {
    node: Arc<Node>,
    caller: Caller,
    kv: KvService,
    lease: LeaseService,
}

impl Client {
    /// Returns the client of `caller` on `node`.
    pub fn new(node: &Arc<Node>, caller: Caller) -> Client {
        Client {
            node: node.clone(),
            caller,
            kv: KvService::new(node.clone()),
            lease: LeaseService::new(node.clone()),
        }
    }

    /// Runs a Txn as the caller.
    pub async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse, Status> {
        Ok(self.kv.txn(self.caller.request(txn)).await?.into_inner())
    }

    /// Runs a Range as the caller.
    pub async fn range(&self, range: pb::RangeRequest) -> Result<pb::RangeResponse, Status> {
        Ok(self
            .kv
            .range(self.caller.request(range))
            .await?
            .into_inner())
    }

    /// Deletes the one key `key` as the caller.
    pub async fn delete(&self, key: Bytes) -> Result<pb::DeleteRangeResponse, Status> {
        let delete = pb::DeleteRangeRequest {
            key,
            ..pb::DeleteRangeRequest::default()
        };
        Ok(self
            .kv
            .delete_range(self.caller.request(delete))
            .await?
            .into_inner())
    }

    /// Returns the caller's place under the lock or election `name` for the session `lease`
    /// asks for (CONC-2): the session's lease, the name's prefix and the caller's key there.
    pub async fn place(&self, name: &[u8], lease: i64) -> Result<(i64, Bytes, Bytes), Status> {
        let lease = self.session_lease(lease).await?;
        let prefix = prefix(name);
        let key = key(&prefix, lease);
        Ok((lease, prefix, key))
    }

    /// Returns the lease of a session asked for with `lease` (CONC-2): `lease` itself, or,
    /// for 0, a lease granted now as the caller.
    pub async fn session_lease(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let grant = pb::LeaseGrantRequest {
            ttl: SESSION_TTL_SECONDS,
            id: 0,
        };
        let granted = self.lease.lease_grant(self.caller.request(grant)).await?;
        Ok(granted.into_inner().id)
    }

    /// Waits until no key under `prefix` created at or before `max_create_revision` is
    /// left (CONC-3); returns the header of the Range that found none.
    pub async fn wait_deletes(
        &self,
        prefix: &Bytes,
        max_create_revision: i64,
    ) -> Result<Option<pb::ResponseHeader>, Status> {
        loop {
            let range = self
                .range(last_created_at_most(prefix, max_create_revision))
                .await?;
            let Some(last) = kvs(&range)?.into_iter().next() else {
                return Ok(range.header);
            };
            let from = revision(range.header.as_ref()) + 1;
            self.wait_delete(last.key, from).await?;
        }
    }

    /// Waits for a delete of `key` at `from` or later.
    async fn wait_delete(&self, key: Bytes, from: i64) -> Result<(), Status> {
        let watcher = self.watch_key(key, from).await?;
        loop {
            let response = watcher.next().await?;
            if response
                .events
                .iter()
                .any(|event| event.r#type == EventType::Delete as i32)
            {
                return Ok(());
            }
        }
    }

    /// Starts a watch of the one key `key` from revision `from`, as the caller (CONC-1).
    pub async fn watch_key(&self, key: Bytes, from: i64) -> Result<Watcher, Status> {
        self.watch(pb::WatchCreateRequest {
            key,
            start_revision: from,
            ..pb::WatchCreateRequest::default()
        })
        .await
    }

    /// Starts the watch `create` as the caller (CONC-1).
    pub async fn watch(&self, create: pb::WatchCreateRequest) -> Result<Watcher, Status> {
        watch::authorize(&self.node, &self.caller, &create)?;
        let opened = watch::open_stream(&self.node).await?;
        let stream = Arc::new(opened.stream);
        let creating = stream.clone();
        node::blocking(move || creating.create(convert::watch_create_request(create))).await?;
        Ok(Watcher {
            node: self.node.clone(),
            stream,
            generation: opened.generation,
            _guard: opened.guard,
        })
    }
}

/// One watch a recipe waits on; dropping it cancels the watch.
pub struct Watcher {
    node: Arc<Node>,
    stream: Arc<WatchStream>,
    generation: u64,
    _guard: StreamGuard,
}

impl Watcher {
    /// Returns the next response with events; a watch the engine ended, the server's
    /// shutdown and the engine's reopening end the wait with an error (CONC-4).
    pub async fn next(&self) -> Result<pb::WatchResponse, Status> {
        let mut tick = tokio::time::interval(STREAM_POLL);
        loop {
            let received = tokio::select! {
                received = poll_fn(|cx| self.stream.poll_recv(cx)) => received,
                () = self.node.stopping() => return Err(Status::unavailable(SERVER_STOPPED)),
                _ = tick.tick() => match self.reopened() {
                    Some(status) => return Err(status),
                    None => continue,
                },
            };
            let response = match received {
                Ok(response) => self.node.ids.watch(response),
                Err(err) => {
                    return Err(self.reopened().unwrap_or_else(|| status::from_error(&err)));
                }
            };
            if response.canceled {
                return Err(watch_ended(&response));
            }
            if !response.events.is_empty() {
                return Ok(response);
            }
        }
    }

    /// The status to end with once the engine behind the watch is replaced (RECOVERY-3).
    fn reopened(&self) -> Option<Status> {
        (self.node.engines.generation() != self.generation).then(|| {
            Status::unavailable("kvd: the database was reopened after a storage error; ask again")
        })
    }
}

/// Returns the error of a wait whose watch the engine ended: etcd's `compacted` if its
/// start was compacted away.
fn watch_ended(response: &pb::WatchResponse) -> Status {
    if response.compact_revision > 0 {
        return status::from_error(&kvd::Error::Compacted);
    }
    Status::unavailable(format!(
        "kvd: the watch a lock or election waited on ended: {}",
        response.cancel_reason
    ))
}

/// What a recipe undoes when its wait does not finish (CONC-4).
#[derive(Debug, Clone)]
enum UndoAction {
    /// Delete a Lock's key.
    Delete(Bytes),
    /// Resign a Campaign's candidacy: delete the key if it is still the generation created
    /// at the revision.
    Resign { key: Bytes, revision: i64 },
}

impl UndoAction {
    async fn run(&self, client: &Client) {
        let result = match self {
            UndoAction::Delete(key) => client.delete(key.clone()).await.map(drop),
            UndoAction::Resign { key, revision } => {
                client.txn(resign_txn(key, *revision)).await.map(drop)
            }
        };
        if let Err(status) = result {
            tracing::warn!(action = ?self, code = ?status.code(), message = status.message(), "could not undo an unfinished lock or campaign");
        }
    }
}

/// An undo armed while a recipe waits (CONC-4): [`Undo::disarm`] once the wait succeeded,
/// [`Undo::run`] to undo now; dropped armed (the client went away), it undoes on a task of
/// its own.
pub struct Undo {
    client: Option<Client>,
    action: UndoAction,
}

impl Undo {
    /// Returns the undo that deletes `key`.
    pub fn delete(client: &Client, key: Bytes) -> Undo {
        Undo {
            client: Some(client.clone()),
            action: UndoAction::Delete(key),
        }
    }

    /// Returns the undo that resigns the candidacy of `key` created at `revision`.
    pub fn resign(client: &Client, key: Bytes, revision: i64) -> Undo {
        Undo {
            client: Some(client.clone()),
            action: UndoAction::Resign { key, revision },
        }
    }

    /// Leaves everything as it is.
    pub fn disarm(mut self) {
        self.client = None;
    }

    /// Undoes now.
    pub async fn run(mut self) {
        if let Some(client) = self.client.take() {
            self.action.run(&client).await;
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let action = self.action.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move { action.run(&client).await });
            }
            Err(_) => {
                tracing::warn!(action = ?action, "no runtime left to undo an unfinished lock or campaign");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_prefix_and_the_lease_in_hex() {
        let prefix = prefix(b"lock");
        assert_eq!(prefix.as_ref(), b"lock/");
        assert_eq!(
            key(&prefix, 0x694d_a24d_3edd_7709).as_ref(),
            b"lock/694da24d3edd7709"
        );
        assert_eq!(key(&prefix, 255).as_ref(), b"lock/ff");
        assert_eq!(key(&prefix, -5).as_ref(), b"lock/-5", "as Go's %x");
        assert_eq!(key(b"/", 1).as_ref(), b"/1", "an empty name, as in etcd");
    }

    #[test]
    fn first_and_last_created_ranges_cover_the_prefix_only() {
        let prefix = prefix(b"e");
        let first = first_created(&prefix);
        assert_eq!(
            (first.key.as_ref(), first.range_end.as_ref()),
            (&b"e/"[..], &b"e0"[..])
        );
        assert_eq!(
            (first.limit, first.sort_order, first.sort_target),
            (1, 1, 2)
        );
        let last = last_created_at_most(&prefix, 7);
        assert_eq!((last.sort_order, last.max_create_revision), (2, 7));
    }
}
