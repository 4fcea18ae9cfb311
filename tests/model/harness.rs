//! Runs a sequence against a fresh engine and the model, comparing everything observable.
//!
//! After every op: the full reply (response structs or errors), the engine's Status (current
//! and compaction revisions, alarms), its lease list (ids, soonest deadline first), and its
//! consumption report (`Engine::roles`: every counter, the roles listed and their registry
//! entries) against the model's own recount from its history and records
//! ([`super::drift`]). HashKV: every
//! field but `hash` against the model, and the hash itself must be a function of (compaction
//! revision, hash revision), so it may not change across reopens, background compaction or
//! later writes. On Reopen: hash_kv(0) before and after. After a reopen and at the end: a
//! Range of every key at every readable revision (and just outside the readable window) and
//! TimeToLive (with keys) of every lease.
//!
//! Time: the engine runs on a `ManualClock` shared with the harness (kept across reopens),
//! and the model keeps the same time. `AdvanceClock` moves both; the engine's apply thread
//! revokes due leases on its own within ~50 ms, so the harness then polls the engine's lease
//! list and revision until they equal the model's (at most [`EXPIRY_PATIENCE`]) before the
//! next op: expiry has to have happened, and happened exactly as the model says, before
//! anything else is compared. A grant of id 0 takes the engine's id (checked positive and
//! unused) into the model.
//!
//! Watches: see [`super::watch`]. The eager stream is read after every op; both streams are
//! settled and every watch is checked before each Reopen and at the end.
//!
//! Space: the engine's free-space figure is a `ManualFreeSpace` the harness sets with the
//! model (`Op::SetFreeSpace`), so the filesystem guard is deterministic. The pages redb
//! allocates are not: where the model cannot tell whether a write fits the quota
//! (`space::Verdict::Either`), the harness tells it what the engine answered, and the model
//! follows (a refusal must then be NOSPACE, raise the alarm and change nothing, which the
//! later comparisons check). `Op::MeasureSpace` hands the engine's measurement to the model,
//! after checking it is at least the bytes of the live keys and values.
//!
//! The write prepare queue: the engine runs with the sequence's small
//! `prepare_queue_length` and a `Faults` switch. After every op its `prepare_queue` report
//! (every role with writes queued or refused since open) must be the model's: nothing stays
//! queued between operations. [`Op::QueueBurst`] holds the log syncs, so every admitted Put
//! stays in the queue, submits its Puts in order and takes the ones answered at once as the
//! refusals: they must be exactly the model's (`super::queue`), with a retry hint within
//! the documented bounds, and nothing admitted may be answered before the syncs are
//! released. Then the admitted Puts' answers: each successful one has its own revision,
//! following the revision before the burst, one role's in submission order (PREP-4); the
//! order across roles is the engine's choice (deficit round robin), which the model cannot
//! know, so it applies the admitted Puts in the engine's order, checking each answer, and a
//! Range of every refused key must find nothing the model does not have.
//!
//! Any mismatch panics with the sequence label and op index.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvd::{
    AlarmAction, AlarmType, Config, Engine, Error, Faults, HashKvResponse, LeaseGrantRequest,
    ManualClock, ManualFreeSpace, PutRequest, PutResponse, RangeRequest, RangeResponse,
    WriteOptions,
};

use super::drift;
use super::ops::{Op, QuotaOp, Reply, Seq};
use super::queue;
use super::space::SpaceStats;
use super::state::{FREE_SPACE_PLENTY_BYTES, Limits, Model, SpaceChoice};
use super::watch::{Mismatch, WatchCoverage, WatchLog, Watches};
use super::wire;

/// What a run observed that depends on the engine alone, for comparing two engines fed the
/// same sequence, and what the checks covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Every HashKV the harness asked for: (op index, engine reply).
    pub hashes: Vec<(usize, Result<HashKvResponse, Error>)>,
    /// Counts of what was checked (timing-dependent for watches: not for comparing).
    pub coverage: Coverage,
    /// How every watch ended (timing-dependent for watches that raced a compaction).
    pub watches: Vec<WatchLog>,
}

/// Counts of what a run checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Ops run (undefined txns skipped).
    pub ops: usize,
    /// Leases revoked by the clock.
    pub expired_leases: usize,
    /// Of which held keys (a revision of deletes).
    pub expired_with_keys: usize,
    /// Time spent waiting for expiry.
    pub expiry_wait: Duration,
    /// The watch checks.
    pub watches: WatchCoverage,
    /// Reopens (restarts of the engine on its directory).
    pub restarts: usize,
    /// Replies refused with NOSPACE (`etcdserver: mvcc: database space exceeded`).
    pub no_space: usize,
    /// How the model decided the space checks.
    pub space: SpaceStats,
    /// Defrags run.
    pub defrags: usize,
    /// Measurements of the pages in use handed to the model.
    pub measurements: usize,
    /// Writes and records refused by a per-role limit (`kvd: quota exceeded ...`).
    pub quota_exceeded: usize,
    /// Registry and record requests refused as invalid (`Error::QuotaRequest`).
    pub quota_request_refused: usize,
    /// Registry and record requests applied.
    pub quota_applied: usize,
    /// Comparisons of the engine's consumption report with the model's recount.
    pub recounts: usize,
    /// Largest number of (role, resource) rows a recount produced.
    pub rows_max: usize,
    /// Write refusals that named another over-limit (role, resource) than the documented
    /// first one (see `Harness::same`).
    pub limit_order_divergences: usize,
    /// The prepare queue's bursts.
    pub queue: QueueCoverage,
}

