//! Reads: Range (limit, count, sort, filters) and Txn compares, over the index and a
//! source of history records.
//!
//! Invariants:
//! - READ-1: a Range is computed from one index state and one record source, so it shows one
//!   revision; `count` is the number of keys alive at that revision before filters and
//!   limit (etcd).
//! - READ-2: when neither a sort order nor a filter is asked for and `limit > 0`, only the
//!   first `limit + 1` keys are fetched (etcd's quirk: a sort target without an order sorts
//!   only those).
//! - READ-3: a Range returns the same records whether it looks each one up or scans the
//!   history between the lowest and highest revision it needs (it scans when it needs at
//!   least `RANGE_SCAN_RECORDS_MIN` records spread over at most `RANGE_SCAN_SPREAD_MAX` times
//!   as many main revisions); a record the index names but storage lacks is `Corrupted`
//!   either way.
//!
//! Contact points: the engine's read path (index read lock, then a storage snapshot) and
//! `mvcc::write` (a Range inside a Txn reads the batch being written).

use std::cmp::Ordering;

use super::Revision;
use super::index::{Hit, Index, KeyRange};
use super::record::{Decoder, Record};
use super::wire;
use crate::api::{
    Compare, CompareResult, CompareTarget, KeyValue, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, SortOrder, SortTarget, TxnRequest, TxnResponse,
};
use crate::error::{Error, Result, StorageError};
use crate::storage::{RevisionKey, Snapshot, WriteBatch};

/// A Range fetching at least this many records may scan the history instead of looking each
/// record up (READ-3).
pub const RANGE_SCAN_RECORDS_MIN: usize = 64;
/// ... if the records it needs are at least one in this many of the main revisions between
/// the lowest and the highest of them.
pub const RANGE_SCAN_SPREAD_MAX: usize = 4;

/// A source of history records by revision.
pub trait Records {
    /// Returns the decoded record at `rev`, or `None` if absent.
    fn get(&self, rev: Revision) -> Result<Option<Record>, StorageError>;

    /// Returns the decoded records at `revs`, in that order; a missing one is corruption.
    fn records(&self, revs: &[Revision]) -> Result<Vec<Record>, StorageError> {
        revs.iter().map(|rev| self.record(*rev)).collect()
    }

    /// Returns the decoded record at `rev`; a record the index names but storage lacks is
    /// corruption.
    fn record(&self, rev: Revision) -> Result<Record, StorageError> {
        self.get(rev)?.ok_or_else(|| missing(rev))
    }
}

impl Records for Snapshot {
    fn get(&self, rev: Revision) -> Result<Option<Record>, StorageError> {
        let key = rev.to_key();
        self.decode_history(&key, |bytes| Record::decode(&key, bytes))
    }

    /// READ-3: many records close together in revision order are read in one ordered scan
    /// of the history (one B-tree descent, then leaf to leaf) rather than one lookup each.
    /// Either way they are decoded into shared buffers (REC-3).
    fn records(&self, revs: &[Revision]) -> Result<Vec<Record>, StorageError> {
        let mut decoder = Decoder::with_capacity(revs.len());
        // The position in `revs` of each record pushed, in the order visited.
        let mut pushed = Vec::with_capacity(revs.len());
        visit_records(self, revs, |at, key, bytes| {
            pushed.push(at);
            decoder.push(key, bytes)
        })?;
        let records = decoder.finish();
        if pushed.iter().enumerate().all(|(i, &at)| i == at) {
            return Ok(records);
        }
        let mut found: Vec<Option<Record>> = vec![None; revs.len()];
        for (record, at) in records.into_iter().zip(pushed) {
            found[at] = Some(record);
        }
        // visit_records visited every position once.
        Ok(found.into_iter().flatten().collect())
    }
}

