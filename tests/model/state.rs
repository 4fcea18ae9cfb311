//! The reference model: etcd 3.6's KV, lease and watch semantics over a plain per-key
//! history, with the space quota and alarms (`space.rs`), the request-size limit computed
//! from the protobuf wire rules (`wire.rs`), and the quota registry, records and consumption
//! (`accounts.rs`).
//!
//! Every change ever made is kept, as `(main revision, sub revision, Some(kv) | None for a
//! tombstone)` appended to the key's history, so a read at revision R is "the last entry of
//! the key with revision ≤ R", and the events a watch must see are the entries in its range
//! and revision window in (main, sub) order. Compaction only moves `compact`: reads below it
//! are refused, reads at or above it see the full history, which is exactly what a compacted
//! store must return.
//!
//! Leases live in a table of (granted TTL, deadline) on the model's own clock, which the
//! harness keeps equal to the engine's `ManualClock`. Attachments are not stored: the keys of
//! lease L are the live keys whose `lease` field is L (a Put with lease L needs L to exist,
//! and a revoke deletes every key naming L, so the two views cannot differ). Advancing the
//! clock revokes every lease whose deadline is at or before the new time, soonest deadline
//! first (ties by id), each through the same path as a client's revoke: one revision for its
//! keys, deleted in key order, none if it has no keys. A reopen gives every lease its full
//! TTL again from the current time.
//!
//! The order of the checks of a write, as etcd and kvd apply them (the first failure is the
//! answer, and a refused request changes nothing):
//! 1. admission's alarm gate, for Put, write Txn and LeaseGrant only: CORRUPT refuses, and
//!    NOSPACE refuses a write with a cost;
//! 2. validation (empty keys, flags, the Txn operation budget, duplicate keys), then a slot
//!    in the write prepare queue (`queue.rs`: refused with `etcdserver: too many requests`
//!    past the bound or the role's share; every write that gets this far counts as admitted
//!    for its role, whatever its answer), then the request size (a read-only Txn has no
//!    gate, slot or size check: it is a read; Defrag takes no slot);
//! 3. at apply, for every write but Alarm: CORRUPT refuses; a write with a cost is refused
//!    under NOSPACE, then by the filesystem reserve, then by the space quota, and a refusal
//!    there raises NOSPACE (member 0);
//! 4. etcd's apply-time checks (leases, keys the ignore flags need, Txn Range revisions);
//! 5. the per-role limits (`accounts.rs`).
//!
//! Consumption is never stored by the model: [`Model::usage`] recounts it from the history
//! (which Put revisions the index retains after compaction, which keys are alive) and the
//! records, so the engine's counters are judged against a function of the data alone.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::time::Duration;

use bytes::Bytes;
use kvd::{
    AgentState, AlarmAction, AlarmMember, AlarmRequest, AlarmResponse, AlarmType,
    CompactionRequest, CompactionResponse, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Error, HashKvResponse, KeyValue, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse, LeaseRevokeResponse,
    LeaseTimeToLiveResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, SortOrder, SortTarget, TxnRequest, TxnResponse,
};

use super::accounts::{Accounts, KeyFacts, PlannedPut, Refusal, Registry, UsageMap};
use super::ops::{Op, QuotaOp, Reply};
use super::queue::{self, Queue, QueueStats};
use super::space::{self, Alarms, SpaceStats, Verdict};
use super::wire::{self, Raft};

/// etcd's MaxLeaseTTL in seconds: a grant above it is refused.
pub const LEASE_TTL_MAX_SECONDS: i64 = 9_000_000_000;
/// etcd's minimum lease TTL with default timing, kvd's `Config` default: grants below
/// it are raised to it.
pub const LEASE_TTL_MIN_SECONDS: i64 = 2;

/// The limits the engine is opened with (`kvd::Config` fields of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum operations per txn level (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Maximum encoded size of a write request (etcd's `--max-request-bytes`).
    pub max_request_bytes: usize,
    /// etcd's `--quota-backend-bytes`: 0 for 2 GiB, negative for none.
    pub quota_backend_bytes: i64,
    /// kvd's `--prepare-queue-length`: writes admitted and not yet answered, at most.
    pub prepare_queue_length: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_txn_ops: 128,
            max_request_bytes: 1_572_864,
            quota_backend_bytes: 0,
            prepare_queue_length: queue::CAPACITY_DEFAULT,
        }
    }
}

/// The member id the engine raises its own alarms with (`Config::member_id` default).
pub const ENGINE_MEMBER_ID: u64 = 0;

/// Room a burst leaves above an upper bound of the pages in use, beyond twice the cost of
/// its Puts and the commit allowance: a burst of at most a few dozen Puts of a few hundred
/// bytes each cannot make redb allocate this much.
pub const BURST_PAGES_MARGIN_BYTES: u64 = 1 << 20;

/// The free space the filesystem guard reads until a sequence sets another figure.
pub const FREE_SPACE_PLENTY_BYTES: u64 = 1 << 50;

/// One change to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The main revision of the change.
    pub rev: i64,
    /// Its position among the changes of that revision (etcd's sub revision).
    pub sub: usize,
    /// The new KeyValue, or `None` for a delete (tombstone).
    pub kv: Option<KeyValue>,
}

/// One key's history: every change in (revision, sub) order.
type History = Vec<Entry>;

/// One change of the store, for watch expectations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key.
    pub key: Bytes,
    /// The change.
    pub entry: Entry,
}

/// One lease of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lease {
    /// The granted TTL in seconds, after raising it to the minimum.
    ttl: i64,
    /// When it expires, on the model clock.
    deadline: Duration,
}

/// The engine's answer to a space check the model cannot decide ([`Verdict::Either`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceChoice {
    /// The write fits (what a model without an engine assumes).
    Accept,
    /// The engine refused the write for space.
    Refuse,
}

/// The model store.
#[derive(Debug, Clone)]
pub struct Model {
    limits: Limits,
    current: i64,
    compact: i64,
    history: BTreeMap<Bytes, History>,
    /// The model clock: the time the engine's `ManualClock` shows.
    now: Duration,
    leases: BTreeMap<i64, Lease>,
    alarms: Alarms,
    /// What the engine's filesystem guard reads (None: unreadable).
    free_space: Option<u64>,
    /// The harness's measurement of the pages in use, until the next commit.
    measured: Option<u64>,
    /// The file length the harness read after the last operation.
    file_len: Option<u64>,
    /// The engine's answer for the next undecidable space check.
    space_choice: SpaceChoice,
    /// NOSPACE was raised and then cleared, and no write with a cost got through since.
    disarmed_after_nospace: bool,
    space_stats: SpaceStats,
    accounts: Accounts,
    /// See [`Model::other_limit_refusals`].
    other_limit_refusals: Vec<String>,
    /// The write prepare queue (`queue.rs`).
    queue: Queue,
    /// Writes applied with an operation id: id → (the write, when, its reply).
    operations: BTreeMap<String, (Op, Duration, Reply)>,
}

