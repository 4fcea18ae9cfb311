//! The operations a test sequence is made of, and their replies.

use std::collections::BTreeMap;
use std::time::Duration;

use kvd::quota::RawQuotaConfig;
use kvd::{
    AgentState, AlarmRequest, AlarmResponse, CompactionRequest, CompactionResponse,
    DeleteRangeRequest, DeleteRangeResponse, Error, HashKvResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse, LeaseRevokeResponse,
    LeaseTimeToLiveResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader,
    TxnRequest, TxnResponse, WatchCreateRequest,
};

use super::state::{Limits, Model, SpaceChoice};

/// Which of the two watch streams of an engine a watch is created on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StreamKind {
    /// Read after every operation: its watches stay synced and get live responses.
    Eager,
    /// Read only at the end of a segment (before a Reopen and at the end): its busy watches
    /// fill their buffers, fall behind and catch up from the history, racing compactions.
    Lazy,
}

/// A request on the quota registry or the records (the engine's shorthand calls).
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaOp {
    /// `Engine::update_quota` (Mesos's UPDATE_QUOTA).
    UpdateQuota {
        /// The configurations, all or nothing.
        configs: Vec<RawQuotaConfig>,
        /// Skip the consumption and capacity checks.
        force: bool,
    },
    /// `Engine::register_agent`.
    RegisterAgent {
        /// The agent.
        id: String,
        /// Its state.
        state: AgentState,
        /// Its total resources.
        resources: BTreeMap<String, f64>,
    },
    /// `Engine::reserve`.
    Reserve {
        /// The record id.
        id: String,
        /// The role.
        role: String,
        /// The agent.
        agent: String,
        /// The resources.
        resources: BTreeMap<String, f64>,
    },
    /// `Engine::unreserve`.
    Unreserve(String),
    /// `Engine::allocate`.
    Allocate {
        /// The record id.
        id: String,
        /// The role.
        role: String,
        /// The agent.
        agent: String,
        /// The resources.
        resources: BTreeMap<String, f64>,
    },
    /// `Engine::release`.
    Release(String),
    /// `Engine::repair_consumption`: nothing may have drifted, so it repairs 0 rows.
    Repair,
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `Engine::put`.
    Put(PutRequest),
    /// `Engine::delete_range`.
    DeleteRange(DeleteRangeRequest),
    /// A Put or DeleteRange sent with an operation id (`Engine::put_with`,
    /// `Engine::delete_range_with`): exactly-once, so a retry gets the first reply.
    Once {
        /// The operation id.
        id: String,
        /// The write: an `Op::Put` or an `Op::DeleteRange`.
        op: Box<Op>,
    },
    /// `Engine::txn`, possibly with nested txns.
    Txn(TxnRequest),
    /// `Engine::range`, at any revision (compacted, future and negative ones included).
    Range(RangeRequest),
    /// `Engine::compact`, physical or not.
    Compact(CompactionRequest),
    /// Close the engine and open the same directory again (same clock).
    Reopen,
    /// `Engine::hash_kv` at this revision.
    HashKv(i64),
    /// `Engine::lease_grant`.
    LeaseGrant(LeaseGrantRequest),
    /// `Engine::lease_revoke`.
    LeaseRevoke(i64),
    /// `Engine::lease_keep_alive`.
    LeaseKeepAlive(i64),
    /// `Engine::lease_time_to_live`.
    LeaseTimeToLive {
        /// The lease.
        id: i64,
        /// Ask for the attached keys.
        keys: bool,
    },
    /// `Engine::lease_leases`.
    LeaseLeases,
    /// Move the engine's `ManualClock` forward; the harness then waits (bounded) until the
    /// engine has revoked every lease that is due.
    AdvanceClock(Duration),
    /// Read both watch streams until each is settled (every watch synced at the current
    /// revision) and check every watch's events so far: a consumer that catches up.
    SettleWatches,
    /// Create a watch on one of the engine's two streams; its responses are checked when the
    /// stream is drained (see `harness::watch`).
    Watch {
        /// The stream.
        stream: StreamKind,
        /// The request, as sent.
        req: WatchCreateRequest,
    },
    /// `Engine::alarm`: Get, Activate or Deactivate.
    Alarm(AlarmRequest),
    /// `Engine::defrag`.
    Defrag,
    /// `Engine::measure_space`: the harness hands the figure to the model, which may then
    /// insist that the next write with a cost fits (see `space::verdict`).
    MeasureSpace,
    /// Set the free space the engine's filesystem guard reads (`None`: unreadable).
    SetFreeSpace(Option<u64>),
    /// A request on the quota registry or the records.
    Quota(QuotaOp),
    /// The write prepare queue filled: with the engine's log syncs held (so nothing admitted
    /// is answered), these Puts are submitted in order with `Engine::submit_put`; the ones
    /// the queue refuses are answered at once (`etcdserver: too many requests`), the rest
    /// after the syncs are released. The model predicts which are refused (`queue.rs`) and
    /// every answer; the harness sends nothing if [`Model::burst_unpredictable`] says the
    /// answers could depend on timing.
    QueueBurst(Vec<PutRequest>),
}

