//! The composition root: [`Engine`] opens a data directory, rebuilds the index, starts the
//! apply and commit threads, and serves reads in the caller's thread.
//!
//! Write path: a caller's request passes admission once (the alarm gate, `mvcc::validate`,
//! the in-flight bound → `TooManyRequests`, the size limit) and goes, with the completion of
//! its own response type, onto the proposal mailbox (`Engine::submit_*`; the blocking
//! methods wait on a one-slot channel). The apply thread (`engine::apply`) applies a batch of
//! requests in one storage write transaction and hands it to the commit thread
//! (`engine::commit`), which makes its log record durable, publishes the new revision, and
//! only then answers each request (`docs/design/write-path.md`).
//!
//! Read path: take the index read lock, load the published revision, check the revision
//! against the compaction revision, look up the revisions to read, open a storage snapshot,
//! release the lock, fetch the records.
//!
//! Invariants:
//! - ENG-1: a reader never sees a write before the commit that holds it is durable: readers
//!   read at most the published revision, and the thread that finishes a batch (normally the
//!   commit thread) publishes it only once it is durable (COMMIT-1).
//! - ENG-2: the published revision never goes backwards, also across a restart.
//! - ENG-3: a reader opens its storage snapshot while holding the index read lock, so the
//!   records the index named cannot have been deleted by compaction (which needs the index
//!   write lock first).
//! - ENG-4: no storage snapshot outlives one request.
//! - ENG-5: a reader loads the published revision while holding the index read lock, so the
//!   revision is at least the compaction revision it then checks against (APPLY-2 publishes
//!   a revision before any compaction at it): a read at the current revision never fails as
//!   compacted.
//! - ENG-6: a panic of the apply thread (a bug) poisons the store and refuses every queued
//!   and later write; the commit thread finishes what it was handed, so close and drop
//!   return.
//!
//! Contact points: the public API of the crate.

mod apply;
mod auth;
mod auto_compact;
mod commit;
mod defrag;
mod etcd_snapshot;
mod lanes;
mod mailbox;
mod offline;
mod prepare;
mod proposal;
mod publish;
mod realtime;
mod recover;
mod reply;
mod scrub;
mod snapshot;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use std::thread::JoinHandle;

use crate::accounting::{
    self, AccountingRequest, Accounts, Agent, AgentState, AllocationPrepareQueue, RecordKind,
    RoleUsage, TaskQuery, TaskStatus,
};
use crate::alarm::{ALARMS_TABLE, Alarms};
use crate::api::{
    AlarmAction, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest, CompactionResponse,
    DefragProgress, DefragResponse, DeleteRangeRequest, DeleteRangeResponse, HashKvResponse,
    KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, ResponseHeader, Status, TxnRequest, TxnResponse,
};
use crate::auth::{AUTH_TABLES, AuthStore};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, Result, StorageError};
use crate::lease::{LEASE_TTL_MAX_SECONDS, LEASE_TTL_MIN_SECONDS_DEFAULT, LEASES_TABLE, Lessor};
use crate::mvcc::hash::HashState;
use crate::mvcc::write::Change;
use crate::mvcc::{Index, read, validate};
use crate::operations::reconcile::{OperationQuery, OperationStatus};
use crate::operations::{OPERATIONS_TABLE, Operations, Retention, validate_operation_id};
use crate::quota::{self, QuotaConfig, RawQuotaConfig, STAR_ROLE};
use crate::space::{self, FreeSpace, SpaceTracker, StatvfsFreeSpace};
use crate::storage::faults::Faults;
pub use crate::storage::wal::{
    WAL_DEFRAG_ROOM_BYTES_DEFAULT, WAL_FILE_BYTES_DEFAULT, WAL_FILE_BYTES_MAX, WAL_FILE_BYTES_MIN,
};
use crate::storage::{CommitSync, Store, StoreOptions};
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Name, Ordering, RwLock, Wake, Weak};
use crate::watch::{Hub, WATCH_STALLED_RETRY, WATCH_SYNC_INTERVAL, WatchSource, WatchStream};
use apply::Applier;
pub use apply::{burst_hinted, in_burst};
pub use auto_compact::AutoCompaction;
pub use commit::{CommitFailpoint, CommitStep};
use commit::{Committer, Handover};
pub use defrag::DefragFailpoint;
use defrag::DefragState;
pub use etcd_snapshot::{
    EtcdMember, EtcdRestoreSummary, EtcdSnapshotStream, etcd_snapshot_status, import_etcd_snapshot,
    restore_etcd_snapshot,
};
use lanes::Queued;
use mailbox::Mailbox;
pub use offline::{CheckReport, OfflineDefrag, OlderSchema, check_data_dir, defrag_data_dir};
use prepare::PrepareQueue;
pub use prepare::{RoleDurations, RoleQueue, WRITE_DURATION_BOUNDS_MICROS};
pub use proposal::{Completion, WriteRequest, write_cost};
use proposal::{Identified, Proposal, ReconcileAnswer, ReconcileRequest};
pub use publish::Published;
pub use scrub::ScrubReport;
pub use snapshot::{SnapshotStream, restore_snapshot, snapshot_summary};

/// etcd's default `--max-request-bytes`.
pub const MAX_REQUEST_BYTES_DEFAULT: usize = 1_572_864;
/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS_DEFAULT: usize = 128;
/// Default bound of the prepare queue of admitted, not yet answered writes (etcd's
/// maxGapBetweenApplyAndCommitIndex).
pub const PREPARE_QUEUE_LENGTH_DEFAULT: usize = 5_000;
/// Default largest number of requests applied in one commit.
pub const BATCH_REQUESTS_MAX_DEFAULT: usize = 1_024;
/// Default number of history records a compaction step examines (etcd's batch limit).
pub const COMPACTION_BATCH_RECORDS_DEFAULT: usize = 1_000;
/// Default redb page cache.
pub const CACHE_SIZE_BYTES_DEFAULT: usize = 256 << 20;
/// etcd's default progress notification interval (10 minutes).
pub const WATCH_PROGRESS_NOTIFY_INTERVAL_DEFAULT: Duration = Duration::from_secs(600);
/// How many times HashKV restarts when a compaction lands while it hashes.
const HASH_RESTARTS_MAX: usize = 8;

const _: () = assert!(BATCH_REQUESTS_MAX_DEFAULT <= PREPARE_QUEUE_LENGTH_DEFAULT);
// Both prepare queues call a role active for the same window after its last admission.
const _: () =
    assert!(accounting::ALLOCATION_ACTIVE_WINDOW.as_nanos() == prepare::ACTIVE_WINDOW.as_nanos());

/// Settings of an [`Engine`].
///
/// ```
/// let config = kvd::Config { max_txn_ops: 256, unsafe_no_fsync: false, ..kvd::Config::default() };
/// assert_eq!(config.max_request_bytes, 1_572_864);
/// ```
#[derive(Debug, Clone)]
pub struct Config {
    /// Largest request accepted, as etcd measures it (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Largest number of operations in one Txn level (`--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Writes admitted and not yet answered, at most (`--prepare-queue-length`), shared
    /// fairly between roles (`engine::prepare`); past it a write gets `TooManyRequests`
    /// with a retry hint.
    pub prepare_queue_length: usize,
    /// Requests applied in one commit, at most.
    pub batch_requests_max: usize,
    /// History records a compaction step examines per commit.
    pub compaction_batch_records: usize,
    /// The storage page cache in bytes.
    pub cache_size_bytes: usize,
    /// Skip fsync on commits: a crash loses acknowledged writes. For benchmarks only.
    pub unsafe_no_fsync: bool,
    /// The source of time for everything the engine schedules.
    pub clock: Arc<dyn Clock>,
    /// Injected storage failures, for tests of the poisoned state. `None` in production.
    pub faults: Option<Arc<Faults>>,
    /// Lease TTLs below this many seconds are raised to it (etcd derives 2 s from its
    /// election timeout).
    pub lease_ttl_min_seconds: i64,
    /// How often watches with `progress_notify` get a progress response when idle.
    pub watch_progress_notify_interval: Duration,
    /// etcd's `--quota-backend-bytes`: 0 means the 2 GiB default, negative disables the
    /// space quota.
    pub quota_backend_bytes: i64,
    /// Writes with a cost stop while the data directory's filesystem has less than this
    /// free; `None` means an eighth of the quota, at least 64 MiB.
    pub fs_reserve_bytes: Option<u64>,
    /// The member id alarms raised by this engine carry.
    pub member_id: u64,
    /// Where the filesystem guard reads the free space (statvfs unless a test drives it).
    pub free_space: Arc<dyn FreeSpace>,
    /// Length of the write-ahead log between checkpoints (64 KiB to 64 MiB; less is taken as
    /// 64 KiB, more is refused at open): a record that
    /// would pass it makes its batch a checkpoint, except while a defrag copies. The file is
    /// eight times as long and at least `wal_defrag_room_bytes`, the rest used only during a
    /// defrag.
    pub wal_file_bytes: u64,
    /// The log file's least length (`kvd.wal`, default 16 MiB): past `wal_file_bytes` it is
    /// used only while a defrag copies, and a copy that fills it makes a checkpoint whose
    /// `fsync` queues behind the copy's. Size it by how long a defrag lasts; tests that open
    /// many engines and never defrag can set 0 (each open allocates and reads the file).
    pub wal_defrag_room_bytes: u64,
    /// Opens a data directory whose database was not closed cleanly although its log is
    /// missing, losing the writes acknowledged since the last checkpoint; without it such a
    /// directory is refused as damaged (STORE-7). For `kvd check --accept-missing-log`.
    pub accept_missing_log: bool,
    /// Makes a defrag stop at a step as if the process died there (tests only).
    pub defrag_failpoint: Option<DefragFailpoint>,
    /// Makes the process abort at a step of the commit protocol (crash tests only).
    pub commit_failpoint: Option<CommitFailpoint>,
    /// etcd's `--auto-compaction-mode` and `--auto-compaction-retention`; `None` is off.
    pub auto_compaction: Option<AutoCompaction>,
    /// The allocation prepare queue length set at start (`--allocation-prepare-queue-length`):
    /// `Some(n)` replaces the persisted length at open (0 turns the queue off); `None` keeps
    /// the persisted one (off if it was never set). [`Engine::allocation_prepare_queue_replaced`] says
    /// whether it replaced one.
    pub allocation_prepare_queue_length: Option<u64>,
    /// How many outcomes of writes with an operation id are kept, and for how long
    /// (`--operation-retention-count`, `--operation-retention`; OPER-4).
    pub operation_retention: Retention,
    /// A recovered agent that has not registered again this long after open (engine clock)
    /// becomes unreachable (`--agent-reregister-timeout`).
    pub agent_reregister_timeout: Duration,
    /// Runs the apply and commit threads under `SCHED_FIFO` at this priority (1 to 99,
    /// Linux; `--pipeline-priority`), so a write is not held behind other threads' time
    /// slices while the CPU is busy (RT-1). Needs root, `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`
    /// at least this high, else `Engine::open` fails. `None` (the default) leaves them
    /// under the normal scheduler.
    pub pipeline_priority: Option<u8>,
}