/// Counts of what the bursts of [`Op::QueueBurst`] checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCoverage {
    /// Bursts sent.
    pub bursts: usize,
    /// Bursts not sent because their answers could depend on timing.
    pub skipped: usize,
    /// Puts submitted in bursts.
    pub writes: usize,
    /// Of which refused with `etcdserver: too many requests`.
    pub refused: usize,
    /// Refusals because the queue was full (PREP-1), as the model decided them.
    pub refused_at_bound: usize,
    /// Refusals because the role held its share (PREP-2), as the model decided them.
    pub refused_for_share: usize,
    /// Writes admitted into a queue that held others.
    pub admitted_beside_others: usize,
    /// Bursts of at least two Puts that had every one admitted.
    pub all_admitted: usize,
    /// Bursts with Puts of more than one role.
    pub multi_role: usize,
    /// Refusals and admissions compared with the engine's `prepare_queue` report.
    pub reports: usize,
}

impl QueueCoverage {
    fn add(&mut self, o: &QueueCoverage) {
        self.bursts += o.bursts;
        self.skipped += o.skipped;
        self.writes += o.writes;
        self.refused += o.refused;
        self.refused_at_bound += o.refused_at_bound;
        self.refused_for_share += o.refused_for_share;
        self.admitted_beside_others += o.admitted_beside_others;
        self.all_admitted += o.all_admitted;
        self.multi_role += o.multi_role;
        self.reports += o.reports;
    }
}

impl Coverage {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &Coverage) {
        self.ops += other.ops;
        self.expired_leases += other.expired_leases;
        self.expired_with_keys += other.expired_with_keys;
        self.expiry_wait += other.expiry_wait;
        let (w, o) = (&mut self.watches, &other.watches);
        w.created += o.created;
        w.refused += o.refused;
        w.compacted_at_create += o.compacted_at_create;
        w.compacted_while_behind += o.compacted_while_behind;
        w.full += o.full;
        w.events += o.events;
        w.grouped_responses += o.grouped_responses;
        w.progress += o.progress;
        self.restarts += other.restarts;
        self.no_space += other.no_space;
        let (s, o) = (&mut self.space, &other.space);
        s.refused_latched += o.refused_latched;
        s.refused_fs += o.refused_fs;
        s.refused_must += o.refused_must;
        s.refused_either += o.refused_either;
        s.accepted_must += o.accepted_must;
        s.accepted_measured += o.accepted_measured;
        s.accepted_either += o.accepted_either;
        s.accepted_after_disarm += o.accepted_after_disarm;
        s.refused_corrupt += o.refused_corrupt;
        s.disarms += o.disarms;
        self.defrags += other.defrags;
        self.measurements += other.measurements;
        self.quota_exceeded += other.quota_exceeded;
        self.quota_request_refused += other.quota_request_refused;
        self.quota_applied += other.quota_applied;
        self.recounts += other.recounts;
        self.rows_max = self.rows_max.max(other.rows_max);
        self.limit_order_divergences += other.limit_order_divergences;
        self.queue.add(&other.queue);
    }
}

/// History records per compaction step: small, so that compactions take many steps and
/// overlap with the ops that follow them.
const COMPACTION_BATCH_RECORDS: usize = 16;

/// The longest the harness waits for the engine to revoke the leases a clock step made due.
pub const EXPIRY_PATIENCE: Duration = Duration::from_secs(10);

/// Progress notifications every 20 s of the manual clock, so that `AdvanceClock` steps
/// trigger some (etcd's default is 10 minutes).
const PROGRESS_NOTIFY_INTERVAL: Duration = Duration::from_secs(20);

/// The longest the harness waits for the answers of a burst's admitted Puts once the log
/// syncs are released.
pub const BURST_PATIENCE: Duration = Duration::from_secs(30);

/// Returns the engine configuration for `limits` on `clock`, `free` and `faults`: no fsync
/// and a small cache, to stay fast; the default filesystem reserve.
pub fn config(
    limits: Limits,
    clock: &Arc<ManualClock>,
    free: &Arc<ManualFreeSpace>,
    faults: &Arc<Faults>,
) -> Config {
    Config {
        unsafe_no_fsync: true,
        cache_size_bytes: 4 << 20,
        // The engine clamps it to its smallest log (64 KiB): each open zero-fills the log,
        // and a short sequence opens engines often.
        wal_file_bytes: 0,
        max_txn_ops: limits.max_txn_ops,
        max_request_bytes: limits.max_request_bytes,
        quota_backend_bytes: limits.quota_backend_bytes,
        prepare_queue_length: limits.prepare_queue_length,
        faults: Some(faults.clone()),
        free_space: free.clone(),
        compaction_batch_records: COMPACTION_BATCH_RECORDS,
        clock: clock.clone(),
        watch_progress_notify_interval: PROGRESS_NOTIFY_INTERVAL,
        ..Config::default()
    }
}