/// Calls `visit(i, bytes)` with the stored bytes of the record at `revs[i]`, once for every
/// `i`: in `revs`' order when it looks each record up, in revision order when it scans
/// (READ-3). A record the index names but storage lacks is `Corrupted`.
fn visit_records(
    snapshot: &Snapshot,
    revs: &[Revision],
    mut visit: impl FnMut(usize, &RevisionKey, &[u8]) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let mut order: Vec<usize> = (0..revs.len()).collect();
    order.sort_unstable_by_key(|&i| revs[i]);
    let (Some(&first), Some(&last)) = (order.first(), order.last()) else {
        return Ok(());
    };
    let (low, high) = (revs[first], revs[last]);
    let spread = usize::try_from(high.main - low.main + 1).unwrap_or(usize::MAX);
    if revs.len() < RANGE_SCAN_RECORDS_MIN
        || spread > revs.len().saturating_mul(RANGE_SCAN_SPREAD_MAX)
    {
        for (at, rev) in revs.iter().enumerate() {
            let key = rev.to_key();
            snapshot
                .decode_history(&key, |bytes| visit(at, &key, bytes))?
                .ok_or_else(|| missing(*rev))?;
        }
        return Ok(());
    }
    let mut visited = vec![false; revs.len()];
    let mut next = 0;
    snapshot.scan_history(low.to_key()..=high.to_key(), usize::MAX, |key, value| {
        let rev = Revision::from_key(key);
        while next < order.len() && revs[order[next]] < rev {
            // Named by the index but not stored: reported below as corruption.
            next += 1;
        }
        if next < order.len() && revs[order[next]] == rev {
            visit(order[next], key, value)?;
            visited[order[next]] = true;
            next += 1;
        }
        Ok(next < order.len())
    })?;
    match visited.iter().position(|seen| !seen) {
        Some(at) => Err(missing(revs[at])),
        None => Ok(()),
    }
}

fn missing(rev: Revision) -> StorageError {
    StorageError::Corrupted(format!(
        "history record ({}, {}) named by the index is missing",
        rev.main, rev.sub
    ))
}

impl Records for WriteBatch<'_> {
    fn get(&self, rev: Revision) -> Result<Option<Record>, StorageError> {
        let key = rev.to_key();
        self.decode_history(&key, |bytes| Record::decode(&key, bytes))
    }
}

/// The index half of a Range: which revisions to fetch, and the count.
#[derive(Debug, Clone)]
pub struct RangePlan {
    hits: Vec<Hit>,
    count: i64,
}

/// Returns the revision a Range reads at, given the current revision and the compaction
/// revision; future is checked before compacted (etcd).
pub fn read_revision(asked: i64, current: i64, compacted: i64) -> Result<i64, Error> {
    if asked > current {
        return Err(Error::FutureRevision);
    }
    let at = if asked <= 0 { current } else { asked };
    if at < compacted {
        return Err(Error::Compacted);
    }
    Ok(at)
}

/// etcd's checkRange, run on a Txn's Range ops before the Txn does anything: an explicit
/// revision must not be above `current` nor below `compacted`; unlike a standalone Range, a
/// negative revision is not "current" (etcd's quirk).
pub fn check_txn_range_revision(revision: i64, current: i64, compacted: i64) -> Result<(), Error> {
    if revision == 0 {
        return Ok(());
    }
    if revision > current {
        return Err(Error::FutureRevision);
    }
    if revision < compacted {
        return Err(Error::Compacted);
    }
    Ok(())
}

/// Returns the index half of `req` at main revision `at` (READ-2).
pub fn plan_range(index: &Index, req: &RangeRequest, at: i64) -> RangePlan {
    let mut hits = index.range(KeyRange::new(&req.key, &req.range_end), at);
    let count = hits.len() as i64;
    if req.count_only {
        hits.clear();
    } else if !fetches_all(req) && req.limit > 0 {
        let wanted = usize::try_from(req.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        hits.truncate(wanted);
    }
    RangePlan { hits, count }
}

impl RangePlan {
    /// The number of records the plan reads.
    pub fn records(&self) -> usize {
        self.hits.len()
    }
}

fn fetches_all(req: &RangeRequest) -> bool {
    req.sort_order != SortOrder::None
        || req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

/// Fetches the planned records and applies filters, sort, limit and `keys_only`.
pub fn finish_range(
    plan: RangePlan,
    records: &impl Records,
    req: &RangeRequest,
    header_revision: i64,
) -> Result<RangeResponse, StorageError> {
    let revs: Vec<Revision> = plan.hits.iter().map(|hit| hit.revision).collect();
    let mut kvs: Vec<KeyValue> = records
        .records(&revs)?
        .into_iter()
        .zip(&revs)
        .map(|(record, rev)| record.into_key_value(rev.main))
        .collect();
    kvs.retain(|kv| passes_filters(kv, req));
    sort(&mut kvs, req.sort_order, req.sort_target);
    let more = truncate_to_limit(&mut kvs, req.limit);
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = bytes::Bytes::new();
        }
    }
    Ok(RangeResponse {
        header: ResponseHeader {
            revision: header_revision,
        },
        kvs,
        more,
        count: plan.count,
    })
}

