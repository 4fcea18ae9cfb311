//! etcd's Maintenance service: Status, HashKV, Alarm and Defragment are answered; Hash,
//! Snapshot, MoveLeader and Downgrade are refused with a clear message.
//!
//! Owns: how a single-member engine fills etcd's cluster-shaped Status.
//!
//! Invariants:
//! - MAINT-1: Status reports `leader == header.member_id`, so `etcdctl endpoint status`
//!   shows this member as the leader; `raftIndex` and `raftAppliedIndex` are both the
//!   engine's applied index (one member commits what it applies); `raftTerm` is 1.
//! - MAINT-2: Alarm GET answers no alarms and ACTIVATE/DEACTIVATE change nothing until the
//!   engine keeps alarms; the header is filled (etcd 3.5+; 3.4 left it empty).
//! - MAINT-3: Defragment answers OK without touching the file until the engine's defrag
//!   lands; the log says so.
//!
//! Contact points: `server::node` (engine status), `server::status` (refusals).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::server::node::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION, Node};
use crate::server::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::server::pb::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use crate::server::{convert, status};
use crate::sync::Arc;

/// The Maintenance service.
#[derive(Debug, Clone)]
pub struct MaintenanceService {
    node: Arc<Node>,
}

impl MaintenanceService {
    /// Returns the service over `node`.
    pub fn new(node: Arc<Node>) -> MaintenanceService {
        MaintenanceService { node }
    }
}

/// Converts a byte count to protobuf's int64, saturating (a file cannot reach 2^63 bytes).
fn size_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        _request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        // MAINT-2: every action answers "no alarms" until the engine keeps alarms.
        let header = self.node.current_header().await?;
        Ok(Response::new(AlarmResponse {
            header: Some(header),
            alarms: Vec::new(),
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let status = self.node.status().await?;
        let member_id = self.node.ids.member_id;
        Ok(Response::new(StatusResponse {
            header: Some(self.node.ids.header(status.header.revision)),
            version: ETCD_SERVER_VERSION.to_owned(),
            db_size: size_i64(status.db_size),
            leader: member_id,
            raft_index: status.applied_index,
            raft_term: convert::RAFT_TERM,
            raft_applied_index: status.applied_index,
            errors: Vec::new(),
            db_size_in_use: size_i64(status.db_size_in_use),
            is_learner: false,
            storage_version: ETCD_CLUSTER_VERSION.to_owned(),
            db_size_quota: self.node.settings.quota_bytes,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        _request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        // MAINT-3.
        tracing::info!("defragment requested: not implemented by the engine yet, nothing done");
        let header = self.node.current_header().await?;
        Ok(Response::new(DefragmentResponse {
            header: Some(header),
        }))
    }

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(status::unimplemented(status::HASH_NOT_IMPLEMENTED))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        let revision = request.get_ref().revision;
        let resp = self
            .node
            .call(move |engine| engine.hash_kv(revision))
            .await?;
        Ok(Response::new(self.node.ids.hash_kv(resp)))
    }

    type SnapshotStream = BoxStream<SnapshotResponse>;

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(status::unimplemented(status::SNAPSHOT_NOT_IMPLEMENTED))
    }

    async fn move_leader(
        &self,
        _request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(status::unimplemented(status::MOVE_LEADER_NOT_SUPPORTED))
    }

    async fn downgrade(
        &self,
        _request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(status::unimplemented(status::DOWNGRADE_NOT_SUPPORTED))
    }
}