/// How long the engine keeps an operation's outcome by default (one hour).
const OPERATION_RETENTION: Duration = Duration::from_secs(3_600);

/// The outcome of the compares of a txn and of the nested txns on its chosen branch, all
/// evaluated against the state at the start of the txn.
#[derive(Debug)]
struct Path {
    succeeded: bool,
    /// One entry per nested txn of the chosen branch, in order.
    nested: Vec<Path>,
}

impl Model {
    /// Returns a fresh store: revision 1, never compacted, no alarm, plenty of free space.
    pub fn new(limits: Limits) -> Model {
        Model {
            limits,
            current: 1,
            compact: -1,
            history: BTreeMap::new(),
            now: Duration::ZERO,
            leases: BTreeMap::new(),
            alarms: Alarms::default(),
            free_space: Some(FREE_SPACE_PLENTY_BYTES),
            measured: None,
            file_len: None,
            space_choice: SpaceChoice::Accept,
            disarmed_after_nospace: false,
            space_stats: SpaceStats::default(),
            accounts: Accounts::default(),
            other_limit_refusals: Vec::new(),
            queue: Queue::new(limits.prepare_queue_length),
            operations: BTreeMap::new(),
        }
    }

    /// Returns the limits the model admits requests with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Returns the current store revision.
    pub fn current_revision(&self) -> i64 {
        self.current
    }

    /// Returns the compaction revision (-1 if never compacted).
    pub fn compact_revision(&self) -> i64 {
        self.compact
    }

    /// Returns every key that exists at the current revision, in key order.
    pub fn live_keys(&self) -> Vec<Bytes> {
        self.live(b"\0", b"\0", self.current)
            .into_iter()
            .map(|kv| kv.key)
            .collect()
    }

    /// Returns the model clock.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Returns the ids of every lease, in id order.
    pub fn lease_ids(&self) -> Vec<i64> {
        self.leases.keys().copied().collect()
    }

    /// Returns true if lease `id` exists.
    pub fn lease_exists(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    /// Returns `key` as it was at revision `rev` (None if absent there), compaction ignored.
    pub fn kv_at(&self, key: &[u8], rev: i64) -> Option<KeyValue> {
        self.get(key, rev).cloned()
    }

    /// Returns every change to a key of the range `key`/`end` (Range conventions) with
    /// a main revision in `from..=to`, in (revision, sub) order.
    pub fn changes(&self, key: &[u8], end: &[u8], from: i64, to: i64) -> Vec<Change> {
        let Some(bounds) = bounds(key, end) else {
            return Vec::new();
        };
        let mut out: Vec<Change> = self
            .history
            .range::<[u8], _>(bounds)
            .flat_map(|(k, history)| {
                history
                    .iter()
                    .filter(|e| from <= e.rev && e.rev <= to)
                    .map(|e| Change {
                        key: k.clone(),
                        entry: e.clone(),
                    })
            })
            .collect();
        out.sort_by_key(|c| (c.entry.rev, c.entry.sub));
        out
    }

    // ---- Requests --------------------------------------------------------------------------

    /// A standalone Range.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        check_range(req)?;
        // Future first, then compacted; revision ≤ 0 reads the current revision.
        if req.revision > self.current {
            return Err(Error::FutureRevision);
        }
        let rev = if req.revision <= 0 {
            self.current
        } else {
            req.revision
        };
        if rev < self.compact {
            return Err(Error::Compacted);
        }
        Ok(self.range_at(req, rev, self.current))
    }

    /// A standalone Put.
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, Error> {
        let role = self.put_admission(req)?;
        // Nothing else is in the queue during a lone operation, so the slot's release when
        // the Put is answered changes no decision: free it now.
        self.queue.release(&role);
        self.put_admitted(req)
    }

    /// A Put's admission, in the caller's thread: the alarm gate, validation, a slot in the
    /// prepare queue (taken before the size check, so a Put refused for its size was
    /// admitted), the size. Returns the role whose slot the Put holds.
    fn put_admission(&mut self, req: &PutRequest) -> Result<String, Error> {
        self.admission_gate(space::put_cost(&req.key, &req.value))?;
        check_put(req)?;
        let role = self.take_slot(Some(&req.key))?;
        if let Err(e) = self.check_size(Raft::Put(req)) {
            // Refused at once: its answer frees the slot.
            self.queue.release(&role);
            return Err(e);
        }
        Ok(role)
    }

    /// The rest of an admitted Put, at apply.
    fn put_admitted(&mut self, req: &PutRequest) -> Result<PutResponse, Error> {
        let cost = space::put_cost(&req.key, &req.value);
        self.apply_gate(cost)?;
        // A standalone Put checks the lease before the key the ignore flags need.
        if req.lease != 0 && !self.lease_exists(req.lease) {
            return Err(Error::LeaseNotFound);
        }
        if (req.ignore_value || req.ignore_lease) && self.get(&req.key, self.current).is_none() {
            return Err(Error::KeyNotFound);
        }
        let planned = [self.planned_put(req)];
        self.check_limits(&planned)?;
        let mut w = Writer::new(self);
        let resp = w.put(req);
        w.finish();
        Ok(resp)
    }

    /// A standalone DeleteRange.
    pub fn delete_range(&mut self, req: &DeleteRangeRequest) -> Result<DeleteRangeResponse, Error> {
        check_delete(req)?;
        self.lone_slot(Some(&req.key))?;
        self.check_size(Raft::DeleteRange(req))?;
        self.apply_gate(0)?;
        let mut w = Writer::new(self);
        let resp = w.delete(req);
        w.finish();
        Ok(resp)
    }

    /// Returns the write recorded under operation id `id`, if any.
    pub fn recorded_operation(&self, id: &str) -> Option<Op> {
        self.operations.get(id).map(|(op, _, _)| op.clone())
    }