/// A Range's answer with its key-values in etcd's wire form (WIRE-1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodedRange {
    /// The revision of the answer's header.
    pub revision: i64,
    /// The bytes of the answer's `kvs` field: every key-value's entry, in key order.
    pub kvs: Vec<u8>,
    /// More keys than the limit matched.
    pub more: bool,
    /// The number of keys alive at the revision read, before filters and limit.
    pub count: i64,
}

/// Answers the Range as [`finish_range`] does, with its key-values in etcd's wire form
/// (WIRE-1): written from the stored records as they are read when the Range neither sorts
/// nor filters (then its plan holds exactly the keys to return, plus one when limited), and
/// from `finish_range`'s key-values otherwise.
pub fn finish_range_wire(
    plan: RangePlan,
    snapshot: &Snapshot,
    req: &RangeRequest,
    header_revision: i64,
) -> Result<EncodedRange, StorageError> {
    if fetches_all(req) || req.sort_target != SortTarget::Key {
        let answer = finish_range(plan, snapshot, req, header_revision)?;
        let mut kvs = Vec::new();
        for kv in &answer.kvs {
            wire::put_key_value(&mut kvs, kv);
        }
        return Ok(EncodedRange {
            revision: answer.header.revision,
            kvs,
            more: answer.more,
            count: answer.count,
        });
    }
    let mut revs: Vec<Revision> = plan.hits.iter().map(|hit| hit.revision).collect();
    let more = truncate_to_limit(&mut revs, req.limit);
    let mut out = Vec::new();
    // Each record's position in `revs` and its entry's bytes in `out`, in the order read.
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(revs.len());
    visit_records(snapshot, &revs, |at, key, bytes| {
        let start = out.len();
        wire::put_record(&mut out, key, bytes, req.keys_only)?;
        if spans.is_empty() {
            // Most Ranges return records of one shape: room for the rest at the first's size.
            out.reserve((out.len() - start).saturating_mul(revs.len()));
        }
        spans.push((at, start, out.len()));
        Ok(())
    })?;
    let kvs = if spans.iter().enumerate().all(|(i, &(at, ..))| i == at) {
        out
    } else {
        let mut by_key = vec![(0, 0); revs.len()];
        for (at, start, end) in spans {
            by_key[at] = (start, end);
        }
        let mut sorted = Vec::with_capacity(out.len());
        for (start, end) in by_key {
            sorted.extend_from_slice(&out[start..end]);
        }
        sorted
    };
    Ok(EncodedRange {
        revision: header_revision,
        kvs,
        more,
        count: plan.count,
    })
}

/// Keeps the first `limit` of `items` when `limit > 0`; returns true if it dropped any (the
/// answer's `more`).
fn truncate_to_limit<T>(items: &mut Vec<T>, limit: i64) -> bool {
    match usize::try_from(limit) {
        Ok(limit) if limit > 0 && items.len() > limit => {
            items.truncate(limit);
            true
        }
        _ => false,
    }
}

fn passes_filters(kv: &KeyValue, req: &RangeRequest) -> bool {
    let above = |value: i64, min: i64| min == 0 || value >= min;
    let below = |value: i64, max: i64| max == 0 || value <= max;
    above(kv.mod_revision, req.min_mod_revision)
        && below(kv.mod_revision, req.max_mod_revision)
        && above(kv.create_revision, req.min_create_revision)
        && below(kv.create_revision, req.max_create_revision)
}

