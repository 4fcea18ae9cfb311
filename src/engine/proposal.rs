//! Typed proposals: what a caller hands the apply thread, and how its answer gets back.
//!
//! A [`Proposal`] pairs one request with the [`Completion`] of that request's own response
//! type, so a caller receives exactly what it asked for. The apply thread turns a proposal
//! and its result into an [`Answer`], which the commit thread delivers once the batch that
//! holds it is durable (APPLY-1).
//!
//! Invariants:
//! - PROP-1: every proposal's completion is called at most once: with the result after the
//!   commit that holds it, or with the storage error if that commit failed. It is dropped
//!   uncalled only if the engine stops before applying it; the callers' own channels then
//!   report `Closed`.
//! - PROP-2: a proposal counts against the prepare queue (`Config::prepare_queue_length`,
//!   `engine::prepare`) from admission until its completion ran.
//!
//! Contact points: `Engine` builds proposals; `engine::apply` consumes them;
//! `engine::commit` delivers the answers.

use crate::accounting::AccountingRequest;
use crate::accounting::{TaskQuery, TaskStatus};
use crate::api::{
    AlarmRequest, AlarmResponse, CompactionRequest, CompactionResponse, DeleteRangeRequest,
    DeleteRangeResponse, LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest,
    LeaseRevokeResponse, PutRequest, PutResponse, RequestOp, TxnRequest, TxnResponse,
    raft_entry_len,
};
use crate::auth::AuthRequest;
use crate::engine::defrag::DefragStep;
use crate::error::{Error, Result};
use crate::operations::Digest;
use crate::operations::digest::digest;
use crate::operations::reconcile::{OperationQuery, OperationStatus};
use crate::space;

/// Receives the result of one write. Called exactly once (PROP-1): on the engine's commit or
/// apply thread, or in the caller's thread for a refusal at admission and for a lone write
/// applied there (APPLY-5). It must not block, and must not wait for another write.
pub type Completion<T> = Box<dyn FnOnce(Result<T>) + Send + 'static>;

/// Any write the apply thread executes, as plain data: the unit of the request-size limit
/// and of the space cost.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteRequest {
    /// A Put.
    Put(PutRequest),
    /// A DeleteRange.
    DeleteRange(DeleteRangeRequest),
    /// A Txn that may write.
    Txn(TxnRequest),
    /// A compaction.
    Compaction(CompactionRequest),
    /// A lease grant.
    LeaseGrant(LeaseGrantRequest),
    /// A lease revoke (from a client or from expiry).
    LeaseRevoke(LeaseRevokeRequest),
    /// An alarm activation or deactivation.
    Alarm(AlarmRequest),
    /// A quota registry or consumption record request.
    Accounting(AccountingRequest),
}

impl WriteRequest {
    /// Returns the size etcd would check against `--max-request-bytes`: the request as
    /// marshalled inside etcd's raft entry (API-2).
    ///
    /// ```
    /// let put = kvd::WriteRequest::Put(kvd::PutRequest::new("big", vec![0u8; 1_572_836]));
    /// assert!(put.encoded_len() <= 1_572_864);
    /// let put = kvd::WriteRequest::Put(kvd::PutRequest::new("big", vec![0u8; 1_572_838]));
    /// assert!(put.encoded_len() > 1_572_864);
    /// ```
    pub fn encoded_len(&self) -> usize {
        raft_entry_len(self.message_len())
    }

    /// Returns the protobuf length of the request's own message (API-2), without the raft
    /// entry around it that [`WriteRequest::encoded_len`] adds.
    pub(crate) fn message_len(&self) -> usize {
        match self {
            WriteRequest::Put(r) => r.encoded_len(),
            WriteRequest::DeleteRange(r) => r.encoded_len(),
            WriteRequest::Txn(r) => r.encoded_len(),
            WriteRequest::Compaction(r) => r.encoded_len(),
            WriteRequest::LeaseGrant(r) => r.encoded_len(),
            WriteRequest::LeaseRevoke(r) => r.encoded_len(),
            WriteRequest::Accounting(r) => r.encoded_len(),
            WriteRequest::Alarm(r) => r.encoded_len(),
        }
    }

    /// Returns etcd's space cost of the request (SPACE-1).
    pub fn cost(&self) -> u64 {
        write_cost(self)
    }
}