/// Runs `seq` against a fresh engine in `dir` (which must be empty) and the model; panics
/// on the first difference, naming the sequence and the op index.
pub fn run(seq: &Seq, dir: &Path) -> Trace {
    let mut h = Harness::new(seq, dir);
    for (i, op) in seq.ops.iter().enumerate() {
        h.step(i, op);
    }
    let end = seq.ops.len();
    h.finish_watches(end);
    h.sweep(end, "final sweep", true);
    h.close(end);
    h.trace.coverage.watches = h.watches.coverage.clone();
    h.trace.coverage.space = h.model.space_stats().clone();
    let (q, stats) = (&mut h.trace.coverage.queue, h.model.queue_stats());
    q.refused_at_bound = stats.refused_bound;
    q.refused_for_share = stats.refused_share;
    q.admitted_beside_others = stats.admitted_beside_others;
    h.trace.watches = std::mem::take(&mut h.watches.logs);
    h.trace
}

struct Harness<'a> {
    seq: &'a Seq,
    dir: &'a Path,
    clock: Arc<ManualClock>,
    free: Arc<ManualFreeSpace>,
    faults: Arc<Faults>,
    engine: Option<Engine>,
    model: Model,
    watches: Watches,
    /// (compaction revision, hash revision) → the hash first seen for it.
    hashes: BTreeMap<(i64, i64), u32>,
    trace: Trace,
}

/// The longest Debug text a failure message prints per value (values can be 1.5 MiB).
const DEBUG_CHARS_MAX: usize = 6000;

fn shown(value: &dyn Debug) -> String {
    let text = format!("{value:?}");
    match text.char_indices().nth(DEBUG_CHARS_MAX) {
        Some((cut, _)) => format!("{}… ({} more bytes)", &text[..cut], text.len() - cut),
        None => text,
    }
}

