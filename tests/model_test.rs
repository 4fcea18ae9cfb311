//! Reference-model tests of the engine's KV semantics (etcd 3.6: revisions, Range, Put,
//! DeleteRange, Txn, compaction, HashKV, reopen).
//!
//! - `model_*` tests check the model alone against hand-computed cases from
//!   `/work/shared/spec/etcd.md` (§ numbers below), so the model can be trusted as an oracle.
//! - `random_sequences` runs seeded random sequences through engine and model
//!   (`tests/model/harness.rs` says what is compared). Defaults: 8 seeds × 1,500 ops. For
//!   longer runs set `KVD_MODEL_SEEDS` (a count `N` for seeds 0..N, a range `A..B`, or a list
//!   `A,B,C`) and `KVD_MODEL_OPS`. A failure names its seed and op index; it replays with
//!   `KVD_MODEL_SEEDS=<seed>..<seed+1> KVD_MODEL_OPS=<index+1>`.
//! - The other tests run small fixed sequences, named for the behaviour they pin down,
//!   through the same harness, after asserting the model's replies by hand.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod model;

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use kvd::{
    CompactionRequest, CompactionResponse, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Error, KeyValue, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, SortOrder, SortTarget,
    TxnRequest, TxnResponse,
};
use model::ops::Reply;
use model::{Limits, Model, Op, Seq, decode, generate, run};

// ---- Helpers ------------------------------------------------------------------------------

fn put(key: &'static str, value: &'static str) -> Op {
    Op::Put(PutRequest::new(key, value))
}

fn get(key: &'static str) -> Op {
    Op::Range(RangeRequest::key(key))
}

fn get_at(key: &'static str, revision: i64) -> Op {
    Op::Range(RangeRequest {
        revision,
        ..RangeRequest::key(key)
    })
}

fn del(key: &'static str) -> Op {
    Op::DeleteRange(DeleteRangeRequest::key(key))
}

fn compact(revision: i64) -> Op {
    Op::Compact(CompactionRequest {
        revision,
        physical: revision % 2 == 0,
    })
}

fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

fn rput(key: &'static str, value: &'static str) -> RequestOp {
    RequestOp::Put(PutRequest::new(key, value))
}

fn rget(key: &'static str) -> RequestOp {
    RequestOp::Range(RangeRequest::key(key))
}

fn rdel(key: &'static str, range_end: &'static str) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest {
        key: Bytes::from_static(key.as_bytes()),
        range_end: Bytes::from_static(range_end.as_bytes()),
        prev_kv: true,
    })
}

fn kv(
    key: &'static str,
    create: i64,
    modified: i64,
    version: i64,
    value: &'static str,
) -> KeyValue {
    KeyValue {
        key: Bytes::from_static(key.as_bytes()),
        create_revision: create,
        mod_revision: modified,
        version,
        value: Bytes::from_static(value.as_bytes()),
        lease: 0,
    }
}

fn header(revision: i64) -> ResponseHeader {
    ResponseHeader { revision }
}

fn range_ok(revision: i64, kvs: Vec<KeyValue>, more: bool, count: i64) -> Reply {
    Reply::Range(Ok(RangeResponse {
        header: header(revision),
        kvs,
        more,
        count,
    }))
}

/// Returns the model's replies to `ops`.
fn model_replies(limits: Limits, ops: &[Op]) -> Vec<Reply> {
    let mut model = Model::new(limits);
    ops.iter().map(|op| model.apply(op)).collect()
}

/// Returns the model's replies to `ops`, then runs them through engine and model.
fn check(name: &str, limits: Limits, ops: Vec<Op>) -> Vec<Reply> {
    let replies = model_replies(limits, &ops);
    let seq = Seq {
        label: format!("fixed sequence `{name}`"),
        limits,
        ops,
    };
    let dir = tempfile::tempdir().unwrap();
    run(&seq, dir.path());
    replies
}

fn txn_reply(reply: &Reply) -> &TxnResponse {
    match reply {
        Reply::Txn(Ok(resp)) => resp,
        other => panic!("expected a successful txn, got {other:?}"),
    }
}

// ---- Random sequences ---------------------------------------------------------------------

/// Parses `KVD_MODEL_SEEDS`: `N` (seeds 0..N), `A..B` or `A,B,C`.
fn seeds() -> Vec<u64> {
    let Ok(text) = std::env::var("KVD_MODEL_SEEDS") else {
        return (0..8).collect();
    };
    let text = text.trim();
    if let Some((a, b)) = text.split_once("..") {
        return (a.trim().parse().unwrap()..b.trim().parse().unwrap()).collect();
    }
    if text.contains(',') {
        return text
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse().unwrap())
            .collect();
    }
    (0..text.parse().unwrap()).collect()
}

fn ops_per_seed() -> usize {
    std::env::var("KVD_MODEL_OPS").map_or(1500, |n| n.trim().parse().unwrap())
}

#[test]
fn random_sequences() {
    let seeds = seeds();
    let ops = ops_per_seed();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(seeds.len());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let mut seq = generate(seed, ops);
                    seq.label = format!(
                        "seed {seed} (replay: KVD_MODEL_SEEDS={seed}..{} KVD_MODEL_OPS={ops} \
                         cargo test --test model_test random_sequences; a failure at op #i \
                         also replays with KVD_MODEL_OPS=i+1)",
                        seed + 1
                    );
                    let dir = tempfile::tempdir().unwrap();
                    run(&seq, dir.path());
                }
            });
        }
    });
}

#[test]
fn hash_kv_is_equal_across_engines() {
    let seq = generate(1001, 400);
    assert!(seq.ops.iter().any(|op| matches!(op, Op::HashKv(_))));
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let first = run(&seq, a.path());
    let second = run(&seq, b.path());
    assert!(!first.hashes.is_empty());
    assert_eq!(
        first, second,
        "two engines fed seed 1001 answered HashKV differently"
    );
}