/// Returns etcd's space cost of a write (SPACE-1).
///
/// ```
/// use kvd::{PutRequest, WriteRequest};
/// assert_eq!(kvd::write_cost(&WriteRequest::Put(PutRequest::new("ab", "xyz"))), 256 + 2 + 3);
/// ```
pub fn write_cost(request: &WriteRequest) -> u64 {
    match request {
        WriteRequest::Put(p) => space::put_cost(p.key.len(), p.value.len()),
        WriteRequest::Txn(t) => space::txn_cost(t),
        WriteRequest::LeaseGrant(_) => space::LEASE_GRANT_COST_BYTES,
        WriteRequest::DeleteRange(_)
        | WriteRequest::Compaction(_)
        | WriteRequest::LeaseRevoke(_)
        | WriteRequest::Alarm(_)
        | WriteRequest::Accounting(_) => 0,
    }
}

/// A write with the completion of its own response type, or a defrag step.
pub enum Proposal {
    /// A Put.
    Put(PutRequest, Completion<PutResponse>),
    /// A DeleteRange.
    DeleteRange(DeleteRangeRequest, Completion<DeleteRangeResponse>),
    /// A Txn that may write.
    Txn(TxnRequest, Completion<TxnResponse>),
    /// A compaction.
    Compaction(CompactionRequest, Completion<CompactionResponse>),
    /// A lease grant.
    LeaseGrant(LeaseGrantRequest, Completion<LeaseGrantResponse>),
    /// A lease revoke, from a client or from expiry.
    LeaseRevoke(LeaseRevokeRequest, Completion<LeaseRevokeResponse>),
    /// An alarm activation or deactivation.
    Alarm(AlarmRequest, Completion<AlarmResponse>),
    /// A quota registry or consumption record request; answers the rows a repair changed.
    Accounting(AccountingRequest, Completion<usize>),
    /// A change to the auth store; answers the auth revision after it.
    Auth(AuthRequest, Completion<u64>),
    /// A step of a defrag, run between two batches.
    Defrag(DefragStep),
    /// A write that carries an operation id (exactly-once, OPER-2).
    Identified(Box<Identified>),
    /// A reconciliation, answered in apply order so it sees every write before it.
    Reconcile(ReconcileRequest, Completion<ReconcileAnswer>),
    /// A write checked against the auth store in apply order (PERM-4).
    Authorized(Box<Authorized>),
}

/// A write with the caller it is checked as when applied (PERM-4).
pub struct Authorized {
    /// The caller's user name; `None`: the request presented no identity.
    pub caller: Option<String>,
    /// The write itself; never a defrag step or a reconciliation.
    pub inner: Proposal,
}

/// A write with its operation id and its request's digest.
pub struct Identified {
    /// The operation id.
    pub id: String,
    /// The request's digest (DIGEST-1).
    pub digest: Digest,
    /// The write itself; never itself `Identified`, a defrag step or a reconciliation.
    pub inner: Proposal,
}

/// A reconciliation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileRequest {
    /// RECONCILE_OPERATIONS: the named operations, or every retained one whose id starts
    /// with `prefix` when `queries` is empty.
    Operations {
        /// The operations asked about.
        queries: Vec<OperationQuery>,
        /// For an implicit query, the id prefix.
        prefix: String,
    },
    /// RECONCILE over the allocations: the named ones, or every live one when empty.
    Tasks {
        /// The tasks asked about.
        tasks: Vec<TaskQuery>,
        /// The scheduler is partition-aware.
        partition_aware: bool,
    },
}

/// A reconciliation's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileAnswer {
    /// One status per operation.
    Operations(Vec<OperationStatus>),
    /// One status per task (none for Mesos's branch 2).
    Tasks(Vec<TaskStatus>),
}

