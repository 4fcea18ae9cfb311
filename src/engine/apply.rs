//! The apply thread: group commit of admitted writes, compaction steps between batches, and
//! recovery on open.
//!
//! Each loop: take the first queued proposal (block if there is no compaction work), take
//! up to `batch_requests_max - 1` more without waiting, apply them in order in one storage
//! write transaction, commit, publish the revision, answer every request; then run one
//! compaction step if a compaction is pending.
//!
//! Invariants:
//! - APPLY-1: a request's answer is sent only after the commit holding it returned (durable
//!   unless `unsafe_no_fsync`); if the commit fails, every request of the batch gets the
//!   storage error and nothing of the batch is published.
//! - APPLY-2: a Compaction is applied first in its batch, so the revision it compacts at is
//!   already published: a reader at the published revision never meets a compaction above
//!   it.
//! - APPLY-3: apply is deterministic given its inputs: the same requests in the same order
//!   give the same history bytes. It reads no randomness; it reads the engine's `Clock` only
//!   for lease deadlines (memory only, reset on restart) and to generate expiry revokes and
//!   auto-compactions, which then go through apply like client requests (a replicated log
//!   would carry them as entries).
//!   history bytes; it reads no clock and no randomness.
//!
//! Contact points: `Engine` sends [`Proposal`]s; `mvcc::write` applies each request.

use std::collections::VecDeque;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::Shared;
use super::auto_compact::AutoCompactor;
use super::defrag::{self, DefragStep};
use crate::accounting::Accounts;
use crate::alarm::{self, ALARMS_TABLE};
use crate::api::{
    AlarmAction, AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionRequest,
    CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutResponse, ResponseHeader,
    TxnRequest, TxnResponse, WriteRequest,
};
use crate::error::{Error, Result, StorageError};
use crate::lease::{self, LEASE_REVOKES_PER_PASS_MAX, LEASES_TABLE, Lessor};
use crate::mvcc::compaction::CompactionJob;
use crate::mvcc::read;
use crate::mvcc::record::{self, Record};
use crate::mvcc::write::{Change, TxnWriter};
use crate::mvcc::{Index, Revision};
use crate::space;
use crate::storage::{MetaKey, Snapshot, Store, WriteBatch};
use crate::sync::{self, Arc, Ordering};

/// A message to the apply thread.
#[derive(Debug)]
pub enum Proposal {
    /// A step of a defrag, run between two batches.
    Defrag(DefragStep),
    /// A write to apply.
    Write {
        /// The request.
        request: WriteRequest,
        /// Where the answer goes.
        reply: Sender<Result<WriteResponse>>,
    },
}

/// The answer to a write.
#[derive(Debug)]
pub enum WriteResponse {
    /// A Put's answer.
    Put(PutResponse),
    /// A DeleteRange's answer.
    DeleteRange(DeleteRangeResponse),
    /// A Txn's answer.
    Txn(TxnResponse),
    /// A Compaction's answer.
    Compaction(CompactionResponse),
    /// A lease grant's answer.
    LeaseGrant(LeaseGrantResponse),
    /// A lease revoke's answer.
    LeaseRevoke(LeaseRevokeResponse),
    /// An alarm request's answer.
    Alarm(AlarmResponse),
    /// An accounting request's answer: the rows a repair changed, else 0.
    Accounting(usize),
}

/// What open found on disk.
pub struct Recovered {
    /// The rebuilt index, compacted at the compaction revision.
    pub index: Index,
    /// The current revision (ENG-2: never below what was committed).
    pub current: i64,
    /// Requests applied so far.
    pub applied_index: u64,
    /// An interrupted compaction to resume.
    pub jobs: Vec<CompactionJob>,
    /// The leases, with full TTLs from now (LEASE-3), and their keys.
    pub lessor: Lessor,
    /// The active alarms (ALARM-1).
    pub alarms: Vec<AlarmMember>,
}

