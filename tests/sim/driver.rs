//! One seed's run: a step generator driving one engine on a manual clock, an injected
//! free-space figure and the fault backend, checked against the reference after every step.
//!
//! The rules checked (the failure message names the one that broke):
//! - every answer the engine gives is the reference's answer for the same write in the same
//!   state (revisions, values, versions, prev_kv, txn branches, refusals and their texts);
//! - after every step, Status, a Range of the whole key space at the current revision and a
//!   Range at a random past revision equal the reference (a revision below the compaction
//!   revision is refused as compacted), and so do the alarms and the leases;
//! - a write answered with a storage error has an unknown outcome and poisons the engine:
//!   every later write fails until reopen (STORE-2), and reads still answer the acknowledged
//!   state (a compaction whose answer was lost may already show, as reads below it refused;
//!   reads refused outright pass for now, see `Sim::read_refused`);
//! - after every reopen, clean or crashed, the store equals the reference after all
//!   acknowledged writes plus a prefix of the unknown ones, each applied whole or not at all:
//!   nothing acknowledged is lost (checked at every revision still readable), nothing appears
//!   that was never asked for, and a txn is never half applied;
//! - HashKV is a function of (compaction revision, revision) for the whole run, across
//!   reopens, defrags and crashes;
//! - while a batch's log sync is held, its write is neither answered nor visible (APPLY-1,
//!   ENG-1).
//!
//! A crash is in-process: storage starts failing every write and sync (`Faults::fail_after`,
//! possibly part way through the writes in flight), the engine is dropped without `close`,
//! and the directory is reopened. What had reached the operating system stays, as after a
//! process kill; what only the engine's memory held is gone.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Display;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvd::{
    AlarmAction, AlarmRequest, AlarmType, CompactionRequest, CompactionResponse, Compare,
    CompareResult, CompareTarget, Config, DeleteRangeRequest, DeleteRangeResponse, Engine, Error,
    Faults, KeyValue, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeResponse, ManualClock,
    ManualFreeSpace, PutRequest, PutResponse, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};

use super::model::{Env, Model, NOSPACE_MEMBER, Op, Reply, op_cost};
use super::rng::Rng;

/// Keys the simulation writes: few, so writes collide and compares both hold and fail.
const KEYS: u64 = 8;
/// Lease ids the simulation grants (explicit ids, so grants of a taken id are refused too).
const LEASE_IDS: u64 = 3;
/// TTLs asked for; 1 is below the minimum and is raised to it.
const LEASE_TTLS: [i64; 5] = [1, 3, 5, 10, 30];
/// The filesystem reserve the engine keeps, and the free space above it when space is ample.
const RESERVE_BYTES: u64 = 1 << 20;
const AMPLE_ROOM_BYTES: u64 = 1 << 40;
/// The space quota: far above what a run writes, so only the filesystem guard refuses.
const QUOTA_BYTES: i64 = 64 << 20;
/// The smallest write-ahead log, so that runs with large values fill it and checkpoint.
const WAL_FILE_BYTES: u64 = 1 << 20;
/// History records per compaction step: small, so a compaction takes several durable steps
/// and a crash can interrupt one.
const COMPACTION_BATCH_RECORDS: usize = 3;
/// A large value, for the runs that fill the log: a few fill it. A txn holds at most two
/// (values and compare operands), so it stays under etcd's 1.5 MiB request limit.
const BIG_VALUE_BYTES: usize = 384 << 10;
const TXN_BIG_VALUES_MAX: u32 = 2;
/// Writes in flight when a crash hits, at most.
const IN_FLIGHT_MAX: u64 = 4;
/// Steps a fault stays armed without firing before it is healed.
const ARMED_STEPS_MAX: usize = 12;
/// The longest the simulation waits for one answer or one background effect; hitting it is a
/// failure (a hang), not a timing threshold.
const WAIT_MAX: Duration = Duration::from_secs(60);
/// Steps described in a failure message, and the longest text kept of each and of the
/// failure itself (large values make long texts).
const RECENT_STEPS: usize = 16;
const NOTE_TEXT_MAX: usize = 400;
const FAILURE_TEXT_MAX: usize = 8_000;

/// Counts of what a sweep did, so a generator that stopped producing a kind of event fails.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    pub seeds: u64,
    pub fsync_seeds: u64,
    pub big_value_seeds: u64,
    pub steps: u64,
    pub writes: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub nospace_refusals: u64,
    pub disarms: u64,
    pub unknown: u64,
    pub unknown_applied: u64,
    pub unknown_lost: u64,
    pub faults_armed: u64,
    pub faults_fired: u64,
    pub batch_faults: u64,
    pub crashes: u64,
    pub crashes_with_writes_in_flight: u64,
    pub crashes_after_defrag: u64,
    pub clean_reopens: u64,
    pub compactions: u64,
    pub log_fills: u64,
    pub defrags: u64,
    pub lease_expiries: u64,
    pub held_sync_checks: u64,
    pub hash_checks: u64,
    pub past_reads: u64,
    pub reads_refused_while_poisoned: u64,
    pub history_checks: u64,
}

impl Totals {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &Totals) {
        for ((_, mine), (_, theirs)) in self.counts_mut().into_iter().zip(other.counts()) {
            *mine += theirs;
        }
    }

    /// Returns every count with its name, in declaration order.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        let mut copy = self.clone();
        copy.counts_mut()
            .into_iter()
            .map(|(name, n)| (name, *n))
            .collect()
    }

    fn counts_mut(&mut self) -> Vec<(&'static str, &mut u64)> {
        vec![
            ("seeds", &mut self.seeds),
            ("fsync_seeds", &mut self.fsync_seeds),
            ("big_value_seeds", &mut self.big_value_seeds),
            ("steps", &mut self.steps),
            ("writes", &mut self.writes),
            ("acknowledged", &mut self.acknowledged),
            ("refused", &mut self.refused),
            ("nospace_refusals", &mut self.nospace_refusals),
            ("disarms", &mut self.disarms),
            ("unknown", &mut self.unknown),
            ("unknown_applied", &mut self.unknown_applied),
            ("unknown_lost", &mut self.unknown_lost),
            ("faults_armed", &mut self.faults_armed),
            ("faults_fired", &mut self.faults_fired),
            ("batch_faults", &mut self.batch_faults),
            ("crashes", &mut self.crashes),
            (
                "crashes_with_writes_in_flight",
                &mut self.crashes_with_writes_in_flight,
            ),
            ("crashes_after_defrag", &mut self.crashes_after_defrag),
            ("clean_reopens", &mut self.clean_reopens),
            ("compactions", &mut self.compactions),
            ("log_fills", &mut self.log_fills),
            ("defrags", &mut self.defrags),
            ("lease_expiries", &mut self.lease_expiries),
            ("held_sync_checks", &mut self.held_sync_checks),
            ("hash_checks", &mut self.hash_checks),
            ("past_reads", &mut self.past_reads),
            (
                "reads_refused_while_poisoned",
                &mut self.reads_refused_while_poisoned,
            ),
            ("history_checks", &mut self.history_checks),
        ]
    }
}

