//! The apply thread: applies admitted writes in order, in batches, each batch in one
//! storage write transaction, and hands every committed batch to the commit thread
//! (`engine::commit`) without waiting for it to be durable; compaction steps run between
//! batches.
//!
//! Each loop takes every queued proposal into its per-role lanes (sleeps if there is none
//! and no compaction work), forms a batch of up to `batch_requests_max` from them (PREP-4),
//! applies it in order in one `Store::write_logged` transaction (committed without I/O, its
//! changes framed as one log record), and hands the batch with its record, its events and
//! its answers to the commit thread, which makes the record durable, publishes and answers.
//! Meanwhile this thread applies the next batch: one batch's `fdatasync` overlaps the next
//! one's apply (`docs/design/write-path.md`).
//!
//! Invariants:
//! - APPLY-1: a request's answer is delivered only after the commit holding it is durable
//!   (COMMIT-1; durable unless `unsafe_no_fsync`); if the commit fails, every request of the
//!   batch gets the storage error and nothing of the batch is published.
//! - APPLY-2: a Compaction is applied first in its batch, after a barrier (COMMIT-3) has
//!   published every batch before it, so the revision it compacts at is already published:
//!   a reader at the published revision never meets a compaction above it. Defrag steps
//!   also run only after a barrier.
//! - APPLY-3: apply is deterministic given its inputs: the same requests in the same order
//!   give the same history bytes. It reads no randomness; it reads the engine's `Clock`
//!   only for lease deadlines (memory only, reset on restart), for the allocation prepare
//!   queue's fair share (which roles had an allocation admitted in the last 10 s; memory
//!   only; a replicated log would carry the time in the entry), and to generate expiry
//!   revokes and auto-compactions and the re-registration timeouts of recovered agents,
//!   which then go through apply like client requests (a replicated log would carry them as
//!   entries), to space the walks that measure the size in use, and for wall times stored
//!   in rows (an operation's outcome, an agent's unreachable time) and the retention age of
//!   outcomes (OPER-4); the history bytes never depend on it; the filesystem's free space
//!   comes from the injected `FreeSpace`, read at most once per batch.
//! - APPLY-4: the apply thread never waits for a disk sync except in a checkpoint batch
//!   whose sync cannot be deferred (WAL-8) or that comes before the last one's sync is done
//!   (FILE-4), a compaction step, a defrag step, the size-in-use walk, and a batch it
//!   finishes itself (`commit::finish_inline`) because the commit thread is idle and
//!   nothing is queued; it
//!   sleeps only when there is no proposal and no compaction work, or while a batch gathers
//!   (APPLY-6).
//! - APPLY-6: under a real-time priority (`Config::pipeline_priority`, RT-2) the thread
//!   would take each write as it arrives, since it runs the moment it is woken, and a busy
//!   server would make one batch and one sync per write or two. So when its last batch
//!   held more than one request and what it took is fewer than that (at most
//!   `BATCH_GATHER_REQUESTS`), it sleeps until that many are queued or `BATCH_GATHER_WAIT`
//!   passes, and the connection threads run meanwhile. A lone writer (last batch of one)
//!   never waits; under the normal scheduler the thread never gathers: its wake-up waits
//!   for the CPU anyway, and writes gather meanwhile.
//! - APPLY-5: a lone write may be applied in its caller's thread ([`apply_inline`]): only
//!   when the apply thread sleeps with nothing queued (so the write overtakes nobody), the
//!   last batch held one request (the load is a lone writer's, not a burst's first
//!   arrival), nothing taken is unapplied, the commit thread sleeps with nothing handed
//!   over (every batch before is published), no compaction is pending, no defrag runs,
//!   and the request is neither a compaction nor a defrag step. It then runs the same
//!   code as a batch of the apply thread, under the same lock (`Mutex<Applier>`, which
//!   the thread releases while it sleeps), so APPLY-1..3 hold unchanged; the caller's
//!   thread makes the batch durable and answers it (the commit thread is idle). Work
//!   between batches stays on the apply thread, which wakes for it at least every
//!   `IDLE_WAKE_INTERVAL`. A write submitted inside [`in_burst`] is never applied inline:
//!   its caller has more writes to submit at once, which should share its batch and sync.
//!
//! Contact points: `Engine` pushes [`Proposal`]s into a [`Mailbox`], or applies a lone
//! write through [`apply_inline`]; `mvcc::write` applies each request; `engine::commit`
//! finishes each batch.

use std::cell::Cell;
use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;

use super::Shared;
use super::auto_compact::AutoCompactor;
use super::commit::{self, AppliedBatch, CommitStep, Committer, FailpointCounter, Handover};
use super::defrag::{self, DefragStep};
use super::lanes::{Lanes, Queued};
use super::mailbox::{Mailbox, Taken};
use super::proposal::{
    Answer, Completion, Identified, Proposal, ReconcileAnswer, ReconcileRequest,
};
use crate::accounting::{AccountingRequest, Accounts};
use crate::api::{
    AlarmAction, AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, LeaseGrantRequest, LeaseGrantResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, PutRequest, PutResponse, ResponseHeader, TxnRequest,
    TxnResponse,
};
use crate::error::{Error, Result, StorageError};
use crate::lease::{self, LEASE_REVOKES_PER_PASS_MAX, Lessor};
use crate::mvcc::compaction::CompactionJob;
use crate::mvcc::record;
use crate::mvcc::write::{Change, TxnWriter};
use crate::operations::reconcile::ReconcileView;
use crate::operations::{AccountingOutcome, Digest, Lookup, Operations, Recordable};
use crate::space;
use crate::storage::{MetaKey, WriteBatch};
use crate::sync::{self, Arc, Mutex, Ordering};

/// The shortest time between two refreshes of the size-in-use figure.
const STATS_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// A refresh of the size-in-use figure is spaced at least this many times its own duration
/// from the next, so the page walk takes at most 1/20 of the apply thread under load.
const STATS_REFRESH_SPACING_FACTOR: u32 = 20;

/// A walk that took longer than this (a large database) runs under load at most every
/// `STATS_BUSY_LONG_WALK_INTERVAL`, since it stalls writes for its duration.
const STATS_BUSY_WALK_MAX: Duration = Duration::from_millis(20);
const STATS_BUSY_LONG_WALK_INTERVAL: Duration = Duration::from_secs(300);

/// Before the first walk after open, a database whose file is larger than this is expected
/// to walk longer than `STATS_BUSY_WALK_MAX` (about 0.4 s per GiB).
const STATS_SHORT_WALK_FILE_MAX: u64 = 32 << 20;