/// How long after open a recovered agent may take to register again, unless configured.
pub const AGENT_REREGISTER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(600);

/// Options of one write.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let once = kvd::WriteOptions::with_operation_id("client-7/1");
/// let first = engine.put_with(kvd::PutRequest::new("k", "v"), &once).unwrap();
/// let retry = engine.put_with(kvd::PutRequest::new("k", "v"), &once).unwrap();
/// assert_eq!(first, retry, "the retry gets the recorded response");
/// assert_eq!(engine.status().unwrap().header.revision, 2, "applied once");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Makes the write exactly-once (OPER-2): a later write with the same id and the same
    /// request gets the recorded response instead of being applied again.
    pub operation_id: Option<String>,
    /// Checks the write against the auth store as this caller, once its own checks passed
    /// (PERM-5), and again in apply order (PERM-4); a read-only Txn is checked before it is
    /// served. `Some(None)` is a caller without identity; `None` checks nothing (the
    /// embedder's own writes).
    pub caller: Option<Option<String>>,
}

impl WriteOptions {
    /// Returns options carrying operation id `id`.
    pub fn with_operation_id(id: impl Into<String>) -> WriteOptions {
        WriteOptions {
            operation_id: Some(id.into()),
            caller: None,
        }
    }
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_request_bytes: MAX_REQUEST_BYTES_DEFAULT,
            max_txn_ops: MAX_TXN_OPS_DEFAULT,
            prepare_queue_length: PREPARE_QUEUE_LENGTH_DEFAULT,
            batch_requests_max: BATCH_REQUESTS_MAX_DEFAULT,
            compaction_batch_records: COMPACTION_BATCH_RECORDS_DEFAULT,
            cache_size_bytes: CACHE_SIZE_BYTES_DEFAULT,
            unsafe_no_fsync: false,
            clock: Arc::new(SystemClock::new()),
            faults: None,
            lease_ttl_min_seconds: LEASE_TTL_MIN_SECONDS_DEFAULT,
            watch_progress_notify_interval: WATCH_PROGRESS_NOTIFY_INTERVAL_DEFAULT,
            quota_backend_bytes: 0,
            fs_reserve_bytes: None,
            member_id: 0,
            free_space: Arc::new(StatvfsFreeSpace::default()),
            wal_file_bytes: WAL_FILE_BYTES_DEFAULT,
            wal_defrag_room_bytes: WAL_DEFRAG_ROOM_BYTES_DEFAULT,
            accept_missing_log: false,
            defrag_failpoint: None,
            commit_failpoint: None,
            auto_compaction: None,
            allocation_prepare_queue_length: None,
            operation_retention: Retention::default(),
            agent_reregister_timeout: AGENT_REREGISTER_TIMEOUT_DEFAULT,
            pipeline_priority: None,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<()> {
        let positive = [
            ("max_request_bytes", self.max_request_bytes),
            ("max_txn_ops", self.max_txn_ops),
            ("prepare_queue_length", self.prepare_queue_length),
            ("batch_requests_max", self.batch_requests_max),
            ("compaction_batch_records", self.compaction_batch_records),
            (
                "operation_retention.count",
                usize::try_from(self.operation_retention.count).unwrap_or(usize::MAX),
            ),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(Error::InvalidArgument(format!("{name} must be at least 1")));
            }
        }
        if self.wal_file_bytes > WAL_FILE_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "wal_file_bytes must be at most {WAL_FILE_BYTES_MAX}, got {}",
                self.wal_file_bytes
            )));
        }
        realtime::validate(self.pipeline_priority)
    }
}

/// What readers read, the commit thread publishes into and the watch sync thread catches
/// up from: the store, the index, the published revision and applied index, and the hub.
#[derive(Debug)]
struct ReadState {
    store: Store,
    index: RwLock<Index>,
    published: Published,
    /// Requests applied by the last published batch.
    applied_index: AtomicU64,
    hub: Arc<Hub>,
}

/// State shared by the apply thread and the callers: the read state plus what admission,
/// the domains and monitoring need. The commit thread gets only a [`commit::Committer`],
/// the watch sync thread only a [`WatchSync`].
///
/// Lock order: `reads.index`, then `lessor`, then `accounts`.
#[derive(Debug)]
struct Shared {
    reads: Arc<ReadState>,
    lessor: Mutex<Lessor>,
    stats: Stats,
    space: SpaceTracker,
    alarms: Mutex<Alarms>,
    accounts: Mutex<Accounts>,
    /// The auth store (AUTH-STORE-1), changed by the apply thread only.
    auth: RwLock<AuthStore>,
    defrag: DefragState,
    /// Tells the watch sync thread to stop.
    stopping: Arc<AtomicBool>,
    /// Writes admitted and not yet answered, by role (PROP-2, PREP-1..3).
    prepare: Arc<PrepareQueue>,
    /// The roles with a registry entry, for charging a write's queue slot to its owner at
    /// admission; replaced by the apply thread after every quota update.
    owners: RwLock<Arc<BTreeSet<String>>>,
    /// Operation ids admitted and not yet answered, with how many writes carry each
    /// (`OPERATION_PENDING` in reconciliation).
    pending_operations: Arc<Mutex<BTreeMap<String, usize>>>,
    config: Config,
}

/// Marks an operation id pending from admission until its write's completion ran.
struct PendingMark {
    pending: Arc<Mutex<BTreeMap<String, usize>>>,
    id: String,
}

impl PendingMark {
    fn new(pending: &Arc<Mutex<BTreeMap<String, usize>>>, id: &str) -> PendingMark {
        *crate::sync::lock(pending).entry(id.to_owned()).or_default() += 1;
        PendingMark {
            pending: pending.clone(),
            id: id.to_owned(),
        }
    }
}

impl Drop for PendingMark {
    fn drop(&mut self) {
        let mut pending = crate::sync::lock(&self.pending);
        if let Some(count) = pending.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                pending.remove(&self.id);
            }
        }
    }
}

/// What the watch sync thread uses.
struct WatchSync {
    reads: Arc<ReadState>,
    stopping: Arc<AtomicBool>,
    clock: Arc<dyn Clock>,
    progress_interval: Duration,
}

/// Figures the apply thread publishes for [`Engine::status`].
#[derive(Debug)]
struct Stats {
    /// Commits of write batches, by batch size: bucket `i` counts batches of at most
    /// `2^i` requests (the last bucket takes the rest).
    batch_sizes: [AtomicU64; BATCH_SIZE_BUCKETS],
    /// Of those, the batches applied and finished in their caller's thread (APPLY-5).
    inline_batches: AtomicU64,
}

/// Buckets of the batch-size histogram: 1, 2, 4, ... 1024 and more.
pub const BATCH_SIZE_BUCKETS: usize = 12;

impl Stats {
    fn record_batch(&self, requests: usize) {
        let bucket = (usize::BITS - requests.saturating_sub(1).leading_zeros()) as usize;
        self.batch_sizes[bucket.min(BATCH_SIZE_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }
}

/// Figures of the write path, for monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Writes admitted and not yet answered now (queued, being applied or being made
    /// durable).
    pub queue_depth: usize,
    /// The bound of that queue (`Config::prepare_queue_length`).
    pub queue_capacity: usize,
    /// Commits by batch size: `(at most this many requests, commits)`, the last bucket
    /// open-ended.
    pub batch_sizes: Vec<(u64, u64)>,
    /// Of those commits, the batches a lone write's caller applied and finished in its own
    /// thread, with no hand-off to the apply thread (APPLY-5).
    pub inline_batches: u64,
    /// The roles with writes in the queue or refused since open ([`Engine::prepare_queue`]).
    pub roles: Vec<RoleQueue>,
    /// The roles with writes completed since open, with how long each write took from its
    /// admission to its completion (PREP-5).
    pub durations: Vec<RoleDurations>,
}

impl ReadState {
    /// Makes `revision` visible to readers and hands the batch's changes to watchers, in
    /// one step of the hub (the watch switch protocol). Returns the watch streams' wakers,
    /// which the caller must wake ([`crate::watch::Hub::publish`]).
    #[must_use]
    fn publish(&self, revision: i64, events: Vec<(i64, Vec<Change>)>) -> Vec<std::task::Waker> {
        self.hub
            .publish(revision, &events, |r| self.published.publish(r))
    }