/// What the store shows after a reopen, as the no-loss rule compares it.
#[derive(Debug, PartialEq)]
struct View {
    revision: i64,
    compact: i64,
    /// Every key-value at the current revision, values included.
    current: Vec<KeyValue>,
    /// Every revision still readable, oldest first: its key-values without values.
    history: Vec<(i64, Vec<KeyValue>)>,
    /// Every lease: id, granted TTL, remaining TTL, attached keys.
    leases: Vec<(i64, i64, i64, Vec<Bytes>)>,
    nospace: bool,
}

/// The kinds of step, with the generator's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Put,
    Delete,
    Txn,
    ReadOnlyTxn,
    Compact,
    Grant,
    Revoke,
    KeepAlive,
    Clock,
    Defrag,
    Space,
    Fault,
    Crash,
    Reopen,
    HeldSync,
    Hash,
}

const KINDS: [(Kind, u64); 16] = [
    (Kind::Put, 25),
    (Kind::Delete, 8),
    (Kind::Txn, 14),
    (Kind::ReadOnlyTxn, 3),
    (Kind::Compact, 5),
    (Kind::Grant, 4),
    (Kind::Revoke, 3),
    (Kind::KeepAlive, 2),
    (Kind::Clock, 4),
    (Kind::Defrag, 2),
    (Kind::Space, 6),
    (Kind::Fault, 3),
    (Kind::Crash, 3),
    (Kind::Reopen, 1),
    (Kind::HeldSync, 2),
    (Kind::Hash, 3),
];

/// One seed's simulation.
pub struct Sim {
    seed: u64,
    /// Chooses the steps and their requests.
    rng: Rng,
    /// Chooses what the checks read, so checking does not change the steps.
    check_rng: Rng,
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    /// The manual clock in whole seconds (it only moves by whole seconds).
    now: u64,
    free: Arc<ManualFreeSpace>,
    /// The fault switch of the engine now open; a new one per open, so nothing armed
    /// against one engine fires in the next.
    faults: Arc<Faults>,
    fsync: bool,
    big_values: bool,
    engine: Option<Engine>,
    /// The state after every acknowledged write.
    model: Model,
    /// Writes answered with a storage error since the last open, in order, with the world
    /// they were applied in.
    unknown: Vec<(Op, Env)>,
    /// A storage error was seen since the last open: writes must fail until reopen.
    poisoned: bool,
    /// Every unknown write so far is a physical compaction, whose answer waits for its
    /// deletion steps (see `settle`).
    deferred: bool,
    /// The step a fault was armed at, while it has not fired.
    armed: Option<usize>,
    /// The armed fault is `fail_next_batch` (which `heal` does not undo).
    armed_batch: bool,
    /// A defrag ran since the last open: the database in service is not under the fault
    /// backend any more (see `docs/design/simulation.md`).
    defragged: bool,
    /// Bytes free above the reserve; `None`: ample.
    room: Option<u64>,
    /// While a txn is generated, the large values it may still hold.
    txn_big_values_left: Option<u32>,
    /// Value bytes acknowledged since the log last started over (an open or a fill).
    logged_bytes: u64,
    /// (compaction revision, revision) → HashKV, for the whole run.
    hashes: BTreeMap<(i64, i64), u32>,
    step: usize,
    steps: usize,
    recent: VecDeque<String>,
    /// A digest of every step's description (see `note`).
    digest: u64,
    pub totals: Totals,
}

impl Sim {
    /// Opens a fresh engine for `seed`.
    pub fn new(seed: u64, steps: usize) -> Sim {
        let mut rng = Rng::new(seed);
        let check_rng = Rng::new(seed ^ 0x5eed_c4ec);
        // Real fsync costs milliseconds per write here, so most seeds skip the log's
        // fdatasync: the in-process crash keeps what reached the operating system either way
        // (see the design doc). One seed in eight syncs, so sync failures are injected too.
        let fsync = rng.chance(12);
        let big_values = rng.chance(12);
        let dir = tempfile::tempdir().unwrap();
        let mut sim = Sim {
            seed,
            rng,
            check_rng,
            dir,
            clock: Arc::new(ManualClock::new()),
            now: 0,
            free: Arc::new(ManualFreeSpace::new(Some(RESERVE_BYTES + AMPLE_ROOM_BYTES))),
            faults: Arc::new(Faults::new()),
            fsync,
            big_values,
            engine: None,
            model: Model::new(),
            unknown: Vec::new(),
            poisoned: false,
            deferred: false,
            armed: None,
            armed_batch: false,
            defragged: false,
            room: None,
            txn_big_values_left: None,
            logged_bytes: 0,
            hashes: BTreeMap::new(),
            step: 0,
            steps,
            recent: VecDeque::new(),
            digest: 0xcbf2_9ce4_8422_2325,
            totals: Totals {
                seeds: 1,
                fsync_seeds: u64::from(fsync),
                big_value_seeds: u64::from(big_values),
                ..Totals::default()
            },
        };
        sim.open();
        sim
    }

    /// Runs every step, then closes, reopens and checks the whole history once more.
    /// Returns the counts and a digest of the steps taken (equal for two runs of a seed
    /// unless a crash's writes in flight were batched differently).
    pub fn run(mut self) -> (Totals, u64) {
        for step in 1..=self.steps {
            self.step = step;
            self.totals.steps += 1;
            self.one_step();
            self.check_state();
        }
        self.step = self.steps + 1;
        self.note("final clean reopen".into());
        self.reopen(false);
        if let Some(engine) = self.engine.take()
            && let Err(e) = engine.close()
        {
            self.fail(format!("close after the final check: {e}"));
        }
        (self.totals, self.digest)
    }

    fn config(&self) -> Config {
        Config {
            clock: self.clock.clone(),
            free_space: self.free.clone(),
            faults: Some(self.faults.clone()),
            quota_backend_bytes: QUOTA_BYTES,
            fs_reserve_bytes: Some(RESERVE_BYTES),
            wal_file_bytes: WAL_FILE_BYTES,
            compaction_batch_records: COMPACTION_BATCH_RECORDS,
            cache_size_bytes: 4 << 20,
            unsafe_no_fsync: !self.fsync,
            ..Config::default()
        }
    }

    fn open(&mut self) {
        self.faults = Arc::new(Faults::new());
        match Engine::open(self.dir.path(), self.config()) {
            Ok(engine) => self.engine = Some(engine),
            Err(e) => self.fail(format!("reopen failed: {e}")),
        }
    }