/// A long walk runs between writes only once the engine has been quiet (nothing queued,
/// nothing in flight, no batch applied) for this long, and for this many times the last
/// walk's duration: a momentary gap between two writes is not a pause to fill with it.
const STATS_QUIET_MIN: Duration = Duration::from_secs(1);
const STATS_QUIET_WALKS: u32 = 5;

/// Debug builds check ACCT-1 after each batch of a store with at most this many keys.
const ACCT_CHECK_KEYS_MAX: usize = 4_096;

/// How long the idle apply thread sleeps before looking at lease deadlines again.
const IDLE_WAKE_INTERVAL: Duration = Duration::from_millis(50);
/// The most writes a batch gathers for at real-time priority (APPLY-6).
const BATCH_GATHER_REQUESTS: usize = 32;
/// The longest a batch gathers at real-time priority (APPLY-6): a few syncs of this
/// machine's disk (100-150 us each), and under a flood from 1,024 clients it kept the
/// batches as large as under the normal scheduler (`docs/benchmarks-features.md`).
const BATCH_GATHER_WAIT: Duration = Duration::from_micros(500);

/// A compaction being carried out, with the answers owed when it physically ends.
struct PendingCompaction {
    job: CompactionJob,
    waiters: Vec<Answer>,
}

/// The state of the apply thread.
pub struct Applier {
    shared: Arc<Shared>,
    /// What was taken from the mailbox and not yet applied, one lane per role (PREP-4).
    lanes: Lanes,
    /// For finishing a batch inline (`commit::finish_inline`).
    committer: Committer,
    /// Set when the apply thread stopped (or apply panicked in a caller's thread): no
    /// write is applied inline any more.
    stopped: bool,
    /// How many requests the last batch of writes held: a write is applied inline only
    /// after a batch of one, so callers take turns with the apply thread only while the
    /// load is a lone writer's (APPLY-5).
    last_batch_len: usize,
    proposals: Arc<Mailbox<Queued>>,
    commits: Arc<Mailbox<Handover>>,
    /// The revision of the last applied write, committed or not.
    current: i64,
    applied_index: u64,
    compactions: VecDeque<PendingCompaction>,
    /// The changes of the batch being applied, by revision, for watchers once it commits.
    events: Vec<(i64, Vec<Change>)>,
    /// Commits since the size-in-use figure was last refreshed.
    commits_since_stats: u64,
    /// When (engine clock) the figure was last refreshed (or the engine opened), and the
    /// spacing to the next.
    last_stats_at: Duration,
    stats_spacing: Duration,
    /// False until the first refresh after open.
    measured_once: bool,
    /// How long the last walk took (wall clock; spacing only, not an input to apply).
    last_walk: Duration,
    /// When (engine clock) the last batch of writes was applied, or the engine opened.
    last_batch_at: Duration,
    /// The estimated page growth of the records written so far in the current batch.
    batch_cost: u64,
    /// An exact in-use measurement taken during the current batch.
    batch_measured: Option<u64>,
    /// The filesystem's free space, read once per batch when a write with a cost needs it.
    batch_fs_free: Option<Option<u64>>,
    /// True while batches handed to the commit thread may not be published yet.
    undrained: bool,
    auto_compactor: Option<AutoCompactor>,
    failpoint: FailpointCounter,
    /// The retained outcomes of writes with operation ids (OPER-1..4).
    operations: Operations,
    /// When (engine clock) the engine opened, for the re-registration timeout.
    opened_at: Duration,
    /// True once recovered agents were checked against the re-registration timeout.
    reregister_checked: bool,
}

/// What recovery hands the apply thread to go on from.
pub struct Resume {
    /// The revision of the last applied write.
    pub current: i64,
    /// Requests applied so far.
    pub applied_index: u64,
    /// Interrupted compactions to finish.
    pub jobs: Vec<CompactionJob>,
    /// The retained outcomes of writes with operation ids.
    pub operations: Operations,
}

/// The operation id and request digest a write is recorded under, if it carries one.
type OperationTag = Option<(String, Digest)>;

/// What applying one request produced.
enum Outcome {
    /// An answer delivered with the batch.
    Answer(Answer),
    /// A compaction was scheduled; a physical one is answered when its job ends.
    Compaction {
        revision: i64,
        physical: bool,
        answer: Answer,
    },
    /// A physical compaction that failed: like etcd, answered only after the compactions
    /// already scheduled have finished.
    AfterPendingCompactions(Answer),
    /// Already answered with a refusal that changed nothing.
    Refused,
}

/// Turns a typed result into an outcome. A storage failure answers `done` with it at once
/// and aborts the batch (the caller fails the rest).
fn settle<T: Send + 'static>(
    done: Completion<T>,
    result: Result<Result<T>, StorageError>,
) -> Result<Outcome, StorageError> {
    match result {
        Ok(answer) => Ok(Outcome::Answer(Answer::new(done, answer))),
        Err(e) => {
            done(Err(Error::Storage(e.clone())));
            Err(e)
        }
    }
}

/// Nobody waits for the answer of a write the engine makes itself (expiry, auto-compaction).
fn unanswered<T>() -> Completion<T> {
    Box::new(|_| {})
}

/// The apply thread: runs turns until the proposal mailbox is closed and drained, then
/// closes the commit mailbox. An unfinished compaction resumes at the next open
/// (COMPACT-2). It sleeps in `take` without holding `applier`, so a lone write's caller
/// can apply it meanwhile ([`apply_inline`]).
pub fn run(applier: &Mutex<Applier>, proposals: &Mailbox<Queued>) {
    loop {
        let (wait, gather) = {
            let applier = sync::lock(applier);
            (applier.take_wait(), applier.gather_wanted())
        };
        let mut taken = proposals.take(usize::MAX, wait);
        if let Some(want) = gather
            && !taken.items.is_empty()
            && taken.items.len() < want
            && !taken.closed
        {
            let more = proposals.take_at_least(
                usize::MAX,
                want - taken.items.len(),
                Some(BATCH_GATHER_WAIT),
            );
            taken.items.extend(more.items);
            taken.closed = more.closed;
        }
        if sync::lock(applier).turn(taken) {
            break;
        }
    }
    sync::lock(applier).stop();
}