impl std::fmt::Debug for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proposal::Put(r, _) => f.debug_tuple("Put").field(r).finish(),
            Proposal::DeleteRange(r, _) => f.debug_tuple("DeleteRange").field(r).finish(),
            Proposal::Txn(r, _) => f.debug_tuple("Txn").field(r).finish(),
            Proposal::Compaction(r, _) => f.debug_tuple("Compaction").field(r).finish(),
            Proposal::LeaseGrant(r, _) => f.debug_tuple("LeaseGrant").field(r).finish(),
            Proposal::LeaseRevoke(r, _) => f.debug_tuple("LeaseRevoke").field(r).finish(),
            Proposal::Alarm(r, _) => f.debug_tuple("Alarm").field(r).finish(),
            Proposal::Accounting(r, _) => f.debug_tuple("Accounting").field(r).finish(),
            Proposal::Auth(r, _) => f.debug_tuple("Auth").field(r).finish(),
            Proposal::Defrag(step) => f.debug_tuple("Defrag").field(step).finish(),
            Proposal::Identified(op) => f
                .debug_struct("Identified")
                .field("id", &op.id)
                .field("inner", &op.inner)
                .finish(),
            Proposal::Reconcile(r, _) => f.debug_tuple("Reconcile").field(r).finish(),
            Proposal::Authorized(a) => f
                .debug_struct("Authorized")
                .field("caller", &a.caller)
                .field("inner", &a.inner)
                .finish(),
        }
    }
}

impl Proposal {
    /// Answers the proposal with `error` without applying it (PROP-1).
    pub fn refuse(self, error: Error) {
        if let Some(answer) = self.refusal(error) {
            answer.deliver();
        }
    }

    /// Returns the refusal `error` as an answer, for apply to deliver with the batch (after
    /// the commit of the writes before it, like every answer of apply) or [`Proposal::refuse`]
    /// at once; `None` for a defrag step, which has no completion.
    pub fn refusal(self, error: Error) -> Option<Answer> {
        Some(match self {
            Proposal::Put(_, done) => Answer::new(done, Err(error)),
            Proposal::DeleteRange(_, done) => Answer::new(done, Err(error)),
            Proposal::Txn(_, done) => Answer::new(done, Err(error)),
            Proposal::Compaction(_, done) => Answer::new(done, Err(error)),
            Proposal::LeaseGrant(_, done) => Answer::new(done, Err(error)),
            Proposal::LeaseRevoke(_, done) => Answer::new(done, Err(error)),
            Proposal::Alarm(_, done) => Answer::new(done, Err(error)),
            Proposal::Accounting(_, done) => Answer::new(done, Err(error)),
            Proposal::Reconcile(_, done) => Answer::new(done, Err(error)),
            Proposal::Auth(_, done) => Answer::new(done, Err(error)),
            Proposal::Identified(op) => return op.inner.refusal(error),
            Proposal::Authorized(op) => return op.inner.refusal(error),
            // The defrag caller waits on its own reply channel, which sees the drop.
            Proposal::Defrag(_) => return None,
        })
    }

    /// Returns the digest of the write (DIGEST-1), or `None` for what cannot carry an
    /// operation id (alarms, defrag steps, reconciliations).
    pub fn digest(&self) -> Option<Digest> {
        Some(match self {
            // The caller is not part of the request: a retry may come from another login.
            Proposal::Authorized(a) => return a.inner.digest(),
            Proposal::Put(r, _) => digest("put", r),
            Proposal::DeleteRange(r, _) => digest("delete_range", r),
            Proposal::Txn(r, _) => digest("txn", r),
            Proposal::Compaction(r, _) => digest("compaction", r),
            Proposal::LeaseGrant(r, _) => digest("lease_grant", r),
            Proposal::LeaseRevoke(r, _) => digest("lease_revoke", r),
            Proposal::Accounting(r, _) => digest("accounting", r),
            Proposal::Alarm(..)
            | Proposal::Auth(..)
            | Proposal::Defrag(_)
            | Proposal::Identified(_)
            | Proposal::Reconcile(..) => return None,
        })
    }