    fn engine(&self) -> &Engine {
        match &self.engine {
            Some(engine) => engine,
            None => self.fail("no engine open"),
        }
    }

    /// Panics with the seed, the step, the recent steps and the replay command.
    fn fail(&self, what: impl Display) -> ! {
        let what = clip(what.to_string(), FAILURE_TEXT_MAX);
        let recent: Vec<&str> = self.recent.iter().map(String::as_str).collect();
        panic!(
            "kvd sim: seed {seed}, step {step}: {what}\n  recent steps:\n    {recent}\n  \
             replay: KVD_SIM_SEED={seed} KVD_SIM_STEPS={steps} cargo test -p kvd --test sim -- --nocapture",
            seed = self.seed,
            step = self.step,
            recent = recent.join("\n    "),
            steps = self.steps,
        )
    }

    fn note(&mut self, what: String) {
        if self.recent.len() == RECENT_STEPS {
            self.recent.pop_front();
        }
        let what = clip(what, NOTE_TEXT_MAX);
        let line = format!("{}: {what}", self.step);
        // FNV-1a over every step's description: equal digests mean equal runs.
        for byte in line.bytes().chain([b'\n']) {
            self.digest = (self.digest ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.recent.push_back(line);
    }

    /// Returns true, and counts it, if `got` is a read refused as the engine documents for a
    /// store poisoned by a failed durable redb commit (STORE-2: redb then refuses every
    /// transaction, and reads answer `Poisoned` until reopen; tests/sim.rs,
    /// `reads_after_a_failed_checkpoint_commit_answer_poisoned_until_reopen`). Any other read
    /// error, and any read error on a store that is not poisoned, fails the run.
    fn read_refused<T>(&mut self, got: &Result<T, Error>) -> bool {
        let refused =
            self.poisoned && matches!(got, Err(Error::Storage(kvd::StorageError::Poisoned(_))));
        if refused {
            self.totals.reads_refused_while_poisoned += 1;
        }
        refused
    }

    fn healthy(&self) -> bool {
        !self.poisoned && self.armed.is_none()
    }

    fn one_step(&mut self) {
        if let Some(at) = self.armed
            && self.step - at > ARMED_STEPS_MAX
        {
            if self.armed_batch {
                // `heal` does not disarm a batch failure; a new engine has a new switch.
                self.note("fault never fired: reopen".into());
                self.reopen(false);
                return;
            }
            self.faults.heal();
            self.armed = None;
            self.note("fault never fired: healed".into());
        }
        if self.poisoned && self.rng.chance(50) {
            let crash = self.rng.chance(50);
            self.reopen(crash);
            return;
        }
        let weights: Vec<u64> = KINDS
            .iter()
            .map(|(kind, w)| match kind {
                _ if !self.allowed(*kind) => 0,
                // While NOSPACE is latched most writes are refused: recover sooner.
                Kind::Space if self.model.nospace => 4 * w,
                _ => *w,
            })
            .collect();
        let kind = KINDS[self.rng.weighted(&weights)].0;
        match kind {
            Kind::Put => {
                let op = self.gen_put();
                self.write(op);
            }
            Kind::Delete => {
                let op = self.gen_delete();
                self.write(op);
            }
            Kind::Txn => match self.gen_txn(false) {
                Op::Txn(req) if req.is_read_only() => self.read_only_txn(req),
                op => self.write(op),
            },
            Kind::ReadOnlyTxn => match self.gen_txn(true) {
                Op::Txn(req) => self.read_only_txn(req),
                _ => unreachable!("gen_txn returns a txn"),
            },
            Kind::Compact => self.compact(),
            Kind::Grant => {
                let op = self.gen_grant();
                self.write(op);
            }
            Kind::Revoke => {
                let op = Op::Revoke(self.lease_id());
                self.write(op);
            }
            Kind::KeepAlive => self.keep_alive(),
            Kind::Clock => self.clock_step(),
            Kind::Defrag => self.defrag(),
            Kind::Space => self.space_step(),
            Kind::Fault => self.arm_fault(),
            Kind::Crash => self.crash(),
            Kind::Reopen => self.reopen(false),
            Kind::HeldSync => self.held_sync(),
            Kind::Hash => self.hash(),
        }
    }

    /// Returns true if a step of `kind` may run now. Steps that wait for background work
    /// (expiry) or that must not share the fault budget with it run only while healthy.
    fn allowed(&self, kind: Kind) -> bool {
        match kind {
            Kind::Clock | Kind::Fault | Kind::HeldSync | Kind::Hash => self.healthy(),
            Kind::KeepAlive => !self.poisoned,
            // A defrag drops the old database on a thread of its own, whose writes would
            // spend an armed fault budget at an unpredictable moment.
            Kind::Defrag => self.armed.is_none(),
            _ => true,
        }
    }

    // ---- request generation -------------------------------------------------------------

    fn key(&mut self) -> Bytes {
        Bytes::from(format!("k{}", self.rng.below(KEYS)))
    }

    fn value(&mut self) -> Bytes {
        if self.big_values && self.rng.chance(30) {
            let fill = b'a' + self.rng.below(26) as u8;
            if self.take_big_value() {
                return Bytes::from(vec![fill; BIG_VALUE_BYTES]);
            }
        }
        if self.rng.chance(5) {
            return Bytes::new();
        }
        Bytes::from(format!("v{}.{}", self.step, self.rng.below(1000)))
    }

    /// Returns false once a txn has used up its large values (see `txn_big_values_left`).
    fn take_big_value(&mut self) -> bool {
        match &mut self.txn_big_values_left {
            None => true,
            Some(0) => false,
            Some(left) => {
                *left -= 1;
                true
            }
        }
    }

    fn lease_id(&mut self) -> i64 {
        1 + self.rng.below(LEASE_IDS) as i64
    }

    fn put_request(&mut self, key: Bytes) -> PutRequest {
        let value = self.value();
        let lease = if self.rng.chance(25) {
            self.lease_id()
        } else {
            0
        };
        PutRequest {
            key,
            value,
            lease,
            prev_kv: self.rng.chance(30),
            ..PutRequest::default()
        }
    }

    fn gen_put(&mut self) -> Op {
        let key = self.key();
        Op::Put(self.put_request(key))
    }

    fn gen_delete(&mut self) -> Op {
        let prev_kv = self.rng.chance(30);
        let req = match self.rng.below(10) {
            0 => DeleteRangeRequest::prefix("k"),
            1..=3 => {
                let a = self.rng.below(KEYS);
                let b = self.rng.between(a + 1, KEYS);
                DeleteRangeRequest {
                    key: Bytes::from(format!("k{a}")),
                    range_end: Bytes::from(format!("k{b}")),
                    prev_kv: false,
                }
            }
            _ => DeleteRangeRequest::key(self.key()),
        };
        Op::Delete(DeleteRangeRequest { prev_kv, ..req })
    }

    fn gen_range(&mut self) -> RangeRequest {
        let mut req = if self.rng.chance(50) {
            RangeRequest::prefix("k")
        } else {
            RangeRequest::key(self.key())
        };
        if self.rng.chance(20) {
            req.limit = self.rng.between(1, 3) as i64;
        }
        req.keys_only = self.rng.chance(10);
        req.count_only = self.rng.chance(5);
        req
    }

    fn gen_compare(&mut self) -> Compare {
        let key = self.key();
        let revision = self.model.revision.max(1) as u64;
        let target = match self.rng.below(5) {
            0 => CompareTarget::Version(self.rng.below(4) as i64),
            1 => CompareTarget::Create(self.rng.below(revision + 1) as i64),
            2 => CompareTarget::Mod(self.rng.below(revision + 1) as i64),
            3 => {
                // Mostly the key's own value, so value compares hold as well as fail.
                let own = self.model.kv_at(&key, i64::MAX).map(|kv| kv.value.clone());
                match own {
                    Some(v)
                        if self.rng.chance(60)
                            && (v.len() < BIG_VALUE_BYTES || self.take_big_value()) =>
                    {
                        CompareTarget::Value(v)
                    }
                    _ => CompareTarget::Value(self.value()),
                }
            }
            _ => CompareTarget::Lease(self.rng.below(LEASE_IDS + 1) as i64),
        };
        let result = [
            CompareResult::Equal,
            CompareResult::NotEqual,
            CompareResult::Greater,
            CompareResult::Less,
        ][self.rng.below(4) as usize];
        Compare::new(key, result, target)
    }

    /// A branch of up to `ops` ops whose writes name distinct keys (etcd refuses a txn that
    /// writes a key twice).
    fn gen_branch(&mut self, ops: u64, read_only: bool) -> Vec<RequestOp> {
        let mut written: Vec<Bytes> = Vec::new();
        let mut branch = Vec::new();
        for _ in 0..self.rng.below(ops + 1) {
            let pick = if read_only { 0 } else { self.rng.below(4) };
            if pick == 0 {
                let range = self.gen_range();
                branch.push(RequestOp::Range(range));
                continue;
            }
            let key = self.key();
            if written.contains(&key) {
                continue;
            }
            written.push(key.clone());
            if pick == 1 {
                branch.push(RequestOp::DeleteRange(DeleteRangeRequest {
                    prev_kv: self.rng.chance(30),
                    ..DeleteRangeRequest::key(key)
                }));
            } else {
                let put = self.put_request(key);
                branch.push(RequestOp::Put(put));
            }
        }
        branch
    }

    fn gen_txn(&mut self, read_only: bool) -> Op {
        self.txn_big_values_left = Some(TXN_BIG_VALUES_MAX);
        let compares = self.rng.below(3);
        let compare = (0..compares).map(|_| self.gen_compare()).collect();
        let success = self.gen_branch(3, read_only);
        let failure = self.gen_branch(2, read_only);
        self.txn_big_values_left = None;
        Op::Txn(TxnRequest {
            compare,
            success,
            failure,
        })
    }

    fn gen_grant(&mut self) -> Op {
        let id = self.lease_id();
        let ttl = LEASE_TTLS[self.rng.below(LEASE_TTLS.len() as u64) as usize];
        Op::Grant(LeaseGrantRequest { ttl, id })
    }

    fn gen_compaction(&mut self, physical: bool) -> Op {
        let low = self.model.compact.max(1) - 1;
        let revision = match self.rng.below(10) {
            // Now and then one above the current revision, refused as a future revision.
            0 => self.model.revision + 1,
            _ => self
                .rng
                .between(low.max(1) as u64, self.model.revision as u64) as i64,
        };
        Op::Compact(CompactionRequest { revision, physical })
    }

    // ---- writes -----------------------------------------------------------------------

    fn env(&self) -> Env {
        Env {
            now: self.now,
            room: self.room.unwrap_or(AMPLE_ROOM_BYTES),
        }
    }

    /// Sets the free-space figure the engine reads to the reserve plus the room.
    fn set_free(&self, env: Env) {
        self.free.set(Some(RESERVE_BYTES + env.room));
    }

    fn write(&mut self, op: Op) {
        let env = self.env();
        self.set_free(env);
        let rx = self.submit(&op);
        let got = self.answer(rx);
        self.settle(op, env, got, false);
    }

    /// Submits `op` without waiting; the answer arrives on the returned channel.
    fn submit(&self, op: &Op) -> Receiver<Result<Reply, Error>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = self.engine();
        macro_rules! done {
            ($response:ty, $variant:path) => {
                Box::new(move |r: kvd::Result<$response>| {
                    let _ = tx.send(r.map($variant));
                })
            };
        }
        match op {
            Op::Put(req) => engine.submit_put(req.clone(), done!(PutResponse, Reply::Put)),
            Op::Delete(req) => {
                engine.submit_delete_range(req.clone(), done!(DeleteRangeResponse, Reply::Delete))
            }
            Op::Txn(req) => engine.submit_txn(req.clone(), done!(TxnResponse, Reply::Txn)),
            Op::Compact(req) => {
                engine.submit_compact(*req, done!(CompactionResponse, Reply::Compact))
            }
            Op::Grant(req) => {
                engine.submit_lease_grant(*req, done!(LeaseGrantResponse, Reply::Grant))
            }
            Op::Revoke(id) => {
                engine.submit_lease_revoke(*id, done!(LeaseRevokeResponse, Reply::Revoke))
            }
            Op::Disarm => {
                let req = AlarmRequest {
                    action: AlarmAction::Deactivate,
                    member_id: NOSPACE_MEMBER.member_id,
                    alarm: AlarmType::NoSpace,
                };
                let _ = tx.send(engine.alarm(req).map(Reply::Alarm));
            }
        }
        rx
    }

    fn answer(&self, rx: Receiver<Result<Reply, Error>>) -> Result<Reply, Error> {
        match rx.recv_timeout(WAIT_MAX) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => self.fail("no answer to a write within 60 s"),
            Err(RecvTimeoutError::Disconnected) => {
                self.fail("a write's completion was dropped unanswered while the engine ran")
            }
        }
    }

