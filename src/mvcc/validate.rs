//! Request checks that need no state: empty keys, flag combinations, Txn operation counts
//! and etcd's duplicate-key rule. They run in the caller's thread before a request is
//! queued, so a refused request costs the apply thread nothing.
//!
//! Invariants:
//! - VAL-1: the checks and their order are etcd's gRPC-layer checks, so the first error
//!   reported is the one etcd reports.
//! - VAL-2: a request that passes never fails the same checks at apply.
//!
//! Contact points: the engine calls these on every request before admission.

use crate::api::{DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest};
use crate::error::Error;

/// Checks a Range request.
pub fn check_range(req: &RangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::KeyNotProvided);
    }
    Ok(())
}

/// Checks a Put request.
pub fn check_put(req: &PutRequest) -> Result<(), Error> {
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

/// Checks a DeleteRange request.
pub fn check_delete(req: &DeleteRangeRequest) -> Result<(), Error> {
    if req.key.is_empty() {
        return Err(Error::KeyNotProvided);
    }
    Ok(())
}

/// Checks a Txn: the operation budget (nested txns get the budget minus their parent's
/// count), keys, then the duplicate-key rule on each branch.
pub fn check_txn(req: &TxnRequest, max_txn_ops: usize) -> Result<(), Error> {
    check_txn_ops(req, max_txn_ops)?;
    check_intervals(&req.success)?;
    check_intervals(&req.failure)?;
    Ok(())
}

fn check_txn_ops(req: &TxnRequest, max_txn_ops: usize) -> Result<(), Error> {
    let count = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if count > max_txn_ops {
        return Err(Error::TooManyTxnOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Err(Error::KeyNotProvided);
    }
    for op in req.success.iter().chain(&req.failure) {
        match op {
            RequestOp::Range(r) => check_range(r)?,
            RequestOp::Put(r) => check_put(r)?,
            RequestOp::DeleteRange(r) => check_delete(r)?,
            RequestOp::Txn(t) => check_txn_ops(t, max_txn_ops - count)?,
        }
    }
    Ok(())
}

/// A deleted interval `[start, end)` compared as strings, as etcd's interval tree does:
/// a single-key delete is the point `[key, key + "\0")`; an end of `"\0"` makes an interval
/// that contains nothing (etcd's quirk).
#[derive(Debug, Clone)]
struct Interval {
    start: Vec<u8>,
    end: Vec<u8>,
}

impl Interval {
    fn of(req: &DeleteRangeRequest) -> Interval {
        let end = if req.range_end.is_empty() {
            let mut end = req.key.to_vec();
            end.push(0);
            end
        } else {
            req.range_end.to_vec()
        };
        Interval {
            start: req.key.to_vec(),
            end,
        }
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.start.as_slice() <= key && key < self.end.as_slice()
    }
}

/// The keys written and the intervals deleted by one branch, nested txns included.
#[derive(Debug, Default)]
struct Writes {
    puts: Vec<Vec<u8>>,
    deletes: Vec<Interval>,
}

impl Writes {
    fn has_put(&self, key: &[u8]) -> bool {
        self.puts.iter().any(|k| k == key)
    }

    fn deleted(&self, key: &[u8]) -> bool {
        self.deletes.iter().any(|iv| iv.contains(key))
    }
}

fn check_intervals(ops: &[RequestOp]) -> Result<(), Error> {
    collect_writes(ops).map(|_| ())
}

/// etcd's checkIntervals: this level's deletes first, then each nested txn's puts against
/// what is known so far (then/else of one nested txn may share keys), then this level's
/// puts against everything.
fn collect_writes(ops: &[RequestOp]) -> Result<Writes, Error> {
    let mut writes = Writes::default();
    for op in ops {
        if let RequestOp::DeleteRange(d) = op {
            writes.deletes.push(Interval::of(d));
        }
    }
    for op in ops {
        let RequestOp::Txn(t) = op else {
            continue;
        };
        let then = collect_writes(&t.success)?;
        let otherwise = collect_writes(&t.failure)?;
        let mut added = Vec::new();
        for key in &then.puts {
            if writes.has_put(key) || writes.deleted(key) {
                return Err(Error::DuplicateKey);
            }
            added.push(key.clone());
        }
        for key in &otherwise.puts {
            let clash = writes.has_put(key) && !then.has_put(key);
            if clash || writes.deleted(key) {
                return Err(Error::DuplicateKey);
            }
            added.push(key.clone());
        }
        writes.puts.extend(added);
        writes.deletes.extend(then.deletes);
        writes.deletes.extend(otherwise.deletes);
    }
    for op in ops {
        let RequestOp::Put(p) = op else {
            continue;
        };
        if writes.has_put(&p.key) || writes.deleted(&p.key) {
            return Err(Error::DuplicateKey);
        }
        writes.puts.push(p.key.to_vec());
    }
    Ok(writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Compare;

    fn put(key: &str) -> RequestOp {
        RequestOp::Put(PutRequest::new(key.to_owned(), "v"))
    }

    fn del(key: &str, end: &[u8]) -> RequestOp {
        RequestOp::DeleteRange(DeleteRangeRequest {
            key: key.as_bytes().to_vec().into(),
            range_end: end.to_vec().into(),
            prev_kv: false,
        })
    }

    fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
        TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        }
    }

    fn check(t: &TxnRequest) -> Result<(), Error> {
        check_txn(t, 128)
    }

    #[test]
    fn txn_duplicate_key_rule_matches_etcd() {
        let cases: Vec<(&str, TxnRequest, Result<(), Error>)> = vec![
            (
                "two puts of one key",
                txn(vec![put("a"), put("a")], vec![]),
                Err(Error::DuplicateKey),
            ),
            (
                "put inside a delete",
                txn(vec![del("a", b"c"), put("b")], vec![]),
                Err(Error::DuplicateKey),
            ),
            (
                "delete after put",
                txn(vec![put("b"), del("a", b"c")], vec![]),
                Err(Error::DuplicateKey),
            ),
            (
                "point delete and put",
                txn(vec![del("a", b""), put("a")], vec![]),
                Err(Error::DuplicateKey),
            ),
            (
                "same key in both branches",
                txn(vec![put("a")], vec![put("a")]),
                Ok(()),
            ),
            (
                "overlapping deletes",
                txn(vec![del("a", b"c"), del("b", b"d")], vec![]),
                Ok(()),
            ),
            (
                "delete to \\0 covers nothing",
                txn(vec![put("t9"), del("t", b"\0")], vec![]),
                Ok(()),
            ),
            (
                "nested then and else may share a key",
                txn(
                    vec![RequestOp::Txn(txn(vec![put("a")], vec![put("a")]))],
                    vec![],
                ),
                Ok(()),
            ),
            (
                "nested put clashes with parent put",
                txn(
                    vec![put("a"), RequestOp::Txn(txn(vec![put("a")], vec![]))],
                    vec![],
                ),
                Err(Error::DuplicateKey),
            ),
            (
                "nested delete clashes with parent put",
                txn(
                    vec![put("b"), RequestOp::Txn(txn(vec![del("a", b"c")], vec![]))],
                    vec![],
                ),
                Err(Error::DuplicateKey),
            ),
            (
                "nested put inside parent delete",
                txn(
                    vec![del("a", b"c"), RequestOp::Txn(txn(vec![], vec![put("b")]))],
                    vec![],
                ),
                Err(Error::DuplicateKey),
            ),
        ];
        for (name, t, want) in cases {
            assert_eq!(check(&t), want, "{name}");
        }
    }

    #[test]
    fn txn_op_budget_shrinks_for_nested_txns() {
        let puts = |n: usize| (0..n).map(|i| put(&format!("k{i}"))).collect::<Vec<_>>();
        assert_eq!(check(&txn(puts(128), vec![])), Ok(()));
        assert_eq!(check(&txn(puts(129), vec![])), Err(Error::TooManyTxnOps));
        let nested = |n: usize| {
            RequestOp::Txn(txn(
                puts(n)
                    .into_iter()
                    .map(|op| match op {
                        RequestOp::Put(p) => RequestOp::Range(RangeRequest::key(p.key)),
                        other => other,
                    })
                    .collect(),
                vec![],
            ))
        };
        assert_eq!(check(&txn(vec![put("x"), nested(126)], vec![])), Ok(()));
        assert_eq!(
            check(&txn(vec![put("x"), nested(127)], vec![])),
            Err(Error::TooManyTxnOps)
        );
    }

    #[test]
    fn txn_empty_keys_are_refused() {
        let mut t = txn(vec![], vec![]);
        t.compare.push(Compare::default());
        assert_eq!(check(&t), Err(Error::KeyNotProvided));
        assert_eq!(
            check(&txn(vec![put("")], vec![])),
            Err(Error::KeyNotProvided)
        );
        assert_eq!(
            check(&txn(vec![], vec![del("", b"")])),
            Err(Error::KeyNotProvided)
        );
    }
}