impl<'a> Harness<'a> {
    fn new(seq: &'a Seq, dir: &'a Path) -> Harness<'a> {
        let clock = Arc::new(ManualClock::new());
        let free = Arc::new(ManualFreeSpace::new(Some(FREE_SPACE_PLENTY_BYTES)));
        let faults = Arc::new(Faults::new());
        let engine = match Engine::open(dir, config(seq.limits, &clock, &free, &faults)) {
            Ok(engine) => engine,
            Err(e) => panic!("{}: Engine::open failed: {e:?}", seq.label),
        };
        let mut model = Model::new(seq.limits);
        // The file length bounds the pages in use from the first op on.
        match engine.status() {
            Ok(status) => model.set_file_len(status.db_size),
            Err(e) => panic!("{}: Engine::status after open failed: {e:?}", seq.label),
        }
        Harness {
            seq,
            dir,
            clock,
            free,
            faults,
            engine: Some(engine),
            model,
            watches: Watches::new(),
            hashes: BTreeMap::new(),
            trace: Trace {
                hashes: Vec::new(),
                coverage: Coverage::default(),
                watches: Vec::new(),
            },
        }
    }

    fn fail(&self, i: usize, what: &str, engine: &dyn Debug, model: &dyn Debug) -> ! {
        let op = self
            .seq
            .ops
            .get(i)
            .map_or_else(|| "(after the last op)".to_owned(), |op| shown(op));
        panic!(
            "kvd model mismatch: {label}, op #{i} of {n}: {what}\n  op:     {op}\n  engine: {e}\n  \
             model:  {m}\n  (model state: revision {rev}, compact revision {compact}, clock \
             {now:?}, leases {leases:?}, alarms {alarms:?})",
            label = self.seq.label,
            n = self.seq.ops.len(),
            e = shown(engine),
            m = shown(model),
            rev = self.model.current_revision(),
            compact = self.model.compact_revision(),
            now = self.model.now(),
            leases = self.model.lease_ids(),
            alarms = self.model.alarm_list(),
        )
    }

    fn fail_watch(&self, i: usize, m: Mismatch) -> ! {
        self.fail(i, &m.what, &Raw(m.engine), &Raw(m.model))
    }

    /// Checks the engine's wire form of a Range (its WIRE-1) against the model's answer,
    /// written by the model's own protobuf writer.
    fn check_range_wire(&self, i: usize, req: &RangeRequest, answer: &RangeResponse) {
        let engine = self.call(i, |e| e.prepare_range(req).and_then(|p| p.finish_wire()));
        let model = kvd::EncodedRange {
            revision: answer.header.revision,
            kvs: wire::range_kvs(&answer.kvs),
            more: answer.more,
            count: answer.count,
        };
        if engine.as_ref() != Ok(&model) {
            self.fail(i, "the Range's wire form", &engine, &model);
        }
    }

    /// Calls the engine; if it panics, says where before passing the panic on.
    fn call<T>(&self, i: usize, f: impl FnOnce(&Engine) -> T) -> T {
        let Some(engine) = &self.engine else {
            panic!("{}: op #{i}: the engine is not open", self.seq.label)
        };
        match catch_unwind(AssertUnwindSafe(|| f(engine))) {
            Ok(value) => value,
            Err(payload) => {
                eprintln!(
                    "kvd engine panicked: {}, op #{i} of {}",
                    self.seq.label,
                    self.seq.ops.len()
                );
                resume_unwind(payload)
            }
        }
    }

    fn step(&mut self, i: usize, op: &Op) {
        self.trace.coverage.ops += 1;
        match op {
            Op::Reopen => self.reopen(i),
            Op::HashKv(rev) => {
                self.hash_kv(i, *rev);
            }
            Op::LeaseGrant(req) => self.lease_grant(i, req),
            Op::AdvanceClock(by) => self.advance_clock(i, *by),
            Op::SettleWatches => {
                if let Err(m) = self.watches.settle_all(&self.model) {
                    self.fail_watch(i, m);
                }
            }
            Op::Watch { stream, req } => {
                let Some(engine) = &self.engine else {
                    panic!("{}: op #{i}: the engine is not open", self.seq.label)
                };
                if let Err(m) = self.watches.create(i, *stream, req, engine, &self.model) {
                    self.fail_watch(i, m);
                }
            }
            Op::MeasureSpace => self.measure_space(i),
            Op::QueueBurst(puts) => self.queue_burst(i, puts),
            Op::SetFreeSpace(free) => {
                self.free.set(*free);
                self.model.apply(op);
            }
            _ => {
                let revision_before = self.model.current_revision();
                let engine = self.call(i, |e| apply(e, op));
                let choice = if engine.is_no_space() {
                    SpaceChoice::Refuse
                } else {
                    SpaceChoice::Accept
                };
                self.model.set_space_choice(choice);
                let model = self.model.apply(op);
                if !self.same(&engine, &model) {
                    self.fail(i, "replies differ", &engine, &model);
                }
                if let (Op::Range(r), Reply::Range(Ok(answer))) = (op, &model) {
                    self.check_range_wire(i, r, answer);
                }
                self.count(&model);
                if let (Op::Compact(c), Reply::Compact(Ok(_))) = (op, &model) {
                    self.watches.compacted(c.revision);
                }
                if matches!(op, Op::Defrag) {
                    self.trace.coverage.defrags += 1;
                }
                if let Op::Alarm(a) = op
                    && a.action == AlarmAction::Deactivate
                    && a.alarm == AlarmType::Corrupt
                {
                    // Leases that fell due under CORRUPT expire once it is cleared.
                    self.wait_for_expiry(i, "CORRUPT was cleared", revision_before);
                }
            }
        }
        if let Err(m) = self.watches.poll_eager(&self.model) {
            self.fail_watch(i, m);
        }
        self.check_status(i);
        self.check_accounts(i);
        self.check_queue(i);
    }

    /// Returns true if the engine's reply is the model's. A write over the limits of several
    /// (role, resource) pairs must name the documented first (role-name order, then
    /// resource name); other orders are counted as divergences
    /// (`Coverage::limit_order_divergences`) before they fail the comparison.
    fn same(&mut self, engine: &Reply, model: &Reply) -> bool {
        if engine == model {
            return true;
        }
        if let (
            Reply::Put(Err(Error::QuotaExceeded(e))) | Reply::Txn(Err(Error::QuotaExceeded(e))),
            Reply::Put(Err(Error::QuotaExceeded(_))) | Reply::Txn(Err(Error::QuotaExceeded(_))),
        ) = (engine, model)
            && self.model.other_limit_refusals().contains(e)
        {
            self.trace.coverage.limit_order_divergences += 1;
        }
        false
    }

    /// Counts what a reply exercised.
    fn count(&mut self, reply: &Reply) {
        let c = &mut self.trace.coverage;
        let err = match reply {
            Reply::Put(Err(e))
            | Reply::Txn(Err(e))
            | Reply::LeaseGrant(Err(e))
            | Reply::DeleteRange(Err(e))
            | Reply::Compact(Err(e))
            | Reply::LeaseRevoke(Err(e))
            | Reply::Quota(Err(e)) => e,
            Reply::Quota(Ok(_)) => {
                c.quota_applied += 1;
                return;
            }
            _ => return,
        };
        match err {
            Error::NoSpace => c.no_space += 1,
            Error::QuotaExceeded(_) => c.quota_exceeded += 1,
            Error::QuotaRequest(_) => c.quota_request_refused += 1,
            _ => {}
        }
    }

    /// Compares the engine's prepare queue report with the model's: every role with writes
    /// queued (none, between operations) or refused since the engine opened.
    fn check_queue(&mut self, i: usize) {
        let engine = self.call(i, Engine::prepare_queue);
        let model = self.model.queue_roles();
        if !matches!(&engine, Ok(roles) if *roles == model) {
            self.fail(
                i,
                "Engine::prepare_queue after the op (roles with writes queued or refused since \
                 open; nothing stays queued between operations)",
                &engine,
                &model,
            );
        }
        self.trace.coverage.queue.reports += 1;
    }

    /// Runs [`Op::QueueBurst`]: see the module documentation.
    fn queue_burst(&mut self, i: usize, puts: &[PutRequest]) {
        if self.model.burst_unpredictable(puts).is_some() {
            self.trace.coverage.queue.skipped += 1;
            return;
        }
        let revision_before = self.model.current_revision();
        let answers = self.submit_burst(i, puts);
        // Admission, in submission order: exactly the model's refusals were answered at once.
        let admitted: Vec<Result<(), Error>> =
            puts.iter().map(|p| self.model.burst_admit(p)).collect();
        for (j, (answer, admission)) in answers.iter().zip(&admitted).enumerate() {
            let answered_at_once = answer.at_once.then(|| answer.result.clone());
            let engine = answered_at_once.map(|r| r.map_err(|e| self.hint_checked(i, j, e)));
            let model = admission.clone().err().map(Err);
            if engine != model {
                self.fail(
                    i,
                    &format!(
                        "Put #{j} of the burst (role {}, queue of {}): the answer at submission \
                         (None: admitted; a refusal of the prepare queue, PREP-1/PREP-2, or of \
                         the alarm gate or validation)",
                        self.model.put_role(&puts[j].key),
                        self.model.queue_capacity(),
                    ),
                    &engine,
                    &model,
                );
            }
        }
        // The admitted Puts, in the engine's order, each answer against the model's.
        for j in self.burst_order(i, puts, &answers, &admitted, revision_before) {
            let model = Reply::Put(self.model.burst_apply(&puts[j]));
            let engine = Reply::Put(answers[j].result.clone());
            if !self.same(&engine, &model) {
                self.fail(
                    i,
                    &format!("Put #{j} of the burst: the answer once applied"),
                    &engine,
                    &model,
                );
            }
            self.count(&model);
        }
        // PREP-3: nothing of a refused Put is visible.
        for (put, admission) in puts.iter().zip(&admitted) {
            if admission.is_ok() {
                continue;
            }
            let req = RangeRequest::key(put.key.clone());
            let engine = self.call(i, |e| e.range(&req));
            let model = self.model.range(&req);
            if engine != model {
                self.fail(
                    i,
                    "a refused Put of the burst must leave its key as it was",
                    &engine,
                    &model,
                );
            }
        }
        let q = &mut self.trace.coverage.queue;
        q.bursts += 1;
        q.writes += puts.len();
        let refused = admitted
            .iter()
            .filter(|a| matches!(a, Err(Error::TooManyRequests { .. })))
            .count();
        q.refused += refused;
        if refused == 0 && puts.len() >= 2 && admitted.iter().all(Result::is_ok) {
            q.all_admitted += 1;
        }
        let mut roles: Vec<String> = puts.iter().map(|p| self.model.put_role(&p.key)).collect();
        roles.sort();
        roles.dedup();
        if roles.len() > 1 {
            q.multi_role += 1;
        }
    }

    /// Submits `puts` in order with the log syncs held; returns each one's answer and
    /// whether it came before `submit_put` returned. Nothing admitted may be answered before
    /// the syncs are released (an answer waits for the sync that makes it durable).
    fn submit_burst(&self, i: usize, puts: &[PutRequest]) -> Vec<BurstAnswer> {
        let held = HeldSyncs::new(&self.faults);
        let mut answers: Vec<Option<BurstAnswer>> = Vec::with_capacity(puts.len());
        let mut pending: Vec<(usize, Receiver<Result<PutResponse, Error>>)> = Vec::new();
        for (j, put) in puts.iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            self.call(i, |e| {
                e.submit_put(
                    put.clone(),
                    Box::new(move |result| {
                        // The harness may have failed and stopped listening.
                        let _ = tx.send(result);
                    }),
                );
            });
            match rx.try_recv() {
                Ok(result) => answers.push(Some(BurstAnswer {
                    at_once: true,
                    result,
                })),
                Err(TryRecvError::Empty) => {
                    answers.push(None);
                    pending.push((j, rx));
                }
                Err(TryRecvError::Disconnected) => self.fail(
                    i,
                    &format!("Put #{j} of the burst"),
                    &"no answer",
                    &"an answer",
                ),
            }
        }
        for (j, rx) in &pending {
            if let Ok(early) = rx.try_recv() {
                self.fail(
                    i,
                    &format!(
                        "Put #{j} of the burst was admitted, so it is answered only after its \
                         commit's log sync, which is held"
                    ),
                    &early,
                    &"no answer yet",
                );
            }
        }
        drop(held);
        let deadline = Instant::now() + BURST_PATIENCE;
        for (j, rx) in pending {
            let wait = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(result) => {
                    answers[j] = Some(BurstAnswer {
                        at_once: false,
                        result,
                    })
                }
                Err(e) => self.fail(
                    i,
                    &format!(
                        "Put #{j} of the burst: its answer within {BURST_PATIENCE:?} of the \
                         syncs' release"
                    ),
                    &format!("{e:?}"),
                    &"an answer",
                ),
            }
        }
        answers.into_iter().flatten().collect()
    }

    /// Returns a refusal with its retry hint replaced by the model's placeholder, after
    /// checking that a `TooManyRequests` carries a hint within the documented bounds and
    /// keeps etcd's message.
    fn hint_checked(&self, i: usize, j: usize, e: Error) -> Error {
        let Error::TooManyRequests { retry_after_ms } = e else {
            return e;
        };
        let bounds = queue::HINT_MIN_MS..=queue::HINT_MAX_MS;
        if !bounds.contains(&retry_after_ms)
            || e.to_string() != "etcdserver: too many requests"
            || !e.is_too_many_requests()
        {
            self.fail(
                i,
                &format!("Put #{j} of the burst: the refusal's message and retry hint"),
                &format!("{e:?}: {e}"),
                &format!("etcdserver: too many requests, a hint in {bounds:?} ms"),
            );
        }
        Error::TooManyRequests {
            retry_after_ms: queue::HINT_UNKNOWN_MS,
        }
    }

    /// Returns the indices of the admitted Puts of a burst in the order the engine applied
    /// them, after checking what can be checked of it: the successful ones have distinct
    /// revisions following `before` without a gap (a Put makes one revision), and one role's
    /// revisions rise in submission order (PREP-4). A refused Put changed nothing, so it is
    /// placed right after its role's previous Put; roles of one burst share no ancestor with
    /// limits (the generator's key groups), so no answer depends on the order across roles.
    fn burst_order(
        &self,
        i: usize,
        puts: &[PutRequest],
        answers: &[BurstAnswer],
        admitted: &[Result<(), Error>],
        before: i64,
    ) -> Vec<usize> {
        let mut last: BTreeMap<String, i64> = BTreeMap::new();
        let mut revisions = Vec::new();
        let mut order: Vec<(i64, u8, usize)> = Vec::new();
        for (j, admission) in admitted.iter().enumerate() {
            if admission.is_err() {
                continue;
            }
            let role = self.model.put_role(&puts[j].key);
            let previous = last.get(&role).copied();
            match &answers[j].result {
                Ok(resp) => {
                    let revision = resp.header.revision;
                    if previous.is_some_and(|p| revision <= p) {
                        self.fail(
                            i,
                            &format!(
                                "PREP-4: role {role}'s Puts are applied in submission order \
                                 (Put #{j}'s revision after the role's previous one)"
                            ),
                            &revision,
                            &format!("above {previous:?}"),
                        );
                    }
                    last.insert(role, revision);
                    revisions.push(revision);
                    order.push((revision, 0, j));
                }
                Err(_) => order.push((previous.unwrap_or(before), 1, j)),
            }
        }
        revisions.sort_unstable();
        let expected: Vec<i64> = (1..=revisions.len() as i64).map(|n| before + n).collect();
        if revisions != expected {
            self.fail(
                i,
                "the revisions of the burst's applied Puts: one each, right after the revision \
                 before the burst",
                &revisions,
                &expected,
            );
        }
        order.sort_unstable();
        order.into_iter().map(|(_, _, j)| j).collect()
    }

    /// Measures the pages in use and hands the figure to the model: it cannot be below the
    /// bytes of the live keys and values, which redb stores as they are.
    fn measure_space(&mut self, i: usize) {
        let measured = self.call(i, Engine::measure_space);
        let live = self.model.live_bytes();
        match measured {
            Ok(in_use) if in_use >= live => self.model.set_measured(in_use),
            other => self.fail(
                i,
                "Engine::measure_space: the pages in use hold at least the live keys and values",
                &other,
                &format!("Ok(at least {live})"),
            ),
        }
        self.trace.coverage.measurements += 1;
    }

    /// Compares the engine's consumption report with the model's recount (see
    /// [`super::drift`]).
    fn check_accounts(&mut self, i: usize) {
        let roles = match self.call(i, Engine::roles) {
            Ok(roles) => roles,
            Err(e) => self.fail(i, "Engine::roles", &Err::<(), _>(e), &"Ok"),
        };
        let usage = self.model.usage();
        let listed = self.model.accounts().listed_roles(&usage);
        let reported = drift::reported(&roles);
        let drift = drift::compare(&reported, &usage, &listed, &self.model.accounts().registry);
        if !drift.is_empty() {
            self.fail(
                i,
                "consumption report (Engine::roles) against the model's recount: drift",
                &drift,
                &usage,
            );
        }
        self.trace.coverage.recounts += 1;
        self.trace.coverage.rows_max = self.trace.coverage.rows_max.max(usage.len());
    }

    fn check_status(&mut self, i: usize) {
        let status = self.call(i, Engine::status);
        if let Ok(s) = &status {
            self.model.set_file_len(s.db_size);
        }
        let want = (self.model.current_revision(), self.model.compact_revision());
        let alarms = self.model.alarm_list();
        match status {
            Ok(s) if (s.header.revision, s.compact_revision) == want && s.alarms == alarms => {}
            other => self.fail(
                i,
                "status (revision, compact_revision, alarms) after the op",
                &other,
                &(want, alarms),
            ),
        }
        let leases = self.call(i, Engine::lease_leases).map(|r| r.leases);
        let want = self.model.lease_leases().map(|r| r.leases);
        if leases != want {
            self.fail(i, "lease list after the op", &leases, &want);
        }
    }

    /// A grant: an id the engine chose (for id 0) must be positive and unused; the model
    /// then records that id.
    fn lease_grant(&mut self, i: usize, req: &LeaseGrantRequest) {
        let engine = self.call(i, |e| e.lease_grant(*req));
        let chosen = match (&engine, req.id) {
            (Ok(resp), 0) => {
                if resp.id <= 0 || self.model.lease_exists(resp.id) {
                    self.fail(
                        i,
                        "lease id chosen by the engine for a grant of id 0",
                        &engine,
                        &format!(
                            "a positive id not in use (in use: {:?})",
                            self.model.lease_ids()
                        ),
                    );
                }
                Some(resp.id)
            }
            _ => None,
        };
        let engine = Reply::LeaseGrant(engine);
        let choice = if engine.is_no_space() {
            SpaceChoice::Refuse
        } else {
            SpaceChoice::Accept
        };
        self.model.set_space_choice(choice);
        let model = Reply::LeaseGrant(self.model.lease_grant(req, chosen));
        self.model.set_space_choice(SpaceChoice::Accept);
        self.model.forget_measurement();
        if !self.same(&engine, &model) {
            self.fail(i, "replies differ", &engine, &model);
        }
        self.count(&model);
    }

    /// Moves the clock, then waits until the engine has revoked what the model revoked:
    /// its lease list and revision equal the model's.
    fn advance_clock(&mut self, i: usize, by: Duration) {
        let revision_before = self.model.current_revision();
        self.clock.advance(by);
        self.model.forget_measurement();
        let expired = self.model.advance_clock(by);
        self.trace.coverage.expired_leases += expired.len();
        self.wait_for_expiry(
            i,
            &format!("the clock moved by {by:?} (due: {expired:?})"),
            revision_before,
        );
    }

    /// Waits until the engine has revoked what the model revoked since `revision_before`:
    /// its lease list and revision equal the model's.
    fn wait_for_expiry(&mut self, i: usize, why: &str, revision_before: i64) {
        self.trace.coverage.expired_with_keys +=
            (self.model.current_revision() - revision_before) as usize;
        let want_leases = self.model.lease_leases().map(|r| r.leases);
        let want_rev = self.model.current_revision();
        let started = Instant::now();
        loop {
            let leases = self.call(i, Engine::lease_leases).map(|r| r.leases);
            let revision = self.call(i, Engine::status).map(|s| s.header.revision);
            if leases == want_leases && revision == Ok(want_rev) {
                break;
            }
            if started.elapsed() > EXPIRY_PATIENCE {
                self.fail(
                    i,
                    &format!(
                        "after {why} the engine must revoke the due leases (soonest deadline \
                         first, one revision each if it has keys); (lease list, revision) \
                         after waiting {EXPIRY_PATIENCE:?}"
                    ),
                    &(leases, revision),
                    &(want_leases, want_rev),
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.trace.coverage.expiry_wait += started.elapsed();
    }

    fn hash_kv(&mut self, i: usize, rev: i64) -> Option<u32> {
        let engine = self.call(i, |e| e.hash_kv(rev));
        self.trace.hashes.push((i, engine.clone()));
        let model = self.model.hash_kv(rev);
        let masked = engine.clone().map(|r| HashKvResponse { hash: 0, ..r });
        if masked != model {
            self.fail(i, &format!("hash_kv({rev}) (hash masked)"), &engine, &model);
        }
        let resp = engine.ok()?;
        let key = (resp.compact_revision, resp.hash_revision);
        match self.hashes.get(&key) {
            Some(&seen) if seen != resp.hash => self.fail(
                i,
                &format!(
                    "hash_kv at hash revision {} (compact revision {}) changed since it was \
                     first taken",
                    key.1, key.0
                ),
                &resp,
                &format!("hash {seen}"),
            ),
            Some(_) => {}
            None => {
                self.hashes.insert(key, resp.hash);
            }
        }
        Some(resp.hash)
    }

    /// Settles and checks every watch of the engine incarnation, then drops the streams.
    fn finish_watches(&mut self, i: usize) {
        if let Err(m) = self.watches.finish_segment(&self.model) {
            self.fail_watch(i, m);
        }
    }

    fn reopen(&mut self, i: usize) {
        let before = self.hash_kv(i, 0);
        self.finish_watches(i);
        if let Some(engine) = self.engine.take()
            && let Err(e) = engine.close()
        {
            self.fail(i, "Engine::close", &Err::<(), _>(e), &Ok::<(), Error>(()));
        }
        self.model.apply(&Op::Reopen);
        self.trace.coverage.restarts += 1;
        let config = config(self.seq.limits, &self.clock, &self.free, &self.faults);
        match Engine::open(self.dir, config) {
            Ok(engine) => self.engine = Some(engine),
            Err(e) => self.fail(
                i,
                "Engine::open on reopen",
                &Err::<(), _>(e),
                &Ok::<(), Error>(()),
            ),
        }
        let after = self.hash_kv(i, 0);
        if before != after {
            self.fail(i, "hash_kv(0) differs across close/reopen", &after, &before);
        }
        self.sweep(i, "sweep after reopen", false);
        // The engine's own recount must agree with its counters too (it rebuilt them at
        // open; the independent check is `check_accounts`, against the model).
        let own = self.call(i, Engine::consumption_drift);
        if !matches!(&own, Ok(d) if d.is_empty()) {
            self.fail(i, "Engine::consumption_drift after reopen", &own, &"Ok([])");
        }
    }

    /// Reads every key at every revision from just below the compaction revision to just
    /// above the current one (`full`), or at about 20 revisions spread over that window.
    fn sweep(&self, i: usize, what: &str, full: bool) {
        let first = (self.model.compact_revision() - 1).max(1);
        let last = self.model.current_revision() + 1;
        let stride = if full {
            1
        } else {
            ((last - first) / 20).max(1)
        };
        let revs = (first..=last)
            .step_by(stride as usize)
            .chain([last - 1, last]);
        for rev in revs {
            let req = RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                revision: rev,
                ..RangeRequest::default()
            };
            let engine = self.call(i, |e| e.range(&req));
            let model = self.model.range(&req);
            if engine != model {
                self.fail(
                    i,
                    &format!("{what}: every key at revision {rev}"),
                    &engine,
                    &model,
                );
            }
        }
        for id in self.model.lease_ids() {
            let engine = self.call(i, |e| e.lease_time_to_live(id, true));
            let model = self.model.lease_time_to_live(id, true);
            if engine != model {
                self.fail(
                    i,
                    &format!("{what}: TimeToLive of lease {id} with keys"),
                    &engine,
                    &model,
                );
            }
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(engine) = self.engine.take()
            && let Err(e) = engine.close()
        {
            self.fail(
                i,
                "Engine::close at the end",
                &Err::<(), _>(e),
                &Ok::<(), Error>(()),
            );
        }
    }
}

/// Sends `op` to the engine.
fn apply(engine: &Engine, op: &Op) -> Reply {
    match op {
        Op::Put(r) => Reply::Put(engine.put(r.clone())),
        Op::DeleteRange(r) => Reply::DeleteRange(engine.delete_range(r.clone())),
        Op::Once { id, op } => {
            let options = WriteOptions::with_operation_id(id.clone());
            match &**op {
                Op::Put(r) => Reply::Put(engine.put_with(r.clone(), &options)),
                Op::DeleteRange(r) => {
                    Reply::DeleteRange(engine.delete_range_with(r.clone(), &options))
                }
                other => panic!("harness: no operation id for {other:?}"),
            }
        }
        Op::Txn(r) => Reply::Txn(engine.txn(r.clone())),
        Op::Range(r) => Reply::Range(engine.range(r)),
        Op::Compact(r) => Reply::Compact(engine.compact(*r)),
        Op::HashKv(rev) => Reply::HashKv(engine.hash_kv(*rev)),
        Op::LeaseGrant(r) => Reply::LeaseGrant(engine.lease_grant(*r)),
        Op::LeaseRevoke(id) => Reply::LeaseRevoke(engine.lease_revoke(*id)),
        Op::LeaseKeepAlive(id) => Reply::LeaseKeepAlive(engine.lease_keep_alive(*id)),
        Op::LeaseTimeToLive { id, keys } => {
            Reply::LeaseTimeToLive(engine.lease_time_to_live(*id, *keys))
        }
        Op::LeaseLeases => Reply::LeaseLeases(engine.lease_leases()),
        Op::Alarm(req) => Reply::Alarm(engine.alarm(*req)),
        Op::Defrag => Reply::Defrag(engine.defrag().map(|r| r.header)),
        Op::Quota(q) => Reply::Quota(apply_quota(engine, q)),
        // The harness runs these itself.
        Op::Reopen => Reply::Reopen,
        Op::AdvanceClock(_) => Reply::AdvanceClock(Vec::new()),
        Op::Watch { .. } => Reply::Watch,
        Op::SettleWatches => Reply::SettleWatches,
        Op::MeasureSpace => Reply::MeasureSpace,
        Op::SetFreeSpace(_) => Reply::SetFreeSpace,
        Op::QueueBurst(_) => Reply::QueueBurst(None),
    }
}

/// Sends a registry or record request to the engine.
fn apply_quota(engine: &Engine, op: &QuotaOp) -> Result<usize, Error> {
    match op {
        QuotaOp::UpdateQuota { configs, force } => {
            engine.update_quota(configs.clone(), *force).map(|()| 0)
        }
        QuotaOp::RegisterAgent {
            id,
            state,
            resources,
        } => engine
            .register_agent(id, *state, resources.clone())
            .map(|()| 0),
        QuotaOp::Reserve {
            id,
            role,
            agent,
            resources,
        } => engine
            .reserve(id, role, agent, resources.clone())
            .map(|()| 0),
        QuotaOp::Unreserve(id) => engine.unreserve(id).map(|()| 0),
        QuotaOp::Allocate {
            id,
            role,
            agent,
            resources,
        } => engine
            .allocate(id, role, agent, resources.clone())
            .map(|()| 0),
        QuotaOp::Release(id) => engine.release(id).map(|()| 0),
        QuotaOp::Repair => engine.repair_consumption(),
    }
}

/// One Put of a burst: its answer, and whether it came before `submit_put` returned.
struct BurstAnswer {
    at_once: bool,
    result: Result<PutResponse, Error>,
}

/// Holds the engine's log syncs until dropped, so a failing check cannot leave the engine's
/// commit thread (and the close that waits for it) blocked.
struct HeldSyncs(Arc<Faults>);

impl HeldSyncs {
    fn new(faults: &Arc<Faults>) -> HeldSyncs {
        faults.hold_log_syncs();
        HeldSyncs(faults.clone())
    }
}

impl Drop for HeldSyncs {
    fn drop(&mut self) {
        self.0.release_log_syncs();
    }
}

/// Text shown as is in a failure message.
struct Raw(String);

impl Debug for Raw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