impl Op {
    /// Returns true for an operation that commits nothing (so a measurement of the pages in
    /// use stays what the engine's estimate starts from).
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Op::Range(_)
                | Op::HashKv(_)
                | Op::LeaseKeepAlive(_)
                | Op::LeaseTimeToLive { .. }
                | Op::LeaseLeases
                | Op::Watch { .. }
                | Op::SettleWatches
                | Op::MeasureSpace
                | Op::SetFreeSpace(_)
        ) || matches!(self, Op::Alarm(a) if a.action == kvd::AlarmAction::Get)
    }
}

/// A replayable sequence of operations with the limits the engine is opened with.
#[derive(Debug, Clone)]
pub struct Seq {
    /// Names the sequence in failure messages, with how to replay it.
    pub label: String,
    /// `Config::max_txn_ops` and `Config::max_request_bytes`.
    pub limits: Limits,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

/// The reply to one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Reply to [`Op::Put`].
    Put(Result<PutResponse, Error>),
    /// Reply to [`Op::DeleteRange`].
    DeleteRange(Result<DeleteRangeResponse, Error>),
    /// Reply to [`Op::Txn`].
    Txn(Result<TxnResponse, Error>),
    /// Reply to [`Op::Range`].
    Range(Result<RangeResponse, Error>),
    /// Reply to [`Op::Compact`].
    Compact(Result<CompactionResponse, Error>),
    /// [`Op::Reopen`] has no reply of its own.
    Reopen,
    /// Reply to [`Op::HashKv`]; the model's `hash` is always 0.
    HashKv(Result<HashKvResponse, Error>),
    /// Reply to [`Op::LeaseGrant`]; the model answers id 0 to a grant of id 0 unless told
    /// the engine's choice.
    LeaseGrant(Result<LeaseGrantResponse, Error>),
    /// Reply to [`Op::LeaseRevoke`].
    LeaseRevoke(Result<LeaseRevokeResponse, Error>),
    /// Reply to [`Op::LeaseKeepAlive`].
    LeaseKeepAlive(Result<LeaseKeepAliveResponse, Error>),
    /// Reply to [`Op::LeaseTimeToLive`].
    LeaseTimeToLive(Result<LeaseTimeToLiveResponse, Error>),
    /// Reply to [`Op::LeaseLeases`].
    LeaseLeases(Result<LeaseLeasesResponse, Error>),
    /// [`Op::AdvanceClock`]: the ids of the leases that expired, soonest deadline first
    /// (the model's view; the engine's is checked through its state).
    AdvanceClock(Vec<i64>),
    /// [`Op::Watch`] has no reply of its own: the harness checks the watch's responses.
    Watch,
    /// [`Op::SettleWatches`] has no reply of its own.
    SettleWatches,
    /// Reply to [`Op::Alarm`].
    Alarm(Result<AlarmResponse, Error>),
    /// Reply to [`Op::Defrag`]: the header only (the sizes and the pause are not the model's).
    Defrag(Result<ResponseHeader, Error>),
    /// [`Op::MeasureSpace`]: checked by the harness.
    MeasureSpace,
    /// [`Op::SetFreeSpace`] has no reply.
    SetFreeSpace,
    /// Reply to [`Op::Quota`]: the rows a repair changed, else 0.
    Quota(Result<usize, Error>),
    /// Reply to [`Op::QueueBurst`]: each Put's answer in submission order (a refusal's retry
    /// hint is [`super::queue::HINT_UNKNOWN_MS`]), or None if the burst was not sent.
    QueueBurst(Option<Vec<Result<PutResponse, Error>>>),
}