/// Rebuilds the index from the history and the meta table.
pub fn recover(
    store: &Store,
    now: Duration,
    lease_ttl_min: i64,
) -> Result<Recovered, StorageError> {
    let snapshot = store.snapshot()?;
    let meta = |key| -> Result<i64, StorageError> {
        Ok(snapshot
            .get_meta(key)?
            .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)))
    };
    let finished = meta(MetaKey::FinishedCompactRevision)?;
    let scheduled = meta(MetaKey::ScheduledCompactRevision)?;
    let recorded_current = meta(MetaKey::CurrentRevision)?;
    let applied_index = snapshot.get_meta(MetaKey::AppliedIndex)?.unwrap_or(0);
    let mut alarms = Vec::new();
    for (key, _) in snapshot.rows(ALARMS_TABLE)? {
        alarms.push(alarm::decode_key(&key)?);
    }
    let mut lessor = Lessor::new();
    for (key, value) in snapshot.rows(LEASES_TABLE)? {
        let (id, ttl) = lease::decode_row(&key, &value)?;
        // etcd raises stored TTLs below the minimum on load (LEASE-4).
        lessor.grant(id, lease::effective_ttl(ttl, lease_ttl_min), now);
    }
    // The lease of each key's newest record, for keys that have one.
    let mut attached: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    let mut index = Index::new();
    let mut last_main = 1;
    snapshot.scan_history(.., usize::MAX, |key, value| {
        let rev = Revision::from_key(key);
        let head = Record::decode_head(value)?;
        if head.tombstone || head.lease == 0 {
            attached.remove(head.key);
        } else {
            attached.insert(head.key.to_vec(), head.lease);
        }
        index.restore(
            head.key,
            rev,
            head.tombstone,
            head.create_revision,
            head.version,
            head.cost(),
        );
        last_main = rev.main;
        Ok(true)
    })?;
    let mut jobs = Vec::new();
    if scheduled > finished {
        index.compact(scheduled);
        jobs.push(CompactionJob::new(scheduled));
    } else if finished >= 0 {
        index.compact(finished);
    }
    for (key, lease) in attached {
        lessor.attach(&Bytes::from(key), lease);
    }
    let current = last_main.max(recorded_current).max(scheduled).max(1);
    Ok(Recovered {
        index,
        current,
        applied_index,
        jobs,
        lessor,
        alarms,
    })
}

/// How many times gathering a batch yields the CPU to wait for more proposals.
const GATHER_YIELDS_MAX: usize = 2;

/// The shortest time between two idle refreshes of the size-in-use figure.
const STATS_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// How long the idle apply thread sleeps before looking at lease deadlines again.
const IDLE_WAKE_INTERVAL: Duration = Duration::from_millis(50);

/// A compaction being carried out, with the callers waiting for its physical end.
struct PendingCompaction {
    job: CompactionJob,
    /// Callers answered when the job ends, with the answer each is owed.
    waiters: Vec<(Sender<Result<WriteResponse>>, Result<WriteResponse>)>,
}

/// The state of the apply thread.
pub struct Applier {
    shared: Arc<Shared>,
    /// The revision of the last applied write, committed or not.
    current: i64,
    applied_index: u64,
    compactions: VecDeque<PendingCompaction>,
    /// A proposal held back to start the next batch (APPLY-2).
    carried: Option<Proposal>,
    /// The changes of the batch being applied, by revision, for watchers once it commits.
    events: Vec<(i64, Vec<Change>)>,
    /// Commits since the size-in-use figure was last refreshed.
    commits_since_stats: u64,
    /// When (engine clock) the figure was last refreshed, and the spacing to the next.
    last_stats_at: Option<Duration>,
    stats_spacing: Duration,
    /// The estimated page growth of the records written so far in the current batch.
    batch_cost: u64,
    /// An exact in-use measurement taken during the current batch.
    batch_measured: Option<u64>,
    auto_compactor: Option<AutoCompactor>,
}

/// What applying one request produced.
enum Outcome {
    Answer(Result<WriteResponse>),
    /// A compaction was scheduled; a physical one is answered when its job ends.
    Compaction {
        revision: i64,
        physical: bool,
        response: CompactionResponse,
    },
    /// A physical compaction that failed: like etcd, answered only after the compactions
    /// already scheduled have finished.
    AfterPendingCompactions(Error),
}

impl Applier {
    /// Returns the apply state after recovery.
    pub fn new(
        shared: Arc<Shared>,
        current: i64,
        applied_index: u64,
        jobs: Vec<CompactionJob>,
    ) -> Applier {
        let compactions = jobs
            .into_iter()
            .map(|job| PendingCompaction {
                job,
                waiters: Vec::new(),
            })
            .collect();
        let auto_compactor = shared
            .config
            .auto_compaction
            .map(|mode| AutoCompactor::new(mode, shared.config.clock.now()));
        Applier {
            shared,
            current,
            applied_index,
            compactions,
            carried: None,
            events: Vec::new(),
            // Measure at the first idle moment: open starts from the file length.
            commits_since_stats: 1,
            last_stats_at: None,
            stats_spacing: STATS_REFRESH_INTERVAL,
            batch_cost: 0,
            batch_measured: None,
            auto_compactor,
        }
    }