    /// Returns the proposal with its completion wrapped so that it holds `slot` (a prepare
    /// queue slot, PROP-2, or a pending operation's mark) until it ran.
    pub fn holding<G: Send + 'static>(self, slot: G) -> Proposal {
        match self {
            Proposal::Put(r, done) => Proposal::Put(r, holding(slot, done)),
            Proposal::DeleteRange(r, done) => Proposal::DeleteRange(r, holding(slot, done)),
            Proposal::Txn(r, done) => Proposal::Txn(r, holding(slot, done)),
            Proposal::Compaction(r, done) => Proposal::Compaction(r, holding(slot, done)),
            Proposal::LeaseGrant(r, done) => Proposal::LeaseGrant(r, holding(slot, done)),
            Proposal::LeaseRevoke(r, done) => Proposal::LeaseRevoke(r, holding(slot, done)),
            Proposal::Alarm(r, done) => Proposal::Alarm(r, holding(slot, done)),
            Proposal::Accounting(r, done) => Proposal::Accounting(r, holding(slot, done)),
            Proposal::Auth(r, done) => Proposal::Auth(r, holding(slot, done)),
            Proposal::Defrag(step) => Proposal::Defrag(step),
            Proposal::Identified(mut op) => {
                op.inner = op.inner.holding(slot);
                Proposal::Identified(op)
            }
            Proposal::Reconcile(r, done) => Proposal::Reconcile(r, holding(slot, done)),
            Proposal::Authorized(mut a) => {
                a.inner = a.inner.holding(slot);
                Proposal::Authorized(a)
            }
        }
    }

    /// Returns the size etcd would check against `--max-request-bytes` (API-2), as
    /// [`WriteRequest::encoded_len`] does; 0 for a defrag step.
    pub fn encoded_len(&self) -> usize {
        let inner = match self {
            Proposal::Put(r, _) => r.encoded_len(),
            Proposal::DeleteRange(r, _) => r.encoded_len(),
            Proposal::Txn(r, _) => r.encoded_len(),
            Proposal::Compaction(r, _) => r.encoded_len(),
            Proposal::LeaseGrant(r, _) => r.encoded_len(),
            Proposal::LeaseRevoke(r, _) => r.encoded_len(),
            Proposal::Alarm(r, _) => r.encoded_len(),
            Proposal::Accounting(r, _) => r.encoded_len(),
            Proposal::Auth(r, _) => r.encoded_len(),
            Proposal::Reconcile(ReconcileRequest::Operations { queries, prefix }, _) => {
                prefix.len()
                    + queries
                        .iter()
                        .map(|q| q.operation_id.len() + q.agent_id.as_ref().map_or(0, String::len))
                        .sum::<usize>()
            }
            Proposal::Reconcile(ReconcileRequest::Tasks { tasks, .. }, _) => tasks
                .iter()
                .map(|t| t.task_id.len() + t.agent_id.as_ref().map_or(0, String::len))
                .sum(),
            // The id travels beside the request (metadata), not in it.
            Proposal::Identified(op) => return op.inner.encoded_len(),
            Proposal::Authorized(a) => return a.inner.encoded_len(),
            Proposal::Defrag(_) => return 0,
        };
        raft_entry_len(inner)
    }

    /// Returns etcd's space cost of the write (SPACE-1); 0 for a defrag step.
    pub fn cost(&self) -> u64 {
        match self {
            Proposal::Put(p, _) => space::put_cost(p.key.len(), p.value.len()),
            Proposal::Txn(t, _) => space::txn_cost(t),
            Proposal::LeaseGrant(..) => space::LEASE_GRANT_COST_BYTES,
            Proposal::Identified(op) => op.inner.cost(),
            Proposal::Authorized(a) => a.inner.cost(),
            Proposal::DeleteRange(..)
            | Proposal::Compaction(..)
            | Proposal::LeaseRevoke(..)
            | Proposal::Alarm(..)
            | Proposal::Accounting(..)
            | Proposal::Auth(..)
            | Proposal::Defrag(_)
            | Proposal::Reconcile(..) => 0,
        }
    }

    /// Returns the first key the write would write, whose owner the write's prepare-queue
    /// slot is charged to (PREP-2): a Put's or DeleteRange's key, a Txn's first written key
    /// (success branch first, nested Txns in order); `None` for writes without a key.
    pub fn first_written_key(&self) -> Option<&[u8]> {
        match self {
            Proposal::Put(p, _) => Some(&p.key),
            Proposal::DeleteRange(d, _) => Some(&d.key),
            Proposal::Txn(t, _) => first_written_in(t),
            Proposal::Identified(op) => op.inner.first_written_key(),
            Proposal::Authorized(a) => a.inner.first_written_key(),
            _ => None,
        }
    }

    /// Returns true for a compaction, which starts a batch of its own (APPLY-2).
    pub fn is_compaction(&self) -> bool {
        match self {
            Proposal::Compaction(..) => true,
            Proposal::Identified(op) => op.inner.is_compaction(),
            Proposal::Authorized(a) => a.inner.is_compaction(),
            _ => false,
        }
    }

    /// True if the proposal may be applied in its caller's thread (APPLY-5): anything but
    /// a compaction and a defrag step, which need a barrier first (APPLY-2).
    pub fn may_apply_inline(&self) -> bool {
        !self.is_compaction() && !matches!(self, Proposal::Defrag(_))
    }
}