    /// A Put or DeleteRange with an operation id. Admission runs as for any write (a retry
    /// under a latched alarm is refused and records nothing); then a retained outcome of the
    /// same write answers it, one of another write refuses it, and otherwise the write is
    /// applied and, if it succeeded, recorded (OPER-2, OPER-3).
    pub fn once(&mut self, id: &str, op: &Op) -> Reply {
        let reused = || Error::OperationIdReused(id.to_owned());
        let recorded = self
            .operations
            .get(id)
            .filter(|(_, at, _)| self.now.saturating_sub(*at) <= OPERATION_RETENTION)
            .cloned();
        let Some((first, _, reply)) = recorded else {
            let reply = self.apply_op(op);
            let applied = match &reply {
                Reply::Put(r) => r.is_ok(),
                Reply::DeleteRange(r) => r.is_ok(),
                _ => false,
            };
            if applied {
                self.operations
                    .insert(id.to_owned(), (op.clone(), self.now, reply.clone()));
            }
            return reply;
        };
        match op {
            Op::Put(req) => {
                match self.put_admission(req) {
                    Ok(role) => self.queue.release(&role),
                    Err(e) => return Reply::Put(Err(e)),
                }
                if first != *op {
                    return Reply::Put(Err(reused()));
                }
            }
            Op::DeleteRange(req) => {
                let admitted = check_delete(req)
                    .and_then(|()| self.lone_slot(Some(&req.key)))
                    .and_then(|()| self.check_size(Raft::DeleteRange(req)));
                if let Err(e) = admitted {
                    return Reply::DeleteRange(Err(e));
                }
                if first != *op {
                    return Reply::DeleteRange(Err(reused()));
                }
            }
            _ => panic!("model: only Put and DeleteRange take operation ids: {op:?}"),
        }
        reply
    }

    /// A Txn.
    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, Error> {
        self.admit_txn(req)?;
        if !req.is_read_only() {
            self.apply_gate(space::txn_cost(req))?;
        }
        let path = self.path(req);
        self.precheck(req, &path)?;
        if !req.is_read_only() {
            let mut puts = Vec::new();
            chosen_puts(req, &path, &mut puts);
            let planned: Vec<PlannedPut> = puts.into_iter().map(|p| self.planned_put(p)).collect();
            self.check_limits(&planned)?;
        }
        let mut w = Writer::new(self);
        let responses = w.txn(req, &path);
        let header = ResponseHeader {
            revision: w.read_rev(),
        };
        w.finish();
        Ok(TxnResponse {
            header,
            succeeded: path.succeeded,
            responses,
        })
    }

    /// A compaction. The model keeps the history: reads below the compaction revision are
    /// refused, reads at or above it are unchanged. The revisions the index would retain
    /// matter only to `kv_bytes` ([`Model::key_facts`]).
    pub fn compact(&mut self, req: &CompactionRequest) -> Result<CompactionResponse, Error> {
        self.lone_slot(None)?;
        self.check_size(Raft::Compaction(req))?;
        self.apply_gate(0)?;
        if req.revision <= self.compact {
            return Err(Error::Compacted);
        }
        if req.revision > self.current {
            return Err(Error::FutureRevision);
        }
        self.compact = req.revision;
        Ok(CompactionResponse {
            header: self.header(),
        })
    }