    /// Runs until every sender is gone and the queue is drained. An unfinished compaction
    /// resumes at the next open (COMPACT-2).
    pub fn run(mut self, proposals: Receiver<Proposal>) {
        loop {
            let first = match self.carried.take() {
                Some(p) => Some(p),
                None if self.compactions.is_empty() => {
                    match proposals.recv_timeout(IDLE_WAKE_INTERVAL) {
                        Ok(p) => Some(p),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match proposals.try_recv() {
                    Ok(p) => Some(p),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return,
                },
            };
            let idle = first.is_none();
            match first {
                Some(Proposal::Defrag(step)) => self.defrag_step(step),
                Some(first) => {
                    let batch = self.gather(first, &proposals);
                    self.apply_batch(batch);
                }
                None => {}
            }
            self.refresh_stats(idle);
            // EDEFRAG-1: no compaction step while a defrag copies.
            if !self.compactions.is_empty() && !self.shared.defrag.running.load(Ordering::Acquire) {
                self.compaction_step();
            }
            self.expire_leases();
            self.auto_compact();
        }
    }

    /// Submits the compaction auto-compaction asks for, through the apply path (AUTO-2).
    fn auto_compact(&mut self) {
        let Some(compactor) = self.auto_compactor.as_mut() else {
            return;
        };
        let now = self.shared.config.clock.now();
        let compacted = sync::read(&self.shared.index).compact_revision;
        let Some(revision) = compactor.due(now, self.shared.published.load(), compacted) else {
            return;
        };
        // Nobody waits for the answer; the receiver is dropped at once.
        let (reply, _) = crossbeam_channel::bounded(1);
        let request = WriteRequest::Compaction(CompactionRequest {
            revision,
            physical: false,
        });
        self.apply_writes(vec![(request, reply)]);
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
            .map(|id| {
                // Nobody waits for an expiry's answer; the receiver is dropped at once.
                let (reply, _) = crossbeam_channel::bounded(1);
                (WriteRequest::LeaseRevoke(LeaseRevokeRequest { id }), reply)
            })
            .collect();
        self.apply_writes(revokes);
    }

    /// Takes up to a batch of proposals without waiting; a Compaction ends the batch before
    /// it (APPLY-2).
    fn gather(&mut self, first: Proposal, proposals: &Receiver<Proposal>) -> Vec<Proposal> {
        let mut batch = vec![first];
        let mut yields = 0;
        while batch.len() < self.shared.config.batch_requests_max {
            let next = match proposals.try_recv() {
                Ok(next) => next,
                // Callers answered by the last commit are resubmitting: give them one chance
                // to join this batch (group commit), then commit what is there.
                Err(_) if yields < GATHER_YIELDS_MAX && batch.len() > 1 => {
                    yields += 1;
                    std::thread::yield_now();
                    continue;
                }
                Err(_) => break,
            };
            if is_compaction(&next) || matches!(next, Proposal::Defrag(_)) {
                self.carried = Some(next);
                break;
            }
            batch.push(next);
        }
        batch
    }

    fn apply_batch(&mut self, batch: Vec<Proposal>) {
        let mut writes = Vec::with_capacity(batch.len());
        for proposal in batch {
            match proposal {
                Proposal::Write { request, reply } => writes.push((request, reply)),
                // gather() ends a batch before a defrag step; handle one that slipped in anyway.
                Proposal::Defrag(step) => self.defrag_step(step),
            }
        }
        if !writes.is_empty() {
            self.apply_writes(writes);
        }
    }

    fn defrag_step(&mut self, step: DefragStep) {
        // A caller that gave up waiting is not an error of ours, hence the ignored sends.
        match step {
            DefragStep::Begin(reply) => {
                let _ = reply.send(self.shared.store.snapshot().map_err(Error::from));
            }
            DefragStep::Swap(target, reply) => {
                let _ = reply.send(defrag::swap(&self.shared, *target));
            }
        }
    }

    /// Refreshes the size-in-use figure readers see, only when the thread is idle, commits
    /// happened since, and enough time passed: the figure costs a walk of every page (about
    /// a second per GiB here), so it is spaced at least `STATS_REFRESH_INTERVAL` and twenty
    /// times its own duration apart. Between refreshes admission uses the estimate, and
    /// apply measures exactly when the estimate says a write might not fit (SPACE-2).
    fn refresh_stats(&mut self, idle: bool) {
        let now = self.shared.config.clock.now();
        let due = self
            .last_stats_at
            .is_none_or(|at| now.saturating_sub(at) >= self.stats_spacing);
        if self.commits_since_stats == 0 || !idle || !due {
            return;
        }
        // Wall-clock time of the walk, to space the next one; not an input to apply.
        let started = std::time::Instant::now();
        if let Ok(in_use) = self.shared.store.size_in_use() {
            self.shared.space.measured(in_use);
            self.commits_since_stats = 0;
        }
        self.last_stats_at = Some(now);
        self.stats_spacing = STATS_REFRESH_INTERVAL.max(started.elapsed() * 20);
    }

    fn apply_writes(&mut self, writes: Vec<(WriteRequest, Sender<Result<WriteResponse>>)>) {
        let shared = self.shared.clone();
        let (before_current, before_applied) = (self.current, self.applied_index);
        self.batch_cost = 0;
        self.batch_measured = None;
        let committed = shared.store.write(|batch| {
            let mut outcomes = Vec::with_capacity(writes.len());
            for (request, _) in &writes {
                outcomes.push(self.apply_one(batch, request)?);
            }
            batch.put_meta(
                MetaKey::CurrentRevision,
                u64::try_from(self.current).unwrap_or(0),
            )?;
            batch.put_meta(MetaKey::AppliedIndex, self.applied_index)?;

            Ok(outcomes)
        });
        match committed {
            Ok(outcomes) => {
                let events = std::mem::take(&mut self.events);
                self.shared
                    .stats
                    .applied_index
                    .store(self.applied_index, Ordering::Release);
                self.shared.stats.record_batch(outcomes.len());
                if let Some(measured) = self.batch_measured.take() {
                    self.shared.space.measured(measured);
                }
                self.shared.space.committed(self.batch_cost);
                self.commits_since_stats += 1;
                self.shared.publish(self.current, events);
                for ((_, reply), outcome) in writes.into_iter().zip(outcomes) {
                    self.answer(reply, outcome);
                }
            }
            Err(e) => {
                // APPLY-1: nothing of the batch is published; the store is now poisoned.
                self.events.clear();
                self.current = before_current;
                self.applied_index = before_applied;
                for (_, reply) in writes {
                    let _ = reply.send(Err(Error::Storage(e.clone())));
                }
            }
        }
    }

    fn answer(&mut self, reply: Sender<Result<WriteResponse>>, outcome: Outcome) {
        // A caller that gave up waiting is not an error of ours, hence the ignored sends.
        match outcome {
            Outcome::Answer(answer) => {
                let _ = reply.send(answer);
            }
            Outcome::Compaction {
                revision,
                physical,
                response,
            } => {
                let answer = Ok(WriteResponse::Compaction(response));
                let mut waiters = Vec::new();
                if physical {
                    waiters.push((reply, answer));
                } else {
                    let _ = reply.send(answer);
                }
                self.compactions.push_back(PendingCompaction {
                    job: CompactionJob::new(revision),
                    waiters,
                });
            }
            Outcome::AfterPendingCompactions(error) => match self.compactions.back_mut() {
                Some(last) => last.waiters.push((reply, Err(error))),
                None => {
                    let _ = reply.send(Err(error));
                }
            },
        }
    }

    /// Applies one request. An `Err` is a storage failure that aborts the batch; a refused
    /// request is an `Ok(Outcome::Answer(Err(..)))` and changed nothing.
    fn apply_one(
        &mut self,
        batch: &mut WriteBatch<'_>,
        request: &WriteRequest,
    ) -> Result<Outcome, StorageError> {
        let shared = self.shared.clone();
        if let WriteRequest::Alarm(a) = request {
            return self.apply_alarm(batch, *a);
        }
        if let Some(refusal) = self.gate(batch, request)? {
            return Ok(Outcome::Answer(Err(refusal)));
        }
        let mut index = sync::write(&shared.index);
        let mut lessor = sync::lock(&shared.lessor);
        let mut accounts = sync::lock(&shared.accounts);
        match request {
            WriteRequest::Compaction(c) => {
                return self.apply_compaction(&mut index, &mut accounts, batch, *c);
            }
            WriteRequest::LeaseGrant(g) => return self.apply_lease_grant(&mut lessor, batch, *g),
            WriteRequest::Accounting(a) => {
                let quota = space::quota_bytes(shared.config.quota_backend_bytes);
                let answer = a.apply(&mut accounts, quota, &index, batch)?;
                if answer.is_ok() {
                    self.applied_index += 1;
                }
                return Ok(Outcome::Answer(answer.map(WriteResponse::Accounting)));
            }
            _ => {}
        }
        let exists = |id: i64| lessor.contains(id);
        let mut writer = TxnWriter::new(&mut index, batch, &exists, self.current);
        let answer = match request {
            WriteRequest::Put(p) => match writer.check_put(p) {
                Ok(()) => match accounts.check_puts(&[writer.planned_put(p)?]) {
                    Ok(()) => Ok(WriteResponse::Put(writer.put(p)?)),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            },
            WriteRequest::DeleteRange(d) => Ok(WriteResponse::DeleteRange(writer.delete_range(d)?)),
            WriteRequest::Txn(t) => apply_txn(&mut writer, &accounts, t)?.map(WriteResponse::Txn),
            WriteRequest::LeaseRevoke(r) => revoke_keys(&mut writer, &lessor, r.id)?,
            WriteRequest::Compaction(_)
            | WriteRequest::LeaseGrant(_)
            | WriteRequest::Alarm(_)
            | WriteRequest::Accounting(_) => Err(Error::InvalidArgument("handled above".into())),
        };
        let changed = writer.changed();
        let changes = writer.into_changes();
        if let (WriteRequest::LeaseRevoke(r), Ok(_)) = (request, &answer) {
            lessor.revoke(r.id);
            batch.delete_row(LEASES_TABLE, &r.id.to_be_bytes())?;
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
        Ok(Outcome::Answer(answer))
    }

    fn apply_lease_grant(
        &mut self,
        lessor: &mut Lessor,
        batch: &mut WriteBatch<'_>,
        req: LeaseGrantRequest,
    ) -> Result<Outcome, StorageError> {
        let id = match req.id {
            0 => lease::generate_id(
                self.applied_index ^ (self.current as u64).rotate_left(32),
                |id| lessor.contains(id),
            ),
            id => id,
        };
        if lessor.contains(id) {
            return Ok(Outcome::Answer(Err(Error::LeaseExists)));
        }
        let ttl = lease::effective_ttl(req.ttl, self.shared.config.lease_ttl_min_seconds);
        let (key, value) = lease::encode_row(id, ttl);
        batch.put_row(LEASES_TABLE, &key, &value)?;
        lessor.grant(id, ttl, self.shared.config.clock.now());
        self.applied_index += 1;
        let header = ResponseHeader {
            revision: self.current,
        };
        Ok(Outcome::Answer(Ok(WriteResponse::LeaseGrant(
            LeaseGrantResponse { header, id, ttl },
        ))))
    }

    /// The alarm and space gate of the apply chain (etcd's capped and quota appliers):
    /// returns the refusal, if any, of a request before it changes anything. CORRUPT stops
    /// every write; NOSPACE, the quota and the filesystem reserve stop writes with a cost,
    /// and the first such refusal raises NOSPACE in this batch (ALARM-3, SPACE-2).
    fn gate(
        &mut self,
        batch: &mut WriteBatch<'_>,
        request: &WriteRequest,
    ) -> Result<Option<Error>, StorageError> {
        let cost = space::cost(request);
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
        if sync::lock(&self.shared.alarms).activate(member) {
            batch.put_row(ALARMS_TABLE, &alarm::encode_key(member), &[])?;
        }
        Ok(Some(Error::NoSpace))
    }

    /// Returns true if a write of `cost` fits the quota and the filesystem reserve: first
    /// against the running estimate, then, if that says no, against an exact measurement of
    /// this transaction's allocated pages.
    fn space_available(
        &mut self,
        batch: &mut WriteBatch<'_>,
        cost: u64,
    ) -> Result<bool, StorageError> {
        let config = &self.shared.config;
        let quota = space::quota_bytes(config.quota_backend_bytes);
        if let Some(free) = space::fs_available(self.shared.store.dir()) {
            let reserve = config
                .fs_reserve_bytes
                .unwrap_or_else(|| space::default_fs_reserve_bytes(quota));
            if free < reserve.saturating_add(cost) {
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
    ) -> Result<Outcome, StorageError> {
        let member = AlarmMember {
            member_id: req.member_id,
            alarm: req.alarm,
        };
        let mut alarms = sync::lock(&self.shared.alarms);
        let listed = match req.action {
            AlarmAction::Activate => {
                if alarms.activate(member) {
                    batch.put_row(ALARMS_TABLE, &alarm::encode_key(member), &[])?;
                }
                if member.alarm == AlarmType::None {
                    Vec::new()
                } else {
                    vec![member]
                }
            }
            AlarmAction::Deactivate => {
                if alarms.deactivate(member) {
                    batch.delete_row(ALARMS_TABLE, &alarm::encode_key(member))?;
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
        Ok(Outcome::Answer(Ok(WriteResponse::Alarm(AlarmResponse {
            header,
            alarms: listed,
        }))))
    }

    fn apply_compaction(
        &mut self,
        index: &mut Index,
        accounts: &mut Accounts,
        batch: &mut WriteBatch<'_>,
        req: CompactionRequest,
    ) -> Result<Outcome, StorageError> {
        if req.revision <= index.compact_revision {
            if req.physical {
                return Ok(Outcome::AfterPendingCompactions(Error::Compacted));
            }
            return Ok(Outcome::Answer(Err(Error::Compacted)));
        }
        if req.revision > self.current {
            return Ok(Outcome::Answer(Err(Error::FutureRevision)));
        }
        debug_assert!(req.revision <= self.shared.published.load(), "APPLY-2");
        for (key, cost) in index.compact(req.revision) {
            // ACCT-1: kv_bytes counts revisions the index retains.
            accounts.release_bytes(&key, cost);
        }
        batch.put_meta(
            MetaKey::ScheduledCompactRevision,
            u64::try_from(req.revision).unwrap_or(0),
        )?;
        self.applied_index += 1;
        let response = CompactionResponse {
            header: ResponseHeader {
                revision: self.current,
            },
        };
        Ok(Outcome::Compaction {
            revision: req.revision,
            physical: req.physical,
            response,
        })
    }

    fn compaction_step(&mut self) {
        let shared = self.shared.clone();
        let limit = shared.config.compaction_batch_records;
        let Some(pending) = self.compactions.front_mut() else {
            return;
        };
        let stepped = shared.store.write(|batch| {
            let index = sync::read(&shared.index);
            pending.job.step(&index, batch, limit)
        });
        match stepped {
            Ok(false) => {}
            Ok(true) => {
                if let Some(done) = self.compactions.pop_front() {
                    for (reply, answer) in done.waiters {
                        let _ = reply.send(answer);
                    }
                }
            }
            Err(e) => {
                for pending in self.compactions.drain(..) {
                    for (reply, _) in pending.waiters {
                        let _ = reply.send(Err(Error::Storage(e.clone())));
                    }
                }
            }
        }
    }
}

fn is_compaction(proposal: &Proposal) -> bool {
    matches!(
        proposal,
        Proposal::Write {
            request: WriteRequest::Compaction(_),
            ..
        }
    )
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
) -> Result<Result<WriteResponse>, StorageError> {
    let Some(ttl) = lessor.time_to_live(id, Duration::ZERO) else {
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
    Ok(Ok(WriteResponse::LeaseRevoke(LeaseRevokeResponse {
        header,
    })))
}

/// Runs a Txn whose branches only read, at the published revision, in the caller's thread.
pub fn read_only_txn(
    index: &Index,
    snapshot: &Snapshot,
    req: &TxnRequest,
    current: i64,
) -> Result<TxnResponse> {
    let mut succeeded = true;
    for compare in &req.compare {
        if !read::compare_holds(index, snapshot, compare, current)? {
            succeeded = false;
            break;
        }
    }
    let branch = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    for op in branch {
        if let crate::api::RequestOp::Range(r) = op {
            read::check_txn_range_revision(r.revision, current, index.compact_revision)?;
        }
    }
    let mut responses = Vec::with_capacity(branch.len());
    for op in branch {
        let crate::api::RequestOp::Range(r) = op else {
            return Err(Error::InvalidArgument("read-only txn holds a write".into()));
        };
        let at = read::read_revision(r.revision, current, index.compact_revision)?;
        let plan = read::plan_range(index, r, at);
        responses.push(crate::api::ResponseOp::Range(read::finish_range(
            plan, snapshot, r, current,
        )?));
    }
    Ok(TxnResponse {
        header: ResponseHeader { revision: current },
        succeeded,
        responses,
    })
}
