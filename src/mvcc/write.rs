//! Writes: Put, DeleteRange and Txn applied to the index and to one storage write batch,
//! with etcd's revision rules.
//!
//! A [`TxnWriter`] is one write request: every change it makes is at main revision
//! `begin + 1`, with `sub` counting changes in order; the request moves the revision only if
//! it changed something.
//!
//! Invariants:
//! - WRITE-1: changes of one request share one main revision and have consecutive subs from
//!   0, in execution order (DeleteRange: ascending key order).
//! - WRITE-2: every fallible check of a request (ignore flags, Txn range revisions) runs
//!   before its first change, so a refused request changes nothing; an error after the first
//!   change can only come from storage, which poisons the batch.
//! - WRITE-3: all compares of a Txn, nested ones on the chosen branches included, are
//!   evaluated against the state at `begin`, before any op runs (etcd).
//! - WRITE-4: an `ignore_value` or `ignore_lease` Put of a Txn needs its key when it runs,
//!   not only at `begin`: one whose key a from-key DeleteRange (`range_end == "\0"`) of the
//!   same Txn removes before it is refused with `key not found`, before any change. etcd's
//!   duplicate-key check lets that pair through (the `"\0"` quirk) and etcd then panics at
//!   apply; kvd refuses the Txn instead.
//!
//! Contact points: the engine's apply thread creates one per write request.

use bytes::Bytes;

use super::Revision;
use super::index::{Hit, Index, KeyRange, Probed};
use super::read::{self, Records};
use super::record::{self, Record};
use crate::api::{
    DeleteRangeRequest, DeleteRangeResponse, KeyValue, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use crate::error::{Error, StorageError};
use crate::storage::WriteBatch;

/// The newest revision the index holds, for reads inside the apply thread.
const NEWEST: i64 = i64::MAX;

/// One change a write request made, in order: what watchers and the lessor need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A Put: the full new key-value.
    Put(KeyValue),
    /// A delete: the key and the deletion's main revision only (etcd's delete event).
    Delete(KeyValue),
}

impl Change {
    /// Returns the changed key-value.
    pub fn kv(&self) -> &KeyValue {
        match self {
            Change::Put(kv) | Change::Delete(kv) => kv,
        }
    }
}

/// What the index holds for a Put's key, looked up once per Put ([`TxnWriter::probe_put`]).
#[derive(Debug, Clone, Copy)]
pub struct PutProbe {
    prev: Option<Hit>,
    probed: Probed,
}

/// One write request being applied.
pub struct TxnWriter<'a, 't> {
    index: &'a mut Index,
    batch: &'a mut WriteBatch<'t>,
    lease_exists: &'a dyn Fn(i64) -> bool,
    begin: i64,
    changes: i64,
    log: Vec<Change>,
}

/// The branches a Txn takes, decided before any op runs (WRITE-3).
#[derive(Debug, Clone)]
pub struct TxnPath {
    succeeded: bool,
    /// One path per nested Txn op of the chosen branch, in order.
    nested: Vec<TxnPath>,
}

impl<'a, 't> TxnWriter<'a, 't> {
    /// Returns a writer for a request applied on top of revision `begin`.
    pub fn new(
        index: &'a mut Index,
        batch: &'a mut WriteBatch<'t>,
        lease_exists: &'a dyn Fn(i64) -> bool,
        begin: i64,
    ) -> Self {
        TxnWriter {
            index,
            batch,
            lease_exists,
            begin,
            changes: 0,
            log: Vec::new(),
        }
    }

    /// Returns the changes made, in order (WRITE-1).
    pub fn into_changes(self) -> Vec<Change> {
        self.log
    }

    /// Returns true if the request changed anything.
    pub fn changed(&self) -> bool {
        self.changes > 0
    }

    /// Returns the revision this request's reads see and its responses report.
    pub fn revision(&self) -> i64 {
        if self.changed() {
            self.begin + 1
        } else {
            self.begin
        }
    }

    fn next_revision(&mut self) -> Revision {
        let rev = Revision::new(self.begin + 1, self.changes);
        self.changes += 1;
        rev
    }

    /// Checks a standalone Put against the current state (WRITE-2): the lease first, then
    /// the key the ignore flags need (etcd's order for a plain Put).
    pub fn check_put(&self, req: &PutRequest) -> Result<(), Error> {
        self.check_put_lease(req)?;
        self.check_put_key(req)
    }

    /// Checks a Put inside a Txn: the key the ignore flags need, then the lease (etcd's
    /// order for txn ops). `deleted_from` is the lowest start of the from-key deletes
    /// (`range_end == "\0"`) the Txn runs before this Put: a key at or above it is gone by
    /// the time the Put runs (WRITE-4).
    fn check_txn_put(&self, req: &PutRequest, deleted_from: Option<&[u8]>) -> Result<(), Error> {
        if (req.ignore_value || req.ignore_lease)
            && deleted_from.is_some_and(|start| req.key.as_ref() >= start)
        {
            return Err(Error::KeyNotFound);
        }
        self.check_put_key(req)?;
        self.check_put_lease(req)
    }