    /// HashKV (etcd 3.6's shape, with `hash_revision`). The model cannot compute the hash:
    /// `hash` is 0 and the harness compares every other field.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKvResponse, Error> {
        if revision > self.current {
            return Err(Error::FutureRevision);
        }
        if revision > 0 && revision < self.compact {
            return Err(Error::Compacted);
        }
        let hash_revision = if revision == 0 {
            self.current
        } else {
            revision
        };
        Ok(HashKvResponse {
            header: self.header(),
            hash: 0,
            compact_revision: self.compact,
            hash_revision,
        })
    }

    // ---- Leases ------------------------------------------------------------------------------

    /// LeaseGrant. A grant with id 0 gets the id the engine chose, `chosen`; with
    /// `chosen = None` (the generator, which has no engine) it answers id 0 and records
    /// nothing, so later operations never name that lease.
    pub fn lease_grant(
        &mut self,
        req: &LeaseGrantRequest,
        chosen: Option<i64>,
    ) -> Result<LeaseGrantResponse, Error> {
        self.admission_gate(space::LEASE_GRANT_COST_BYTES)?;
        if req.ttl > LEASE_TTL_MAX_SECONDS {
            return Err(Error::LeaseTtlTooLarge);
        }
        self.lone_slot(None)?;
        self.check_size(Raft::LeaseGrant(req))?;
        self.apply_gate(space::LEASE_GRANT_COST_BYTES)?;
        let ttl = req.ttl.max(LEASE_TTL_MIN_SECONDS);
        let id = match (req.id, chosen) {
            (0, None) => {
                return Ok(LeaseGrantResponse {
                    header: self.header(),
                    id: 0,
                    ttl,
                });
            }
            (0, Some(id)) => id,
            (id, _) => id,
        };
        if self.lease_exists(id) {
            return Err(Error::LeaseExists);
        }
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline: deadline(self.now, ttl),
            },
        );
        Ok(LeaseGrantResponse {
            header: self.header(),
            id,
            ttl,
        })
    }

    /// LeaseRevoke: the lease's keys deleted in key order in one revision.
    pub fn lease_revoke(&mut self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        self.lone_slot(None)?;
        self.check_size(Raft::LeaseRevoke(id))?;
        self.apply_gate(0)?;
        if !self.lease_exists(id) {
            return Err(Error::LeaseNotFound);
        }
        Ok(self.revoke(id))
    }

    fn revoke(&mut self, id: i64) -> LeaseRevokeResponse {
        let keys = self.lease_keys(id);
        let mut w = Writer::new(self);
        for key in keys {
            w.delete(&DeleteRangeRequest::key(key));
        }
        let header = ResponseHeader {
            revision: w.read_rev(),
        };
        w.finish();
        self.leases.remove(&id);
        LeaseRevokeResponse { header }
    }

    /// The live keys attached to lease `id`, in key order.
    fn lease_keys(&self, id: i64) -> Vec<Bytes> {
        self.live(b"\0", b"\0", self.current)
            .into_iter()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key)
            .collect()
    }

    /// LeaseKeepAlive: a full TTL from now; TTL 0, no error, if unknown.
    pub fn lease_keep_alive(&mut self, id: i64) -> Result<LeaseKeepAliveResponse, Error> {
        let header = self.header();
        let now = self.now;
        let ttl = match self.leases.get_mut(&id) {
            Some(lease) => {
                lease.deadline = deadline(now, lease.ttl);
                lease.ttl
            }
            None => 0,
        };
        Ok(LeaseKeepAliveResponse { header, id, ttl })
    }

    /// LeaseTimeToLive: whole seconds left (truncated), the granted TTL and, if asked,
    /// the keys in key order; TTL -1 and granted 0 if unknown.
    pub fn lease_time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<LeaseTimeToLiveResponse, Error> {
        let header = self.header();
        Ok(match self.leases.get(&id) {
            Some(lease) => LeaseTimeToLiveResponse {
                header,
                id,
                ttl: i64::try_from(lease.deadline.saturating_sub(self.now).as_secs())
                    .unwrap_or(i64::MAX),
                granted_ttl: lease.ttl,
                keys: if keys {
                    self.lease_keys(id)
                } else {
                    Vec::new()
                },
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

    /// LeaseLeases: every lease, soonest deadline first, ties by id.
    pub fn lease_leases(&self) -> Result<LeaseLeasesResponse, Error> {
        let mut leases: Vec<(Duration, i64)> = self
            .leases
            .iter()
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        leases.sort_unstable();
        Ok(LeaseLeasesResponse {
            header: self.header(),
            leases: leases.into_iter().map(|(_, id)| id).collect(),
        })
    }

    /// Moves the clock forward by `by` and revokes every lease whose deadline is at or before
    /// the new time, soonest deadline first (ties by id), one revoke each. Returns the
    /// revoked ids in that order. Under CORRUPT nothing expires until the alarm is cleared.
    pub fn advance_clock(&mut self, by: Duration) -> Vec<i64> {
        self.now = self.now.saturating_add(by);
        self.expire_due()
    }

    /// Revokes every lease that is due, unless CORRUPT blocks the revokes.
    fn expire_due(&mut self) -> Vec<i64> {
        if self.alarms.corrupt() {
            return Vec::new();
        }
        let mut due: Vec<(Duration, i64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= self.now)
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        due.sort_unstable();
        for (_, id) in &due {
            self.revoke(*id);
        }
        due.into_iter().map(|(_, id)| id).collect()
    }

    /// A close and reopen: every lease gets its full TTL again from now (LEASE-3). Alarms,
    /// the registry and the records survive; the new engine's prepare queue knows no role.
    pub fn reopen(&mut self) {
        self.queue.reopen();
        // A registered agent has to register again after a restart (it is recovered).
        self.accounts.recover_agents();
        let now = self.now;
        for lease in self.leases.values_mut() {
            lease.deadline = deadline(now, lease.ttl);
        }
    }

    // ---- Space and alarms --------------------------------------------------------------------

    /// Admission's alarm gate (Put, write Txn, LeaseGrant): CORRUPT refuses everything,
    /// NOSPACE a write with a cost. Raises nothing.
    fn admission_gate(&mut self, cost: u64) -> Result<(), Error> {
        if self.alarms.corrupt() {
            self.space_stats.refused_corrupt += 1;
            return Err(Error::Corrupt);
        }
        if cost > 0 && self.alarms.nospace() {
            self.space_stats.refused_latched += 1;
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// The gate at apply, for every write but Alarm: CORRUPT, then for a write with a cost
    /// NOSPACE, the filesystem reserve and the space quota; a refusal for space raises
    /// NOSPACE for the engine's member.
    fn apply_gate(&mut self, cost: u64) -> Result<(), Error> {
        if self.alarms.corrupt() {
            self.space_stats.refused_corrupt += 1;
            return Err(Error::Corrupt);
        }
        if cost == 0 {
            return Ok(());
        }
        if self.alarms.nospace() {
            self.space_stats.refused_latched += 1;
            return Err(Error::NoSpace);
        }
        let quota = space::quota_in_force(self.limits.quota_backend_bytes);
        if let Some(free) = self.free_space
            && free < space::fs_reserve(quota).saturating_add(cost)
        {
            self.space_stats.refused_fs += 1;
            return Err(self.raise_nospace());
        }
        let in_use_max = match (self.measured, self.file_len) {
            (Some(m), Some(f)) => Some(m.min(f)),
            (m, f) => m.or(f),
        };
        let verdict = space::verdict(quota, cost, self.live_bytes(), in_use_max);
        let fits = match (verdict, self.space_choice) {
            (Verdict::MustRefuse, _) => {
                self.space_stats.refused_must += 1;
                false
            }
            (Verdict::MustAccept, _) => {
                if quota.is_some() {
                    self.space_stats.accepted_must += 1;
                }
                if quota.is_some() && self.measured.is_some() && self.measured == in_use_max {
                    self.space_stats.accepted_measured += 1;
                }
                true
            }
            (Verdict::Either, SpaceChoice::Refuse) => {
                self.space_stats.refused_either += 1;
                false
            }
            (Verdict::Either, SpaceChoice::Accept) => {
                self.space_stats.accepted_either += 1;
                true
            }
        };
        if !fits {
            return Err(self.raise_nospace());
        }
        if self.disarmed_after_nospace {
            self.disarmed_after_nospace = false;
            self.space_stats.accepted_after_disarm += 1;
        }
        Ok(())
    }

    fn raise_nospace(&mut self) -> Error {
        self.alarms.activate(AlarmMember {
            member_id: ENGINE_MEMBER_ID,
            alarm: AlarmType::NoSpace,
        });
        Error::NoSpace
    }

    /// Sets the engine's answer for the next space check the model cannot decide; it holds
    /// for one operation.
    pub fn set_space_choice(&mut self, choice: SpaceChoice) {
        self.space_choice = choice;
    }

    /// Records the harness's measurement of the pages in use (until the next commit).
    pub fn set_measured(&mut self, in_use: u64) {
        self.measured = Some(in_use);
    }

    /// Forgets the measurement: something may have committed since.
    pub fn forget_measurement(&mut self) {
        self.measured = None;
    }

    /// Records the database file's length (Status `db_size`), read after the last
    /// operation: the pages in use lie within it.
    pub fn set_file_len(&mut self, len: u64) {
        self.file_len = Some(len);
    }

    /// Sets the free space the filesystem guard reads.
    pub fn set_free_space(&mut self, free: Option<u64>) {
        self.free_space = free;
    }

    /// Returns the free space the filesystem guard reads.
    pub fn free_space(&self) -> Option<u64> {
        self.free_space
    }

    /// Returns the quota in force.
    pub fn space_quota(&self) -> Option<u64> {
        space::quota_in_force(self.limits.quota_backend_bytes)
    }

    /// Returns the bytes of every live key and value: a lower bound of the pages in use.
    pub fn live_bytes(&self) -> u64 {
        self.live(b"\0", b"\0", self.current)
            .iter()
            .map(|kv| (kv.key.len() + kv.value.len()) as u64)
            .sum()
    }

    /// Returns the active alarms, by member then type.
    pub fn alarm_list(&self) -> Vec<AlarmMember> {
        self.alarms.list(AlarmType::None)
    }

    /// Returns the space decisions counted so far.
    pub fn space_stats(&self) -> &SpaceStats {
        &self.space_stats
    }

    /// An Alarm request: Get lists, Activate adds (NONE: nothing), Deactivate removes; none
    /// is gated. Clearing the last CORRUPT alarm lets the leases that fell due expire.
    pub fn alarm(&mut self, req: &AlarmRequest) -> Result<AlarmResponse, Error> {
        if req.action != AlarmAction::Get {
            self.lone_slot(None)?;
            self.check_size(Raft::Alarm(req))?;
        }
        let member = AlarmMember {
            member_id: req.member_id,
            alarm: req.alarm,
        };
        let alarms = match req.action {
            AlarmAction::Get => self.alarms.list(req.alarm),
            AlarmAction::Activate if req.alarm == AlarmType::None => Vec::new(),
            AlarmAction::Activate => {
                self.alarms.activate(member);
                vec![member]
            }
            AlarmAction::Deactivate => {
                if self.alarms.deactivate(member) {
                    if req.alarm == AlarmType::NoSpace && !self.alarms.nospace() {
                        self.space_stats.disarms += 1;
                        self.disarmed_after_nospace = true;
                    }
                    vec![member]
                } else {
                    Vec::new()
                }
            }
        };
        let header = self.header();
        if req.action == AlarmAction::Deactivate && req.alarm == AlarmType::Corrupt {
            self.expire_due();
        }
        Ok(AlarmResponse { header, alarms })
    }

    /// A defrag: allowed under every alarm, changes nothing the model sees.
    pub fn defrag(&self) -> Result<ResponseHeader, Error> {
        Ok(self.header())
    }

    // ---- The write prepare queue -------------------------------------------------------------

    /// Returns the role a write whose first written key is `key` belongs to (`*` for a
    /// write without a key).
    fn queue_role(&self, key: Option<&[u8]>) -> String {
        key.map_or("*", |k| super::accounts::owner(k, &self.accounts.registry))
            .to_owned()
    }

    /// Takes a slot in the prepare queue for a write whose first written key is `key`, or
    /// refuses the write (PREP-1..3). Returns the role that holds the slot.
    fn take_slot(&mut self, key: Option<&[u8]>) -> Result<String, Error> {
        let role = self.queue_role(key);
        match self.queue.admit(&role, self.now) {
            Ok(()) => Ok(role),
            Err(_) => Err(Error::TooManyRequests {
                retry_after_ms: queue::HINT_UNKNOWN_MS,
            }),
        }
    }

    /// The slot of a write of a lone operation: taken, and free again once it is answered
    /// (nothing else is in the queue meanwhile, so it can be freed at once).
    fn lone_slot(&mut self, key: Option<&[u8]>) -> Result<(), Error> {
        let role = self.take_slot(key)?;
        self.queue.release(&role);
        Ok(())
    }

    /// Returns what `Engine::prepare_queue` must report: every role with writes queued or
    /// refused since the engine opened.
    pub fn queue_roles(&self) -> Vec<kvd::RoleQueue> {
        self.queue.roles()
    }

    /// Returns the queue's capacity.
    pub fn queue_capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// Returns the queue's decisions so far.
    pub fn queue_stats(&self) -> &QueueStats {
        self.queue.stats()
    }

    /// Returns the role a Put of `key` belongs to.
    pub fn put_role(&self, key: &[u8]) -> String {
        self.queue_role(Some(key))
    }

    /// Returns why the answers to a burst of `puts` could depend on timing, or None if the
    /// model can predict every one:
    /// - a role the writers' shares depend on was last admitted 10 to 11 s ago (the engine
    ///   drops idle roles once a second: [`Queue::uncertain`]);
    /// - a burst Put could be refused for space at apply, which would raise NOSPACE while
    ///   later Puts are still being admitted (the alarm gate then refuses them or not,
    ///   depending on how far the apply thread got). With no alarm active, every Put must
    ///   fit the filesystem reserve and the quota must leave room for all of them together
    ///   with [`BURST_PAGES_MARGIN_BYTES`] to spare above an upper bound of the pages in use
    ///   (the file length the harness read; without an engine, the generator's model
    ///   estimates from the live bytes).
    pub fn burst_unpredictable(&self, puts: &[PutRequest]) -> Option<String> {
        let mut writers: Vec<String> = puts.iter().map(|p| self.put_role(&p.key)).collect();
        writers.sort();
        writers.dedup();
        for writer in &writers {
            if let Some(role) = self.queue.uncertain(writer, self.now) {
                return Some(format!(
                    "role {role}'s last admitted write is 10 to 11 s old: {writer}'s share is                      not certain"
                ));
            }
        }
        if self.alarms.corrupt() || self.alarms.nospace() {
            // The alarm gate refuses every burst Put at admission: nothing reaches apply.
            return None;
        }
        let quota = self.space_quota();
        let reserve = space::fs_reserve(quota);
        let costs: Vec<u64> = puts
            .iter()
            .map(|p| space::put_cost(&p.key, &p.value))
            .collect();
        if let Some(free) = self.free_space
            && costs.iter().any(|c| free < reserve.saturating_add(*c))
        {
            return Some("a burst Put does not fit the filesystem reserve".to_owned());
        }
        if let Some(quota) = quota {
            let in_use_max = match (self.measured, self.file_len) {
                (Some(m), Some(f)) => m.min(f),
                (m, f) => m.or(f).unwrap_or_else(|| self.live_bytes()),
            };
            let room: u64 = costs.iter().map(|c| space::room_needed(*c)).sum();
            let needed = in_use_max
                .saturating_add(room)
                .saturating_add(BURST_PAGES_MARGIN_BYTES)
                .saturating_add(space::MUST_ACCEPT_SLACK_BYTES);
            if needed >= quota {
                return Some("the burst may not fit the space quota".to_owned());
            }
        }
        None
    }

    /// The admission of the next Put of a burst, in the caller's thread: Ok if it was
    /// admitted (it then holds its slot until [`Model::burst_apply`]), else its refusal.
    pub fn burst_admit(&mut self, req: &PutRequest) -> Result<(), Error> {
        self.put_admission(req).map(drop)
    }

    /// Applies an admitted Put of a burst and frees its slot.
    pub fn burst_apply(&mut self, req: &PutRequest) -> Result<PutResponse, Error> {
        self.clear_other_limit_refusals();
        let role = self.put_role(&req.key);
        let reply = self.put_admitted(req);
        self.queue.release(&role);
        self.forget_measurement();
        reply
    }

    /// A burst as the model alone runs it (the generator): None if it is
    /// [unpredictable](Model::burst_unpredictable) (the harness sends nothing then), else every
    /// Put admitted or refused in order, then the admitted ones applied in order.
    pub fn queue_burst(&mut self, puts: &[PutRequest]) -> Option<Vec<Result<PutResponse, Error>>> {
        if self.burst_unpredictable(puts).is_some() {
            return None;
        }
        let admitted: Vec<Result<(), Error>> = puts.iter().map(|p| self.burst_admit(p)).collect();
        let replies = puts
            .iter()
            .zip(admitted)
            .map(|(p, admission)| admission.and_then(|()| self.burst_apply(p)))
            .collect();
        Some(replies)
    }

    // ---- Quota registry, records, consumption --------------------------------------------

    /// What the recount needs of every key: the bytes of the Put revisions the index
    /// retains, and whether it is alive. After compaction at C the index keeps every revision
    /// above C and, of those at or below C, only the key's newest one, if it is a Put (a
    /// generation deleted at or before C is gone, and a tombstone costs nothing). A Put
    /// revision costs 256 + |key| + |value stored| (an `ignore_value` Put stores, and costs,
    /// the value it keeps).
    pub fn key_facts(&self) -> Vec<KeyFacts> {
        let mut out = Vec::new();
        for (key, history) in &self.history {
            let newest_at_compact = history.iter().rposition(|e| e.rev <= self.compact);
            let mut retained_bytes = 0;
            for (i, e) in history.iter().enumerate() {
                let Some(kv) = &e.kv else { continue };
                if e.rev > self.compact || Some(i) == newest_at_compact {
                    retained_bytes += space::put_cost(&kv.key, &kv.value);
                }
            }
            let alive = self.get(key, self.current).is_some();
            if retained_bytes > 0 || alive {
                out.push(KeyFacts {
                    key: key.clone(),
                    retained_bytes,
                    alive,
                });
            }
        }
        out
    }

    /// Returns the consumption table, recounted from the history and the records.
    pub fn usage(&self) -> UsageMap {
        self.accounts
            .recount(&self.key_facts(), &self.accounts.registry)
    }

    /// Returns the registry, agents and records.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// The kv_bytes and key a Put adds, judged before the request.
    fn planned_put(&self, p: &PutRequest) -> PlannedPut {
        let prev = self.get(&p.key, self.current);
        let value = match prev {
            Some(kv) if p.ignore_value => kv.value.clone(),
            _ => p.value.clone(),
        };
        PlannedPut {
            key: p.key.clone(),
            bytes: space::put_cost(&p.key, &value),
            new_key: prev.is_none(),
        }
    }

    /// The per-role limits on the Puts of one write. A refusal names the documented first
    /// (role, resource) over its limit; the others over theirs are kept in
    /// [`Model::other_limit_refusals`].
    fn check_limits(&mut self, planned: &[PlannedPut]) -> Result<(), Error> {
        if self.accounts.registry.is_empty() {
            return Ok(());
        }
        match self.accounts.check_write(&self.usage(), planned) {
            Ok(()) => Ok(()),
            Err(mut over) => {
                let first = over.remove(0);
                self.other_limit_refusals = over;
                Err(Error::QuotaExceeded(first))
            }
        }
    }

    /// Returns the refusals of the last write's limit check other than the one it answered:
    /// the other (role, resource) pairs that were over their limits.
    pub fn other_limit_refusals(&self) -> &[String] {
        &self.other_limit_refusals
    }

    /// Forgets the last write's other limit refusals.
    pub fn clear_other_limit_refusals(&mut self) {
        self.other_limit_refusals.clear();
    }

    /// A registry or record request: gated by CORRUPT (cost 0), then the request's own
    /// checks. Returns the rows a repair changed (none: nothing drifts in the model).
    pub fn quota(&mut self, op: &QuotaOp) -> Result<usize, Error> {
        self.lone_slot(None)?;
        self.apply_gate(0)?;
        let usage = self.usage();
        let refused = |r: Refusal| match r {
            Refusal::Request(m) => Error::QuotaRequest(m),
            Refusal::Limit(m) => Error::QuotaExceeded(m),
        };
        match op {
            QuotaOp::UpdateQuota { configs, force } => {
                let keys = self.key_facts();
                let accounts = &self.accounts;
                let usage_under = |registry: &Registry| accounts.recount(&keys, registry);
                let registry = accounts
                    .update_quota(configs, *force, self.space_quota(), &usage_under)
                    .map_err(Error::QuotaRequest)?;
                self.accounts.registry = registry;
            }
            QuotaOp::RegisterAgent {
                id,
                state,
                resources,
            } => {
                self.accounts
                    .register_agent(id, *state, resources)
                    .map_err(refused)?;
            }
            QuotaOp::Reserve {
                id,
                role,
                agent,
                resources,
            } => self
                .accounts
                .reserve(&usage, id, role, agent, resources)
                .map_err(refused)?,
            QuotaOp::Unreserve(id) => self.accounts.unreserve(id).map_err(refused)?,
            QuotaOp::Allocate {
                id,
                role,
                agent,
                resources,
            } => self
                .accounts
                .allocate(&usage, id, role, agent, resources)
                .map_err(refused)?,
            QuotaOp::Release(id) => self.accounts.release(id).map_err(refused)?,
            QuotaOp::Repair => {}
        }
        Ok(0)
    }

    // ---- Reads -----------------------------------------------------------------------------

    fn header(&self) -> ResponseHeader {
        ResponseHeader {
            revision: self.current,
        }
    }

    /// Returns the key's KeyValue at `rev`, or None if it does not exist there.
    fn get(&self, key: &[u8], rev: i64) -> Option<&KeyValue> {
        let history = self.history.get(key)?;
        history
            .iter()
            .rev()
            .find(|e| e.rev <= rev)
            .and_then(|e| e.kv.as_ref())
    }

    /// Returns the KeyValues alive at `rev` in the range `key`/`end`, in key order.
    fn live(&self, key: &[u8], end: &[u8], rev: i64) -> Vec<KeyValue> {
        let Some(bounds) = bounds(key, end) else {
            return Vec::new();
        };
        self.history
            .range::<[u8], _>(bounds)
            .filter_map(|(k, _)| self.get(k, rev).cloned())
            .collect()
    }

    /// etcd's Range algorithm (count, filters, sort, limit), reading at `rev` and answering
    /// with `header_rev`.
    fn range_at(&self, req: &RangeRequest, rev: i64, header_rev: i64) -> RangeResponse {
        let mut kvs = self.live(&req.key, &req.range_end, rev);
        let count = kvs.len() as i64;
        let header = ResponseHeader {
            revision: header_rev,
        };
        if req.count_only {
            return RangeResponse {
                header,
                kvs: Vec::new(),
                more: false,
                count,
            };
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        // The fetch-everything decision looks at the requested order, before NONE is promoted
        // to ASCEND below: that is etcd's quirk.
        if req.sort_order == SortOrder::None && !filtered && req.limit > 0 {
            let fetch = usize::try_from(req.limit).map_or(usize::MAX, |l| l.saturating_add(1));
            kvs.truncate(fetch);
        }
        kvs.retain(|kv| {
            !(req.max_mod_revision != 0 && kv.mod_revision > req.max_mod_revision
                || req.min_mod_revision != 0 && kv.mod_revision < req.min_mod_revision
                || req.max_create_revision != 0 && kv.create_revision > req.max_create_revision
                || req.min_create_revision != 0 && kv.create_revision < req.min_create_revision)
        });
        let order = match (req.sort_target, req.sort_order) {
            (SortTarget::Key, SortOrder::Ascend) => SortOrder::None,
            (SortTarget::Key, order) => order,
            (_, SortOrder::None) => SortOrder::Ascend,
            (_, order) => order,
        };
        let target = req.sort_target;
        // Stable sorts, as the engine's: ties keep key order in both directions.
        match order {
            SortOrder::None => {}
            SortOrder::Ascend => kvs.sort_by(|a, b| cmp_by(target, a, b)),
            SortOrder::Descend => kvs.sort_by(|a, b| cmp_by(target, b, a)),
        }
        let mut more = false;
        if req.limit > 0 && kvs.len() as i64 > req.limit {
            kvs.truncate(req.limit as usize);
            more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value = Bytes::new();
            }
        }
        RangeResponse {
            header,
            kvs,
            more,
            count,
        }
    }

    // ---- Txn -------------------------------------------------------------------------------

    /// The checks before anything runs: for a txn that may write the alarm gate, then
    /// validation (the op budget, keys, duplicate keys), then the request size.
    fn admit_txn(&mut self, req: &TxnRequest) -> Result<(), Error> {
        if !req.is_read_only() {
            self.admission_gate(space::txn_cost(req))?;
        }
        check_txn_budget(req, self.limits.max_txn_ops)?;
        check_intervals(&req.success)?;
        check_intervals(&req.failure)?;
        if !req.is_read_only() {
            self.lone_slot(first_written_key(req))?;
            self.check_size(Raft::Txn(req))?;
        }
        Ok(())
    }

    /// Evaluates the compares of `req` and of the nested txns of its chosen branch, all
    /// against the state before the txn.
    fn path(&self, req: &TxnRequest) -> Path {
        let succeeded = req.compare.iter().all(|c| self.compare(c));
        let branch = if succeeded {
            &req.success
        } else {
            &req.failure
        };
        let nested = branch
            .iter()
            .filter_map(|op| match op {
                RequestOp::Txn(t) => Some(self.path(t)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }

    fn compare(&self, c: &Compare) -> bool {
        let kvs = self.live(&c.key, &c.range_end, self.current);
        if kvs.is_empty() {
            // A missing key fails every value compare and is all-zero for the others.
            return !matches!(c.target, CompareTarget::Value(_))
                && compare_kv(c, &KeyValue::default());
        }
        kvs.iter().all(|kv| compare_kv(c, kv))
    }

    /// etcd's apply-time pre-checks on the chosen branches: every Put first (for a txn that
    /// may write), then every Range.
    fn precheck(&self, req: &TxnRequest, path: &Path) -> Result<(), Error> {
        if !req.is_read_only() {
            // Inside a txn each Put checks the key the ignore flags need, then its lease,
            // one Put after the other. The key must still be there when the Put runs: a
            // from-key delete earlier in the txn (which etcd's duplicate-key check lets
            // through, and after which etcd panics) removes it, and kvd refuses the txn.
            let mut from_key_deletes: Vec<Vec<u8>> = Vec::new();
            walk_chosen(req, path, &mut |op| match op {
                RequestOp::DeleteRange(d) if d.range_end.as_ref() == [0] => {
                    from_key_deletes.push(d.key.to_vec());
                    Ok(())
                }
                RequestOp::Put(p)
                    if (p.ignore_value || p.ignore_lease)
                        && (self.get(&p.key, self.current).is_none()
                            || from_key_deletes
                                .iter()
                                .any(|start| p.key.as_ref() >= &start[..])) =>
                {
                    Err(Error::KeyNotFound)
                }
                RequestOp::Put(p) if p.lease != 0 && !self.lease_exists(p.lease) => {
                    Err(Error::LeaseNotFound)
                }
                _ => Ok(()),
            })?;
        }
        // The revision check does not treat negative revisions as "current": that is the
        // negative-revision quirk: a negative revision is compared with the compaction
        // revision, where a standalone Range reads the current revision.
        walk_chosen(req, path, &mut |op| match op {
            RequestOp::Range(r) if r.revision != 0 && r.revision > self.current => {
                Err(Error::FutureRevision)
            }
            RequestOp::Range(r) if r.revision != 0 && r.revision < self.compact => {
                Err(Error::Compacted)
            }
            _ => Ok(()),
        })
    }

    /// etcd's request-size limit, on the model's own protobuf encoding of the raft entry.
    fn check_size(&self, req: Raft<'_>) -> Result<(), Error> {
        if wire::raft_entry_len(req) > self.limits.max_request_bytes {
            return Err(Error::RequestTooLarge);
        }
        Ok(())
    }
}

/// Returns the first key a Txn writes: its first Put or DeleteRange, the success branch
/// before the failure branch, nested Txns in order (None for a read-only Txn).
fn first_written_key(txn: &TxnRequest) -> Option<&[u8]> {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            RequestOp::Put(p) => Some(&p.key[..]),
            RequestOp::DeleteRange(d) => Some(&d.key[..]),
            RequestOp::Txn(t) => first_written_key(t),
            RequestOp::Range(_) => None,
        })
}

/// The bounds of a key range, for `BTreeMap::range`.
type KeyBounds<'k> = (Bound<&'k [u8]>, Bound<&'k [u8]>);

/// Returns the BTreeMap bounds of the range `key`/`end` (empty end: the key alone; `"\0"`:
/// everything from the key on), or None if it is empty.
fn bounds<'k>(key: &'k [u8], end: &'k [u8]) -> Option<KeyBounds<'k>> {
    if end.is_empty() {
        Some((Bound::Included(key), Bound::Included(key)))
    } else if end == b"\0" {
        Some((Bound::Included(key), Bound::Unbounded))
    } else if key >= end {
        None
    } else {
        Some((Bound::Included(key), Bound::Excluded(end)))
    }
}

/// A lease deadline: `ttl` seconds after `now` (a negative TTL cannot occur: grants raise it).
fn deadline(now: Duration, ttl: i64) -> Duration {
    now.saturating_add(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)))
}

/// Calls `f` on every non-txn op of the chosen branches of `req`, depth first, in order.
fn walk_chosen(
    req: &TxnRequest,
    path: &Path,
    f: &mut impl FnMut(&RequestOp) -> Result<(), Error>,
) -> Result<(), Error> {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    for op in branch {
        match op {
            RequestOp::Txn(t) => {
                if let Some(p) = nested.next() {
                    walk_chosen(t, p, f)?;
                }
            }
            other => f(other)?,
        }
    }
    Ok(())
}

/// Collects the Puts of the chosen branches of `req`, nested ones included, in order.
fn chosen_puts<'r>(req: &'r TxnRequest, path: &Path, out: &mut Vec<&'r PutRequest>) {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    for op in branch {
        match op {
            RequestOp::Put(p) => out.push(p),
            RequestOp::Txn(t) => {
                if let Some(p) = nested.next() {
                    chosen_puts(t, p, out);
                }
            }
            RequestOp::Range(_) | RequestOp::DeleteRange(_) => {}
        }
    }
}

fn cmp_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Value(v) => kv.value[..].cmp(&v[..]),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
    }
}

