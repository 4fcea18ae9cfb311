//! etcd's KV service: Range, Put, DeleteRange, Txn and Compact, served by the engine.
//!
//! Owns: nothing but the glue from gRPC to [`kvd::Engine`].
//!
//! Invariants:
//! - KV-1: each RPC translates its request (`convert`), makes one engine call (a read on the
//!   blocking pool, a write submitted and awaited, NODE-1), and translates the answer or the
//!   error (`status`); no semantics live here.
//!
//! Contact points: `server::convert`, `server::node`.

use tonic::{Request, Response, Status};

use crate::convert;
use crate::node::Node;
use crate::pb::etcdserverpb::kv_server::Kv;
use crate::pb::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
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
        let req = convert::range_request(request.into_inner());
        let resp = self.node.call(move |engine| engine.range(&req)).await?;
        Ok(Response::new(self.node.ids.range(resp)))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let req = convert::put_request(request.into_inner());
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_put(req, done))
            .await?;
        Ok(Response::new(self.node.ids.put(resp)))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let req = convert::delete_range_request(request.into_inner());
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_delete_range(req, done))
            .await?;
        Ok(Response::new(self.node.ids.delete_range(resp)))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let req = convert::txn_request(request.into_inner(), self.node.settings.max_txn_ops)
            .map_err(|err| status::from_error(&err))?;
        let resp = if req.is_read_only() {
            // A read, served in the caller's thread: keep it off the reactor (NODE-1).
            self.node.call(move |engine| engine.txn(req)).await?
        } else {
            self.node
                .submit(move |engine, done| engine.submit_txn(req, done))
                .await?
        };
        Ok(Response::new(self.node.ids.txn(resp)))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let req = convert::compaction_request(request.get_ref());
        let resp = self
            .node
            .submit(move |engine, done| engine.submit_compact(req, done))
            .await?;
        tracing::info!(
            revision = req.revision,
            physical = req.physical,
            "compacted"
        );
        Ok(Response::new(self.node.ids.compaction(resp)))
    }
}
