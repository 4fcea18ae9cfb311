//! etcd's Maintenance service: Status, HashKV, Alarm and Defragment are answered; Hash,
//! Snapshot, MoveLeader and Downgrade are refused with a clear message.
//!
//! Owns: how a single-member engine fills etcd's cluster-shaped Status.
//!
//! Invariants:
//! - MAINT-1: Status is the engine's status translated by `convert` (CONV-5), with the
//!   version and quota of this server; `raftIndex` and `raftAppliedIndex` are both the
//!   engine's applied index (one member commits what it applies).
//! - MAINT-2: Alarm GET answers no alarms and ACTIVATE/DEACTIVATE change nothing until the
//!   engine keeps alarms; the header is filled (etcd 3.5+; 3.4 left it empty).
//! - MAINT-3: Defragment answers OK without touching the file until the engine's defrag
//!   lands; the log says so.
//!
//! Contact points: `server::node` (engine status), `server::status` (refusals).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::server::convert::ReportedStatus;
use crate::server::node::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION, Node};
use crate::server::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::server::pb::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use crate::server::status;
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
        let reported = ReportedStatus {
            version: ETCD_SERVER_VERSION,
            storage_version: ETCD_CLUSTER_VERSION,
            quota_bytes: self.node.settings.quota_bytes,
        };
        Ok(Response::new(self.node.ids.status(status, &reported)))
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
