//! etcd's Maintenance service: Status, Hash, HashKV, Alarm, Defragment, Snapshot and
//! MoveLeader are answered; Downgrade is refused with a clear message.
//!
//! Owns: how a single-member engine fills etcd's cluster-shaped Status.
//!
//! Invariants:
//! - MAINT-1: Status is the engine's status translated by `convert` (CONV-5), with the
//!   version and quota of this server; `raftIndex` and `raftAppliedIndex` are both the
//!   engine's applied index + 4 (CONV-5; one member commits what it applies).
//! - MAINT-2: Alarm is the engine's alarm store. ACTIVATE, GET and DEACTIVATE keep the
//!   member id given, member 0 included, as etcd does. The engine raises its own alarms as
//!   its member 0, which the wire shows as this member's id; so the wire and the engine swap
//!   the ids 0 and this member's ([`swap_member`], a bijection: distinct wire ids stay
//!   distinct alarms). The header is filled (etcd 3.5+; 3.4 left it empty). Status lists each alarm in `errors` as etcd's compact
//!   text, `memberID:<id> alarm:<TYPE> ` (trailing space).
//! - MAINT-3: Defragment is the engine's online defrag; writes pause only for the swap.
//! - MAINT-4: Snapshot streams one read snapshot (SNAP-1, ETCDSNAP-1) as etcd's bbolt file,
//!   or as the engine's dump when the request metadata `kvd-snapshot-format` is `kvd`,
//!   through `server::snapshot`: 32 KiB chunks with `remaining_bytes`, then a 32-byte SHA-256
//!   trailer (etcd's format), in a bounded number of slots, with bounded memory, no copy on
//!   disk and a stall timeout (SNAPSHOT-1..5).
//! - MAINT-5: Hash is a hash of the logical store at the current revision (HASH-SRV-1), not
//!   of a database file as etcd's is.
//! - MAINT-6: while auth is enabled Defragment, Hash, HashKV, Snapshot and Alarm
//!   activate/deactivate need an administrator, refused with etcd 3.6's translated errors
//!   (`etcdserver: permission denied`, PermissionDenied); Status and Alarm GET are open.
//! - MAINT-7: MoveLeader (an administrator's call while auth is enabled, as in etcd 3.6) to
//!   this member succeeds and changes nothing, as etcd's does when the target already leads;
//!   to any other id it is etcd's `FailedPrecondition "etcdserver: bad leader transferee"`.
//!
//! Contact points: `server::node` (engine status), `server::status` (refusals),
//! `server::hash` (Hash).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::auth;
use crate::convert::ReportedStatus;
use crate::hash;
use crate::node::{ETCD_CLUSTER_VERSION, ETCD_SERVER_VERSION, Node};
use crate::pb::etcdserverpb::AlarmMember;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use crate::snapshot::Snapshots;
use crate::status;
use kvd as api;
use kvd::sync::Arc;

pub(crate) fn alarm_type(wire: i32) -> api::AlarmType {
    match wire {
        1 => api::AlarmType::NoSpace,
        2 => api::AlarmType::Corrupt,
        _ => api::AlarmType::None,
    }
}

/// Returns the engine's member id for a wire member id, and the wire's for an engine's:
/// the ids 0 and `this_member` trade places, every other id is itself (MAINT-2). The
/// function is its own inverse.
pub(crate) fn swap_member(member: u64, this_member: u64) -> u64 {
    if member == 0 {
        this_member
    } else if member == this_member {
        0
    } else {
        member
    }
}

/// The Maintenance service.
#[derive(Debug, Clone)]
pub struct MaintenanceService {
    node: Arc<Node>,
    snapshots: Arc<Snapshots>,
}

impl MaintenanceService {
    /// Returns the service over `node`, streaming snapshots in the slots of `snapshots`.
    pub fn new(node: Arc<Node>, snapshots: Arc<Snapshots>) -> MaintenanceService {
        MaintenanceService { node, snapshots }
    }

