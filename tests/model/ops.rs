//! The operations a test sequence is made of, and their replies.

use kvd::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, Error,
    HashKvResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};

use super::state::{Limits, Model};

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
    /// Close the engine and open the same directory again.
    Reopen,
    /// `Engine::hash_kv` at this revision.
    HashKv(i64),
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
}

impl Model {
    /// Applies `op` to the model and returns its reply.
    pub fn apply(&mut self, op: &Op) -> Reply {
        match op {
            Op::Put(r) => Reply::Put(self.put(r)),
            Op::DeleteRange(r) => Reply::DeleteRange(self.delete_range(r)),
            Op::Txn(r) => Reply::Txn(self.txn(r)),
            Op::Range(r) => Reply::Range(self.range(r)),
            Op::Compact(r) => Reply::Compact(self.compact(r)),
            Op::Reopen => Reply::Reopen,
            Op::HashKv(rev) => Reply::HashKv(self.hash_kv(*rev)),
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
