//! etcd's KV service: Range, Put, DeleteRange, Txn and Compact, served by the engine.
//!
//! Owns: nothing but the glue from gRPC to [`kvd::Engine`].
//!
//! Invariants:
//! - KV-1: each RPC translates its request (`convert`), makes one engine call (a read where
//!   NODE-1 puts it, a write submitted and awaited), and translates the answer or the error
//!   (`status`); no semantics live here.
//! - AUTHZ-1: while auth is enabled each RPC resolves its caller and the engine checks its
//!   permission (read on a Range's range, write on a Put's key and its lease's keys, read
//!   and write on a DeleteRange's range, every compare and op of a Txn, nested ones
//!   included) after the request's own checks (PERM-5): a Range through
//!   `auth_check_range` before the read, a write or a read-only Txn as the caller it is
//!   submitted with; a denial changes nothing. Compact is unchecked (etcd).
//! - AUTHZ-2: every write goes to the engine with its caller, so the engine checks it at
//!   admission and again in apply order (PERM-4): a write admitted before a permission was
//!   revoked and applied after the revoke is refused.
//! - KV-2: a write's `kvd-operation-id` metadata is checked before the engine is called and
//!   handed to it as the write's options (OPID-1); a retry's answer is the engine's
//!   recorded response, translated as any other.
//!
//! Contact points: `server::convert`, `server::node`, `server::operation`.

use tonic::{Request, Response, Status};

use crate::auth;
use crate::convert;
use crate::node::Node;
use crate::operation;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use crate::role_turns;
use crate::status;
use kvd::sync::Arc;

/// The KV service.
#[derive(Debug, Clone)]
pub struct KvService {
    node: Arc<Node>,
}

impl KvService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> KvService {
        KvService { node }
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let user = auth::authenticated_user(&self.node, &request)?;
        let req = convert::range_request(request.into_inner());
        // The check validates first (an empty key is `key is not provided`, PERM-5).
        self.node
            .quick(|e| e.auth_check_range(user.as_deref(), &req))?;
        // RWIRE-1: the key-values go out as the engine wrote them.
        let answer = self.node.range(req).await?;
        Ok(Response::new(RangeResponse {
            header: Some(self.node.ids.header(answer.revision)),
            kvs: Vec::new(),
            more: answer.more,
            count: answer.count,
            encoded_kvs: answer.kvs.into(),
        }))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let options = operation::write_options(request.metadata())?;
        let user = auth::authenticated_user(&self.node, &request)?;
        let req = convert::put_request(request.into_inner());
        // PERM-5, AUTHZ-2: checked as this caller after the request's own checks, and
        // again in apply order.
        let with = kvd::WriteOptions {
            caller: Some(user),
            ..options.clone()
        };
        let resp = self
            .node
            .submit(move |engine, done| {
                role_turns::note_owner(|| engine.owning_role(&req.key));
                engine.submit_put_with(req, &with, done);
            })
            .await?;
        let resp = self.node.ids.put(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let options = operation::write_options(request.metadata())?;
        let user = auth::authenticated_user(&self.node, &request)?;
        let req = convert::delete_range_request(request.into_inner());
        // PERM-5, AUTHZ-2: checked as this caller after the request's own checks, and
        // again in apply order.
        let with = kvd::WriteOptions {
            caller: Some(user),
            ..options.clone()
        };
        let resp = self
            .node
            .submit(move |engine, done| {
                role_turns::note_owner(|| engine.owning_role(&req.key));
                engine.submit_delete_range_with(req, &with, done);
            })
            .await?;
        let resp = self.node.ids.delete_range(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let options = operation::write_options(request.metadata())?;
        let user = auth::authenticated_user(&self.node, &request)?;
        let req = convert::txn_request(request.into_inner(), self.node.settings.max_txn_ops)
            .map_err(|err| status::from_error(&err))?;
        // PERM-5, AUTHZ-2: checked as this caller after the request's own checks, and
        // again in apply order.
        let with = kvd::WriteOptions {
            caller: Some(user),
            ..options.clone()
        };
        if req.is_read_only() {
            // A read: served here if small, else on the blocking pool (NODE-1). It changes
            // nothing, so its id (if any) records nothing.
            let resp = self.node.read_only_txn(req, with).await?;
            return Ok(Response::new(self.node.ids.txn(resp)));
        }
        let resp = self
            .node
            .submit(move |engine, done| {
                role_turns::note_owner(|| engine.txn_owning_role(&req));
                engine.submit_txn_with(req, &with, done);
            })
            .await?;
        let resp = self.node.ids.txn(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        // AUTHN-6: no permission needed, but a token presented must be live, as in etcd.
        auth::authenticated_user(&self.node, &request)?;
        let options = operation::write_options(request.metadata())?;
        let req = convert::compaction_request(request.get_ref());
        let with = options.clone();
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_compact_with(req, &with, done))
            .await?;
        tracing::info!(
            revision = req.revision,
            physical = req.physical,
            "compacted"
        );
        let resp = self.node.ids.compaction(resp);
        self.node.drop_after_commit.check(&options, &resp)?;
        Ok(Response::new(resp))
    }
}
