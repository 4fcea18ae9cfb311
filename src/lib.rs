//! kvd: an embedded MVCC key-value store with etcd's data model, on redb.
//!
//! Open a data directory with [`Engine::open`] and use it as etcd's KV service:
//!
//! ```
//! use kvd::{Config, Engine, PutRequest, RangeRequest};
//! let dir = tempfile::tempdir().unwrap();
//! let engine = Engine::open(dir.path(), Config::default()).unwrap();
//! let put = engine.put(PutRequest::new("greeting", "hello")).unwrap();
//! assert_eq!(put.header.revision, 2); // a fresh store is at 1; the first write makes 2
//! let got = engine.range(&RangeRequest::key("greeting")).unwrap();
//! assert_eq!(&got.kvs[0].value[..], b"hello");
//! engine.close().unwrap();
//! ```
//!
//! The layers, top to bottom: [`Engine`] (composition root and the apply thread), `mvcc`
//! (revisions, the key index, range, txn, compaction, hash), `storage` (the only module that
//! names redb). See `docs/ARCHITECTURE.md`.

mod accounting;
mod alarm;
mod api;
mod auth;
#[doc(hidden)]
pub mod bbolt;
mod clock;
mod codec;
mod engine;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod lease;
mod mvcc;
mod operations;
pub mod quota;
mod reconciler;
mod space;
mod storage;
pub mod sync;
mod watch;

pub use accounting::{
    ALLOCATION_ACTIVE_WINDOW, ALLOCATION_RETRY_AFTER, AccountingRequest, Agent, AgentState,
    AllocationPrepareQueue, Counters, KV_BYTES, KV_KEYS, RecordKind, RoleUsage, TaskQuery,
    TaskState, TaskStatus,
};
pub use api::*;
pub use auth::{
    Access, AuthRequest, Permission, PermissionType, ROOT_ROLE, ROOT_USER, Role as AuthRole,
    User as AuthUser,
};
pub use clock::{Clock, MANUAL_CLOCK_EPOCH, ManualClock, SystemClock};
pub use engine::{
    AGENT_REREGISTER_TIMEOUT_DEFAULT, AllocationPrepareQueueReplaced, ApplyStats, AutoCompaction,
    CheckReport, CommitFailpoint, CommitStep, Completion, Config, DefragFailpoint, Engine,
    EtcdMember, EtcdRestoreSummary, EtcdSnapshotStream, OfflineDefrag, OlderSchema, PreparedRange,
    RoleDurations, RoleQueue, ScrubReport, SnapshotStream, WAL_DEFRAG_ROOM_BYTES_DEFAULT,
    WAL_FILE_BYTES_DEFAULT, WAL_FILE_BYTES_MAX, WAL_FILE_BYTES_MIN, WRITE_DURATION_BOUNDS_MICROS,
    WriteOptions, WriteRequest, burst_hinted, check_data_dir, defrag_data_dir,
    etcd_snapshot_status, in_burst, restore_etcd_snapshot, restore_snapshot, snapshot_summary,
    write_cost,
};
pub use error::{AuthError, Error, Result, StorageError};
pub use mvcc::read::EncodedRange;
pub use mvcc::{KeyIndex, Revision};
pub use operations::reconcile::{OperationQuery, OperationState, OperationStatus};
pub use operations::{
    OPERATION_ID_BYTES_MAX, OPERATION_RETENTION_COUNT_DEFAULT, OPERATION_RETENTION_DEFAULT,
    Retention, validate_operation_id,
};
pub use reconciler::{ReconcileRun, Reconciler};
pub use space::{
    FreeSpace, ManualFreeSpace, StatvfsFreeSpace, default_fs_reserve_bytes,
    quota_bytes as space_quota_bytes,
};
pub use storage::dump::DumpSummary;

/// Returns the first bytes of a kvd dump (a `--format kvd` snapshot).
pub fn dump_magic() -> &'static [u8] {
    storage::dump::DUMP_MAGIC
}
pub use storage::faults::Faults;
pub use storage::timings::{DiskTimingsSnapshot, HistogramSnapshot, disk_bucket_bounds_seconds};
pub use watch::WatchStream;