impl Reply {
    /// Returns true if the reply is a refusal for space (`etcdserver: mvcc: database space
    /// exceeded`).
    pub fn is_no_space(&self) -> bool {
        let err = match self {
            Reply::Put(Err(e)) | Reply::Txn(Err(e)) | Reply::LeaseGrant(Err(e)) => e,
            _ => return false,
        };
        matches!(err, Error::NoSpace)
    }
}

impl Model {
    /// Applies `op` to the model and returns its reply. A grant of id 0 records nothing (see
    /// [`Model::lease_grant`]); the harness calls `lease_grant` itself with the engine's id.
    pub fn apply(&mut self, op: &Op) -> Reply {
        self.clear_other_limit_refusals();
        let reply = self.apply_op(op);
        if !op.is_read() {
            // The operation may have committed: the measurement is stale for the next one.
            self.forget_measurement();
        }
        self.set_space_choice(SpaceChoice::Accept);
        reply
    }

    pub(super) fn apply_op(&mut self, op: &Op) -> Reply {
        match op {
            Op::Put(r) => Reply::Put(self.put(r)),
            Op::DeleteRange(r) => Reply::DeleteRange(self.delete_range(r)),
            Op::Once { id, op } => self.once(id, op),
            Op::Txn(r) => Reply::Txn(self.txn(r)),
            Op::Range(r) => Reply::Range(self.range(r)),
            Op::Compact(r) => Reply::Compact(self.compact(r)),
            Op::Reopen => {
                self.reopen();
                Reply::Reopen
            }
            Op::HashKv(rev) => Reply::HashKv(self.hash_kv(*rev)),
            Op::LeaseGrant(r) => Reply::LeaseGrant(self.lease_grant(r, None)),
            Op::LeaseRevoke(id) => Reply::LeaseRevoke(self.lease_revoke(*id)),
            Op::LeaseKeepAlive(id) => Reply::LeaseKeepAlive(self.lease_keep_alive(*id)),
            Op::LeaseTimeToLive { id, keys } => {
                Reply::LeaseTimeToLive(self.lease_time_to_live(*id, *keys))
            }
            Op::LeaseLeases => Reply::LeaseLeases(self.lease_leases()),
            Op::AdvanceClock(by) => Reply::AdvanceClock(self.advance_clock(*by)),
            Op::Watch { .. } => Reply::Watch,
            Op::SettleWatches => Reply::SettleWatches,
            Op::Alarm(req) => Reply::Alarm(self.alarm(req)),
            Op::Defrag => Reply::Defrag(self.defrag()),
            Op::MeasureSpace => Reply::MeasureSpace,
            Op::SetFreeSpace(free) => {
                self.set_free_space(*free);
                Reply::SetFreeSpace
            }
            Op::Quota(q) => Reply::Quota(self.quota(q)),
            Op::QueueBurst(puts) => Reply::QueueBurst(self.queue_burst(puts)),
        }
    }
}
