//! etcd's Maintenance service: Status, Hash, HashKV, Alarm, Defragment and Snapshot are
//! answered; MoveLeader and Downgrade are refused with a clear message.
//!
//! Owns: how a single-member engine fills etcd's cluster-shaped Status.
//!
//! Invariants:
//! - MAINT-1: Status is the engine's status translated by `convert` (CONV-5), with the
//!   version and quota of this server; `raftIndex` and `raftAppliedIndex` are both the
//!   engine's applied index (one member commits what it applies).
//! - MAINT-2: Alarm is the engine's alarm store. ACTIVATE, GET and DEACTIVATE keep the
//!   member id given, member 0 included, as etcd does. The engine raises its own alarms as
//!   its member 0, which the wire shows as this member's id; so the wire and the engine swap
//!   the ids 0 and this member's ([`swap_member`], a bijection: distinct wire ids stay
//!   distinct alarms). The header is filled (etcd 3.5+; 3.4 left it empty). Status lists each alarm in `errors` as etcd's compact
//!   text, `memberID:<id> alarm:<TYPE> ` (trailing space).
//! - MAINT-3: Defragment is the engine's online defrag; writes pause only for the swap.
//! - MAINT-4: Snapshot writes a consistent copy of the database next to it, streams it in
//!   32 KiB chunks with `remaining_bytes`, then a 32-byte SHA-256 trailer (etcd's format),
//!   and deletes the copy. Plain reads, not a memory map: the copy is private and read once,
//!   so a map would buy nothing and need unsafe code.
//! - MAINT-5: Hash is a hash of the logical store at the current revision (HASH-SRV-1), not
//!   of a database file as etcd's is.
//!
//! Contact points: `server::node` (engine status), `server::status` (refusals),
//! `server::hash` (Hash).

use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

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
use crate::status;
use kvd as api;
use kvd::sync::Arc;

/// etcd's snapshot chunk size.
const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;
/// Chunks buffered between the reader thread and the gRPC stream.
const SNAPSHOT_CHANNEL_CHUNKS: usize = 16;
/// Numbers the snapshot copies of this process.
static SNAPSHOTS: kvd::sync::AtomicU64 = kvd::sync::AtomicU64::new(0);

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

/// Sends the file at `path` as etcd's snapshot stream (MAINT-4).
fn stream_file(
    path: &std::path::Path,
    total: u64,
    sender: &tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>,
) -> std::io::Result<()> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut remaining = total;
    let mut buffer = vec![0u8; SNAPSHOT_CHUNK_BYTES];
    while remaining > 0 {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Err(std::io::Error::other("the copy is shorter than its length"));
        }
        hasher.update(&buffer[..n]);
        remaining = remaining.saturating_sub(n as u64);
        let chunk = SnapshotResponse {
            header: None,
            remaining_bytes: remaining,
            blob: bytes::Bytes::copy_from_slice(&buffer[..n]),
            version: String::new(),
        };
        if sender.blocking_send(Ok(chunk)).is_err() {
            return Ok(()); // The client went away.
        }
    }
    let trailer = SnapshotResponse {
        header: None,
        remaining_bytes: 0,
        blob: bytes::Bytes::copy_from_slice(&hasher.finalize()),
        version: String::new(),
    };
    let _ = sender.blocking_send(Ok(trailer));
    Ok(())
}

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
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        let member = self.node.ids.member_id;
        let action = match req.action {
            1 => api::AlarmAction::Activate,
            2 => api::AlarmAction::Deactivate,
            _ => api::AlarmAction::Get,
        };
        let alarm = alarm_type(req.alarm);
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
        let status = self.node.status().await?;
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
        _request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
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

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
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
        // MAINT-4: one copy per request, named so that concurrent requests never collide.
        let sequence = SNAPSHOTS.fetch_add(1, kvd::sync::Ordering::Relaxed);
        let path = self
            .node
            .settings
            .data_dir
            .join(format!("snapshot.{}.{sequence}.tmp", std::process::id()));
        let copy = path.clone();
        let (bytes, _) = self
            .node
            .call(move |engine| engine.snapshot_to(&copy))
            .await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(SNAPSHOT_CHANNEL_CHUNKS);
        tokio::task::spawn_blocking(move || {
            let result = stream_file(&path, bytes, &sender);
            // The copy served its purpose either way; a leftover would only take space.
            let _ = std::fs::remove_file(&path);
            if let Err(e) = result {
                let _ = sender.blocking_send(Err(Status::internal(format!("kvd: snapshot: {e}"))));
            }
        });
        Ok(Response::new(Box::pin(
            tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
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