    /// Checks one write's answer against the reference and records it. `in_flight`: the
    /// write was submitted before the answers of earlier ones arrived (a crash step).
    fn settle(&mut self, op: Op, env: Env, got: Result<Reply, Error>, in_flight: bool) {
        self.totals.writes += 1;
        let cost = op_cost(&op);
        match got {
            Err(Error::Storage(e)) => {
                if !self.poisoned && self.armed.is_none() {
                    self.fail(format!(
                        "{op:?} failed with a storage error no fault caused: {e}"
                    ));
                }
                if !self.poisoned {
                    self.totals.faults_fired += 1;
                    self.deferred = is_physical_compaction(&op);
                } else if !is_physical_compaction(&op) {
                    self.deferred = false;
                }
                self.note(format!("{} -> unknown outcome ({e})", short(&op)));
                self.poisoned = true;
                self.armed = None;
                self.totals.unknown += 1;
                self.unknown.push((op, env));
            }
            // A physical compaction is answered when its last deletion step commits, after
            // the batch that scheduled it and maybe after later batches: a later write
            // answered from a batch that committed means the compaction's own batch did too
            // (batches are durable in order), so its failed step left it applied.
            // A NoSpace then may come from admission (no batch: proves nothing) or from a
            // batch that committed with the alarm it raised: which one is unknown.
            Err(Error::NoSpace) if self.poisoned && in_flight && self.deferred => {
                self.note(format!("{} -> NoSpace after a deferred answer", short(&op)));
                self.totals.refused += 1;
                self.unknown.push((op, env));
            }
            got if self.poisoned && in_flight && self.deferred => {
                for (earlier, at) in std::mem::take(&mut self.unknown) {
                    let _ = self.model.apply(&earlier, at);
                    self.totals.unknown_applied += 1;
                    self.note(format!(
                        "{} adopted: a later write was answered",
                        short(&earlier)
                    ));
                }
                self.check_reply(op, env, got);
            }
            // Admission's alarm gate refuses without touching storage: the alarm may have
            // been raised in memory by a batch whose outcome is unknown.
            Err(Error::NoSpace) if self.poisoned && cost > 0 => {
                self.note(format!(
                    "{} -> NoSpace at admission while poisoned",
                    short(&op)
                ));
                self.totals.refused += 1;
            }
            got if self.poisoned => self.fail(format!(
                "a write after a storage error was answered {got:?}; writes must fail until \
                 reopen (STORE-2): {op:?}"
            )),
            got => self.check_reply(op, env, got),
        }
    }