    fn check_put_key(&self, req: &PutRequest) -> Result<(), Error> {
        if (req.ignore_value || req.ignore_lease) && self.index.get(&req.key, self.begin).is_none()
        {
            return Err(Error::KeyNotFound);
        }
        Ok(())
    }

    fn check_put_lease(&self, req: &PutRequest) -> Result<(), Error> {
        if req.lease != 0 && !(self.lease_exists)(req.lease) {
            return Err(Error::LeaseNotFound);
        }
        Ok(())
    }

    /// Looks `req`'s key up in the index, once for both [`TxnWriter::planned_put_probed`]
    /// and [`TxnWriter::put_probed`].
    pub fn probe_put(&self, req: &PutRequest) -> PutProbe {
        let (prev, probed) = self.index.probe(&req.key, NEWEST);
        PutProbe { prev, probed }
    }

    /// Returns the Puts `req` would make, as (key, cost, new key), for the quota check
    /// before anything changes (ACCT-4). The cost is etcd's, with the value the Put will
    /// really store (the current one under `ignore_value`).
    pub fn planned_put(&self, req: &PutRequest) -> Result<(Vec<u8>, u32, bool), StorageError> {
        self.planned_put_probed(req, &self.probe_put(req))
    }

    /// [`TxnWriter::planned_put`] with the index's answer `probe` already taken.
    pub fn planned_put_probed(
        &self,
        req: &PutRequest,
        probe: &PutProbe,
    ) -> Result<(Vec<u8>, u32, bool), StorageError> {
        let prev = probe.prev;
        let value_len = match prev {
            Some(hit) if req.ignore_value => self.batch.record(hit.revision)?.value.len(),
            _ => req.value.len(),
        };
        Ok((
            req.key.to_vec(),
            record::put_cost(req.key.len(), value_len),
            prev.is_none(),
        ))
    }

    /// Returns the Puts of the branches `path` chose, nested ones included (ACCT-4). A key
    /// deleted earlier in the txn and put again counts as not new: the check may refuse a
    /// txn that would just fit, never admit one that does not.
    pub fn planned_txn_puts(
        &self,
        req: &TxnRequest,
        path: &TxnPath,
    ) -> Result<Vec<(Vec<u8>, u32, bool)>, StorageError> {
        let branch = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut nested = path.nested.iter();
        let mut puts = Vec::new();
        for op in branch {
            match op {
                RequestOp::Put(p) => puts.push(self.planned_put(p)?),
                RequestOp::Txn(t) => {
                    if let Some(p) = nested.next() {
                        puts.extend(self.planned_txn_puts(t, p)?);
                    }
                }
                RequestOp::Range(_) | RequestOp::DeleteRange(_) => {}
            }
        }
        Ok(puts)
    }

    /// Applies a Put whose checks passed.
    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, StorageError> {
        let probe = self.probe_put(req);
        self.put_probed(req, probe)
    }

    /// [`TxnWriter::put`] with the index's answer `probe` already taken, with nothing
    /// changed in the index since.
    pub fn put_probed(
        &mut self,
        req: &PutRequest,
        probe: PutProbe,
    ) -> Result<PutResponse, StorageError> {
        let PutProbe { prev, probed } = probe;
        let needs_prev = req.prev_kv || req.ignore_value || req.ignore_lease;
        let prev_kv = match prev {
            Some(hit) if needs_prev => Some(
                self.batch
                    .record(hit.revision)?
                    .into_key_value(hit.revision.main),
            ),
            _ => None,
        };
        let rev = self.next_revision();
        let (create_revision, version) = match prev {
            Some(hit) => (hit.created, hit.version + 1),
            None => (rev.main, 1),
        };
        let value = match (&prev_kv, req.ignore_value) {
            (Some(kv), true) => kv.value.clone(),
            _ => req.value.clone(),
        };
        let lease = match (&prev_kv, req.ignore_lease) {
            (Some(kv), true) => kv.lease,
            _ => req.lease,
        };
        let record = Record {
            key: req.key.clone(),
            tombstone: false,
            create_revision,
            version,
            lease,
            value,
        };
        self.batch
            .put_history_encoded(&rev.to_key(), |out| record.encode_into(&rev.to_key(), out))?;
        self.index.put_probed(
            &req.key,
            rev,
            record::put_cost(record.key.len(), record.value.len()),
            probed,
        );
        self.log.push(Change::Put(record.into_key_value(rev.main)));
        Ok(PutResponse {
            header: ResponseHeader {
                revision: self.revision(),
            },
            prev_kv: if req.prev_kv { prev_kv } else { None },
        })
    }