// ---- Validation before admission ----------------------------------------------------------

fn check_range(req: &RangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::KeyNotProvided);
    }
    Ok(())
}

fn check_put(req: &PutRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::KeyNotProvided);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

fn check_delete(req: &DeleteRangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::KeyNotProvided);
    }
    Ok(())
}

/// etcd's Txn validation with `--max-txn-ops = budget`: a level may hold at most `budget`
/// operations in its longest list (compares, success or failure); a nested txn has what this
/// level left (`budget − this level's longest list`), so a parent with 2 operations under
/// 128 allows a nested txn of 126. A level's count is checked before its compare keys, and
/// both before the operations, in order (success, then failure); an empty key anywhere is
/// refused.
fn check_txn_budget(req: &TxnRequest, budget: usize) -> Result<(), Error> {
    let longest = [req.compare.len(), req.success.len(), req.failure.len()]
        .into_iter()
        .max()
        .unwrap_or(0);
    let Some(left) = budget.checked_sub(longest) else {
        return Err(Error::TooManyTxnOps);
    };
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::KeyNotProvided);
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            RequestOp::Range(r) => check_range(r)?,
            RequestOp::Put(p) => check_put(p)?,
            RequestOp::DeleteRange(d) => check_delete(d)?,
            RequestOp::Txn(t) => check_txn_budget(t, left)?,
        }
    }
    Ok(())
}