thread_local! {
    /// True while this thread runs inside [`in_burst`].
    static IN_BURST: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as part of a burst of submissions from this thread: the writes `f` submits go to
/// the apply thread, never applied inline in this thread (APPLY-5). A caller that holds more
/// writes to submit right after this one (the server, for a connection with more calls ready)
/// thus lets them join the same batch and the same log sync, instead of making each wait for
/// the sync of the one before.
pub fn in_burst<T>(f: impl FnOnce() -> T) -> T {
    /// Restores the flag as it was, also if `f` panics.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_BURST.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(IN_BURST.with(|flag| flag.replace(true)));
    f()
}

/// Returns true while this thread runs inside [`in_burst`].
pub fn burst_hinted() -> bool {
    IN_BURST.with(Cell::get)
}

/// Applies `queued` in its caller's thread, as a batch of its own finished there (APPLY-5),
/// if the apply thread sleeps with nothing queued and nothing in flight: a lone writer then
/// pays no thread hand-off, neither to the apply thread nor back with its answer. Returns
/// the proposal otherwise, to be queued (`None`: applied). A panic in the apply is what a panic of the apply
/// thread is (ENG-6): the store is poisoned and the mailbox closed.
pub fn apply_inline(
    applier: &Mutex<Applier>,
    proposals: &Mailbox<Queued>,
    queued: Queued,
) -> Option<Queued> {
    if !queued.proposal.may_apply_inline() || burst_hinted() || !proposals.consumer_idle() {
        return Some(queued);
    }
    let Ok(mut applier) = applier.try_lock() else {
        return Some(queued);
    };
    // Checked again under the lock: the apply thread may have taken a push meanwhile.
    if !applier.ready_inline() || !proposals.consumer_idle() {
        return Some(queued);
    }
    let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        applier.apply_taken(vec![queued.proposal]);
    }));
    applier
        .shared
        .stats
        .inline_batches
        .fetch_add(1, Ordering::Relaxed);
    if applied.is_err() {
        applier.stopped = true;
        super::apply_thread_died(&applier.shared, proposals, &applier.commits);
    }
    None
}

