//! The operations a test sequence is made of, and their replies.

use std::time::Duration;

use kvd::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, Error,
    HashKvResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseLeasesResponse, LeaseRevokeResponse, LeaseTimeToLiveResponse, PutRequest, PutResponse,
    RangeRequest, RangeResponse, TxnRequest, TxnResponse, WatchCreateRequest,
};

use super::state::{Limits, Model};

/// Which of the two watch streams of an engine a watch is created on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StreamKind {
    /// Read after every operation: its watches stay synced and get live responses.
    Eager,
    /// Read only at the end of a segment (before a Reopen and at the end): its busy watches
    /// fill their buffers, fall behind and catch up from the history, racing compactions.
    Lazy,
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `Engine::put`.
    Put(PutRequest),
    /// `Engine::delete_range`.
    DeleteRange(DeleteRangeRequest),
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
}

impl Model {
    /// Applies `op` to the model and returns its reply. A grant of id 0 records nothing (see
    /// [`Model::lease_grant`]); the harness calls `lease_grant` itself with the engine's id.
    pub fn apply(&mut self, op: &Op) -> Reply {
        match op {
            Op::Put(r) => Reply::Put(self.put(r)),
            Op::DeleteRange(r) => Reply::DeleteRange(self.delete_range(r)),
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
        }
    }

    /// Returns false if `op` is a txn whose outcome etcd leaves undefined (see
    /// [`Model::txn_defined`]).
    pub fn op_defined(&self, op: &Op) -> bool {
        match op {
            Op::Txn(t) => self.txn_defined(t),
            _ => true,
        }
    }
}