fn sort(kvs: &mut [KeyValue], order: SortOrder, target: SortTarget) {
    let order = match (order, target) {
        (SortOrder::None, SortTarget::Key) => return,
        (SortOrder::None, _) => SortOrder::Ascend,
        (order, _) => order,
    };
    let by = |a: &KeyValue, b: &KeyValue| -> Ordering {
        match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        }
    };
    // Stable sorts: ties keep key order, as etcd's insertion sort does for small results.
    match order {
        SortOrder::Descend => kvs.sort_by(|a, b| by(b, a)),
        _ => kvs.sort_by(by),
    }
}

/// Evaluates a Txn's compares at `at`: returns whether they all hold, and the branch that
/// runs (success if they do, failure otherwise).
pub fn txn_branch<'r>(
    index: &Index,
    records: &impl Records,
    req: &'r TxnRequest,
    at: i64,
) -> Result<(bool, &'r [RequestOp]), StorageError> {
    for compare in &req.compare {
        if !compare_holds(index, records, compare, at)? {
            return Ok((false, &req.failure));
        }
    }
    Ok((true, &req.success))
}

/// Returns true if `compare` holds at main revision `at` (etcd's applyCompare).
pub fn compare_holds(
    index: &Index,
    records: &impl Records,
    compare: &Compare,
    at: i64,
) -> Result<bool, StorageError> {
    let hits: Vec<Hit> = if compare.range_end.is_empty() {
        index.get(&compare.key, at).into_iter().collect()
    } else {
        index.range(KeyRange::new(&compare.key, &compare.range_end), at)
    };
    if hits.is_empty() {
        // A missing key compares as the all-zero KeyValue, except that a value compare on
        // a missing key always fails.
        return Ok(match &compare.target {
            CompareTarget::Value(_) => false,
            _ => holds(compare, &KeyValue::default()),
        });
    }
    for hit in hits {
        let kv = match compare.target {
            CompareTarget::Value(_) | CompareTarget::Lease(_) => records
                .record(hit.revision)?
                .into_key_value(hit.revision.main),
            _ => KeyValue {
                create_revision: hit.created,
                mod_revision: hit.revision.main,
                version: hit.version,
                ..KeyValue::default()
            },
        };
        if !holds(compare, &kv) {
            return Ok(false);
        }
    }
    Ok(true)
}

fn holds(compare: &Compare, kv: &KeyValue) -> bool {
    let ordering = match &compare.target {
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::Create(v) => kv.create_revision.cmp(v),
        CompareTarget::Mod(v) => kv.mod_revision.cmp(v),
        CompareTarget::Value(v) => kv.value[..].cmp(&v[..]),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
    };
    match compare.result {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
        CompareResult::NotEqual => ordering != Ordering::Equal,
    }
}

/// Runs a Txn whose branches only read, at the published revision, in the caller's thread.
pub fn read_only_txn(
    index: &Index,
    snapshot: &Snapshot,
    req: &TxnRequest,
    current: i64,
) -> Result<TxnResponse> {
    let (succeeded, branch) = txn_branch(index, snapshot, req, current)?;
    for op in branch {
        if let RequestOp::Range(r) = op {
            check_txn_range_revision(r.revision, current, index.compact_revision)?;
        }
    }
    let mut responses = Vec::with_capacity(branch.len());
    for op in branch {
        let RequestOp::Range(r) = op else {
            return Err(Error::InvalidArgument("read-only txn holds a write".into()));
        };
        let at = read_revision(r.revision, current, index.compact_revision)?;
        let plan = plan_range(index, r, at);
        responses.push(ResponseOp::Range(finish_range(plan, snapshot, r, current)?));
    }
    Ok(TxnResponse {
        header: ResponseHeader { revision: current },
        succeeded,
        responses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_revision_checks_future_before_compacted() {
        assert_eq!(read_revision(0, 5, -1), Ok(5));
        assert_eq!(read_revision(-3, 5, 2), Ok(5), "negative means current");
        assert_eq!(read_revision(6, 5, 7), Err(Error::FutureRevision));
        assert_eq!(read_revision(2, 5, 3), Err(Error::Compacted));
        assert_eq!(
            read_revision(3, 5, 3),
            Ok(3),
            "reading at the compaction revision works"
        );
    }
}