    /// Chooses the keys of a Range: the first half of the read path of the module doc.
    fn prepare_range(&self, req: &RangeRequest) -> Result<PreparedRange> {
        let index = crate::sync::read(&self.index);
        // ENG-5: load the revision under the lock, after any compaction it must cover.
        let current = self.published.load();
        let at = read::read_revision(req.revision, current, index.compact_revision)?;
        let plan = read::plan_range(&index, req, at);
        // ENG-3: open the snapshot before the lock is released.
        let snapshot = self.store.snapshot()?;
        Ok(PreparedRange {
            req: req.clone(),
            current,
            plan,
            snapshot,
        })
    }
}

/// A Range whose keys are chosen (at its revision, under the index lock) and whose records
/// are still to be read from the snapshot opened then ([`Engine::prepare_range`]): a caller
/// can read a small one where it stands and hand a large one to a thread that may block.
pub struct PreparedRange {
    req: RangeRequest,
    current: i64,
    plan: read::RangePlan,
    snapshot: crate::storage::Snapshot,
}

impl std::fmt::Debug for PreparedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRange")
            .field("records", &self.records())
            .field("revision", &self.current)
            .finish_non_exhaustive()
    }
}

impl PreparedRange {
    /// The number of records [`PreparedRange::finish`] will read (a `count_only` Range reads
    /// none; a limited one at most its limit plus one).
    pub fn records(&self) -> usize {
        self.plan.records()
    }

    /// Reads the chosen records and returns the Range's answer. The caller's thread does
    /// not wait for a file a defrag replaced to close, should this be its last reader.
    pub fn finish(self) -> Result<RangeResponse> {
        self.finish_with(|plan, snapshot, req, current| {
            read::finish_range(plan, snapshot, req, current)
        })
    }

    /// Reads the chosen records and returns the Range's answer with its key-values in
    /// etcd's wire form (WIRE-1), for a server that writes them into its answer as they are.
    /// As [`PreparedRange::finish`], the caller's thread does not wait for a replaced file.
    pub fn finish_wire(self) -> Result<read::EncodedRange> {
        self.finish_with(read::finish_range_wire)
    }

    fn finish_with<T>(
        self,
        answer: impl FnOnce(
            read::RangePlan,
            &crate::storage::Snapshot,
            &RangeRequest,
            i64,
        ) -> std::result::Result<T, StorageError>,
    ) -> Result<T> {
        let PreparedRange {
            req,
            current,
            plan,
            snapshot,
        } = self;
        let answer = answer(plan, &snapshot, &req, current);
        if snapshot.holds_replaced_database() {
            snapshot.drop_in_background();
        }
        Ok(answer?)
    }
}

impl WatchSync {
    /// Runs the watch sync thread until the engine stops.
    fn run(&self) {
        let mut last_tick = self.clock.now();
        while !self.stopping.load(Ordering::Acquire) {
            let hub = &self.reads.hub;
            // A storage failure here is also seen by the writer, which poisons the store;
            // watchers simply stop catching up until reopen.
            match hub.sync_pass(&self.reads.store, &self.reads.index) {
                Ok(pass) if pass.progressed => {}
                Ok(pass) if pass.behind => {
                    hub.wait_for_work(WATCH_STALLED_RETRY);
                }
                // Nothing behind, or a storage failure (also seen by the writer, which
                // poisons the store): sleep until woken or the next interval.
                Ok(_) | Err(_) => {
                    hub.wait_for_work(WATCH_SYNC_INTERVAL);
                }
            }
            let now = self.clock.now();
            if now.saturating_sub(last_tick) >= self.progress_interval {
                hub.progress_tick();
                last_tick = now;
            }
        }
    }
}

impl WatchSource for ReadState {
    fn compact_revision(&self) -> i64 {
        crate::sync::read(&self.index).compact_revision
    }

    fn kv_at(&self, key: &Bytes, revision: i64) -> Option<KeyValue> {
        let req = RangeRequest {
            revision,
            ..RangeRequest::key(key.clone())
        };
        self.prepare_range(&req)
            .and_then(PreparedRange::finish)
            .ok()
            .and_then(|r| r.kvs.into_iter().next())
    }
}

/// An open data directory serving etcd's KV semantics.
///
/// Reads run in the caller's thread; writes are applied in order by one apply thread.
/// `Engine` is `Send + Sync`: share it with an `Arc`.
#[derive(Debug)]
pub struct Engine {
    /// `None` once closed.
    running: Option<Running>,
}

/// What `Config::allocation_prepare_queue_length` did at open: the persisted length it
/// replaced (`None` if none was ever set) and the length now in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationPrepareQueueReplaced {
    /// The length persisted before this open, if any.
    pub previous: Option<u64>,
    /// The length set at open, now persisted.
    pub length: u64,
}

#[derive(Debug)]
struct Running {
    shared: Arc<Shared>,
    allocation_prepare_queue_replaced: Option<AllocationPrepareQueueReplaced>,
    proposals: Arc<Mailbox<Queued>>,
    /// The apply state: the apply thread's, and a lone write's caller's (APPLY-5).
    applier: Arc<Mutex<Applier>>,
    /// The role of writes without a key and of defrag steps.
    star: Name,
    apply_thread: JoinHandle<()>,
    commit_thread: JoinHandle<()>,
    watch_thread: JoinHandle<()>,
    /// Wakes the apply thread when the clock jumps (a manual clock's `advance`), so a lease
    /// due then expires without waiting for the idle timeout; the clock holds it weakly.
    _on_clock_jump: OnClockJump,
}

/// Keeps a [`Wake`] alive: only the clock calls it, through its weak reference (its Debug
/// text names it only).
struct OnClockJump {
    _wake: Wake,
}

impl std::fmt::Debug for OnClockJump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnClockJump")
    }
}