impl std::fmt::Debug for Applier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applier")
            .field("current", &self.current)
            .field("applied_index", &self.applied_index)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Applier {
    /// Returns the apply state after recovery.
    pub fn new(
        shared: Arc<Shared>,
        committer: Committer,
        proposals: Arc<Mailbox<Queued>>,
        commits: Arc<Mailbox<Handover>>,
        resume: Resume,
    ) -> Applier {
        let Resume {
            current: recovered_current,
            applied_index,
            jobs,
            operations,
        } = resume;
        let compactions = jobs
            .into_iter()
            .map(|job| PendingCompaction {
                job,
                waiters: Vec::new(),
            })
            .collect();
        let opened_at = shared.config.clock.now();
        let auto_compactor = shared
            .config
            .auto_compaction
            .map(|mode| AutoCompactor::new(mode, opened_at));
        Applier {
            shared,
            lanes: Lanes::default(),
            committer,
            stopped: false,
            last_batch_len: 0,
            proposals,
            commits,
            current: recovered_current,
            applied_index,
            compactions,
            events: Vec::new(),
            // Measure at the first chance: open starts from the file length.
            commits_since_stats: 1,
            last_stats_at: opened_at,
            stats_spacing: STATS_REFRESH_INTERVAL,
            measured_once: false,
            last_walk: Duration::ZERO,
            last_batch_at: opened_at,
            batch_cost: 0,
            batch_measured: None,
            batch_fs_free: None,
            undrained: false,
            auto_compactor,
            failpoint: FailpointCounter::default(),
            operations,
            opened_at,
            reregister_checked: false,
        }
    }

    /// What the next take waits for: a proposal, or the idle timeout (lease deadlines)
    /// when there is no work; nothing when there is.
    fn take_wait(&self) -> Option<Duration> {
        if self.compactions.is_empty() && self.lanes.is_empty() {
            Some(IDLE_WAKE_INTERVAL)
        } else {
            Some(Duration::ZERO)
        }
    }

    /// How many writes the next batch gathers for before it is applied (APPLY-6): `None`
    /// under the normal scheduler, after a batch of one, and while writes wait in the lanes.
    fn gather_wanted(&self) -> Option<usize> {
        (self.shared.config.pipeline_priority.is_some()
            && self.last_batch_len > 1
            && self.lanes.is_empty())
        .then(|| self.last_batch_len.min(BATCH_GATHER_REQUESTS))
    }

    /// One turn of the apply thread with what a take returned: a batch, then the work
    /// between batches. Returns true once the mailbox is closed and drained.
    fn turn(&mut self, taken: Taken<Queued>) -> bool {
        // Everything queued goes into the lanes (at most the prepare queue's length, by
        // PREP-1), so a batch can take from every role that has work (PREP-4).
        self.lanes.stage(taken.items);
        let batch = self.lanes.next_batch(self.shared.config.batch_requests_max);
        let idle = batch.is_empty();
        self.apply_taken(batch);
        if taken.closed && self.lanes.is_empty() {
            return true;
        }
        self.refresh_stats(idle);
        // EDEFRAG-1: no compaction step while a defrag copies.
        if !self.compactions.is_empty() && !self.shared.defrag.running.load(Ordering::Acquire) {
            self.compaction_step();
        }
        self.expire_leases();
        self.auto_compact();
        self.reregister_timeout();
        false
    }

    /// After the last turn: waits for the commit thread, makes one durable commit and
    /// closes the commit mailbox; no write is applied inline after this (APPLY-5).
    fn stop(&mut self) {
        self.stopped = true;
        self.drain();
        // A durable commit at the end makes `kvd.redb` hold every batch on its own, so a
        // cleanly closed data directory needs no log replay (and a copy of the file is whole).
        // A poisoned store refuses it; the next open replays the log then.
        let _ = self.shared.reads.store.write(|_| Ok(()));
        self.commits.close();
    }

    /// True if a write may be applied in its caller's thread now (APPLY-5): the last batch
    /// held one request, the commit thread sleeps with nothing handed over (so every batch
    /// handed over is published), nothing is taken and unapplied, no compaction is pending,
    /// no defrag runs and the thread has not stopped.
    fn ready_inline(&self) -> bool {
        !self.stopped
            && self.last_batch_len <= 1
            && self.commits.consumer_idle()
            && self.lanes.is_empty()
            && self.compactions.is_empty()
            && !self.shared.defrag.running.load(Ordering::Acquire)
    }

    /// Applies what one take returned: runs of writes as batches; a compaction starts a
    /// batch of its own after a barrier (APPLY-2); a defrag step runs after a barrier.
    fn apply_taken(&mut self, items: Vec<Proposal>) {
        let mut batch = Vec::with_capacity(items.len());
        for proposal in items {
            match proposal {
                Proposal::Defrag(step) => {
                    self.apply_batch(std::mem::take(&mut batch));
                    self.drain();
                    self.defrag_step(step);
                }
                p if p.is_compaction() => {
                    self.apply_batch(std::mem::take(&mut batch));
                    self.drain();
                    batch.push(p);
                }
                p => batch.push(p),
            }
        }
        self.apply_batch(batch);
    }

    /// Waits until every batch handed to the commit thread is published or failed
    /// (COMMIT-3).
    fn drain(&mut self) {
        if !self.undrained {
            return;
        }
        let (reply, done) = crossbeam_channel::bounded(1);
        if self.commits.push(Handover::Barrier(reply)).is_ok() {
            // An error means the commit thread is gone, so nothing is left to wait for.
            let _ = done.recv();
        }
        self.undrained = false;
    }

    /// Submits the compaction auto-compaction asks for, through the apply path (AUTO-2).
    fn auto_compact(&mut self) {
        let Some(compactor) = self.auto_compactor.as_mut() else {
            return;
        };
        let now = self.shared.config.clock.now();
        let compacted = sync::read(&self.shared.reads.index).compact_revision;
        let Some(revision) = compactor.due(now, self.current, compacted) else {
            return;
        };
        self.drain();
        let request = CompactionRequest {
            revision,
            physical: false,
        };
        self.apply_batch(vec![Proposal::Compaction(request, unanswered())]);
    }

    /// Revokes the leases whose deadline passed on the engine's clock, through the same
    /// path as a client's revoke (so watchers see the deletions).
    fn expire_leases(&mut self) {
        // Under CORRUPT every revoke would be refused: don't retry one per pass.
        if sync::lock(&self.shared.alarms).corrupt() {
            return;
        }
        let now = self.shared.config.clock.now();
        let expired = sync::lock(&self.shared.lessor).expired(now, LEASE_REVOKES_PER_PASS_MAX);
        if expired.is_empty() {
            return;
        }
        let revokes = expired
            .into_iter()
            .map(|id| Proposal::LeaseRevoke(LeaseRevokeRequest { id }, unanswered()))
            .collect();
        self.apply_batch(revokes);
    }

    /// Marks the agents still recovered unreachable once the re-registration timeout has
    /// passed since open, through the apply path (once: agents become recovered only at
    /// open).
    fn reregister_timeout(&mut self) {
        if self.reregister_checked {
            return;
        }
        let now = self.shared.config.clock.now();
        if now.saturating_sub(self.opened_at) < self.shared.config.agent_reregister_timeout {
            return;
        }
        self.reregister_checked = true;
        if !sync::lock(&self.shared.accounts).has_recovered_agents() {
            return;
        }
        let request = AccountingRequest::RecoveredTimedOut;
        self.apply_batch(vec![Proposal::Accounting(request, unanswered())]);
    }

    fn defrag_step(&mut self, step: DefragStep) {
        // A caller that gave up waiting is not an error of ours, hence the ignored sends.
        match step {
            DefragStep::Begin(reply) => {
                let _ = reply.send(self.shared.reads.store.snapshot().map_err(Error::from));
            }
            DefragStep::Swap(target, reply) => {
                let _ = reply.send(defrag::swap(&self.shared, *target));
            }
        }
    }

    /// Refreshes the size-in-use figure readers see. The figure costs a walk of every page
    /// (about 0.4 s per GiB here), which stalls writes while it runs, so refreshes are
    /// spaced at least `STATS_REFRESH_INTERVAL` and `STATS_REFRESH_SPACING_FACTOR` times
    /// their own duration apart, on the engine clock. A walk expected to take longer than
    /// `STATS_BUSY_WALK_MAX` (a large database) runs only when the engine has been quiet for
    /// `STATS_QUIET_MIN` and `STATS_QUIET_WALKS` walks, or under continuous writes every
    /// `STATS_BUSY_LONG_WALK_INTERVAL`, and never while a defrag copies (SPACE-4). Between
    /// refreshes admission uses the estimate, and apply measures exactly when the estimate
    /// says a write might not fit (SPACE-2).
    fn refresh_stats(&mut self, idle: bool) {
        let now = self.shared.config.clock.now();
        let long = if self.measured_once {
            self.last_walk > STATS_BUSY_WALK_MAX
        } else {
            // Before the first walk the figure is the file length open started from.
            self.shared.space.last_measured() > STATS_SHORT_WALK_FILE_MAX
        };
        if long && self.shared.defrag.running.load(Ordering::Acquire) {
            // The swap replaces the file being walked; the copy's rows are what the writer
            // must not wait behind.
            return;
        }
        // A short walk fits any gap between batches; a long one waits for a real pause.
        let calm = if long {
            let quiet_for = STATS_QUIET_MIN.max(self.last_walk * STATS_QUIET_WALKS);
            idle && self.commits.consumer_idle()
                && now.saturating_sub(self.last_batch_at) >= quiet_for
        } else {
            idle
        };
        let spacing = if calm || !long {
            self.stats_spacing
        } else {
            self.stats_spacing.max(STATS_BUSY_LONG_WALK_INTERVAL)
        };
        let spaced = now.saturating_sub(self.last_stats_at) >= spacing;
        // The first measurement after open comes at the first calm moment, or one spacing
        // after open under continuous writes.
        let due = spaced || (calm && !self.measured_once);
        if self.commits_since_stats == 0 || !due {
            return;
        }
        // Wall-clock time of the walk, to space the next one; not an input to apply.
        let started = std::time::Instant::now();
        if let Ok(in_use) = self.shared.reads.store.size_in_use() {
            self.shared.space.measured(in_use);
            self.commits_since_stats = 0;
            self.measured_once = true;
        }
        self.last_stats_at = now;
        self.last_walk = started.elapsed();
        self.stats_spacing =
            STATS_REFRESH_INTERVAL.max(self.last_walk * STATS_REFRESH_SPACING_FACTOR);
    }

    /// Applies `proposals` (writes only) as one batch and hands it to the commit thread.
    fn apply_batch(&mut self, proposals: Vec<Proposal>) {
        if proposals.is_empty() {
            return;
        }
        let shared = self.shared.clone();
        self.last_batch_at = shared.config.clock.now();
        self.last_batch_len = proposals.len();
        let (before_current, before_applied) = (self.current, self.applied_index);
        self.batch_cost = 0;
        self.batch_measured = None;
        self.batch_fs_free = None;
        let mut outcomes = Vec::with_capacity(proposals.len());
        let mut pending = proposals.into_iter();
        let retention = shared.config.operation_retention;
        let wall = shared.config.clock.wall();
        let committed = shared.reads.store.write_logged(|batch| {
            // OPER-4: outcomes past their age go in the first batch after they expire.
            if self.operations.has_aged(wall, retention.age) {
                self.operations.evict_aged_in(batch, wall, retention.age)?;
            }
            for proposal in pending.by_ref() {
                outcomes.push(self.apply_one(batch, proposal)?);
            }
            batch.put_meta(
                MetaKey::CurrentRevision,
                u64::try_from(self.current).unwrap_or(0),
            )?;
            batch.put_meta(MetaKey::AppliedIndex, self.applied_index)?;
            Ok(())
        });
        match committed {
            Ok(((), record)) => {
                self.shared.stats.record_batch(outcomes.len());
                if let Some(measured) = self.batch_measured.take() {
                    self.shared.space.measured(measured);
                }
                self.shared.space.committed(self.batch_cost);
                self.debug_check_accounts();
                self.commits_since_stats += 1;
                let step = match &record {
                    Some(record) if !record.is_checkpoint() => CommitStep::AfterApply,
                    _ => CommitStep::AfterCheckpoint,
                };
                self.failpoint.reach(shared.config.commit_failpoint, step);
                if record.is_some() {
                    let failpoint = shared.config.commit_failpoint;
                    self.failpoint.reach(failpoint, CommitStep::ApplyPanic);
                }
                let answers = self.settle_outcomes(outcomes);
                let batch = AppliedBatch {
                    record,
                    revision: self.current,
                    applied_index: self.applied_index,
                    events: std::mem::take(&mut self.events),
                    answers,
                };
                let inline = self.commits.consumer_idle()
                    && self.proposals.is_empty()
                    && self.lanes.is_empty()
                    && !shared.reads.store.log_syncs_held();
                if inline {
                    // Nothing in flight and nothing queued to overlap with: finish here, and
                    // spare a lone writer a thread wake-up.
                    commit::finish_inline(&self.committer, batch, &mut self.failpoint);
                } else if let Err(Handover::Batch(batch)) =
                    self.commits.push(Handover::Batch(batch))
                {
                    // The commit thread is gone (the engine is stopping): nothing can be
                    // made durable any more.
                    for answer in batch.answers {
                        answer.fail(Error::Closed);
                    }
                } else {
                    self.undrained = true;
                }
            }
            Err(e) => {
                // APPLY-1: nothing of the batch is published; the store is now poisoned.
                self.events.clear();
                self.current = before_current;
                self.applied_index = before_applied;
                for outcome in outcomes {
                    match outcome {
                        Outcome::Answer(a)
                        | Outcome::Compaction { answer: a, .. }
                        | Outcome::AfterPendingCompactions(a) => a.fail(Error::Storage(e.clone())),
                        Outcome::Refused => {}
                    }
                }
                for proposal in pending {
                    proposal.refuse(Error::Storage(e.clone()));
                }
            }
        }
    }

    /// Debug builds recount the consumption tables after every batch of a small store and
    /// assert ACCT-1; the recount is O(keys), so stores of more than
    /// `ACCT_CHECK_KEYS_MAX` keys are not checked (release builds check nothing).
    fn debug_check_accounts(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let index = sync::read(&self.shared.reads.index);
        if index.len() > ACCT_CHECK_KEYS_MAX {
            return;
        }
        let accounts = sync::lock(&self.shared.accounts);
        let drift = accounts.drift(&index);
        debug_assert!(drift.is_empty(), "ACCT-1: counters drifted: {drift:?}");
        debug_assert!(
            accounts.prepare_queue_agrees(),
            "ACCT-6: prepare queue counts differ from the allocation records"
        );
    }

    /// Sorts a committed batch's outcomes into the answers delivered with it and the ones
    /// owed when a compaction physically ends.
    fn settle_outcomes(&mut self, outcomes: Vec<Outcome>) -> Vec<Answer> {
        let mut answers = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            match outcome {
                Outcome::Answer(answer) => answers.push(answer),
                Outcome::Compaction {
                    revision,
                    physical,
                    answer,
                } => {
                    let mut waiters = Vec::new();
                    if physical {
                        waiters.push(answer);
                    } else {
                        answers.push(answer);
                    }
                    self.compactions.push_back(PendingCompaction {
                        job: CompactionJob::new(revision),
                        waiters,
                    });
                }
                Outcome::AfterPendingCompactions(answer) => match self.compactions.back_mut() {
                    Some(last) => last.waiters.push(answer),
                    None => answers.push(answer),
                },
                Outcome::Refused => {}
            }
        }
        answers
    }

    /// Applies one request. An `Err` is a storage failure that aborts the batch (the
    /// request itself was answered with it); a refused request is answered with its
    /// refusal and changed nothing.
    fn apply_one(
        &mut self,
        batch: &mut WriteBatch<'_>,
        proposal: Proposal,
    ) -> Result<Outcome, StorageError> {
        match proposal {
            Proposal::Identified(op) => self.apply_identified(batch, *op),
            Proposal::Reconcile(req, done) => {
                let answer = self.reconcile(&req);
                Ok(Outcome::Answer(Answer::new(done, Ok(answer))))
            }
            other => self.apply_tagged(batch, other, None),
        }
    }

    /// Applies a write with an operation id (OPER-2): afresh if no outcome is retained for
    /// the id, else answered from the record (same request) or refused (another request).
    fn apply_identified(
        &mut self,
        batch: &mut WriteBatch<'_>,
        op: Identified,
    ) -> Result<Outcome, StorageError> {
        let Identified { id, digest, inner } = op;
        let wall = self.shared.config.clock.wall();
        let age = self.shared.config.operation_retention.age;
        match self.operations.lookup(&id, &digest, wall, age) {
            Lookup::Fresh => self.apply_tagged(batch, inner, Some((id, digest))),
            Lookup::Retry => replay(batch, inner, &id),
            Lookup::Reused => Ok(refused(inner, Error::OperationIdReused(id))),
        }
    }

    /// Answers a reconciliation from the state every write before it left.
    fn reconcile(&self, req: &ReconcileRequest) -> ReconcileAnswer {
        let accounts = sync::lock(&self.shared.accounts);
        match req {
            ReconcileRequest::Operations { queries, prefix } => {
                let pending = sync::lock(&self.shared.pending_operations);
                let view = ReconcileView {
                    operations: &self.operations,
                    pending: &pending,
                    accounts: &accounts,
                    now: self.shared.config.clock.wall(),
                    age: self.shared.config.operation_retention.age,
                };
                ReconcileAnswer::Operations(view.reconcile(queries, prefix))
            }
            ReconcileRequest::Tasks {
                tasks,
                partition_aware,
            } => ReconcileAnswer::Tasks(accounts.reconcile_tasks(tasks, *partition_aware)),
        }
    }

    /// Records an applied write's outcome under its operation id, in this batch (OPER-1,
    /// OPER-3: only a success is recorded), then settles its answer.
    fn settle_tagged<T: Recordable + Send + 'static>(
        &mut self,
        batch: &mut WriteBatch<'_>,
        tag: OperationTag,
        done: Completion<T>,
        result: Result<Result<T>, StorageError>,
    ) -> Result<Outcome, StorageError> {
        if let (Some((id, digest)), Ok(Ok(response))) = (&tag, &result) {
            let wall = self.shared.config.clock.wall();
            let retention = self.shared.config.operation_retention;
            if let Err(e) = self
                .operations
                .record_in(batch, id, *digest, wall, response, retention)
            {
                done(Err(Error::Storage(e.clone())));
                return Err(e);
            }
        }
        settle(done, result)
    }

    /// Applies one write, recording its outcome under `tag` if it has one.
    fn apply_tagged(
        &mut self,
        batch: &mut WriteBatch<'_>,
        proposal: Proposal,
        tag: OperationTag,
    ) -> Result<Outcome, StorageError> {
        let cost = proposal.cost();
        match proposal {
            Proposal::Alarm(req, done) => settle(done, self.apply_alarm(batch, req)),
            Proposal::Auth(req, done) => {
                let result = self.gated(batch, cost, |a, b| {
                    let answer = super::auth::apply_auth(&a.shared, &req, b)?;
                    if answer.is_ok() {
                        a.applied_index += 1;
                    }
                    Ok(answer)
                });
                settle(done, result)
            }
            Proposal::Put(req, done) => {
                let result = self.gated(batch, cost, |a, b| a.apply_put(b, &req));
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::DeleteRange(req, done) => {
                let result = self.gated(batch, cost, |a, b| {
                    a.apply_kv(b, None, |w, _, _| Ok(Ok(w.delete_range(&req)?)))
                });
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::Txn(req, done) => {
                let result = self.gated(batch, cost, |a, b| {
                    a.apply_kv(b, None, |w, _, accounts| apply_txn(w, accounts, &req))
                });
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::LeaseRevoke(req, done) => {
                let result = self.gated(batch, cost, |a, b| {
                    a.apply_kv(b, Some(req.id), |w, lessor, _| {
                        revoke_keys(w, lessor, req.id)
                    })
                });
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::LeaseGrant(req, done) => {
                let result = self.gated(batch, cost, |a, b| a.apply_lease_grant(b, req));
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::Identified(op) => {
                // enqueue_with never nests ids; apply the outer id's write as such.
                self.apply_identified(batch, *op)
            }
            Proposal::Authorized(a) => {
                // PERM-4: checked here, in apply order, against the store as it is now.
                match super::auth::check_write(&self.shared, a.caller.as_deref(), &a.inner) {
                    Ok(()) => self.apply_tagged(batch, a.inner, tag),
                    Err(refusal) => Ok(refused(a.inner, refusal)),
                }
            }
            Proposal::Reconcile(req, done) => {
                let answer = self.reconcile(&req);
                Ok(Outcome::Answer(Answer::new(done, Ok(answer))))
            }
            Proposal::Accounting(req, done) => {
                let result = self.gated(batch, cost, |a, b| {
                    let shared = a.shared.clone();
                    let index = sync::read(&shared.reads.index);
                    let mut accounts = sync::lock(&shared.accounts);
                    let quota = space::quota_bytes(shared.config.quota_backend_bytes);
                    // The prepare queue's fair share looks at recent admissions (APPLY-3).
                    let now = shared.config.clock.now();
                    let wall = shared.config.clock.wall();
                    let answer = req.apply(&mut accounts, quota, &index, now, wall, b)?;
                    if answer.is_ok() {
                        a.applied_index += 1;
                        if matches!(req, AccountingRequest::UpdateQuota { .. }) {
                            // Admission charges queue slots to the new owners from now on.
                            let owners = accounts.registry().keys().cloned().collect();
                            *sync::write(&shared.owners) = Arc::new(owners);
                        }
                    }
                    Ok(answer)
                });
                // An operator call's outcome is its answer and the revision it saw.
                let revision = self.current;
                let result = result.map(|r| {
                    r.map(|answer| AccountingOutcome {
                        revision,
                        answer: answer as u64,
                    })
                });
                let done: Completion<AccountingOutcome> =
                    Box::new(move |r| done(r.map(|o| o.answer as usize)));
                self.settle_tagged(batch, tag, done, result)
            }
            Proposal::Compaction(req, done) => {
                match self.gated(batch, cost, |a, b| a.apply_compaction(b, req)) {
                    Ok(Ok(scheduled)) => {
                        if let Some((id, digest)) = &tag {
                            let wall = self.shared.config.clock.wall();
                            let retention = self.shared.config.operation_retention;
                            let recorded = self
                                .operations
                                .record_in(batch, id, *digest, wall, &scheduled, retention);
                            if let Err(e) = recorded {
                                done(Err(Error::Storage(e.clone())));
                                return Err(e);
                            }
                        }
                        Ok(Outcome::Compaction {
                            revision: req.revision,
                            physical: req.physical,
                            answer: Answer::new(done, Ok(scheduled)),
                        })
                    }
                    Ok(Err(Error::Compacted)) if req.physical => Ok(
                        Outcome::AfterPendingCompactions(Answer::new(done, Err(Error::Compacted))),
                    ),
                    other => settle(done, other),
                }
            }
            Proposal::Defrag(step) => {
                // apply_taken() never puts a defrag step in a batch; run it anyway.
                self.defrag_step(step);
                Err(StorageError::Io(
                    "internal error: defrag step inside a write batch".into(),
                ))
            }
        }
    }

    /// Runs `apply` if the alarm and space gate let a write of `cost` through.
    fn gated<T>(
        &mut self,
        batch: &mut WriteBatch<'_>,
        cost: u64,
        apply: impl FnOnce(&mut Self, &mut WriteBatch<'_>) -> Result<Result<T>, StorageError>,
    ) -> Result<Result<T>, StorageError> {
        match self.gate(batch, cost)? {
            Some(refusal) => Ok(Err(refusal)),
            None => apply(self, batch),
        }
    }

    fn apply_put(
        &mut self,
        batch: &mut WriteBatch<'_>,
        req: &PutRequest,
    ) -> Result<Result<PutResponse>, StorageError> {
        self.apply_kv(batch, None, |writer, _, accounts| {
            if let Err(e) = writer.check_put(req) {
                return Ok(Err(e));
            }
            let probe = writer.probe_put(req);
            if accounts.checks_puts()
                && let Err(e) = accounts.check_puts(&[writer.planned_put_probed(req, &probe)?])
            {
                return Ok(Err(e));
            }
            Ok(Ok(writer.put_probed(req, probe)?))
        })
    }

    /// Runs a key-value write through a [`TxnWriter`], then charges its changes, attaches
    /// leases and records its events. `revoked` is a lease whose revoke this is: it goes
    /// once its keys are deleted.
    fn apply_kv<T>(
        &mut self,
        batch: &mut WriteBatch<'_>,
        revoked: Option<i64>,
        write: impl FnOnce(
            &mut TxnWriter<'_, '_>,
            &Lessor,
            &Accounts,
        ) -> Result<Result<T>, StorageError>,
    ) -> Result<Result<T>, StorageError> {
        let shared = self.shared.clone();
        let mut index = sync::write(&shared.reads.index);
        let mut lessor = sync::lock(&shared.lessor);
        let mut accounts = sync::lock(&shared.accounts);
        let (answer, changed, changes) = {
            let exists = |id: i64| lessor.contains(id);
            let mut writer = TxnWriter::new(&mut index, batch, &exists, self.current);
            let answer = write(&mut writer, &lessor, &accounts)?;
            let changed = writer.changed();
            (answer, changed, writer.into_changes())
        };
        if let (Some(id), Ok(_)) = (revoked, &answer) {
            lessor.revoke_in(batch, id)?;
        }
        for change in &changes {
            // SPACE-3: every record written, tombstones included, grows the estimate.
            self.batch_cost += space::record_growth(change.kv().key.len(), change.kv().value.len());
            // LEASE-1: a Put attaches its key to its lease (0 detaches); a delete detaches.
            // ACCT-2: the consumption rows change with the data they count.
            let lease = match change {
                Change::Put(kv) => {
                    let cost = record::put_cost(kv.key.len(), kv.value.len());
                    accounts.charge_put(&kv.key, cost, kv.version == 1);
                    kv.lease
                }
                Change::Delete(kv) => {
                    accounts.charge_delete(&kv.key);
                    0
                }
            };
            lessor.attach(&change.kv().key, lease);
        }
        if changed {
            self.current += 1;
            self.events.push((self.current, changes));
        }
        if answer.is_ok() {
            self.applied_index += 1;
        }
        Ok(answer)
    }

    fn apply_lease_grant(
        &mut self,
        batch: &mut WriteBatch<'_>,
        req: LeaseGrantRequest,
    ) -> Result<Result<LeaseGrantResponse>, StorageError> {
        let shared = self.shared.clone();
        let mut lessor = sync::lock(&shared.lessor);
        let id = match req.id {
            0 => lease::generate_id(
                self.applied_index ^ (self.current as u64).rotate_left(32),
                |id| lessor.contains(id),
            ),
            id => id,
        };
        if lessor.contains(id) {
            return Ok(Err(Error::LeaseExists));
        }
        let ttl = lease::effective_ttl(req.ttl, shared.config.lease_ttl_min_seconds);
        lessor.grant_in(batch, id, ttl, shared.config.clock.now())?;
        self.applied_index += 1;
        let header = ResponseHeader {
            revision: self.current,
        };
        Ok(Ok(LeaseGrantResponse { header, id, ttl }))
    }

    /// The alarm and space gate of the apply chain (etcd's capped and quota appliers):
    /// returns the refusal, if any, of a request of `cost` before it changes anything.
    /// CORRUPT stops every write; NOSPACE, the quota and the filesystem reserve stop writes
    /// with a cost, and the first such refusal raises NOSPACE in this batch (ALARM-3,
    /// SPACE-2).
    fn gate(
        &mut self,
        batch: &mut WriteBatch<'_>,
        cost: u64,
    ) -> Result<Option<Error>, StorageError> {
        {
            let alarms = sync::lock(&self.shared.alarms);
            if alarms.corrupt() {
                return Ok(Some(Error::Corrupt));
            }
            if cost == 0 {
                return Ok(None);
            }
            if alarms.nospace() {
                return Ok(Some(Error::NoSpace));
            }
        }
        if self.space_available(batch, cost)? {
            return Ok(None);
        }
        let member = AlarmMember {
            member_id: self.shared.config.member_id,
            alarm: AlarmType::NoSpace,
        };
        sync::lock(&self.shared.alarms).set(member, true, batch)?;
        Ok(Some(Error::NoSpace))
    }

    /// Returns true if a write of `cost` fits the quota and the filesystem reserve: first
    /// against the running estimate, then, if that says no, against an exact measurement of
    /// this transaction's allocated pages. The free space is read once per batch; later
    /// writes of the batch count against it with what the batch wrote so far.
    fn space_available(
        &mut self,
        batch: &mut WriteBatch<'_>,
        cost: u64,
    ) -> Result<bool, StorageError> {
        let config = &self.shared.config;
        let quota = space::quota_bytes(config.quota_backend_bytes);
        let free = *self
            .batch_fs_free
            .get_or_insert_with(|| config.free_space.available(self.shared.reads.store.dir()));
        if let Some(free) = free {
            let reserve = config
                .fs_reserve_bytes
                .unwrap_or_else(|| space::default_fs_reserve_bytes(quota));
            let left = free.saturating_sub(self.batch_cost);
            if left < reserve.saturating_add(cost) {
                return Ok(false);
            }
        }
        // What the write may really take in pages (SPACE-2): more than etcd's cost.
        let need = space::growth_bound(cost);
        let base = self
            .batch_measured
            .unwrap_or_else(|| self.shared.space.estimate());
        if space::fits(base.saturating_add(self.batch_cost), need, quota) {
            return Ok(true);
        }
        let exact = batch.allocated_bytes()?;
        self.batch_measured = Some(exact);
        self.batch_cost = 0;
        Ok(space::fits(exact, need, quota))
    }

    fn apply_alarm(
        &mut self,
        batch: &mut WriteBatch<'_>,
        req: AlarmRequest,
    ) -> Result<Result<AlarmResponse>, StorageError> {
        let member = AlarmMember {
            member_id: req.member_id,
            alarm: req.alarm,
        };
        let mut alarms = sync::lock(&self.shared.alarms);
        let listed = match req.action {
            AlarmAction::Activate => {
                alarms.set(member, true, batch)?;
                if member.alarm == AlarmType::None {
                    Vec::new()
                } else {
                    vec![member]
                }
            }
            AlarmAction::Deactivate => {
                if alarms.set(member, false, batch)? {
                    vec![member]
                } else {
                    Vec::new()
                }
            }
            AlarmAction::Get => alarms.list(req.alarm),
        };
        self.applied_index += 1;
        let header = ResponseHeader {
            revision: self.current,
        };
        Ok(Ok(AlarmResponse {
            header,
            alarms: listed,
        }))
    }

    /// Schedules a compaction: the index drops what it supersedes now; the records go in
    /// later compaction steps.
    fn apply_compaction(
        &mut self,
        batch: &mut WriteBatch<'_>,
        req: CompactionRequest,
    ) -> Result<Result<CompactionResponse>, StorageError> {
        let shared = self.shared.clone();
        let mut index = sync::write(&shared.reads.index);
        let mut accounts = sync::lock(&shared.accounts);
        if req.revision <= index.compact_revision {
            return Ok(Err(Error::Compacted));
        }
        if req.revision > self.current {
            return Ok(Err(Error::FutureRevision));
        }
        debug_assert!(req.revision <= shared.reads.published.load(), "APPLY-2");
        for (key, cost) in index.compact(req.revision) {
            // ACCT-1: kv_bytes counts revisions the index retains.
            accounts.release_bytes(&key, cost);
        }
        batch.put_meta(
            MetaKey::ScheduledCompactRevision,
            u64::try_from(req.revision).unwrap_or(0),
        )?;
        self.applied_index += 1;
        Ok(Ok(CompactionResponse {
            header: ResponseHeader {
                revision: self.current,
            },
        }))
    }

    fn compaction_step(&mut self) {
        let shared = self.shared.clone();
        let limit = shared.config.compaction_batch_records;
        let Some(pending) = self.compactions.front_mut() else {
            return;
        };
        let stepped = shared.reads.store.write(|batch| {
            let index = sync::read(&shared.reads.index);
            pending.job.step(&index, batch, limit)
        });
        match stepped {
            Ok(false) => {}
            Ok(true) => {
                // The step's durable commit holds the compaction's own batch too.
                if let Some(done) = self.compactions.pop_front() {
                    for answer in done.waiters {
                        answer.deliver();
                    }
                }
            }
            Err(e) => {
                for pending in self.compactions.drain(..) {
                    for answer in pending.waiters {
                        answer.fail(Error::Storage(e.clone()));
                    }
                }
            }
        }
    }
}

/// A refusal at apply, delivered with the batch like every other answer of apply, so it
/// never reaches its caller before the commit of the writes it was judged after.
fn refused(proposal: Proposal, error: Error) -> Outcome {
    match proposal.refusal(error) {
        Some(answer) => Outcome::Answer(answer),
        None => Outcome::Refused,
    }
}

/// Answers a retry from its recorded response (OPER-2), delivered with the batch so that it
/// comes after the commit that holds the first attempt.
fn replay(
    batch: &mut WriteBatch<'_>,
    proposal: Proposal,
    id: &str,
) -> Result<Outcome, StorageError> {
    fn recorded<T: Recordable + Send + 'static>(
        batch: &WriteBatch<'_>,
        id: &str,
        done: Completion<T>,
    ) -> Result<Outcome, StorageError> {
        settle(done, Operations::response_in::<T>(batch, id).map(Ok))
    }
    match proposal {
        // A retry is answered from the record of a write that passed its check.
        Proposal::Authorized(a) => replay(batch, a.inner, id),
        Proposal::Put(_, done) => recorded(batch, id, done),
        Proposal::DeleteRange(_, done) => recorded(batch, id, done),
        Proposal::Txn(_, done) => recorded(batch, id, done),
        Proposal::Compaction(_, done) => recorded(batch, id, done),
        Proposal::LeaseGrant(_, done) => recorded(batch, id, done),
        Proposal::LeaseRevoke(_, done) => recorded(batch, id, done),
        Proposal::Accounting(_, done) => {
            let done: Completion<AccountingOutcome> =
                Box::new(move |r| done(r.map(|o| o.answer as usize)));
            recorded(batch, id, done)
        }
        other => {
            // Admission gives ids to these kinds only (Proposal::digest).
            let error = Error::InvalidArgument("this request cannot carry an operation id".into());
            Ok(refused(other, error))
        }
    }
}

/// Decides, checks and runs a write Txn. The outer `Result` is a storage failure.
fn apply_txn(
    writer: &mut TxnWriter<'_, '_>,
    accounts: &Accounts,
    req: &TxnRequest,
) -> Result<Result<TxnResponse>, StorageError> {
    let path = writer.txn_path(req)?;
    if let Err(e) = writer.check_txn(req, &path) {
        return Ok(Err(e));
    }
    if !req.is_read_only()
        && accounts.checks_puts()
        && let Err(e) = accounts.check_puts(&writer.planned_txn_puts(req, &path)?)
    {
        return Ok(Err(e));
    }
    match writer.txn(req, &path) {
        Ok(response) => Ok(Ok(response)),
        Err(Error::Storage(e)) => Err(e),
        Err(other) if !writer.changed() => Ok(Err(other)),
        // WRITE-2 says this cannot happen: every check ran before the first change. Should it
        // happen anyway, abort the whole batch rather than commit half a txn.
        Err(other) => Err(StorageError::Corrupted(format!(
            "internal error: txn failed after its first change ({other}); batch aborted"
        ))),
    }
}

/// Deletes the keys of lease `id` in one revision (etcd: sorted, one delete each). The
/// caller removes the lease itself once this succeeded.
fn revoke_keys(
    writer: &mut TxnWriter<'_, '_>,
    lessor: &Lessor,
    id: i64,
) -> Result<Result<LeaseRevokeResponse>, StorageError> {
    let Some(ttl) = lessor.time_to_live(id, Duration::ZERO, true) else {
        return Ok(Err(Error::LeaseNotFound));
    };
    for key in ttl.keys {
        writer.delete_range(&DeleteRangeRequest {
            key,
            range_end: Bytes::new(),
            prev_kv: false,
        })?;
    }
    let header = ResponseHeader {
        revision: writer.revision(),
    };
    Ok(Ok(LeaseRevokeResponse { header }))
}