    /// Compares an answer with the reference's and applies the write to the reference.
    fn check_reply(&mut self, op: Op, env: Env, got: Result<Reply, Error>) {
        let cost = op_cost(&op);
        let want = self.model.apply(&op, env);
        self.note(format!("{} -> {}", short(&op), brief(&got)));
        if got != want {
            self.fail(format!(
                "reply differs from the reference\n  op: {op:?}\n  engine: {got:?}\n  \
                 reference: {want:?}"
            ));
        }
        match &got {
            Ok(reply) => {
                self.totals.acknowledged += 1;
                self.logged_bytes += written_bytes(&op, reply);
                if self.logged_bytes > WAL_FILE_BYTES {
                    // The log cannot hold these records: a batch was a checkpoint.
                    self.totals.log_fills += 1;
                    self.logged_bytes = 0;
                }
                if let Some(room) = self.room.as_mut() {
                    *room = room.saturating_sub(cost);
                }
                match reply {
                    Reply::Compact(_) => self.totals.compactions += 1,
                    Reply::Alarm(a) if !a.alarms.is_empty() => self.totals.disarms += 1,
                    _ => {}
                }
            }
            Err(e) => {
                self.totals.refused += 1;
                if e.is_no_space() {
                    self.totals.nospace_refusals += 1;
                }
            }
        }
    }

    fn compact(&mut self) {
        let physical = self.armed.is_some() || self.rng.chance(70);
        let op = self.gen_compaction(physical);
        self.write(op);
        if !physical && self.healthy() {
            self.compaction_barrier();
        }
    }

    /// Waits for background compaction to end: a physical compaction at the compaction
    /// revision is refused as compacted, and answered only after the compactions already
    /// scheduled have finished.
    fn compaction_barrier(&mut self) {
        if self.model.compact < 1 {
            return;
        }
        let op = Op::Compact(CompactionRequest {
            revision: self.model.compact,
            physical: true,
        });
        let rx = self.submit(&op);
        match self.answer(rx) {
            Err(Error::Compacted) => {}
            other => self.fail(format!(
                "a compaction at the compaction revision answered {other:?}, not compacted"
            )),
        }
    }

    // ---- other steps --------------------------------------------------------------------

    fn read_only_txn(&mut self, req: TxnRequest) {
        let got = self.engine().txn(req.clone());
        let want = self.model.read_only_txn(&req);
        self.note(format!("read-only {}", short_txn(&req)));
        // Served at the published revision, also while poisoned.
        if self.read_refused(&got) {
            return;
        }
        if got.as_ref() != Ok(&want) {
            self.fail(format!(
                "read-only txn differs\n  txn: {req:?}\n  engine: {got:?}\n  reference: {want:?}"
            ));
        }
    }

    fn keep_alive(&mut self) {
        let id = self.lease_id();
        let got = self.engine().lease_keep_alive(id);
        let want = self.model.keep_alive(id, self.now);
        self.note(format!("keep-alive {id} -> {got:?}"));
        match got {
            Ok(r) if r.ttl == want => {}
            other => self.fail(format!(
                "keep-alive of {id}: {other:?}, expected TTL {want}"
            )),
        }
    }