    /// Applies a DeleteRange.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, StorageError> {
        let doomed = self
            .index
            .range_keys(KeyRange::new(&req.key, &req.range_end), NEWEST);
        let mut prev_kvs = Vec::new();
        for (key, hit) in &doomed {
            if req.prev_kv {
                prev_kvs.push(
                    self.batch
                        .record(hit.revision)?
                        .into_key_value(hit.revision.main),
                );
            }
            let rev = self.next_revision();
            let record = Record::tombstone(Bytes::copy_from_slice(key));
            self.batch
                .put_history_encoded(&rev.to_key(), |out| record.encode_into(&rev.to_key(), out))?;
            let alive = self.index.tombstone(key, rev);
            debug_assert!(alive, "the index listed a dead key as alive");
            self.log.push(Change::Delete(KeyValue {
                key: record.key,
                mod_revision: rev.main,
                ..KeyValue::default()
            }));
        }
        Ok(DeleteRangeResponse {
            header: ResponseHeader {
                revision: self.revision(),
            },
            deleted: doomed.len() as i64,
            prev_kvs,
        })
    }

    /// Applies a Range inside a write request: it sees the request's own earlier writes.
    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, Error> {
        let view = self.revision();
        let at = read::read_revision(req.revision, view, self.index.compact_revision)?;
        let plan = read::plan_range(self.index, req, at);
        Ok(read::finish_range(plan, &*self.batch, req, view)?)
    }

    /// Decides every branch of `req` against the state at `begin` (WRITE-3).
    pub fn txn_path(&self, req: &TxnRequest) -> Result<TxnPath, StorageError> {
        let (succeeded, branch) = read::txn_branch(self.index, &*self.batch, req, self.begin)?;
        let mut nested = Vec::new();
        for op in branch {
            if let RequestOp::Txn(t) = op {
                nested.push(self.txn_path(t)?);
            }
        }
        Ok(TxnPath { succeeded, nested })
    }

    /// Runs etcd's apply-time checks on the chosen branches: Puts first (for txns that
    /// write), then Ranges (WRITE-2).
    pub fn check_txn(&self, req: &TxnRequest, path: &TxnPath) -> Result<(), Error> {
        if !req.is_read_only() {
            let mut deleted_from: Option<&[u8]> = None;
            self.check_branch(req, path, &mut |w, op| match op {
                RequestOp::Put(p) => w.check_txn_put(p, deleted_from),
                RequestOp::DeleteRange(d) if d.range_end.as_ref() == b"\0" => {
                    let start = d.key.as_ref();
                    deleted_from = Some(deleted_from.map_or(start, |s| s.min(start)));
                    Ok(())
                }
                _ => Ok(()),
            })?;
        }
        self.check_branch(req, path, &mut |w, op| match op {
            RequestOp::Range(r) => w.check_txn_range(r),
            _ => Ok(()),
        })
    }

    /// Calls `check` on every op of the branches `path` chose, nested ones included, in the
    /// order the Txn runs them.
    fn check_branch<'r>(
        &self,
        req: &'r TxnRequest,
        path: &TxnPath,
        check: &mut dyn FnMut(&Self, &'r RequestOp) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let branch = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut nested = path.nested.iter();
        for op in branch {
            check(self, op)?;
            if let RequestOp::Txn(t) = op {
                // One path per nested Txn op, in order: only Txn ops consume one.
                let Some(p) = nested.next() else {
                    return Err(Error::InvalidArgument("txn path does not match".into()));
                };
                self.check_branch(t, p, check)?;
            }
        }
        Ok(())
    }

    /// etcd's checkRange: an explicit revision must not be in the future nor below the
    /// compaction revision; unlike a standalone Range a negative one is not "current".
    fn check_txn_range(&self, req: &RangeRequest) -> Result<(), Error> {
        read::check_txn_range_revision(req.revision, self.begin, self.index.compact_revision)
    }

    /// Executes the branches `path` chose. Checks must have passed.
    pub fn txn(&mut self, req: &TxnRequest, path: &TxnPath) -> Result<TxnResponse, Error> {
        let branch = if path.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            let response = match op {
                RequestOp::Range(r) => ResponseOp::Range(self.range(r)?),
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete_range(d)?),
                RequestOp::Txn(t) => {
                    let Some(p) = nested.next() else {
                        return Err(Error::InvalidArgument("txn path does not match".into()));
                    };
                    let mut inner = self.txn(t, p)?;
                    // etcd leaves a nested txn's header all zero.
                    inner.header = ResponseHeader::default();
                    ResponseOp::Txn(inner)
                }
            };
            responses.push(response);
        }
        Ok(TxnResponse {
            header: ResponseHeader {
                revision: self.revision(),
            },
            succeeded: path.succeeded,
            responses,
        })
    }
}