impl Engine {
    /// Opens the data directory `dir` (creating it if needed), rebuilds the index from the
    /// history, resumes an interrupted compaction, and starts the apply thread.
    ///
    /// Fails with a locked error if another engine holds the directory.
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let second = kvd::Engine::open(dir.path(), kvd::Config::default());
    /// assert!(second.unwrap_err().is_locked());
    /// engine.close().unwrap();
    /// ```
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine> {
        config.validate()?;
        let options = StoreOptions {
            cache_size_bytes: config.cache_size_bytes,
            sync: if config.unsafe_no_fsync {
                CommitSync::UnsafeNoFsync
            } else {
                CommitSync::Durable
            },
            row_tables: [LEASES_TABLE, ALARMS_TABLE, OPERATIONS_TABLE]
                .into_iter()
                .chain(accounting::TABLES)
                .chain(AUTH_TABLES)
                .collect(),
            faults: config.faults.clone(),
            wal_file_bytes: config.wal_file_bytes,
            wal_defrag_room_bytes: config.wal_defrag_room_bytes,
            accept_missing_log: config.accept_missing_log,
            check_history: Some(|key, bytes| {
                crate::mvcc::record::Record::decode_head(key, bytes).map(drop)
            }),
        };
        let store = Store::open(dir.as_ref(), &options)?;
        let recovered = recover::recover(&store, config.clock.now(), config.lease_ttl_min_seconds)?;
        // Conservative until the apply thread's first measurement (SPACE-3, SPACE-4): the
        // pages in use never exceed the file.
        let in_use = store.file_size()?;
        let mut accounts = Accounts::load(&store.snapshot()?, &recovered.index)?;
        let operations = Operations::load(&store.snapshot()?)?;
        let auth = AuthStore::load(&store.snapshot()?)?;
        let allocation_prepare_queue_replaced = configure_prepare_queue(
            &store,
            &mut accounts,
            config.allocation_prepare_queue_length,
        )?;
        let owners: BTreeSet<String> = accounts.registry().keys().cloned().collect();
        let (prepare_queue_length, clock) = (config.prepare_queue_length, config.clock.clone());
        let reads = Arc::new(ReadState {
            store,
            index: RwLock::new(recovered.index),
            published: Published::new(recovered.current),
            applied_index: AtomicU64::new(recovered.applied_index),
            hub: Arc::new(Hub::new(recovered.current)),
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let committer = Committer {
            reads: reads.clone(),
            failpoint: config.commit_failpoint,
        };
        let watch_sync = WatchSync {
            reads: reads.clone(),
            stopping: stopping.clone(),
            clock: config.clock.clone(),
            progress_interval: config.watch_progress_notify_interval,
        };
        let shared = Arc::new(Shared {
            reads,
            lessor: Mutex::new(recovered.lessor),
            stats: Stats {
                batch_sizes: Default::default(),
                inline_batches: AtomicU64::new(0),
            },
            space: SpaceTracker::new(in_use),
            alarms: Mutex::new(recovered.alarms),
            accounts: Mutex::new(accounts),
            auth: RwLock::new(auth),
            defrag: DefragState::default(),
            stopping,
            prepare: Arc::new(PrepareQueue::new(prepare_queue_length, clock.clone())),
            owners: RwLock::new(Arc::new(owners)),
            pending_operations: Arc::default(),
            config,
        });
        let proposals = Arc::new(Mailbox::new());
        let on_clock_jump: Wake = {
            let proposals = proposals.clone();
            crate::sync::wake(move || proposals.nudge())
        };
        clock.on_jump(Wake::downgrade(&on_clock_jump));
        let commits: Arc<Mailbox<Handover>> = Arc::new(Mailbox::new());
        let applier = Applier::new(
            shared.clone(),
            committer.clone(),
            proposals.clone(),
            commits.clone(),
            apply::Resume {
                current: recovered.current,
                applied_index: recovered.applied_index,
                jobs: recovered.jobs,
                operations,
            },
        );
        let applier = Arc::new(Mutex::new(applier));
        let apply_thread = std::thread::Builder::new()
            .name("kvd-apply".into())
            .spawn({
                let (shared, proposals, commits) =
                    (shared.clone(), proposals.clone(), commits.clone());
                let applier = applier.clone();
                move || {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        apply::run(&applier, &proposals);
                    }));
                    if run.is_err() {
                        apply_thread_died(&shared, &proposals, &commits);
                    }
                }
            })
            .map_err(|e| StorageError::Io(format!("spawn apply thread: {e}")))?;
        let commit_thread = std::thread::Builder::new()
            .name("kvd-commit".into())
            .spawn(move || commit::run(&committer, &commits))
            .map_err(|e| StorageError::Io(format!("spawn commit thread: {e}")))?;
        let watch_thread = std::thread::Builder::new()
            .name("kvd-watch".into())
            .spawn(move || watch_sync.run())
            .map_err(|e| StorageError::Io(format!("spawn watch thread: {e}")))?;
        let priority = shared.config.pipeline_priority;
        let engine = Engine {
            running: Some(Running {
                shared,
                allocation_prepare_queue_replaced,
                proposals,
                applier,
                star: Name::from(STAR_ROLE),
                apply_thread,
                commit_thread,
                watch_thread,
                _on_clock_jump: OnClockJump {
                    _wake: on_clock_jump,
                },
            }),
        };
        if let (Some(priority), Some(running)) = (priority, engine.running.as_ref()) {
            // RT-1: on an error the engine is dropped here, which stops every thread.
            realtime::raise(&running.apply_thread, "kvd-apply", priority)?;
            realtime::raise(&running.commit_thread, "kvd-commit", priority)?;
        }
        Ok(engine)
    }

    /// Reads a key or a range (etcd's Range).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("a/1", "x")).unwrap();
    /// engine.put(kvd::PutRequest::new("a/2", "y")).unwrap();
    /// let got = engine.range(&kvd::RangeRequest::prefix("a/")).unwrap();
    /// assert_eq!(got.count, 2);
    /// let old = engine.range(&kvd::RangeRequest { revision: 2, ..kvd::RangeRequest::prefix("a/") }).unwrap();
    /// assert_eq!(old.kvs.len(), 1);
    /// ```
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse> {
        self.prepare_range(req)?.finish()
    }

    /// Chooses the keys of a Range now (its revision, its snapshot) and leaves reading
    /// their records to [`PreparedRange::finish`], wherever the caller likes: the server
    /// reads a small Range on its own thread and a large one on a thread that may block.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("a/1", "x")).unwrap();
    /// let prepared = engine.prepare_range(&kvd::RangeRequest::prefix("a/")).unwrap();
    /// engine.put(kvd::PutRequest::new("a/2", "y")).unwrap();
    /// assert_eq!(prepared.records(), 1);
    /// assert_eq!(prepared.finish().unwrap().count, 1);
    /// ```
    pub fn prepare_range(&self, req: &RangeRequest) -> Result<PreparedRange> {
        validate::check_range(req)?;
        self.shared()?.reads.prepare_range(req)
    }

    /// Writes a key (etcd's Put).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let first = engine.put(kvd::PutRequest::new("k", "v1")).unwrap();
    /// let second = engine.put(kvd::PutRequest { prev_kv: true, ..kvd::PutRequest::new("k", "v2") }).unwrap();
    /// assert_eq!(second.header.revision, first.header.revision + 1);
    /// assert_eq!(&second.prev_kv.unwrap().value[..], b"v1");
    /// ```
    pub fn put(&self, req: PutRequest) -> Result<PutResponse> {
        self.put_with(req, &WriteOptions::default())
    }

    /// Puts with `options` (an operation id makes it exactly-once; see [`WriteOptions`]).
    pub fn put_with(&self, req: PutRequest, options: &WriteOptions) -> Result<PutResponse> {
        wait(|done| self.submit_put_with(req, options, done))
    }

    /// Submits a Put without waiting for the engine's threads; `done` receives the answer
    /// once the commit that holds it is durable, or the refusal (from this thread, before
    /// this returns, for a refusal at admission). A lone write, with nothing else queued or
    /// in flight, is applied, made durable and answered in this thread before this returns
    /// (APPLY-5); otherwise this returns at once. `done` must not block: it runs on one of
    /// the engine's threads or in this one.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// engine.submit_put(kvd::PutRequest::new("k", "v"), Box::new(move |r| tx.send(r).unwrap()));
    /// assert_eq!(rx.recv().unwrap().unwrap().header.revision, 2);
    /// ```
    pub fn submit_put(&self, req: PutRequest, done: Completion<PutResponse>) {
        self.submit_put_with(req, &WriteOptions::default(), done);
    }

    /// Submits a Put with `options`; `done` receives the answer as with
    /// [`Engine::submit_put`] (for a retry of an operation id, the recorded one).
    pub fn submit_put_with(
        &self,
        req: PutRequest,
        options: &WriteOptions,
        done: Completion<PutResponse>,
    ) {
        if let Err(e) = self.admit_put(&req) {
            return done(Err(e));
        }
        self.enqueue_with(Proposal::Put(req, done), options);
    }

    /// Deletes a key or a range (etcd's DeleteRange).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let deleted = engine.delete_range(kvd::DeleteRangeRequest::key("k")).unwrap();
    /// assert_eq!(deleted.deleted, 1);
    /// ```
    pub fn delete_range(&self, req: DeleteRangeRequest) -> Result<DeleteRangeResponse> {
        self.delete_range_with(req, &WriteOptions::default())
    }

    /// Deletes with `options` (see [`WriteOptions`]).
    pub fn delete_range_with(
        &self,
        req: DeleteRangeRequest,
        options: &WriteOptions,
    ) -> Result<DeleteRangeResponse> {
        wait(|done| self.submit_delete_range_with(req, options, done))
    }

    /// Submits a DeleteRange; `done` receives the answer as with [`Engine::submit_put`].
    pub fn submit_delete_range(
        &self,
        req: DeleteRangeRequest,
        done: Completion<DeleteRangeResponse>,
    ) {
        self.submit_delete_range_with(req, &WriteOptions::default(), done);
    }

    /// Submits a DeleteRange with `options` (see [`Engine::submit_put_with`]).
    pub fn submit_delete_range_with(
        &self,
        req: DeleteRangeRequest,
        options: &WriteOptions,
        done: Completion<DeleteRangeResponse>,
    ) {
        if let Err(e) = validate::check_delete(&req) {
            return done(Err(e));
        }
        self.enqueue_with(Proposal::DeleteRange(req, done), options);
    }

    /// Runs a transaction (etcd's Txn). A read-only one is served in the caller's thread.
    ///
    /// ```
    /// use kvd::{Compare, CompareResult, CompareTarget, PutRequest, RequestOp, TxnRequest};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let create_if_absent = TxnRequest {
    ///     compare: vec![Compare::new("lock", CompareResult::Equal, CompareTarget::Version(0))],
    ///     success: vec![RequestOp::Put(PutRequest::new("lock", "me"))],
    ///     failure: vec![],
    /// };
    /// assert!(engine.txn(create_if_absent.clone()).unwrap().succeeded);
    /// assert!(!engine.txn(create_if_absent).unwrap().succeeded);
    /// ```
    pub fn txn(&self, req: TxnRequest) -> Result<TxnResponse> {
        self.txn_with(req, &WriteOptions::default())
    }

    /// Runs a Txn with `options` (see [`WriteOptions`]; a read-only Txn changes nothing,
    /// so it is served afresh and nothing is recorded for its id).
    pub fn txn_with(&self, req: TxnRequest, options: &WriteOptions) -> Result<TxnResponse> {
        wait(|done| self.submit_txn_with(req, options, done))
    }

    /// Submits a Txn; `done` receives the answer as with [`Engine::submit_put`]. A
    /// read-only Txn is served in this thread before this returns.
    pub fn submit_txn(&self, req: TxnRequest, done: Completion<TxnResponse>) {
        self.submit_txn_with(req, &WriteOptions::default(), done);
    }

    /// Submits a Txn with `options` (see [`Engine::submit_put_with`]).
    pub fn submit_txn_with(
        &self,
        req: TxnRequest,
        options: &WriteOptions,
        done: Completion<TxnResponse>,
    ) {
        if let Err(e) = self.admit_txn(&req) {
            return done(Err(e));
        }
        if req.is_read_only() {
            if let Some(caller) = &options.caller
                && let Err(e) = self.auth_check_txn_as(caller.as_deref(), &req)
            {
                return done(Err(e));
            }
            return done(self.read_only_txn(&req));
        }
        self.enqueue_with(Proposal::Txn(req, done), options);
    }

    /// Compacts the history at `req.revision` (etcd's Compact); with `physical` the call
    /// returns after the superseded records are deleted.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v1")).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v2")).unwrap();
    /// engine.compact(kvd::CompactionRequest { revision: 3, physical: true }).unwrap();
    /// let old = engine.range(&kvd::RangeRequest { revision: 2, ..kvd::RangeRequest::key("k") });
    /// assert!(old.unwrap_err().is_compacted());
    /// ```
    pub fn compact(&self, req: CompactionRequest) -> Result<CompactionResponse> {
        self.compact_with(req, &WriteOptions::default())
    }

    /// Compacts with `options` (see [`WriteOptions`]).
    pub fn compact_with(
        &self,
        req: CompactionRequest,
        options: &WriteOptions,
    ) -> Result<CompactionResponse> {
        wait(|done| self.submit_compact_with(req, options, done))
    }

    /// Submits a Compact; `done` receives the answer as with [`Engine::submit_put`] (with
    /// `physical`, after the superseded records are deleted).
    pub fn submit_compact(&self, req: CompactionRequest, done: Completion<CompactionResponse>) {
        self.submit_compact_with(req, &WriteOptions::default(), done);
    }

    /// Submits a Compact with `options` (see [`Engine::submit_put_with`]).
    pub fn submit_compact_with(
        &self,
        req: CompactionRequest,
        options: &WriteOptions,
        done: Completion<CompactionResponse>,
    ) {
        self.enqueue_with(Proposal::Compaction(req, done), options);
    }

    /// Hashes the history visible at `revision` (0 = current), as etcd's HashKV.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let a = engine.hash_kv(0).unwrap();
    /// assert_eq!(a.hash_revision, 2);
    /// assert_eq!(engine.hash_kv(2).unwrap().hash, a.hash);
    /// ```
    pub fn hash_kv(&self, revision: i64) -> Result<HashKvResponse> {
        let shared = self.shared()?;
        for _ in 0..HASH_RESTARTS_MAX {
            let (current, compact) = {
                let index = crate::sync::read(&shared.reads.index);
                (shared.reads.published.load(), index.compact_revision)
            };
            let at = if revision <= 0 { current } else { revision };
            if at > current {
                return Err(Error::FutureRevision);
            }
            if at < compact {
                return Err(Error::Compacted);
            }
            let mut state = HashState::new(at, compact);
            while !state.is_done() {
                let index = crate::sync::read(&shared.reads.index);
                if index.compact_revision != compact {
                    break;
                }
                let snapshot = shared.reads.store.snapshot()?;
                state.step(&index, &snapshot)?;
            }
            if state.is_done() {
                return Ok(HashKvResponse {
                    header: ResponseHeader { revision: current },
                    compact_revision: compact,
                    hash_revision: at,
                    hash: state.finish(),
                });
            }
        }
        Err(Error::InvalidArgument(
            "compactions kept landing while hashing; retry".into(),
        ))
    }

    /// Opens a watch stream (etcd's Watch RPC): create watches on it and receive their
    /// events in revision order.
    ///
    /// ```
    /// use std::time::Duration;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let stream = engine.watch_stream().unwrap();
    /// let id = stream.create(kvd::WatchCreateRequest::prefix("jobs/")).unwrap();
    /// assert!(stream.recv_timeout(Duration::from_secs(5)).unwrap().unwrap().created);
    /// engine.put(kvd::PutRequest::new("jobs/1", "run")).unwrap();
    /// let got = stream.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
    /// assert_eq!((got.watch_id, got.header.revision, got.events.len()), (id, 2, 1));
    /// ```
    pub fn watch_stream(&self) -> Result<WatchStream> {
        let running = self.running.as_ref().ok_or(Error::Closed)?;
        let source: Weak<dyn WatchSource> =
            Arc::downgrade(&running.shared.reads) as Weak<dyn WatchSource>;
        Ok(WatchStream::new(running.shared.reads.hub.clone(), source))
    }

    /// Returns the number of watches open on all streams.
    pub fn watchers(&self) -> Result<usize> {
        Ok(self.shared()?.reads.hub.watchers())
    }

    /// Returns the write queue's depth and the group-commit batch sizes so far.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let stats = engine.apply_stats().unwrap();
    /// assert_eq!(stats.batch_sizes[0], (1, 1), "one commit of one request");
    /// ```
    pub fn apply_stats(&self) -> Result<ApplyStats> {
        let running = self.running.as_ref().ok_or(Error::Closed)?;
        let batch_sizes = running
            .shared
            .stats
            .batch_sizes
            .iter()
            .enumerate()
            .map(|(i, n)| (1u64 << i, n.load(Ordering::Relaxed)))
            .collect();
        Ok(ApplyStats {
            queue_depth: running.shared.prepare.depth(),
            queue_capacity: running.shared.prepare.capacity(),
            batch_sizes,
            inline_batches: running.shared.stats.inline_batches.load(Ordering::Relaxed),
            roles: running.shared.prepare.roles(),
            durations: running.shared.prepare.durations(),
        })
    }

    /// Returns every role with writes in the prepare queue now or refused since open, with
    /// those figures, sorted by role (`/roles`, the metrics).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// assert!(engine.prepare_queue().unwrap().is_empty(), "answered writes left the queue");
    /// ```
    pub fn prepare_queue(&self) -> Result<Vec<RoleQueue>> {
        Ok(self.shared()?.prepare.roles())
    }

    /// Returns the role a write whose first written key is `key` belongs to in the prepare
    /// queue (PREP-2): the deepest role with a registry entry whose namespace prefixes the
    /// key, else `*` (also once the engine is closed).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// assert_eq!(engine.owning_role(b"/team/k"), "*", "no registry entry yet");
    /// ```
    pub fn owning_role<'k>(&self, key: &'k [u8]) -> &'k str {
        let Ok(shared) = self.shared() else {
            return STAR_ROLE;
        };
        let owners = crate::sync::read(&shared.owners);
        quota::charged_role(key, &**owners)
    }

    /// Returns the role `txn` belongs to in the prepare queue: that of its first written key
    /// (success branch first, then failure), or `*` if it writes nothing.
    pub fn txn_owning_role<'t>(&self, txn: &'t TxnRequest) -> &'t str {
        proposal::first_written_in(txn).map_or(STAR_ROLE, |key| self.owning_role(key))
    }

    /// Grants a lease (etcd's LeaseGrant). A TTL below the minimum is raised to it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let lease = engine.lease_grant(kvd::LeaseGrantRequest { ttl: 60, id: 7 }).unwrap();
    /// engine.put(kvd::PutRequest { lease: lease.id, ..kvd::PutRequest::new("k", "v") }).unwrap();
    /// let ttl = engine.lease_time_to_live(7, true).unwrap();
    /// assert_eq!((ttl.granted_ttl, ttl.keys.len()), (60, 1));
    /// ```
    pub fn lease_grant(&self, req: LeaseGrantRequest) -> Result<LeaseGrantResponse> {
        self.lease_grant_with(req, &WriteOptions::default())
    }

    /// Grants with `options` (see [`WriteOptions`]).
    pub fn lease_grant_with(
        &self,
        req: LeaseGrantRequest,
        options: &WriteOptions,
    ) -> Result<LeaseGrantResponse> {
        wait(|done| self.submit_lease_grant_with(req, options, done))
    }

    /// Submits a LeaseGrant; `done` receives the answer as with [`Engine::submit_put`].
    pub fn submit_lease_grant(&self, req: LeaseGrantRequest, done: Completion<LeaseGrantResponse>) {
        self.submit_lease_grant_with(req, &WriteOptions::default(), done);
    }

    /// Submits a LeaseGrant with `options` (see [`Engine::submit_put_with`]).
    pub fn submit_lease_grant_with(
        &self,
        req: LeaseGrantRequest,
        options: &WriteOptions,
        done: Completion<LeaseGrantResponse>,
    ) {
        if let Err(e) = self.alarm_gate(space::LEASE_GRANT_COST_BYTES) {
            return done(Err(e));
        }
        if req.ttl > LEASE_TTL_MAX_SECONDS {
            return done(Err(Error::LeaseTtlTooLarge));
        }
        self.enqueue_with(Proposal::LeaseGrant(req, done), options);
    }

    /// Revokes a lease and deletes its keys in one revision (etcd's LeaseRevoke).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let lease = engine.lease_grant(kvd::LeaseGrantRequest { ttl: 60, id: 0 }).unwrap();
    /// for k in ["a", "b"] {
    ///     engine.put(kvd::PutRequest { lease: lease.id, ..kvd::PutRequest::new(k, "v") }).unwrap();
    /// }
    /// let revoked = engine.lease_revoke(lease.id).unwrap();
    /// assert_eq!(revoked.header.revision, 4, "two keys, one revision");
    /// assert!(engine.lease_revoke(lease.id).unwrap_err().to_string().contains("lease not found"));
    /// ```
    pub fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse> {
        self.lease_revoke_with(id, &WriteOptions::default())
    }

    /// Revokes with `options` (see [`WriteOptions`]).
    pub fn lease_revoke_with(
        &self,
        id: i64,
        options: &WriteOptions,
    ) -> Result<LeaseRevokeResponse> {
        wait(|done| self.submit_lease_revoke_with(id, options, done))
    }

    /// Submits a LeaseRevoke; `done` receives the answer as with [`Engine::submit_put`].
    pub fn submit_lease_revoke(&self, id: i64, done: Completion<LeaseRevokeResponse>) {
        self.submit_lease_revoke_with(id, &WriteOptions::default(), done);
    }

    /// Submits a LeaseRevoke with `options` (see [`Engine::submit_put_with`]).
    pub fn submit_lease_revoke_with(
        &self,
        id: i64,
        options: &WriteOptions,
        done: Completion<LeaseRevokeResponse>,
    ) {
        let req = LeaseRevokeRequest { id };
        self.enqueue_with(Proposal::LeaseRevoke(req, done), options);
    }

    /// Renews a lease to its full TTL (etcd's LeaseKeepAlive); TTL 0 if it does not exist.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let lease = engine.lease_grant(kvd::LeaseGrantRequest { ttl: 30, id: 0 }).unwrap();
    /// assert_eq!(engine.lease_keep_alive(lease.id).unwrap().ttl, 30);
    /// ```
    pub fn lease_keep_alive(&self, id: i64) -> Result<LeaseKeepAliveResponse> {
        let shared = self.shared()?;
        let header = ResponseHeader {
            revision: shared.reads.published.load(),
        };
        let now = shared.config.clock.now();
        let ttl = crate::sync::lock(&shared.lessor)
            .keep_alive(id, now)
            .unwrap_or(0);
        Ok(LeaseKeepAliveResponse { header, id, ttl })
    }

    /// Reports a lease's remaining and granted TTL and, if asked, its keys (etcd's
    /// LeaseTimeToLive); TTL -1 if it does not exist.
    pub fn lease_time_to_live(&self, id: i64, keys: bool) -> Result<LeaseTimeToLiveResponse> {
        let shared = self.shared()?;
        let header = ResponseHeader {
            revision: shared.reads.published.load(),
        };
        let now = shared.config.clock.now();
        let found = crate::sync::lock(&shared.lessor).time_to_live(id, now, keys);
        Ok(match found {
            Some(t) => LeaseTimeToLiveResponse {
                header,
                id,
                ttl: t.remaining,
                granted_ttl: t.granted,
                keys: t.keys,
            },
            None => LeaseTimeToLiveResponse {
                header,
                id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
        })
    }

    /// Lists every lease, soonest expiry first (etcd's LeaseLeases).
    pub fn lease_leases(&self) -> Result<LeaseLeasesResponse> {
        let shared = self.shared()?;
        let header = ResponseHeader {
            revision: shared.reads.published.load(),
        };
        let leases = crate::sync::lock(&shared.lessor).list();
        Ok(LeaseLeasesResponse { header, leases })
    }

    /// Lists, raises or clears alarms (etcd's Alarm). Raising and clearing are persisted
    /// through the apply path; clearing NOSPACE while the data is still over the quota lets
    /// the next write raise it again.
    ///
    /// ```
    /// use kvd::{AlarmAction, AlarmMember, AlarmRequest, AlarmType};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let raise = AlarmRequest { action: AlarmAction::Activate, member_id: 1, alarm: AlarmType::NoSpace };
    /// engine.alarm(raise).unwrap();
    /// assert!(engine.put(kvd::PutRequest::new("k", "v")).unwrap_err().is_no_space());
    /// engine.alarm(AlarmRequest { action: AlarmAction::Deactivate, ..raise }).unwrap();
    /// assert!(engine.put(kvd::PutRequest::new("k", "v")).is_ok());
    /// ```
    pub fn alarm(&self, req: AlarmRequest) -> Result<AlarmResponse> {
        if req.action == AlarmAction::Get {
            let shared = self.shared()?;
            let header = ResponseHeader {
                revision: shared.reads.published.load(),
            };
            let alarms = crate::sync::lock(&shared.alarms).list(req.alarm);
            return Ok(AlarmResponse { header, alarms });
        }
        wait(|done| self.enqueue(Proposal::Alarm(req, done)))
    }

    /// Rewrites the database into a fresh, densely packed file while writes go on, pausing
    /// them only to copy the last revisions and swap the files (etcd's Defragment, without
    /// stopping the world). Allowed while NOSPACE is active; clears no alarm.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// for i in 0..100 { engine.put(kvd::PutRequest::new(format!("k{i}"), "v")).unwrap(); }
    /// let before = engine.hash_kv(0).unwrap();
    /// engine.defrag().unwrap();
    /// assert_eq!(engine.hash_kv(0).unwrap(), before);
    /// ```
    pub fn defrag(&self) -> Result<DefragResponse> {
        let running = self.running.as_ref().ok_or(Error::Closed)?;
        defrag::run(&running.shared, |step| {
            running
                .proposals
                .push(Queued {
                    role: running.star.clone(),
                    proposal: Proposal::Defrag(step),
                })
                .map_err(|_| Error::Closed)
        })
    }

    /// Writes a consistent copy of the database, as of one revision, to `path` (a new redb
    /// file a kvd can open as its `kvd.redb`); returns its length and the revision it holds.
    /// Reads one snapshot for the whole copy: meant for backups, not for a hot loop.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let backup = tempfile::tempdir().unwrap();
    /// let (bytes, revision) = engine.snapshot_to(&backup.path().join("kvd.redb")).unwrap();
    /// assert!(bytes > 0 && revision == 2);
    /// let restored = kvd::Engine::open(backup.path(), kvd::Config::default()).unwrap();
    /// assert_eq!(restored.range(&kvd::RangeRequest::key("k")).unwrap().count, 1);
    /// ```
    pub fn snapshot_to(&self, path: &Path) -> Result<(u64, i64)> {
        let shared = self.shared()?;
        let snapshot = shared.reads.store.snapshot()?;
        // The revision the snapshot itself holds, not the published one, which may be newer.
        let recorded = snapshot
            .get_meta(crate::storage::MetaKey::CurrentRevision)?
            .unwrap_or(1);
        let revision = i64::try_from(recorded).unwrap_or(i64::MAX).max(1);
        let progress = crate::storage::defrag::Progress::default();
        let bytes = shared.reads.store.copy_to(&snapshot, path, &progress)?;
        Ok((bytes, revision))
    }

    /// Measures the bytes in use now (Status reports the last measurement, refreshed when the
    /// engine is idle) and returns them. Walks every page of the database and waits for the
    /// current write batch: meant for operators and tests, not for a hot loop.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let in_use = engine.measure_space().unwrap();
    /// assert_eq!(engine.status().unwrap().db_size_in_use, in_use);
    /// ```
    pub fn measure_space(&self) -> Result<u64> {
        let shared = self.shared()?;
        let in_use = shared.reads.store.size_in_use()?;
        shared.space.measured(in_use);
        Ok(in_use)
    }

    /// Returns how far a running defrag is.
    pub fn defrag_progress(&self) -> Result<DefragProgress> {
        Ok(self.shared()?.defrag.progress())
    }

    /// Applies a Mesos UPDATE_QUOTA: all or nothing, validated and committed in one write
    /// transaction; a configuration equal to the default quota deletes the role's entry.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use kvd::quota::RawQuotaConfig;
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let limits = BTreeMap::from([("kv_keys".to_owned(), 1.0)]);
    /// engine.update_quota(vec![RawQuotaConfig { role: "dev".into(), limits, ..Default::default() }], false).unwrap();
    /// engine.put(kvd::PutRequest::new("/dev/a", "v")).unwrap();
    /// let err = engine.put(kvd::PutRequest::new("/dev/b", "v")).unwrap_err();
    /// assert!(err.to_string().starts_with("kvd: quota exceeded for role 'dev'"));
    /// ```
    pub fn update_quota(&self, configs: Vec<RawQuotaConfig>, force: bool) -> Result<()> {
        self.apply_accounting(AccountingRequest::UpdateQuota { configs, force })
            .map(drop)
    }

    /// Returns every non-default quota configuration, sorted by role (Mesos's GET_QUOTA).
    pub fn get_quota(&self) -> Result<Vec<QuotaConfig>> {
        let shared = self.shared()?;
        let accounts = crate::sync::lock(&shared.accounts);
        Ok(crate::quota::get_quota(accounts.registry())
            .into_iter()
            .cloned()
            .collect())
    }

    /// Returns every role with a quota, consumption or a reservation, with its counters
    /// (subtree included). Costs O(roles).
    pub fn roles(&self) -> Result<Vec<RoleUsage>> {
        Ok(crate::sync::lock(&self.shared()?.accounts).roles())
    }

    /// Registers or updates an agent and its total resources (capacity for guarantees).
    pub fn register_agent(
        &self,
        id: &str,
        state: AgentState,
        resources: BTreeMap<String, f64>,
    ) -> Result<()> {
        self.apply_accounting(AccountingRequest::RegisterAgent {
            id: id.to_owned(),
            state,
            resources,
        })
        .map(drop)
    }

    /// Reserves resources on an agent for a role, within the limits of the role and its
    /// ancestors (Mesos's RESERVE_RESOURCES).
    pub fn reserve(
        &self,
        id: &str,
        role: &str,
        agent: &str,
        resources: BTreeMap<String, f64>,
    ) -> Result<()> {
        self.record(RecordKind::Reservation, id, role, agent, resources, false)
    }

    /// Removes a reservation that no allocation draws on (UNRESERVE_RESOURCES).
    pub fn unreserve(&self, id: &str) -> Result<()> {
        self.remove_record(RecordKind::Reservation, id)
    }

    /// Allocates resources on an agent to a role, drawing first on the role's unallocated
    /// reservations on that agent; the rest must fit the limits (ALLOCATE).
    pub fn allocate(
        &self,
        id: &str,
        role: &str,
        agent: &str,
        resources: BTreeMap<String, f64>,
    ) -> Result<()> {
        self.record(RecordKind::Allocation, id, role, agent, resources, false)
    }

    /// Places an allocation *preparing* (ALLOCATE with `prepare`): checked and drawn as
    /// [`Engine::allocate`], but its resources count as the role's `offered` until
    /// [`Engine::start_allocation`], and it takes a slot of the allocation prepare queue.
    /// Refused with [`Error::AllocationPrepareQueueFull`] when the queue is full or the role holds its
    /// fair share of it.
    ///
    /// ```
    /// # use std::collections::BTreeMap;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let config = kvd::Config { allocation_prepare_queue_length: Some(1), ..kvd::Config::default() };
    /// let engine = kvd::Engine::open(dir.path(), config).unwrap();
    /// engine.register_agent("a1", kvd::AgentState::Registered, BTreeMap::new()).unwrap();
    /// let cpus = BTreeMap::from([("cpus".to_owned(), 1.0)]);
    /// engine.prepare_allocation("x1", "ml", "a1", cpus.clone()).unwrap();
    /// let full = engine.prepare_allocation("x2", "ml", "a1", cpus.clone()).unwrap_err();
    /// assert!(full.is_allocation_prepare_queue_full());
    /// engine.start_allocation("x1").unwrap();
    /// engine.prepare_allocation("x2", "ml", "a1", cpus).unwrap();
    /// ```
    pub fn prepare_allocation(
        &self,
        id: &str,
        role: &str,
        agent: &str,
        resources: BTreeMap<String, f64>,
    ) -> Result<()> {
        self.record(RecordKind::Allocation, id, role, agent, resources, true)
    }

    /// Turns a preparing allocation into a running one (START): its resources move from
    /// `offered` to `allocated` in one transaction, and its prepare queue slot is free.
    /// Never refused for quota.
    pub fn start_allocation(&self, id: &str) -> Result<()> {
        self.apply_accounting(AccountingRequest::Start { id: id.to_owned() })
            .map(drop)
    }

    /// Removes an allocation, preparing or running (RELEASE).
    pub fn release(&self, id: &str) -> Result<()> {
        self.remove_record(RecordKind::Allocation, id)
    }

    /// Places a record of `kind`, an allocation `prepare`d or not: the one path behind
    /// [`Engine::reserve`], [`Engine::allocate`] and [`Engine::prepare_allocation`].
    pub fn record(
        &self,
        kind: RecordKind,
        id: &str,
        role: &str,
        agent: &str,
        resources: BTreeMap<String, f64>,
        prepare: bool,
    ) -> Result<()> {
        let request = AccountingRequest::Record {
            kind,
            id: id.to_owned(),
            role: role.to_owned(),
            agent: agent.to_owned(),
            resources,
            prepare,
        };
        self.apply_accounting(request).map(drop)
    }

    /// Removes a record of `kind`: the one path behind [`Engine::unreserve`] and
    /// [`Engine::release`].
    pub fn remove_record(&self, kind: RecordKind, id: &str) -> Result<()> {
        let request = AccountingRequest::Remove {
            kind,
            id: id.to_owned(),
        };
        self.apply_accounting(request).map(drop)
    }

    /// Sets the allocation prepare queue length at run time (UPDATE_PREPARE_QUEUE), persisted
    /// in the transaction that sets it; 0 turns the queue off. Lowering it below the number
    /// preparing cancels nothing: new entries are refused until the number falls.
    pub fn update_prepare_queue(&self, allocation_prepare_queue_length: u64) -> Result<()> {
        self.apply_accounting(AccountingRequest::UpdatePrepareQueue {
            allocation_prepare_queue_length,
        })
        .map(drop)
    }

    /// Returns the allocation prepare queue: its length and what is preparing, by role.
    /// Reads the state the apply thread left, so it never waits behind writes.
    pub fn allocation_prepare_queue(&self) -> Result<AllocationPrepareQueue> {
        Ok(crate::sync::lock(&self.shared()?.accounts).allocation_prepare_queue())
    }

    /// Returns the schema version this open raised the database file from (ROW-2), `None`
    /// if the file was of this build's version or new. Once raised, older builds refuse the
    /// directory.
    pub fn schema_raised_from(&self) -> Result<Option<u64>> {
        Ok(self.shared()?.reads.store.schema_raised_from())
    }

    /// Returns what `Config::allocation_prepare_queue_length` did at open: `None` if it was
    /// not set (the persisted length was kept), else the length it replaced and the new one.
    pub fn allocation_prepare_queue_replaced(
        &self,
    ) -> Result<Option<AllocationPrepareQueueReplaced>> {
        let running = self.running.as_ref().ok_or(Error::Closed)?;
        Ok(running.allocation_prepare_queue_replaced)
    }

    /// Returns the differences between the consumption counters and a full recount from the
    /// index and the records: (role, resource, counted, recounted); empty when they agree.
    pub fn consumption_drift(
        &self,
    ) -> Result<Vec<(String, String, accounting::Counters, accounting::Counters)>> {
        let shared = self.shared()?;
        let index = crate::sync::read(&shared.reads.index);
        let accounts = crate::sync::lock(&shared.accounts);
        Ok(accounts.drift(&index))
    }

    /// Replaces drifted consumption counters with the recount, through the apply path
    /// (idempotent); returns how many rows changed.
    pub fn repair_consumption(&self) -> Result<usize> {
        self.apply_accounting(AccountingRequest::Repair)
    }

    /// Applies any operator request on the registry or the records through the apply path
    /// (the methods above are shorthands for it); returns the rows a repair changed, else 0.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// assert_eq!(engine.apply_accounting(kvd::AccountingRequest::Repair).unwrap(), 0);
    /// ```
    pub fn apply_accounting(&self, request: AccountingRequest) -> Result<usize> {
        self.apply_accounting_with(request, &WriteOptions::default())
    }

    /// Applies an operator request with `options` (an operation id makes it exactly-once;
    /// see [`WriteOptions`]).
    pub fn apply_accounting_with(
        &self,
        request: AccountingRequest,
        options: &WriteOptions,
    ) -> Result<usize> {
        wait(|done| self.submit_accounting_with(request, options, done))
    }

    /// Submits an operator request with `options`; `done` receives the answer as with
    /// [`Engine::submit_put`].
    pub fn submit_accounting_with(
        &self,
        request: AccountingRequest,
        options: &WriteOptions,
        done: Completion<usize>,
    ) {
        if request == AccountingRequest::RecoveredTimedOut {
            return done(Err(Error::InvalidArgument(
                "the engine makes that request itself".into(),
            )));
        }
        self.enqueue_with(Proposal::Accounting(request, done), options);
    }

    /// Answers Mesos's RECONCILE_OPERATIONS (RECON-2): a status for each of `queries`, or
    /// with none, for every retained or pending operation whose id starts with `prefix`.
    /// Runs in apply order, so it sees every write admitted before it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let once = kvd::WriteOptions::with_operation_id("c1/put");
    /// engine.put_with(kvd::PutRequest::new("k", "v"), &once).unwrap();
    /// let all = engine.reconcile_operations(vec![], "c1/").unwrap();
    /// assert_eq!((all.len(), all[0].state.name(), all[0].revision), (1, "OPERATION_FINISHED", Some(2)));
    /// ```
    pub fn reconcile_operations(
        &self,
        queries: Vec<OperationQuery>,
        prefix: &str,
    ) -> Result<Vec<OperationStatus>> {
        let request = ReconcileRequest::Operations {
            queries,
            prefix: prefix.to_owned(),
        };
        match wait(|done| self.enqueue(Proposal::Reconcile(request, done)))? {
            ReconcileAnswer::Operations(statuses) => Ok(statuses),
            ReconcileAnswer::Tasks(_) => Err(Error::InvalidArgument(
                "internal error: task answer to an operation query".into(),
            )),
        }
    }

    /// Answers Mesos's RECONCILE over the allocations (RECON-1): implicit with no tasks,
    /// else one status per task except Mesos's branch 2 (agent recovered), which has none.
    pub fn reconcile_tasks(
        &self,
        tasks: Vec<TaskQuery>,
        partition_aware: bool,
    ) -> Result<Vec<TaskStatus>> {
        let request = ReconcileRequest::Tasks {
            tasks,
            partition_aware,
        };
        match wait(|done| self.enqueue(Proposal::Reconcile(request, done)))? {
            ReconcileAnswer::Tasks(statuses) => Ok(statuses),
            ReconcileAnswer::Operations(_) => Err(Error::InvalidArgument(
                "internal error: operation answer to a task query".into(),
            )),
        }
    }

    /// Returns every agent with its state, by id (GET_AGENTS).
    pub fn agents(&self) -> Result<BTreeMap<String, Agent>> {
        Ok(crate::sync::lock(&self.shared()?.accounts).agents().clone())
    }

    /// Marks an agent unreachable (MARK_AGENT_UNREACHABLE), since now on the engine's wall
    /// clock; it keeps its records but is not counted in capacity until it registers again.
    pub fn mark_agent_unreachable(&self, id: &str) -> Result<()> {
        self.apply_accounting(AccountingRequest::MarkAgentUnreachable { id: id.to_owned() })
            .map(drop)
    }

    /// Marks an agent gone (MARK_AGENT_GONE): terminal; its allocations and reservations
    /// are released in the same transaction.
    pub fn mark_agent_gone(&self, id: &str) -> Result<()> {
        self.apply_accounting(AccountingRequest::MarkAgentGone { id: id.to_owned() })
            .map(drop)
    }

    /// Returns the revisions, sizes and applied index.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let status = engine.status().unwrap();
    /// assert_eq!((status.header.revision, status.compact_revision), (1, -1));
    /// assert!(status.db_size >= status.db_size_in_use);
    /// ```
    ///
    /// Reads published figures only, so it never waits behind writes; `db_size_in_use` is
    /// the apply thread's last measurement, refreshed busy or idle within the bounds of
    /// SPACE-4.
    pub fn status(&self) -> Result<Status> {
        let shared = self.shared()?;
        let (revision, compact_revision) = {
            let index = crate::sync::read(&shared.reads.index);
            (shared.reads.published.load(), index.compact_revision)
        };
        Ok(Status {
            header: ResponseHeader { revision },
            compact_revision,
            db_size: shared.reads.store.file_size()?,
            db_size_in_use: shared.space.last_measured(),
            applied_index: shared.reads.applied_index.load(Ordering::Acquire),
            db_size_quota: space::quota_bytes(shared.config.quota_backend_bytes).unwrap_or(0),
            alarms: crate::sync::lock(&shared.alarms).list(AlarmType::None),
        })
    }

    /// Returns the disk histograms (log fsync, database commit) since open, for monitoring.
    pub fn disk_timings(&self) -> Result<crate::storage::timings::DiskTimingsSnapshot> {
        Ok(self.shared()?.reads.store.log().timings.snapshot())
    }

    /// Stops the apply thread after the queued writes and closes the database, returning
    /// any error the database reports on the way.
    pub fn close(mut self) -> Result<()> {
        let Some(running) = self.running.take() else {
            return Ok(());
        };
        let shared = running.stop();
        // Every thread has stopped, so nothing else holds these (watch streams hold weak
        // references only).
        let reads = Arc::try_unwrap(shared).ok().map(|shared| shared.reads);
        match reads.map(Arc::try_unwrap) {
            Some(Ok(reads)) => Ok(reads.store.close()?),
            _ => Err(Error::InvalidArgument(
                "engine still shared at close".into(),
            )),
        }
    }

    fn shared(&self) -> Result<&Shared> {
        self.running
            .as_ref()
            .map(|r| &*r.shared)
            .ok_or(Error::Closed)
    }

    fn read_only_txn(&self, req: &TxnRequest) -> Result<TxnResponse> {
        let shared = self.shared()?;
        let index = crate::sync::read(&shared.reads.index);
        let current = shared.reads.published.load();
        let snapshot = shared.reads.store.snapshot()?;
        read::read_only_txn(&index, &snapshot, req, current)
    }

    /// A Put's checks before it is queued, in etcd's order: the alarm gate (etcd's quota
    /// check), then validation (VAL-1). The permission check comes after them (PERM-5).
    pub(super) fn admit_put(&self, req: &PutRequest) -> Result<()> {
        self.alarm_gate(space::put_cost(req.key.len(), req.value.len()))?;
        validate::check_put(req)
    }

    /// A Txn's checks before it is queued or served, as [`Engine::admit_put`]'s. A
    /// read-only Txn passes no alarm gate: it is a read, served locally (etcd serves it
    /// under CORRUPT too).
    pub(super) fn admit_txn(&self, req: &TxnRequest) -> Result<()> {
        let max_txn_ops = self.shared()?.config.max_txn_ops;
        if !req.is_read_only() {
            self.alarm_gate(space::txn_cost(req))?;
        }
        validate::check_txn(req, max_txn_ops)
    }

    /// The admission half of the alarm gate (etcd checks the quota before validating the
    /// request): refuses fast while an alarm blocks a write of `cost`. The space check
    /// itself is exact only in the apply thread, which measures when the estimate is near
    /// the quota.
    fn alarm_gate(&self, cost: u64) -> Result<()> {
        let shared = self.shared()?;
        let alarms = crate::sync::lock(&shared.alarms);
        if alarms.corrupt() {
            return Err(Error::Corrupt);
        }
        if cost > 0 && alarms.nospace() {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Admission of a write with its options: an operation id is checked, and the write is
    /// marked pending under it until its completion ran; then [`Engine::enqueue`].
    fn enqueue_with(&self, proposal: Proposal, options: &WriteOptions) {
        let proposal = match &options.caller {
            Some(caller) => {
                // PERM-5: the permission check follows the write's own checks, and a
                // denied write is refused before it takes a slot in the queue.
                if let Err(e) = self.check_caller(caller.as_deref(), &proposal) {
                    return proposal.refuse(e);
                }
                auth::authorized(proposal, caller.clone())
            }
            None => proposal,
        };
        let Some(id) = &options.operation_id else {
            return self.enqueue(proposal);
        };
        if let Err(e) = validate_operation_id(id) {
            return proposal.refuse(e);
        }
        let (Some(digest), Ok(shared)) = (proposal.digest(), self.shared()) else {
            return proposal.refuse(Error::InvalidArgument(
                "this request cannot carry an operation id".into(),
            ));
        };
        let mark = PendingMark::new(&shared.pending_operations, id);
        let inner = proposal.holding(mark);
        self.enqueue(Proposal::Identified(Box::new(Identified {
            id: id.clone(),
            digest,
            inner,
        })));
    }

    /// The rest of admission, once per request: the queue bound (PROP-2; etcd checks the
    /// apply backlog before the request size), then the size limit; then queues the
    /// proposal `wrap` makes of `done`. A refusal goes to `done` at once.
    fn enqueue(&self, proposal: Proposal) {
        let Some(running) = &self.running else {
            return proposal.refuse(Error::Closed);
        };
        let shared = &running.shared;
        // The slot is charged to the owner of the first written key (PREP-2).
        let owners = crate::sync::read(&shared.owners).clone();
        let role = proposal
            .first_written_key()
            .map_or(STAR_ROLE, |key| quota::charged_role(key, &*owners));
        let slot = match PrepareQueue::admit(&shared.prepare, role) {
            Ok(slot) => slot,
            Err(full) => {
                return proposal.refuse(Error::TooManyRequests {
                    retry_after_ms: full.retry_after_ms,
                });
            }
        };
        let role = slot.role().clone();
        // The completion releases the slot before it answers, refusal or not.
        let proposal = proposal.holding(slot);
        if proposal.encoded_len() > shared.config.max_request_bytes {
            return proposal.refuse(Error::RequestTooLarge);
        }
        let queued = Queued { role, proposal };
        // APPLY-5: a lone write is applied and answered here, without a thread hand-off.
        let Some(queued) = apply::apply_inline(&running.applier, &running.proposals, queued) else {
            return;
        };
        if let Err(queued) = running.proposals.push(queued) {
            queued.proposal.refuse(Error::Closed);
        }
    }
}

/// Applies the allocation prepare queue length the configuration sets at open, if any:
/// writes its settings row in one durable commit (before any write of the apply thread)
/// unless it is already the persisted one, and returns what it replaced.
fn configure_prepare_queue(
    store: &Store,
    accounts: &mut Accounts,
    configured: Option<u64>,
) -> Result<Option<AllocationPrepareQueueReplaced>> {
    let Some(length) = configured else {
        return Ok(None);
    };
    let previous = accounts.stored_prepare_queue_length();
    if previous != Some(length) {
        store.write(|batch| accounts.set_prepare_queue_length(length, batch))?;
    }
    Ok(Some(AllocationPrepareQueueReplaced { previous, length }))
}

/// What the engine does when the apply thread panicked (a bug; the panic is on stderr):
/// the store is poisoned; every queued write is refused, later ones too (the mailbox is
/// closed, so they get `Closed`); the commit thread finishes what it was handed and
/// stops, so close and drop do not wait for it forever (ENG-6).
fn apply_thread_died(shared: &Shared, proposals: &Mailbox<Queued>, commits: &Mailbox<Handover>) {
    shared
        .reads
        .store
        .poison("the apply thread panicked (see the log); reopen the data directory");
    proposals.close();
    let refusal = || Error::Storage(StorageError::Poisoned("the apply thread panicked".into()));
    for queued in proposals.take(usize::MAX, Some(Duration::ZERO)).items {
        queued.proposal.refuse(refusal());
    }
    commits.close();
}

/// Runs `submit` with a completion that hands the answer to this thread, and waits for it:
/// the blocking API over the asynchronous one.
fn wait<T: Send + 'static>(submit: impl FnOnce(Completion<T>)) -> Result<T> {
    let (answerer, awaited) = reply::slot();
    submit(Box::new(move |result| answerer.answer(result)));
    awaited.wait().ok_or(Error::Closed)?
}

impl Running {
    /// Closes the proposal mailbox and waits for the apply thread to drain it and the commit
    /// thread to finish what it was handed.
    fn stop(self) -> Arc<Shared> {
        self.shared.stopping.store(true, Ordering::Release);
        // Woken now, the watch thread sees the flag at once (else within WATCH_SYNC_INTERVAL).
        self.shared.reads.hub.wake_sync_thread();
        let _ = self.watch_thread.join();
        self.proposals.close();
        // A panic in either thread has already been reported on stderr; the store is
        // closed by the caller either way. The apply thread closes the commit mailbox once
        // it drained the proposals, and the commit thread ends after answering them.
        let _ = self.apply_thread.join();
        let _ = self.commit_thread.join();
        self.shared
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
    }
}
