//! etcd's Lock service (`v3lockpb.Lock`): a lock per name, held by the key created first
//! under the name's prefix, as etcd 3.4's `v3lock` server serves it over the `concurrency`
//! package's `Mutex` (here `server::concurrency`).
//!
//! Invariants:
//! - LOCK-1: Lock answers only when the caller's key (`name/<lease in hex>`, CONC-2 for lease
//!   0) is the key created first under the prefix: the Txn that created it (or found it,
//!   when the lease asked already) saw no older key, or every older key has been deleted
//!   since (CONC-3). The answer's header is that Txn's, or that of the last Range of the
//!   wait. A lock is reentrant per lease, as in etcd: a second Lock with the lease that holds
//!   it answers at once with the same key.
//! - LOCK-2: a Lock that does not get the lock (the client went away, the server stopped,
//!   the wait failed) deletes its key before it ends (CONC-4), as etcd's `Mutex.Lock` does,
//!   so it leaves no waiter behind; with a lease that held the lock already, that key is the
//!   lock's.
//! - LOCK-3: every operation is the caller's own (CONC-1): Lock needs write and read on the
//!   prefix (the Txn's put and ranges), and read for the watch of an older key; Unlock is a
//!   DeleteRange of the one key given, so it needs what that DeleteRange needs, succeeds for
//!   a key not held, and refuses an empty key with `etcdserver: key is not provided`.
//!
//! Contact points: `server::concurrency` (the recipes); `server::http` routes
//! `/v3lockpb.Lock/...` here and the gateway `/v3/lock/...`.

use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::concurrency::{self, Client, Undo};
use crate::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::v3lockpb::lock_server::Lock;
use crate::pb::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use kvd::sync::Arc;

/// The Lock service.
#[derive(Debug, Clone)]
pub struct LockService {
    node: Arc<Node>,
}

impl LockService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> LockService {
        LockService { node }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let req = request.into_inner();
        let (lease, prefix, key) = client.place(&req.name, req.lease).await?;
        // Queue as a waiter (or find the key this lease queued already), and fetch the
        // holder in the same Txn, so an uncontended Lock is one write.
        let txn = pb::TxnRequest {
            compare: vec![concurrency::created_at(&key, 0)],
            success: vec![
                concurrency::put_op(&key, bytes::Bytes::new(), lease),
                concurrency::range_op(concurrency::first_created(&prefix)),
            ],
            failure: vec![
                concurrency::range_op(concurrency::get(&key)),
                concurrency::range_op(concurrency::first_created(&prefix)),
            ],
        };
        let queued = client.txn(txn).await?;
        let my_revision = if queued.succeeded {
            concurrency::revision(queued.header.as_ref())
        } else {
            // The compare failed, so the key exists at the Txn's revision.
            let mine = concurrency::txn_range_kvs(&queued, 0)?;
            mine.first()
                .map(|kv| kv.create_revision)
                .ok_or_else(|| Status::internal("kvd: a lock's key vanished inside its txn"))?
        };
        let holder = concurrency::txn_range_kvs(&queued, 1)?;
        if holder
            .first()
            .is_none_or(|kv| kv.create_revision == my_revision)
        {
            return Ok(Response::new(LockResponse {
                header: queued.header,
                key,
            }));
        }
        // LOCK-2: armed until the lock is ours.
        let undo = Undo::delete(&client, key.clone());
        match client.wait_deletes(&prefix, my_revision - 1).await {
            Ok(header) => {
                undo.disarm();
                Ok(Response::new(LockResponse { header, key }))
            }
            Err(status) => {
                undo.run().await;
                Err(status)
            }
        }
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let client = Client::new(&self.node, Caller::of(&request));
        let deleted = client.delete(request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse {
            header: deleted.header,
        }))
    }
}