    /// Checks that the caller is an administrator while auth is enabled (MAINT-6).
    fn admin<T>(&self, request: &Request<T>) -> Result<(), Status> {
        crate::auth::require_admin(&self.node, request)
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let is_change = matches!(request.get_ref().action, 1 | 2);
        if is_change {
            self.admin(&request)?;
        } else {
            // AUTHN-6: listing needs no permission, but a token presented must be live.
            auth::authenticated_user(&self.node, &request)?;
        }
        let req = request.into_inner();
        let member = self.node.ids.member_id;
        let action = match req.action {
            1 => api::AlarmAction::Activate,
            2 => api::AlarmAction::Deactivate,
            _ => api::AlarmAction::Get,
        };
        let alarm = alarm_type(req.alarm);
        // RECOVERY-2: a disarm is also the operator's word that the cause of a poisoned store is
        // gone; the reopen comes first, and the disarm then goes to the new engine.
        if action == api::AlarmAction::Deactivate && !self.node.engines.reopen_for_disarm().await {
            let why = self.node.engines.refusal().unwrap_or_default();
            return Err(Status::unavailable(why));
        }
        // MAINT-2: this member is the engine's member 0, and the wire's 0 is kept apart.
        let member_id = swap_member(req.member_id, member);
        let engine_req = api::AlarmRequest {
            action,
            member_id,
            alarm,
        };
        let resp = self
            .node
            .call(move |engine| engine.alarm(engine_req))
            .await?;
        Ok(Response::new(AlarmResponse {
            header: Some(self.node.ids.header(resp.header.revision)),
            alarms: resp
                .alarms
                .iter()
                .map(|a| AlarmMember {
                    member_id: swap_member(a.member_id, member),
                    alarm: a.alarm as i32,
                })
                .collect(),
        }))
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let status = self.node.status()?;
        let reported = ReportedStatus {
            version: ETCD_SERVER_VERSION,
            storage_version: ETCD_CLUSTER_VERSION,
            quota_bytes: self.node.settings.quota_bytes,
        };
        let member = self.node.ids.member_id;
        let errors = status
            .alarms
            .iter()
            .map(|a| {
                format!(
                    "memberID:{} alarm:{} ",
                    swap_member(a.member_id, member),
                    a.alarm.name()
                )
            })
            .collect();
        let mut resp = self.node.ids.status(status, &reported);
        resp.errors = errors;
        Ok(Response::new(resp))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.admin(&request)?;
        // MAINT-3.
        let done = self.node.call(|engine| engine.defrag()).await?;
        tracing::info!(
            db_size_before = done.db_size_before,
            db_size_after = done.db_size_after,
            pause_micros = done.pause_micros,
            "defragmented"
        );
        Ok(Response::new(DefragmentResponse {
            header: Some(self.node.ids.header(done.header.revision)),
        }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.admin(&request)?;
        // MAINT-5.
        let done = self.node.call(hash::store_hash).await?;
        Ok(Response::new(HashResponse {
            header: Some(self.node.ids.header(done.revision)),
            hash: done.hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.admin(&request)?;
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
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.admin(&request)?;
        let format = request
            .metadata()
            .get(crate::snapshot::SNAPSHOT_FORMAT_HEADER)
            .map(|v| v.to_str().unwrap_or("").to_ascii_lowercase());
        let native = match format.as_deref() {
            None | Some("etcd") => false,
            Some("kvd") => true,
            Some(other) => {
                return Err(Status::invalid_argument(format!(
                    "kvd: unknown snapshot format {other:?} (etcd or kvd)"
                )));
            }
        };
        // MAINT-4, SNAPSHOT-1: the slot first, so a refused call costs nothing.
        let permit = self.snapshots.reserve()?;
        let source: Box<dyn crate::snapshot::ChunkSource> = if native {
            let source = self.node.call(|engine| engine.snapshot_stream()).await?;
            tracing::info!(
                revision = source.revision(),
                size_estimate = source.size_estimate(),
                format = "kvd",
                "streaming a snapshot"
            );
            Box::new(source)
        } else {
            let member = kvd::EtcdMember {
                id: self.node.ids.member_id,
                name: self.node.settings.name.clone(),
                peer_urls: vec![self.node.settings.peer_url.clone()],
                client_urls: self.node.settings.advertise_client_urls.clone(),
            };
            let source = self
                .node
                .call(move |engine| engine.etcd_snapshot_stream(&member))
                .await?;
            tracing::info!(
                revision = source.revision(),
                size = source.size(),
                format = "etcd",
                "streaming a snapshot"
            );
            Box::new(source)
        };
        let body = self.snapshots.stream(source, permit);
        Ok(Response::new(Box::pin(body)))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        // MAINT-7.
        self.admin(&request)?;
        if request.get_ref().target_id != self.node.ids.member_id {
            return Err(Status::failed_precondition(status::BAD_LEADER_TRANSFEREE));
        }
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.node.ids.header_without_revision()),
        }))
    }

    async fn downgrade(
        &self,
        _request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(status::unimplemented(status::DOWNGRADE_NOT_SUPPORTED))
    }
}