/// A DeleteRange interval as etcd's `checkIntervals` inserts it: `(key, range_end)`.
type Interval = (Bytes, Bytes);

/// Returns true if the point `key` lies in one of the delete intervals, with etcd's
/// interval-tree semantics: an empty `range_end` is the point `key`, anything else the
/// half-open `[key, range_end)`, which is empty when `key ≥ range_end`. So `"\0"` covers
/// nothing here (etcd's quirk), unlike at execution.
fn intersects(dels: &[Interval], key: &[u8]) -> bool {
    dels.iter().any(|(begin, end)| {
        if end.is_empty() {
            begin[..] == *key
        } else {
            begin[..] <= *key && *key < end[..]
        }
    })
}

/// etcd's `checkIntervals` on one branch: returns the keys Put and the intervals deleted by
/// the branch and its nested txns, or DuplicateKey. This level's deletes are collected
/// first; nested txns are merged in order (a nested put is checked against the deletes of
/// earlier nested txns only); this level's puts are checked last, against everything.
fn check_intervals(ops: &[RequestOp]) -> Result<(BTreeSet<Bytes>, Vec<Interval>), Error> {
    let mut dels: Vec<Interval> = ops
        .iter()
        .filter_map(|op| match op {
            RequestOp::DeleteRange(d) => Some((d.key.clone(), d.range_end.clone())),
            _ => None,
        })
        .collect();
    let mut puts = BTreeSet::new();
    for op in ops {
        let RequestOp::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for key in &puts_then {
            if puts.contains(key) || intersects(&dels, key) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        for key in &puts_else {
            // The same key in both branches of one nested txn is fine: they exclude each other.
            if puts.contains(key) && !puts_then.contains(key) || intersects(&dels, key) {
                return Err(Error::DuplicateKey);
            }
            puts.insert(key.clone());
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let RequestOp::Put(p) = op else { continue };
        if puts.contains(&p.key) || intersects(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

// ---- Execution ----------------------------------------------------------------------------

/// One write transaction: every change is made at `begin + 1`; reads see the txn's own
/// changes once there is one.
struct Writer<'m> {
    model: &'m mut Model,
    begin: i64,
    changes: usize,
}

impl<'m> Writer<'m> {
    fn new(model: &'m mut Model) -> Writer<'m> {
        let begin = model.current;
        Writer {
            model,
            begin,
            changes: 0,
        }
    }

    /// The revision reads run at: the start revision until something changed.
    fn read_rev(&self) -> i64 {
        if self.changes > 0 {
            self.begin + 1
        } else {
            self.begin
        }
    }

    fn finish(self) {
        if self.changes > 0 {
            self.model.current = self.begin + 1;
        }
    }

    fn range(&self, req: &RangeRequest) -> RangeResponse {
        let cur = self.read_rev();
        // The pre-check let through only revisions in [compact, begin] or ≤ 0 ones.
        let rev = if req.revision <= 0 { cur } else { req.revision };
        self.model.range_at(req, rev, cur)
    }

    fn put(&mut self, req: &PutRequest) -> PutResponse {
        let rev = self.begin + 1;
        let prev = self.model.get(&req.key, self.read_rev()).cloned();
        assert!(
            prev.is_some() || !(req.ignore_value || req.ignore_lease),
            "model bug: the pre-check let through an ignore flag with no key to keep: {req:?}"
        );
        let value = match (&prev, req.ignore_value) {
            (Some(p), true) => p.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev, req.ignore_lease) {
            (Some(p), true) => p.lease,
            _ => req.lease,
        };
        let kv = KeyValue {
            key: req.key.clone(),
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value,
            lease,
        };
        self.model
            .history
            .entry(req.key.clone())
            .or_default()
            .push(Entry {
                rev,
                sub: self.changes,
                kv: Some(kv),
            });
        self.changes += 1;
        PutResponse {
            header: ResponseHeader { revision: rev },
            prev_kv: if req.prev_kv { prev } else { None },
        }
    }

    fn delete(&mut self, req: &DeleteRangeRequest) -> DeleteRangeResponse {
        let rev = self.begin + 1;
        let doomed = self.model.live(&req.key, &req.range_end, self.read_rev());
        for kv in &doomed {
            self.model
                .history
                .entry(kv.key.clone())
                .or_default()
                .push(Entry {
                    rev,
                    sub: self.changes,
                    kv: None,
                });
            self.changes += 1;
        }
        DeleteRangeResponse {
            header: ResponseHeader {
                revision: self.read_rev(),
            },
            deleted: doomed.len() as i64,
            prev_kvs: if req.prev_kv { doomed } else { Vec::new() },
        }
    }

    fn txn(&mut self, req: &TxnRequest, path: &Path) -> Vec<ResponseOp> {
        let branch = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            let resp = match op {
                RequestOp::Range(r) => ResponseOp::Range(self.range(r)),
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete(d)),
                RequestOp::Txn(t) => {
                    let p = nested
                        .next()
                        .expect("model bug: compare path shorter than the txn");
                    // Nested txn responses carry an all-zero header.
                    ResponseOp::Txn(TxnResponse {
                        header: ResponseHeader::default(),
                        succeeded: p.succeeded,
                        responses: self.txn(t, p),
                    })
                }
            };
            responses.push(resp);
        }
        responses
    }
}