    /// Moves the clock; leases whose deadline passed must be revoked by the engine's expiry,
    /// soonest first, as the reference revokes them.
    fn clock_step(&mut self) {
        let secs = self.rng.between(1, 20);
        self.now += secs;
        self.clock.advance(Duration::from_secs(secs));
        let expired = self.model.expire(self.now);
        self.note(format!(
            "clock +{secs}s -> {}s, expired {expired:?}",
            self.now
        ));
        if expired.is_empty() {
            return;
        }
        self.totals.lease_expiries += expired.len() as u64;
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let engine = self.engine();
            let gone = expired.iter().all(|id| {
                engine
                    .lease_time_to_live(*id, false)
                    .is_ok_and(|t| t.ttl == -1)
            });
            let revision = engine.status().map(|s| s.header.revision);
            if gone && revision == Ok(self.model.revision) {
                break;
            }
            if Instant::now() > deadline {
                self.fail(format!(
                    "leases {expired:?} not expired within 60 s (revision {revision:?}, \
                     expected {})",
                    self.model.revision
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // A write after the expiry is answered after its batch: nothing of it is still in
        // flight when the next step arms a fault.
        let barrier = Op::Delete(DeleteRangeRequest::key("none"));
        self.write(barrier);
    }

    fn defrag(&mut self) {
        let got = self.engine().defrag();
        self.note(format!("defrag -> {:?}", got.as_ref().map(|_| ())));
        match got {
            Ok(_) => {
                self.totals.defrags += 1;
                self.defragged = true;
            }
            // A poisoned store may refuse or finish a defrag; either way the no-loss check at
            // the next reopen decides.
            Err(_) if self.poisoned => {}
            Err(e) => self.fail(format!("defrag failed on a healthy store: {e}")),
        }
    }

    /// Changes the free space (a byte budget that writes use up, none at all, or ample), or
    /// disarms NOSPACE as an operator does once space is back.
    fn space_step(&mut self) {
        match self.rng.weighted(&[3, 1, 3, 4]) {
            0 => {
                let room = self.rng.between(0, 2_000);
                self.room = Some(room);
                self.note(format!("free space: {room} B above the reserve"));
            }
            1 => {
                self.room = Some(0);
                self.note("free space: below the reserve".into());
            }
            2 => {
                self.room = None;
                self.note("free space: ample".into());
            }
            _ => {
                // etcd's recovery: space comes back, then the operator disarms.
                if self.rng.chance(70) {
                    self.room = None;
                }
                self.write(Op::Disarm);
            }
        }
        self.set_free(self.env());
    }

    fn arm_fault(&mut self) {
        self.armed = Some(self.step);
        self.totals.faults_armed += 1;
        self.armed_batch = self.rng.chance(25);
        if self.armed_batch {
            self.faults.fail_next_batch();
            self.totals.batch_faults += 1;
            self.note("fault: the next batch fails".into());
        } else {
            let n = self.rng.below(10);
            self.faults.fail_after(n);
            self.note(format!(
                "fault: storage fails after {n} more writes or syncs"
            ));
        }
    }

    /// Writes in flight, storage failing part way through them, then the engine dropped
    /// without close and the directory reopened.
    fn crash(&mut self) {
        let in_flight = self.rng.below(IN_FLIGHT_MAX + 1);
        let tight = matches!(self.room, Some(r) if r > 0);
        let mut ops = Vec::new();
        for _ in 0..in_flight {
            let op = match self.rng.below(7) {
                0 => self.gen_delete(),
                1 => self.gen_txn(false),
                2 => {
                    let physical = self.rng.chance(50);
                    self.gen_compaction(physical)
                }
                3 => self.gen_grant(),
                4 => Op::Revoke(self.lease_id()),
                _ => self.gen_put(),
            };
            // With a byte budget, how a batch spends it depends on how the requests were
            // batched: only cost-free writes are in flight then. A read-only txn is no write.
            let read_only = matches!(&op, Op::Txn(t) if t.is_read_only());
            if read_only || (tight && op_cost(&op) > 0) {
                continue;
            }
            ops.push(op);
        }
        let budget = self.rng.below(2 * ops.len() as u64 + 3);
        self.note(format!(
            "crash: {} writes in flight, storage fails after {budget}",
            ops.len()
        ));
        if !self.poisoned {
            self.faults.fail_after(budget);
            self.armed = Some(self.step);
            self.armed_batch = false;
            self.totals.faults_armed += 1;
        }
        if !ops.is_empty() {
            self.totals.crashes_with_writes_in_flight += 1;
        }
        let env = self.env();
        self.set_free(env);
        let pending: Vec<_> = ops.iter().map(|op| self.submit(op)).collect();
        for (op, rx) in ops.into_iter().zip(pending) {
            let got = self.answer(rx);
            self.settle(op, env, got, true);
        }
        self.reopen(true);
    }

    /// Holds the log sync of one write: until released, the write is neither answered nor
    /// visible (APPLY-1, ENG-1); then it is answered as the reference says.
    fn held_sync(&mut self) {
        // A write refused at admission never reaches a batch, and so no sync.
        let op = if self.model.nospace || matches!(self.room, Some(r) if r < 1_000) {
            self.gen_delete()
        } else {
            self.gen_put()
        };
        let env = self.env();
        self.set_free(env);
        self.faults.hold_log_syncs();
        let rx = self.submit(&op);
        let deadline = Instant::now() + WAIT_MAX;
        while self.faults.log_syncs_waiting() == 0 {
            if Instant::now() > deadline {
                self.faults.release_log_syncs();
                self.fail(format!("{op:?}: its log sync never started"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let early = rx.try_recv().ok();
        let status = self.engine().status();
        let seen = self.engine().range(&RangeRequest::prefix("k"));
        self.faults.release_log_syncs();
        if let Some(answer) = early {
            self.fail(format!(
                "APPLY-1: {op:?} answered {answer:?} before its log sync"
            ));
        }
        let revision = status.map(|s| s.header.revision);
        let visible = seen.map(|r| r.kvs);
        if revision != Ok(self.model.revision)
            || visible != Ok(self.model.all_at(self.model.revision))
        {
            self.fail(format!(
                "ENG-1: {op:?} visible before its log sync (revision {revision:?}, expected {})",
                self.model.revision
            ));
        }
        self.totals.held_sync_checks += 1;
        let got = self.answer(rx);
        self.settle(op, env, got, false);
    }

    fn hash(&mut self) {
        let low = self.model.compact.max(1) as u64;
        let revision = self.rng.between(low, self.model.revision as u64) as i64;
        let got = match self.engine().hash_kv(revision) {
            Ok(got) => got,
            Err(e) => self.fail(format!("HashKV at {revision}: {e}")),
        };
        self.note(format!("hash at {revision} -> {:08x}", got.hash));
        if (got.compact_revision, got.hash_revision) != (self.model.compact, revision) {
            self.fail(format!(
                "HashKV at {revision} reports compaction {} and revision {}",
                got.compact_revision, got.hash_revision
            ));
        }
        let key = (got.compact_revision, got.hash_revision);
        let before = *self.hashes.entry(key).or_insert(got.hash);
        if before != got.hash {
            self.fail(format!(
                "HashKV at {revision} (compaction {}) changed from {before:08x} to {:08x}",
                got.compact_revision, got.hash
            ));
        }
        self.totals.hash_checks += 1;
    }

    // ---- reopen and the no-loss rule --------------------------------------------------------

    /// Closes (or crashes) and reopens the engine, then resolves the unknown writes and
    /// checks every readable revision.
    fn reopen(&mut self, crash: bool) {
        let Some(engine) = self.engine.take() else {
            self.fail("no engine to reopen")
        };
        if crash {
            self.note(format!(
                "crash: drop without close ({} unknown writes)",
                self.unknown.len()
            ));
            // From here no write or sync reaches the files: what the engine still held in
            // memory is lost, as in a process kill.
            self.faults.fail_after(0);
            drop(engine);
            self.totals.crashes += 1;
            if self.defragged {
                self.totals.crashes_after_defrag += 1;
            }
        } else {
            self.note(format!(
                "clean close and reopen ({} unknown writes)",
                self.unknown.len()
            ));
            self.faults.heal();
            let closed = engine.close();
            if let Err(e) = closed
                && !self.poisoned
            {
                self.fail(format!("close of a healthy engine failed: {e}"));
            }
            self.totals.clean_reopens += 1;
        }
        self.open();
        self.logged_bytes = 0;
        self.poisoned = false;
        self.deferred = false;
        self.armed = None;
        self.armed_batch = false;
        self.defragged = false;
        self.resolve_unknown();
        self.compaction_barrier();
        self.totals.history_checks += 1;
    }

    /// The no-loss rule: the reopened store must be the reference after the acknowledged
    /// writes plus the first `j` unknown ones, for some `j`; the reference becomes that state.
    fn resolve_unknown(&mut self) {
        let unknown = std::mem::take(&mut self.unknown);
        let mut candidates = vec![self.model.clone()];
        for (op, env) in &unknown {
            let mut next = candidates[candidates.len() - 1].clone();
            // A refusal changes nothing (or raises the alarm): still a candidate state.
            let _ = next.apply(op, *env);
            candidates.push(next);
        }
        for candidate in &mut candidates {
            candidate.reopened(self.now);
        }
        let seen = self.view();
        let found = candidates
            .iter()
            .position(|candidate| self.expected_view(candidate) == seen);
        let Some(applied) = found else {
            let nearest = candidates
                .iter()
                .find(|c| c.revision == seen.revision)
                .unwrap_or(&candidates[0]);
            let want = self.expected_view(nearest);
            let unknown: Vec<String> = unknown.iter().map(|(op, _)| short(op)).collect();
            self.fail(format!(
                "after reopen the store is no prefix of the writes (lost or half-applied \
                 writes)\n  unknown writes: {unknown:?}\n  store: {}\n  nearest reference: {}",
                describe_view(&seen, &want),
                describe_view(&want, &seen),
            ));
        };
        self.totals.unknown_applied += applied as u64;
        self.totals.unknown_lost += (unknown.len() - applied) as u64;
        self.note(format!(
            "reopened: {applied} of {} unknown writes applied, revision {}",
            unknown.len(),
            seen.revision
        ));
        self.model = candidates.swap_remove(applied);
    }

    /// Reads what the no-loss rule compares from the engine.
    fn view(&self) -> View {
        let engine = self.engine();
        let status = match engine.status() {
            Ok(status) => status,
            Err(e) => self.fail(format!("status after reopen: {e}")),
        };
        let revision = status.header.revision;
        let compact = status.compact_revision;
        let read = |at: i64, keys_only: bool| -> Vec<KeyValue> {
            let req = RangeRequest {
                revision: at,
                keys_only,
                ..RangeRequest::prefix("k")
            };
            match engine.range(&req) {
                Ok(r) => r.kvs,
                Err(e) => self.fail(format!(
                    "Range at {at} after reopen (revision {revision}, compaction {compact}): {e}"
                )),
            }
        };
        let current = read(revision, false);
        let history = (compact.max(1)..=revision)
            .map(|at| (at, read(at, true)))
            .collect();
        let mut leases = Vec::new();
        let listed = match engine.lease_leases() {
            Ok(l) => l.leases,
            Err(e) => self.fail(format!("lease list after reopen: {e}")),
        };
        for id in listed {
            match engine.lease_time_to_live(id, true) {
                Ok(t) => leases.push((id, t.granted_ttl, t.ttl, t.keys)),
                Err(e) => self.fail(format!("lease {id} after reopen: {e}")),
            }
        }
        leases.sort();
        View {
            revision,
            compact,
            current,
            history,
            leases,
            nospace: status.alarms.contains(&NOSPACE_MEMBER),
        }
    }

    fn expected_view(&self, model: &Model) -> View {
        let strip = |kvs: Vec<KeyValue>| -> Vec<KeyValue> {
            kvs.into_iter()
                .map(|kv| KeyValue {
                    value: Bytes::new(),
                    ..kv
                })
                .collect()
        };
        View {
            revision: model.revision,
            compact: model.compact,
            current: model.all_at(model.revision),
            history: (model.compact.max(1)..=model.revision)
                .map(|at| (at, strip(model.all_at(at))))
                .collect(),
            leases: model
                .leases
                .iter()
                .map(|(id, l)| {
                    let remaining = l.deadline.saturating_sub(self.now) as i64;
                    (*id, l.ttl, remaining, model.lease_keys(*id))
                })
                .collect(),
            nospace: model.nospace,
        }
    }

    // ---- the per-step check -----------------------------------------------------------

    /// Compares Status, the current key space, one past revision, the alarms and the leases
    /// with the reference.
    fn check_state(&mut self) {
        let engine = self.engine();
        let status = match engine.status() {
            Ok(status) => status,
            Err(e) => self.fail(format!("status: {e}")),
        };
        if status.header.revision != self.model.revision {
            self.fail(format!(
                "Status revision {} but the reference is at {} (ENG-1: only acknowledged \
                 writes are visible)",
                status.header.revision, self.model.revision
            ));
        }
        let lost_compactions = self.unknown_compactions();
        if status.compact_revision != self.model.compact
            && !lost_compactions.contains(&status.compact_revision)
        {
            self.fail(format!(
                "Status compaction revision {} but the reference has {}",
                status.compact_revision, self.model.compact
            ));
        }
        let current = engine.range(&RangeRequest::prefix("k"));
        let want = self.model.range(&RangeRequest::prefix("k"));
        if self.read_refused(&current) {
            return;
        }
        if current != want {
            self.fail(format!(
                "the key space differs at the current revision\n  engine: {current:?}\n  \
                 reference: {want:?}"
            ));
        }
        self.past_read(&lost_compactions);
        if !self.poisoned {
            self.check_alarms_and_leases(&status.alarms);
        }
    }

    /// Compactions among the unknown writes that would have been applied: reads below them
    /// may already be refused.
    fn unknown_compactions(&self) -> Vec<i64> {
        self.unknown
            .iter()
            .filter_map(|(op, _)| match op {
                Op::Compact(c) => Some(c.revision),
                _ => None,
            })
            .collect()
    }

    fn past_read(&mut self, lost_compactions: &[i64]) {
        let rng = &mut self.check_rng;
        let revision = rng.between(1, self.model.revision as u64) as i64;
        let mut req = if rng.chance(70) {
            RangeRequest::prefix("k")
        } else {
            RangeRequest::key(format!("k{}", rng.below(KEYS)))
        };
        req.revision = revision;
        if rng.chance(20) {
            req.limit = rng.between(1, 3) as i64;
        }
        req.keys_only = rng.chance(10);
        self.totals.past_reads += 1;
        let got = self.engine().range(&req);
        let want = self.model.range(&req);
        if self.read_refused(&got) {
            return;
        }
        let tolerated = got == Err(Error::Compacted)
            && want.is_ok()
            && lost_compactions.iter().any(|c| revision < *c);
        if got != want && !tolerated {
            self.fail(format!(
                "Range at revision {revision} differs (compaction revision {})\n  request: \
                 {req:?}\n  engine: {got:?}\n  reference: {want:?}",
                self.model.compact
            ));
        }
    }

    fn check_alarms_and_leases(&self, alarms: &[kvd::AlarmMember]) {
        let want_alarms = if self.model.nospace {
            vec![NOSPACE_MEMBER]
        } else {
            Vec::new()
        };
        if alarms != want_alarms {
            self.fail(format!(
                "alarms {alarms:?}, the reference has {want_alarms:?}"
            ));
        }
        let engine = self.engine();
        let mut listed = match engine.lease_leases() {
            Ok(l) => l.leases,
            Err(e) => self.fail(format!("lease list: {e}")),
        };
        listed.sort_unstable();
        let want: Vec<i64> = self.model.leases.keys().copied().collect();
        if listed != want {
            self.fail(format!("leases {listed:?}, the reference has {want:?}"));
        }
        for (id, lease) in &self.model.leases {
            let got = engine.lease_time_to_live(*id, true);
            let remaining = lease.deadline.saturating_sub(self.now) as i64;
            let keys = self.model.lease_keys(*id);
            match got {
                Ok(t) if (t.ttl, t.granted_ttl, &t.keys) == (remaining, lease.ttl, &keys) => {}
                other => self.fail(format!(
                    "lease {id}: {other:?}, the reference has TTL {remaining} of {}, keys \
                     {keys:?}",
                    lease.ttl
                )),
            }
        }
    }
}

/// Returns the key and value bytes of the Puts an acknowledged write made: what its log
/// record holds, less framing.
fn written_bytes(op: &Op, reply: &Reply) -> u64 {
    let puts = |ops: &[RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => (p.key.len() + p.value.len()) as u64,
                _ => 0,
            })
            .sum()
    };
    match (op, reply) {
        (Op::Put(p), _) => (p.key.len() + p.value.len()) as u64,
        (Op::Txn(t), Reply::Txn(r)) if r.succeeded => puts(&t.success),
        (Op::Txn(t), Reply::Txn(_)) => puts(&t.failure),
        _ => 0,
    }
}

/// Returns `text` cut to at most `max` bytes, marked when cut.
fn clip(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(" [...]");
    }
    text
}

/// A value as the step log shows it: short ones as text, long ones by length.
fn short_value(value: &[u8]) -> String {
    if value.len() <= 16 {
        format!("{:?}", String::from_utf8_lossy(value))
    } else {
        format!("<{} B>", value.len())
    }
}

fn short_key(key: &[u8], range_end: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    match range_end {
        [] => key.into_owned(),
        end => format!("[{key}, {})", String::from_utf8_lossy(end)),
    }
}

fn short_put(p: &PutRequest) -> String {
    format!(
        "put {}={}{}{}",
        short_key(&p.key, b""),
        short_value(&p.value),
        if p.lease != 0 {
            format!(" lease {}", p.lease)
        } else {
            String::new()
        },
        if p.prev_kv { " prev" } else { "" }
    )
}

fn short_txn(t: &TxnRequest) -> String {
    let ops = |ops: &[RequestOp]| -> String {
        let parts: Vec<String> = ops
            .iter()
            .map(|op| match op {
                RequestOp::Put(p) => short_put(p),
                RequestOp::DeleteRange(d) => format!("del {}", short_key(&d.key, &d.range_end)),
                RequestOp::Range(r) => format!("range {}", short_key(&r.key, &r.range_end)),
                RequestOp::Txn(_) => "txn".into(),
            })
            .collect();
        parts.join(", ")
    };
    let compares: Vec<String> = t
        .compare
        .iter()
        .map(|c| {
            let target = match &c.target {
                CompareTarget::Value(v) => format!("value {}", short_value(v)),
                other => format!("{other:?}"),
            };
            format!(
                "{} {:?} {target}",
                short_key(&c.key, &c.range_end),
                c.result
            )
        })
        .collect();
    format!(
        "txn if [{}] then [{}] else [{}]",
        compares.join(", "),
        ops(&t.success),
        ops(&t.failure)
    )
}

/// An op as the step log shows it.
fn short(op: &Op) -> String {
    match op {
        Op::Put(p) => short_put(p),
        Op::Delete(d) => format!(
            "delete {}{}",
            short_key(&d.key, &d.range_end),
            if d.prev_kv { " prev" } else { "" }
        ),
        Op::Txn(t) => short_txn(t),
        Op::Compact(c) => format!(
            "compact at {}{}",
            c.revision,
            if c.physical { " physical" } else { "" }
        ),
        Op::Grant(g) => format!("grant lease {} ttl {}", g.id, g.ttl),
        Op::Revoke(id) => format!("revoke lease {id}"),
        Op::Disarm => "disarm NOSPACE".into(),
    }
}

fn is_physical_compaction(op: &Op) -> bool {
    matches!(op, Op::Compact(c) if c.physical)
}

/// A short form of an answer for the step log.
fn brief(got: &Result<Reply, Error>) -> String {
    match got {
        Ok(Reply::Put(r)) => format!("put at {}", r.header.revision),
        Ok(Reply::Delete(r)) => format!("deleted {} at {}", r.deleted, r.header.revision),
        Ok(Reply::Txn(r)) => format!("txn {} at {}", r.succeeded, r.header.revision),
        Ok(Reply::Compact(r)) => format!("compacted at {}", r.header.revision),
        Ok(Reply::Grant(r)) => format!("lease {} ttl {}", r.id, r.ttl),
        Ok(Reply::Revoke(r)) => format!("revoked at {}", r.header.revision),
        Ok(Reply::Alarm(r)) => format!("alarms {:?}", r.alarms),
        Err(e) => format!("refused: {e}"),
    }
}

/// Describes `view` where it differs from `other`, for a failure message.
fn describe_view(view: &View, other: &View) -> String {
    let mut out = format!(
        "revision {} compaction {} nospace {}",
        view.revision, view.compact, view.nospace
    );
    if view.current != other.current {
        let keys: Vec<String> = view
            .current
            .iter()
            .map(|kv| {
                format!(
                    "{}@{}/{}v{}l{}",
                    String::from_utf8_lossy(&kv.key),
                    kv.mod_revision,
                    kv.create_revision,
                    kv.version,
                    kv.lease
                )
            })
            .collect();
        out.push_str(&format!(", current {keys:?}"));
    }
    if let Some((at, kvs)) = view
        .history
        .iter()
        .zip(&other.history)
        .find(|(a, b)| a != b)
        .map(|(a, _)| a)
    {
        let keys: Vec<String> = kvs
            .iter()
            .map(|kv| format!("{}@{}", String::from_utf8_lossy(&kv.key), kv.mod_revision))
            .collect();
        out.push_str(&format!(", first differing revision {at}: {keys:?}"));
    }
    if view.leases != other.leases {
        out.push_str(&format!(", leases {:?}", view.leases));
    }
    out
}