/// A result waiting for the commit that holds it, with the completion it goes to.
pub struct Answer(Box<dyn Deliver>);

trait Deliver: Send {
    fn deliver(self: Box<Self>);
    fn fail(self: Box<Self>, error: Error);
}

struct Ready<T> {
    done: Completion<T>,
    result: Result<T>,
}

impl<T: Send + 'static> Deliver for Ready<T> {
    fn deliver(self: Box<Self>) {
        (self.done)(self.result);
    }

    fn fail(self: Box<Self>, error: Error) {
        (self.done)(Err(error));
    }
}

impl Answer {
    /// Returns the answer `result` for `done`, to deliver after the commit.
    pub fn new<T: Send + 'static>(done: Completion<T>, result: Result<T>) -> Answer {
        Answer(Box::new(Ready { done, result }))
    }

    /// Hands the result to its completion: the commit that holds it returned.
    pub fn deliver(self) {
        self.0.deliver();
    }

    /// Hands `error` to the completion instead: the commit failed (APPLY-1).
    pub fn fail(self, error: Error) {
        self.0.fail(error);
    }
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Answer")
    }
}

pub(crate) fn first_written_in(txn: &TxnRequest) -> Option<&[u8]> {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            RequestOp::Put(p) => Some(&p.key[..]),
            RequestOp::DeleteRange(d) => Some(&d.key[..]),
            RequestOp::Txn(t) => first_written_in(t),
            RequestOp::Range(_) => None,
        })
}

/// Wraps `done` so that the write holds `slot` until its completion ran (PROP-2).
fn holding<T: 'static, G: Send + 'static>(slot: G, done: Completion<T>) -> Completion<T> {
    Box::new(move |result| {
        drop(slot);
        done(result);
    })
}

#[cfg(test)]
mod tests {
    use super::{WriteRequest, write_cost as cost};
    use crate::api::{
        DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    };

    fn put(key: &str, value: &str) -> RequestOp {
        RequestOp::Put(PutRequest::new(key.to_owned(), value.to_owned()))
    }

    #[test]
    fn cost_model_matches_etcds_formula() {
        let txn = |success, failure| {
            WriteRequest::Txn(TxnRequest {
                compare: vec![],
                success,
                failure,
            })
        };
        let cases: Vec<(&str, WriteRequest, u64)> = vec![
            (
                "put",
                WriteRequest::Put(PutRequest::new("k", "vv")),
                256 + 1 + 2,
            ),
            (
                "empty put",
                WriteRequest::Put(PutRequest::new("k", "")),
                257,
            ),
            (
                "delete",
                WriteRequest::DeleteRange(DeleteRangeRequest::key("k")),
                0,
            ),
            (
                "lease grant",
                WriteRequest::LeaseGrant(LeaseGrantRequest { ttl: 5, id: 0 }),
                64,
            ),
            (
                "larger branch",
                txn(vec![put("a", "1"), put("b", "2")], vec![put("c", "12345")]),
                2 * 258,
            ),
            (
                "failure larger",
                txn(vec![put("a", "1")], vec![put("c", "1234567890")]),
                267,
            ),
            (
                "reads and deletes are free",
                txn(
                    vec![
                        RequestOp::Range(RangeRequest::key("a")),
                        RequestOp::DeleteRange(DeleteRangeRequest::key("a")),
                    ],
                    vec![],
                ),
                0,
            ),
            (
                "nested txns count (etcd 3.6.14)",
                txn(
                    vec![RequestOp::Txn(TxnRequest {
                        compare: vec![],
                        success: vec![put("n", "1")],
                        failure: vec![put("n", "1234")],
                    })],
                    vec![],
                ),
                256 + 1 + 4,
            ),
        ];
        for (name, request, want) in cases {
            assert_eq!(cost(&request), want, "{name}");
        }
    }
}