// ---- The model alone ----------------------------------------------------------------------

#[test]
fn model_revisions_and_generations() {
    // §1.2: a fresh store is at 1 and the first write makes 2. §1.5: put a@2, put a@3,
    // del a@4, put a@5 → {create 5, mod 5, version 1}.
    let ops = vec![
        get("a"),
        put("a", "1"),
        put("a", "2"),
        del("a"),
        put("a", "3"),
        get("a"),
    ];
    let r = model_replies(Limits::default(), &ops);
    assert_eq!(r[0], range_ok(1, vec![], false, 0));
    assert_eq!(
        r[1],
        Reply::Put(Ok(PutResponse {
            header: header(2),
            prev_kv: None
        }))
    );
    assert_eq!(
        r[2],
        Reply::Put(Ok(PutResponse {
            header: header(3),
            prev_kv: None
        }))
    );
    assert_eq!(
        r[3],
        Reply::DeleteRange(Ok(DeleteRangeResponse {
            header: header(4),
            deleted: 1,
            prev_kvs: vec![]
        }))
    );
    assert_eq!(r[5], range_ok(5, vec![kv("a", 5, 5, 1, "3")], false, 1));
}

#[test]
fn model_txn_inner_revisions() {
    // §1.3: txn{range a; put a; range a} at 22 → range 22, put 23, range 23 (new value).
    let mut ops: Vec<Op> = (0..21).map(|_| put("a", "old")).collect();
    ops.push(Op::Txn(txn(
        vec![],
        vec![rget("a"), rput("a", "new"), rget("a")],
        vec![],
    )));
    let r = model_replies(Limits::default(), &ops);
    let resp = txn_reply(&r[21]);
    assert_eq!(resp.header, header(23));
    assert!(resp.succeeded);
    let ResponseOp::Range(first) = &resp.responses[0] else {
        panic!()
    };
    assert_eq!(first.header, header(22));
    assert_eq!(first.kvs, vec![kv("a", 2, 22, 21, "old")]);
    assert_eq!(
        resp.responses[1],
        ResponseOp::Put(PutResponse {
            header: header(23),
            prev_kv: None
        })
    );
    let ResponseOp::Range(last) = &resp.responses[2] else {
        panic!()
    };
    assert_eq!(last.header, header(23));
    assert_eq!(last.kvs, vec![kv("a", 2, 23, 22, "new")]);
}

#[test]
fn model_sort_none_with_limit_quirk() {
    // §2.4: s1(v3), s2(v3), s3(v2), s4(v1); target VERSION, limit 2: NONE → [s3, s1] (only
    // the first 3 keys are looked at), ASCEND → [s4, s3].
    let mut ops = Vec::new();
    for (key, versions) in [("s1", 3), ("s2", 3), ("s3", 2), ("s4", 1)] {
        ops.extend((0..versions).map(|_| put(key, "v")));
    }
    let by_version = |sort_order| {
        Op::Range(RangeRequest {
            limit: 2,
            sort_order,
            sort_target: SortTarget::Version,
            ..RangeRequest::prefix("s")
        })
    };
    ops.push(by_version(SortOrder::None));
    ops.push(by_version(SortOrder::Ascend));
    let r = model_replies(Limits::default(), &ops);
    let keys = |reply: &Reply| match reply {
        Reply::Range(Ok(resp)) => {
            assert!(resp.more);
            assert_eq!(resp.count, 4);
            resp.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>()
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(keys(&r[9]), vec![Bytes::from("s3"), Bytes::from("s1")]);
    assert_eq!(keys(&r[10]), vec![Bytes::from("s4"), Bytes::from("s3")]);
}

#[test]
fn model_compaction_rules() {
    // §5.1 on a fresh store: compact −5 → compacted; 0 → OK; 0 again → compacted; 1 → OK;
    // 2 → future. §2.2: after compact 3, rev 2 fails, rev 3 reads, future checked first.
    let ok = |rev| {
        Reply::Compact(Ok(CompactionResponse {
            header: header(rev),
        }))
    };
    let ops = vec![compact(-5), compact(0), compact(0), compact(1), compact(2)];
    let r = model_replies(Limits::default(), &ops);
    assert_eq!(
        r,
        vec![
            Reply::Compact(Err(Error::Compacted)),
            ok(1),
            Reply::Compact(Err(Error::Compacted)),
            ok(1),
            Reply::Compact(Err(Error::FutureRevision)),
        ]
    );
    let ops = vec![
        put("a", "1"),
        put("a", "2"),
        put("a", "3"),
        compact(3),
        get_at("a", 2),
        get_at("a", 3),
        get_at("a", 5),
        get_at("a", -3),
    ];
    let r = model_replies(Limits::default(), &ops);
    assert_eq!(r[3], ok(4));
    assert_eq!(r[4], Reply::Range(Err(Error::Compacted)));
    assert_eq!(r[5], range_ok(4, vec![kv("a", 2, 3, 2, "2")], false, 1));
    assert_eq!(r[6], Reply::Range(Err(Error::FutureRevision)));
    assert_eq!(r[7], range_ok(4, vec![kv("a", 2, 4, 3, "3")], false, 1));
}

#[test]
fn model_txn_validation_limits() {
    // §4.1: 129 puts rejected; 128 ranges accepted; 2 + nested 127 rejected.
    let keys: Vec<&'static str> = (0..130).map(|i| &*format!("k{i:03}").leak()).collect();
    let puts = |n: usize| keys[..n].iter().map(|k| rput(k, "v")).collect::<Vec<_>>();
    let gets = |n: usize| keys[..n].iter().map(|k| rget(k)).collect::<Vec<_>>();
    let nested = |n: usize| RequestOp::Txn(txn(vec![], gets(n), vec![]));
    let ops = vec![
        Op::Txn(txn(vec![], puts(129), vec![])),
        Op::Txn(txn(vec![], gets(128), vec![])),
        Op::Txn(txn(vec![], vec![rget("a"), nested(127)], vec![])),
        Op::Txn(txn(vec![], vec![rget("a"), nested(126)], vec![])),
    ];
    let r = model_replies(Limits::default(), &ops);
    assert_eq!(r[0], Reply::Txn(Err(Error::TooManyTxnOps)));
    assert!(matches!(r[1], Reply::Txn(Ok(_))));
    assert_eq!(r[2], Reply::Txn(Err(Error::TooManyTxnOps)));
    assert!(matches!(r[3], Reply::Txn(Ok(_))));
}

#[test]
fn model_sequences_are_replayable_and_total() {
    // The n-th op of a seed does not depend on the length asked for.
    let long = generate(7, 300);
    let short = generate(7, 120);
    assert_eq!(long.ops[..120], short.ops[..]);
    assert_eq!(long.limits, short.limits);
    // Every byte string decodes, and the model runs what it decodes.
    let mut rng = model::rng::SplitMix64::new(99);
    let mut inputs: Vec<Vec<u8>> = vec![vec![], vec![0; 64], vec![0xff; 64], (0..=255).collect()];
    for _ in 0..200 {
        let len = (rng.next_u64() % 600) as usize;
        inputs.push((0..len).map(|_| rng.next_u64() as u8).collect());
    }
    for input in &inputs {
        let seq = decode(input);
        assert!(seq.ops.len() <= model::generate::MAX_DECODED_OPS);
        model_replies(seq.limits, &seq.ops);
    }
    assert!(decode(&[]).ops.is_empty());
}

#[test]
fn model_random_sequences_exercise_every_reply() {
    // A sanity check of the generator's mix: each kind of reply and error shows up.
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..4 {
        let seq = generate(seed, 1500);
        for reply in model_replies(seq.limits, &seq.ops) {
            let name = match &reply {
                Reply::Put(Ok(_)) => "put ok".to_owned(),
                Reply::DeleteRange(Ok(r)) if r.deleted > 0 => "delete ok".to_owned(),
                Reply::DeleteRange(Ok(_)) => "delete nothing".to_owned(),
                Reply::Txn(Ok(r)) if r.succeeded => "txn succeeded".to_owned(),
                Reply::Txn(Ok(_)) => "txn failed compare".to_owned(),
                Reply::Range(Ok(r)) if r.more => "range more".to_owned(),
                Reply::Range(Ok(_)) => "range ok".to_owned(),
                Reply::Compact(Ok(_)) => "compact ok".to_owned(),
                Reply::HashKv(Ok(_)) => "hash ok".to_owned(),
                Reply::Reopen => "reopen".to_owned(),
                Reply::Put(Err(e))
                | Reply::DeleteRange(Err(e))
                | Reply::Txn(Err(e))
                | Reply::Range(Err(e))
                | Reply::Compact(Err(e))
                | Reply::HashKv(Err(e)) => format!("{e:?}"),
            };
            seen.insert(name);
        }
    }
    for want in [
        "put ok",
        "delete ok",
        "delete nothing",
        "txn succeeded",
        "txn failed compare",
        "range more",
        "range ok",
        "compact ok",
        "hash ok",
        "reopen",
        "KeyNotProvided",
        "KeyNotFound",
        "ValueProvided",
        "LeaseProvided",
        "RequestTooLarge",
        "TooManyTxnOps",
        "DuplicateKey",
        "Compacted",
        "FutureRevision",
    ] {
        assert!(
            seen.contains(want),
            "no `{want}` in 4 × 1500 generated ops; seen: {seen:?}"
        );
    }
}

// ---- Fixed sequences through the engine ---------------------------------------------------

#[test]
fn txn_nested_compare_sees_start_state() {
    // §4.3: `put nc` then a nested `version(nc) == 0` compare takes the nested success
    // branch, and the nested range (run after the put) sees nc.
    let nested = txn(
        vec![Compare::new(
            "nc",
            CompareResult::Equal,
            CompareTarget::Version(0),
        )],
        vec![rget("nc")],
        vec![rput("other", "x")],
    );
    let ops = vec![
        put("z", "0"),
        Op::Txn(txn(
            vec![],
            vec![rput("nc", "1"), RequestOp::Txn(nested)],
            vec![],
        )),
    ];
    let r = check(
        "txn_nested_compare_sees_start_state",
        Limits::default(),
        ops,
    );
    let resp = txn_reply(&r[1]);
    let ResponseOp::Txn(inner) = &resp.responses[1] else {
        panic!()
    };
    assert!(inner.succeeded);
    assert_eq!(inner.header, ResponseHeader::default());
    let ResponseOp::Range(range) = &inner.responses[0] else {
        panic!()
    };
    assert_eq!(range.header, header(3));
    assert_eq!(range.kvs, vec![kv("nc", 3, 3, 1, "1")]);
}

#[test]
fn range_sort_none_with_limit_quirk() {
    let mut ops = Vec::new();
    for (key, versions) in [("s1", 3), ("s2", 3), ("s3", 2), ("s4", 1)] {
        ops.extend((0..versions).map(|_| put(key, "v")));
    }
    for sort_order in [SortOrder::None, SortOrder::Ascend, SortOrder::Descend] {
        for sort_target in [
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Value,
        ] {
            for limit in [0, 2, 3] {
                ops.push(Op::Range(RangeRequest {
                    limit,
                    sort_order,
                    sort_target,
                    ..RangeRequest::prefix("s")
                }));
            }
        }
    }
    check("range_sort_none_with_limit_quirk", Limits::default(), ops);
}

#[test]
fn range_revision_checks_future_before_compacted() {
    let ops = vec![
        put("a", "1"),
        put("a", "2"),
        put("b", "3"),
        compact(3),
        get_at("a", 2),
        get_at("a", 3),
        get_at("a", 4),
        get_at("a", 5),
        get_at("a", -3),
        Op::Reopen,
        get_at("a", 2),
        get_at("a", 3),
        Op::Range(RangeRequest {
            key: Bytes::new(),
            revision: 99,
            ..RangeRequest::default()
        }),
    ];
    let r = check(
        "range_revision_checks_future_before_compacted",
        Limits::default(),
        ops,
    );
    assert_eq!(r[12], Reply::Range(Err(Error::KeyNotProvided)));
}

#[test]
fn txn_range_negative_revision_quirk() {
    // §4.4: inside a txn a negative revision is compared with the compaction revision
    // (-1 on a fresh store); a standalone Range reads the current revision.
    let in_txn = |revision| {
        Op::Txn(txn(
            vec![],
            vec![RequestOp::Range(RangeRequest {
                revision,
                ..RangeRequest::key("a")
            })],
            vec![],
        ))
    };
    let ops = vec![
        put("a", "1"),
        in_txn(-1),
        in_txn(-2),
        put("a", "2"),
        put("a", "3"),
        compact(3),
        in_txn(-3),
        get_at("a", -3),
        in_txn(2),
        in_txn(3),
        in_txn(99),
    ];
    let r = check("txn_range_negative_revision_quirk", Limits::default(), ops);
    assert!(matches!(r[1], Reply::Txn(Ok(_))));
    assert_eq!(r[2], Reply::Txn(Err(Error::Compacted)));
    assert_eq!(r[6], Reply::Txn(Err(Error::Compacted)));
    assert_eq!(r[7], range_ok(4, vec![kv("a", 2, 4, 3, "3")], false, 1));
    assert_eq!(r[8], Reply::Txn(Err(Error::Compacted)));
    assert!(matches!(r[9], Reply::Txn(Ok(_))));
    assert_eq!(r[10], Reply::Txn(Err(Error::FutureRevision)));
}

#[test]
fn txn_duplicate_key_rules() {
    let nested = |success, failure| RequestOp::Txn(txn(vec![], success, failure));
    let cases: Vec<(TxnRequest, bool)> = vec![
        (
            txn(vec![], vec![rput("k", "1"), rput("k", "2")], vec![]),
            false,
        ),
        (
            txn(vec![], vec![rput("k", "1"), rdel("k", "")], vec![]),
            false,
        ),
        (
            txn(vec![], vec![rdel("k", ""), rput("k", "1")], vec![]),
            false,
        ),
        (
            txn(vec![], vec![rdel("a", "c"), rput("b", "1")], vec![]),
            false,
        ),
        // The "\0" quirk: [t, "\0") covers nothing for the check, everything at execution.
        (
            txn(vec![], vec![rput("t9", "1"), rdel("t", "\0")], vec![]),
            true,
        ),
        (
            txn(vec![], vec![rdel("t", "\0"), rput("t9", "1")], vec![]),
            true,
        ),
        // An inverted interval covers nothing.
        (
            txn(vec![], vec![rdel("b", "a"), rput("b", "1")], vec![]),
            true,
        ),
        (
            txn(vec![], vec![rdel("k", ""), rdel("k", "l")], vec![]),
            true,
        ),
        (
            txn(vec![], vec![rput("k", "1")], vec![rput("k", "2")]),
            true,
        ),
        (
            txn(
                vec![],
                vec![nested(vec![rput("k", "1")], vec![rput("k", "2")])],
                vec![],
            ),
            true,
        ),
        (
            txn(
                vec![],
                vec![rput("k", "1"), nested(vec![rput("k", "2")], vec![])],
                vec![],
            ),
            false,
        ),
        (
            txn(
                vec![],
                vec![nested(vec![], vec![rput("k", "2")]), rput("k", "1")],
                vec![],
            ),
            false,
        ),
        (
            txn(
                vec![],
                vec![rdel("k", ""), nested(vec![rput("k", "2")], vec![])],
                vec![],
            ),
            false,
        ),
        (
            txn(
                vec![],
                vec![nested(vec![rdel("j", "m")], vec![]), rput("k", "1")],
                vec![],
            ),
            false,
        ),
        // Nested txns are merged in order: a later nested put meets an earlier nested
        // delete, not the other way round.
        (
            txn(
                vec![],
                vec![
                    nested(vec![rdel("j", "m")], vec![]),
                    nested(vec![rput("k", "1")], vec![]),
                ],
                vec![],
            ),
            false,
        ),
        (
            txn(
                vec![],
                vec![
                    nested(vec![rput("k", "1")], vec![]),
                    nested(vec![rdel("j", "m")], vec![]),
                ],
                vec![],
            ),
            true,
        ),
        (
            txn(
                vec![],
                vec![
                    nested(vec![rput("k", "1")], vec![]),
                    nested(vec![rput("k", "2")], vec![]),
                ],
                vec![],
            ),
            false,
        ),
        // A nested txn's own delete does not meet its other branch's put.
        (
            txn(
                vec![],
                vec![nested(vec![rdel("k", "")], vec![rput("k", "1")])],
                vec![],
            ),
            true,
        ),
    ];
    let mut ops = vec![put("k", "0"), put("t9", "0"), put("b", "0")];
    let mut expected = Vec::new();
    for (t, accepted) in cases {
        expected.push((ops.len(), accepted));
        ops.push(Op::Txn(t));
    }
    let r = check("txn_duplicate_key_rules", Limits::default(), ops);
    for (i, accepted) in expected {
        if accepted {
            assert!(
                matches!(r[i], Reply::Txn(Ok(_))),
                "case at op {i}: {:?}",
                r[i]
            );
        } else {
            assert_eq!(r[i], Reply::Txn(Err(Error::DuplicateKey)), "case at op {i}");
        }
    }
}

#[test]
fn txn_delete_all_quirk_executes_after_put() {
    // §4.1: put t9 + delete [t, ∞) is accepted and the delete removes t9 too.
    let ops = vec![
        put("t1", "0"),
        Op::Txn(txn(
            vec![],
            vec![rput("t9", "1"), rdel("t", "\0"), rget("t9")],
            vec![],
        )),
        Op::Txn(txn(
            vec![],
            vec![rdel("t", "\0"), rput("t9", "2"), rget("t9")],
            vec![],
        )),
        Op::Range(RangeRequest {
            key: Bytes::from_static(b"t"),
            range_end: Bytes::from_static(b"\0"),
            ..RangeRequest::default()
        }),
    ];
    let r = check(
        "txn_delete_all_quirk_executes_after_put",
        Limits::default(),
        ops,
    );
    let first = txn_reply(&r[1]);
    let ResponseOp::DeleteRange(d) = &first.responses[1] else {
        panic!()
    };
    assert_eq!(
        d.prev_kvs,
        vec![kv("t1", 2, 2, 1, "0"), kv("t9", 3, 3, 1, "1")]
    );
    assert_eq!(r[3], range_ok(4, vec![kv("t9", 4, 4, 1, "2")], false, 1));
}

#[test]
fn txn_too_many_ops_nested_budget() {
    let keys: Vec<&'static str> = (0..130).map(|i| &*format!("k{i:03}").leak()).collect();
    let gets = |n: usize| keys[..n].iter().map(|k| rget(k)).collect::<Vec<_>>();
    let puts = |n: usize| keys[..n].iter().map(|k| rput(k, "v")).collect::<Vec<_>>();
    let compares = |n: usize| {
        keys[..n]
            .iter()
            .map(|k| Compare::new(*k, CompareResult::Equal, CompareTarget::Version(0)))
            .collect::<Vec<_>>()
    };
    let nested = |ops| RequestOp::Txn(txn(vec![], ops, vec![]));
    let ops = vec![
        Op::Txn(txn(vec![], puts(129), vec![])),
        Op::Txn(txn(vec![], puts(128), vec![])),
        Op::Txn(txn(vec![], vec![], gets(129))),
        Op::Txn(txn(compares(129), vec![], vec![])),
        Op::Txn(txn(compares(128), gets(128), gets(128))),
        Op::Txn(txn(vec![], vec![rget("a"), nested(gets(127))], vec![])),
        Op::Txn(txn(vec![], vec![rget("a"), nested(gets(126))], vec![])),
        Op::Txn(txn(
            compares(3),
            vec![nested(vec![nested(gets(125))])],
            vec![],
        )),
        Op::Txn(txn(
            compares(3),
            vec![nested(vec![nested(gets(124))])],
            vec![],
        )),
        // The count check comes before the empty-key check.
        Op::Txn(txn(
            vec![Compare::new(
                "",
                CompareResult::Equal,
                CompareTarget::Version(0),
            )],
            gets(129),
            vec![],
        )),
    ];
    let r = check("txn_too_many_ops_nested_budget", Limits::default(), ops);
    let too_many = Reply::Txn(Err(Error::TooManyTxnOps));
    assert_eq!(r[0], too_many);
    assert!(matches!(r[1], Reply::Txn(Ok(_))));
    assert_eq!(r[2], too_many);
    assert_eq!(r[3], too_many);
    assert!(matches!(r[4], Reply::Txn(Ok(_))));
    assert_eq!(r[5], too_many);
    assert!(matches!(r[6], Reply::Txn(Ok(_))));
    assert_eq!(r[7], too_many);
    assert!(matches!(r[8], Reply::Txn(Ok(_))));
    assert_eq!(r[9], too_many);
}

#[test]
fn txn_validation_order() {
    // Validation (§4.1) before duplicate keys, before the size limit, before the apply-time
    // pre-checks (§4.4), where Puts are checked before Ranges.
    let limits = Limits {
        max_txn_ops: 4,
        max_request_bytes: 512,
    };
    let big: &'static str = &*"x".repeat(600).leak();
    let ignore = |key: &'static str| {
        RequestOp::Put(PutRequest {
            ignore_value: true,
            ..PutRequest::new(key, "")
        })
    };
    let future = RequestOp::Range(RangeRequest {
        revision: 99,
        ..RangeRequest::key("a")
    });
    let ops = vec![
        Op::Txn(txn(
            vec![],
            vec![rput("k", "1"), rput("k", "2"), rput("", "3")],
            vec![],
        )),
        Op::Txn(txn(vec![], vec![rput("k", "1"), rput("k", big)], vec![])),
        Op::Txn(txn(
            vec![],
            vec![rput("k", big), future.clone(), ignore("missing")],
            vec![],
        )),
        Op::Txn(txn(vec![], vec![future.clone(), ignore("missing")], vec![])),
        Op::Txn(txn(vec![], vec![future.clone()], vec![])),
        Op::Txn(txn(
            vec![],
            vec![RequestOp::Put(PutRequest {
                ignore_lease: true,
                lease: 5,
                ..PutRequest::new("k", "")
            })],
            vec![],
        )),
        // Pre-checks run on the chosen branch only.
        Op::Txn(txn(
            vec![],
            vec![rget("a")],
            vec![future, ignore("missing")],
        )),
        // A read-only txn is not size-checked; one that may write is.
        Op::Txn(txn(
            vec![Compare::new(
                "a",
                CompareResult::Equal,
                CompareTarget::Value(Bytes::from_static(big.as_bytes())),
            )],
            vec![rget("a")],
            vec![],
        )),
        Op::Txn(txn(
            vec![Compare::new(
                "a",
                CompareResult::Equal,
                CompareTarget::Value(Bytes::from_static(big.as_bytes())),
            )],
            vec![rdel("a", "")],
            vec![],
        )),
    ];
    let r = check("txn_validation_order", limits, ops);
    assert_eq!(r[0], Reply::Txn(Err(Error::KeyNotProvided)));
    assert_eq!(r[1], Reply::Txn(Err(Error::DuplicateKey)));
    assert_eq!(r[2], Reply::Txn(Err(Error::RequestTooLarge)));
    assert_eq!(r[3], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[4], Reply::Txn(Err(Error::FutureRevision)));
    assert_eq!(r[5], Reply::Txn(Err(Error::LeaseProvided)));
    assert!(matches!(r[6], Reply::Txn(Ok(_))));
    assert!(matches!(r[7], Reply::Txn(Ok(_))));
    assert_eq!(r[8], Reply::Txn(Err(Error::RequestTooLarge)));
}

#[test]
fn txn_nested_prechecks_follow_earlier_ops() {
    // §4.4: the pre-checks run on the chosen branches recursively, whatever ops come before
    // a nested txn in its branch.
    let ignore = RequestOp::Put(PutRequest {
        ignore_lease: true,
        ..PutRequest::new("missing", "v")
    });
    let future = RequestOp::Range(RangeRequest {
        revision: 99,
        ..RangeRequest::key("a")
    });
    let nested = |op: RequestOp| RequestOp::Txn(txn(vec![], vec![op], vec![]));
    let ops = vec![
        put("a", "1"),
        Op::Txn(txn(vec![], vec![nested(ignore.clone())], vec![])),
        Op::Txn(txn(vec![], vec![rget("a"), nested(ignore.clone())], vec![])),
        Op::Txn(txn(
            vec![],
            vec![rput("b", "1"), rdel("c", ""), nested(ignore)],
            vec![],
        )),
        Op::Txn(txn(vec![], vec![rget("a"), nested(future.clone())], vec![])),
        Op::Txn(txn(
            vec![],
            vec![rput("b", "2"), nested(rget("a")), nested(future)],
            vec![],
        )),
        get("missing"),
    ];
    let r = check(
        "txn_nested_prechecks_follow_earlier_ops",
        Limits::default(),
        ops,
    );
    assert_eq!(r[1], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[2], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[3], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[4], Reply::Txn(Err(Error::FutureRevision)));
    assert_eq!(r[5], Reply::Txn(Err(Error::FutureRevision)));
    assert_eq!(r[6], range_ok(2, vec![], false, 0));
}

#[test]
fn txn_failing_nested_range_writes_nothing() {
    // A nested Range below the compaction revision fails the whole txn (§4.4) before the Put
    // ahead of it is applied: a request that fails changes nothing.
    let old = RequestOp::Range(RangeRequest {
        revision: 1,
        ..RangeRequest::key("a")
    });
    let nested = RequestOp::Txn(txn(vec![], vec![old], vec![]));
    let ops = vec![
        put("a", "1"),
        compact(2),
        Op::Txn(txn(vec![], vec![rput("b", "1"), nested], vec![])),
        get("b"),
    ];
    let r = check(
        "txn_failing_nested_range_writes_nothing",
        Limits::default(),
        ops,
    );
    assert_eq!(r[2], Reply::Txn(Err(Error::Compacted)));
    assert_eq!(r[3], range_ok(2, vec![], false, 0));
}

#[test]
fn txn_inner_headers_follow_changes() {
    let ops = vec![
        put("a", "1"),
        Op::Txn(txn(
            vec![],
            vec![
                rget("a"),
                rdel("zz", ""),
                rput("a", "2"),
                rget("a"),
                rdel("zz", ""),
                RequestOp::Txn(txn(vec![], vec![rget("a")], vec![])),
            ],
            vec![],
        )),
        Op::Txn(txn(vec![], vec![rget("a"), rdel("zz", "")], vec![])),
        Op::Txn(txn(
            vec![Compare::new(
                "a",
                CompareResult::Equal,
                CompareTarget::Value(Bytes::from_static(b"nope")),
            )],
            vec![rput("b", "1")],
            vec![],
        )),
    ];
    let r = check("txn_inner_headers_follow_changes", Limits::default(), ops);
    let resp = txn_reply(&r[1]);
    assert_eq!(resp.header, header(3));
    let revisions: Vec<i64> = resp
        .responses
        .iter()
        .map(|op| match op {
            ResponseOp::Range(x) => x.header.revision,
            ResponseOp::Put(x) => x.header.revision,
            ResponseOp::DeleteRange(x) => x.header.revision,
            ResponseOp::Txn(x) => x.header.revision,
        })
        .collect();
    assert_eq!(revisions, vec![2, 2, 3, 3, 3, 0]);
    let ResponseOp::Txn(inner) = &resp.responses[5] else {
        panic!()
    };
    let ResponseOp::Range(inner_range) = &inner.responses[0] else {
        panic!()
    };
    assert_eq!(inner_range.header, header(3));
    assert_eq!(txn_reply(&r[2]).header, header(3));
    let failed = txn_reply(&r[3]);
    assert!(!failed.succeeded);
    assert!(failed.responses.is_empty());
    assert_eq!(failed.header, header(3));
}

#[test]
fn txn_compare_rules() {
    // §4.3: missing keys fail value compares and are all-zero for the others; a range
    // compare must hold for every key in it.
    let c = |key: &'static str, result, target| Compare::new(key, result, target);
    let with_end = |key: &'static str, end: &'static str, result, target| Compare {
        range_end: Bytes::from_static(end.as_bytes()),
        ..Compare::new(key, result, target)
    };
    let value = |v: &'static str| CompareTarget::Value(Bytes::from_static(v.as_bytes()));
    let compares = vec![
        c("missing", CompareResult::NotEqual, value("x")),
        c("missing", CompareResult::Equal, CompareTarget::Version(0)),
        c("missing", CompareResult::Equal, CompareTarget::Create(0)),
        c("missing", CompareResult::Less, CompareTarget::Mod(1)),
        c("missing", CompareResult::Equal, CompareTarget::Lease(0)),
        c("p1", CompareResult::Greater, value("a")),
        c("p1", CompareResult::Equal, CompareTarget::Lease(7)),
        with_end("p", "q", CompareResult::Greater, CompareTarget::Version(0)),
        with_end("p", "q", CompareResult::Equal, CompareTarget::Mod(2)),
        with_end("p", "\0", CompareResult::Less, CompareTarget::Mod(4)),
        with_end("p", "\0", CompareResult::Less, CompareTarget::Mod(3)),
        with_end("q", "p", CompareResult::Equal, value("")),
        with_end("q", "p", CompareResult::Equal, CompareTarget::Version(0)),
    ];
    let mut ops = vec![
        Op::Put(PutRequest {
            lease: 7,
            ..PutRequest::new("p1", "b")
        }),
        put("p2", "c"),
    ];
    for cmp in compares {
        ops.push(Op::Txn(txn(vec![cmp], vec![rget("p1")], vec![rget("p2")])));
    }
    let r = check("txn_compare_rules", Limits::default(), ops);
    let outcomes: Vec<bool> = r[2..]
        .iter()
        .map(|reply| txn_reply(reply).succeeded)
        .collect();
    assert_eq!(
        outcomes,
        vec![
            false, true, true, true, true, true, true, true, false, true, false, false, true
        ]
    );
}

#[test]
fn delete_then_put_starts_new_generation() {
    let ops = vec![
        put("a", "1"),
        put("a", "2"),
        Op::DeleteRange(DeleteRangeRequest {
            prev_kv: true,
            ..DeleteRangeRequest::key("a")
        }),
        put("a", "3"),
        get("a"),
        get_at("a", 3),
        get_at("a", 4),
        Op::Reopen,
        get("a"),
        get_at("a", 3),
    ];
    let r = check(
        "delete_then_put_starts_new_generation",
        Limits::default(),
        ops,
    );
    assert_eq!(
        r[2],
        Reply::DeleteRange(Ok(DeleteRangeResponse {
            header: header(4),
            deleted: 1,
            prev_kvs: vec![kv("a", 2, 3, 2, "2")]
        }))
    );
    assert_eq!(r[4], range_ok(5, vec![kv("a", 5, 5, 1, "3")], false, 1));
    assert_eq!(r[5], range_ok(5, vec![kv("a", 2, 3, 2, "2")], false, 1));
    assert_eq!(r[6], range_ok(5, vec![], false, 0));
}

#[test]
fn delete_and_noop_txn_keep_revision() {
    let ops = vec![
        put("a", "1"),
        del("nothing"),
        Op::DeleteRange(DeleteRangeRequest {
            range_end: Bytes::from_static(b"a"),
            ..DeleteRangeRequest::key("b")
        }),
        Op::Txn(txn(vec![], vec![rget("a"), rdel("nothing", "")], vec![])),
        Op::Txn(txn(vec![], vec![], vec![])),
        Op::Txn(txn(
            vec![Compare::new(
                "a",
                CompareResult::Equal,
                CompareTarget::Version(9),
            )],
            vec![rput("a", "x")],
            vec![],
        )),
        get("a"),
        Op::DeleteRange(DeleteRangeRequest {
            range_end: Bytes::from_static(b"\0"),
            prev_kv: true,
            ..DeleteRangeRequest::key("\0")
        }),
        del("a"),
    ];
    let r = check("delete_and_noop_txn_keep_revision", Limits::default(), ops);
    assert_eq!(
        r[1],
        Reply::DeleteRange(Ok(DeleteRangeResponse {
            header: header(2),
            deleted: 0,
            prev_kvs: vec![]
        }))
    );
    assert_eq!(r[6], range_ok(2, vec![kv("a", 2, 2, 1, "1")], false, 1));
    assert_eq!(
        r[8],
        Reply::DeleteRange(Ok(DeleteRangeResponse {
            header: header(3),
            deleted: 0,
            prev_kvs: vec![]
        }))
    );
}

#[test]
fn put_flags_and_errors() {
    let flags = |key: &'static str, value: &'static str, lease, ignore_value, ignore_lease| {
        Op::Put(PutRequest {
            lease,
            prev_kv: true,
            ignore_value,
            ignore_lease,
            ..PutRequest::new(key, value)
        })
    };
    let ops = vec![
        flags("a", "", 0, true, false),
        flags("a", "", 0, false, true),
        flags("a", "v", 0, true, false),
        flags("a", "", 3, false, true),
        flags("", "v", 0, false, false),
        flags("a", "1", 5, false, false),
        flags("a", "2", 0, false, true),
        flags("a", "", 0, true, false),
        flags("a", "", 0, true, true),
        flags("a", "3", i64::MIN, false, false),
        get("a"),
    ];
    let r = check("put_flags_and_errors", Limits::default(), ops);
    assert_eq!(r[0], Reply::Put(Err(Error::KeyNotFound)));
    assert_eq!(r[1], Reply::Put(Err(Error::KeyNotFound)));
    assert_eq!(r[2], Reply::Put(Err(Error::ValueProvided)));
    assert_eq!(r[3], Reply::Put(Err(Error::LeaseProvided)));
    assert_eq!(r[4], Reply::Put(Err(Error::KeyNotProvided)));
    let with_lease = |mut kv: KeyValue, lease| {
        kv.lease = lease;
        kv
    };
    assert_eq!(
        r[5],
        Reply::Put(Ok(PutResponse {
            header: header(2),
            prev_kv: None
        }))
    );
    assert_eq!(
        r[6],
        Reply::Put(Ok(PutResponse {
            header: header(3),
            prev_kv: Some(with_lease(kv("a", 2, 2, 1, "1"), 5))
        }))
    );
    assert_eq!(
        r[7],
        Reply::Put(Ok(PutResponse {
            header: header(4),
            prev_kv: Some(with_lease(kv("a", 2, 3, 2, "2"), 5))
        }))
    );
    assert_eq!(
        r[8],
        Reply::Put(Ok(PutResponse {
            header: header(5),
            prev_kv: Some(kv("a", 2, 4, 3, "2"))
        }))
    );
    assert_eq!(
        r[10],
        range_ok(
            6,
            vec![with_lease(kv("a", 2, 6, 5, "3"), i64::MIN)],
            false,
            1
        )
    );
}

#[test]
fn request_too_large() {
    // The api.rs example: key "big" with a 1,572,836-byte value fits; 1,572,838 does not.
    let big = |len| Op::Put(PutRequest::new("big", vec![b'v'; len]));
    let ops = vec![
        big(1_572_836),
        big(1_572_838),
        Op::Put(PutRequest {
            ignore_value: true,
            ..PutRequest::new("big", vec![b'v'; 1_572_838])
        }),
        Op::Range(RangeRequest {
            keys_only: true,
            ..RangeRequest::key("big")
        }),
    ];
    let r = check("request_too_large", Limits::default(), ops);
    assert!(matches!(r[0], Reply::Put(Ok(_))));
    assert_eq!(r[1], Reply::Put(Err(Error::RequestTooLarge)));
    assert_eq!(r[2], Reply::Put(Err(Error::ValueProvided)));
}

#[test]
fn range_count_only_keys_only_and_filters() {
    let mut ops = vec![
        put("a", "1"),
        put("b", "2"),
        put("a", "3"),
        put("c", "4"),
        del("b"),
        put("d", "5"),
    ];
    let all = RangeRequest {
        key: Bytes::from_static(b"a"),
        range_end: Bytes::from_static(b"\0"),
        ..RangeRequest::default()
    };
    ops.extend([
        Op::Range(RangeRequest {
            count_only: true,
            limit: 1,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            keys_only: true,
            limit: 2,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            min_mod_revision: 4,
            limit: 1,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            max_mod_revision: 4,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            min_create_revision: 3,
            sort_order: SortOrder::Descend,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            max_create_revision: 2,
            revision: 3,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            limit: -1,
            sort_target: SortTarget::Mod,
            ..all.clone()
        }),
        Op::Range(RangeRequest {
            range_end: Bytes::from_static(b"a"),
            ..RangeRequest::key("b")
        }),
        Op::Range(RangeRequest {
            range_end: Bytes::from_static(b"c"),
            ..RangeRequest::key("a")
        }),
    ]);
    let r = check(
        "range_count_only_keys_only_and_filters",
        Limits::default(),
        ops,
    );
    assert_eq!(r[6], range_ok(7, vec![], false, 3));
    let mut a = kv("a", 2, 4, 2, "");
    let mut c = kv("c", 5, 5, 1, "");
    assert_eq!(r[7], range_ok(7, vec![a.clone(), c.clone()], true, 3));
    a.value = Bytes::from_static(b"3");
    c.value = Bytes::from_static(b"4");
    assert_eq!(r[8], range_ok(7, vec![a.clone()], true, 3));
    assert_eq!(r[13], range_ok(7, vec![], false, 0));
    assert_eq!(r[14], range_ok(7, vec![a], false, 1));
}

#[test]
fn compaction_keeps_reads_at_or_above() {
    // §5.3's example shifted by one revision: put k@2, put k@3, del k@4, put k@5, del k@6.
    let mut ops = vec![
        put("k", "1"),
        put("k", "2"),
        del("k"),
        put("k", "3"),
        del("k"),
        put("other", "x"),
    ];
    for rev in [3, 5, 6, 7] {
        ops.push(compact(rev));
        ops.extend((rev - 1..=8).map(|r| get_at("k", r)));
        ops.push(Op::HashKv(0));
        ops.push(Op::HashKv(rev));
        ops.push(Op::Reopen);
    }
    ops.push(compact(7));
    check("compaction_keeps_reads_at_or_above", Limits::default(), ops);
}

#[test]
fn compaction_errors_and_compact_zero() {
    let ops = vec![
        compact(-5),
        compact(0),
        compact(0),
        Op::Reopen,
        compact(1),
        compact(2),
        put("a", "1"),
        compact(2),
        Op::HashKv(1),
        Op::HashKv(2),
        Op::HashKv(3),
        Op::Reopen,
        compact(2),
        Op::HashKv(0),
    ];
    let r = check("compaction_errors_and_compact_zero", Limits::default(), ops);
    assert_eq!(r[8], Reply::HashKv(Err(Error::Compacted)));
    assert_eq!(r[10], Reply::HashKv(Err(Error::FutureRevision)));
    assert_eq!(r[12], Reply::Compact(Err(Error::Compacted)));
}

#[test]
fn reopen_preserves_state_and_hash() {
    let mut ops = Vec::new();
    for i in 0..30 {
        ops.push(put(["a", "b", "c"][i % 3], ["1", "2"][i % 2]));
        if i % 7 == 0 {
            ops.push(del("b"));
        }
    }
    ops.extend([
        Op::HashKv(0),
        Op::HashKv(10),
        compact(12),
        Op::HashKv(0),
        Op::Reopen,
        Op::HashKv(12),
        Op::Reopen,
        Op::Reopen,
    ]);
    check("reopen_preserves_state_and_hash", Limits::default(), ops);
}

#[test]
fn small_limits_random_prefix() {
    // One short random sequence with small limits, so that a plain `cargo test` always
    // covers the size and op-count errors even if the default seeds change.
    let mut seed = 0;
    let seq = loop {
        let seq = generate(seed, 400);
        if seq.limits.max_txn_ops < 128 && seq.limits.max_request_bytes <= 4096 {
            break seq;
        }
        seed += 1;
    };
    let label = format!("seed {seed} (small limits {:?})", seq.limits);
    let dir = tempfile::tempdir().unwrap();
    run(&Seq { label, ..seq }, dir.path());
}
