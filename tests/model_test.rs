//! Reference-model tests of the engine's KV, lease and watch semantics (etcd 3.6: revisions,
//! Range, Put, DeleteRange, Txn, compaction, HashKV, reopen, leases with expiry on a manual
//! clock, watches from any revision).
//!
//! - `model_*` tests check the model alone against hand-computed cases (etcd's documented and
//!   observed behaviour, Mesos's quota rules, kvd's design documents), so the model can be
//!   trusted as an oracle.
//! - `random_sequences` runs seeded random sequences through engine and model
//!   (`tests/model/harness.rs` and `tests/model/watch.rs` say what is compared), space
//!   quota, alarms, the quota registry and records, and bursts into the write prepare queue
//!   included. Defaults: 8 seeds × 1,500 ops (12,000), and it asserts that restarts,
//!   NOSPACE, limit refusals, queue refusals, bursts with every Put admitted and the rest
//!   were exercised. For longer runs set `KVD_MODEL_SEEDS` (a count `N` for seeds 0..N,
//!   a range `A..B`, or a list `A,B,C`) and `KVD_MODEL_OPS`. A failure names its seed and op
//!   index; it replays with `KVD_MODEL_SEEDS=<seed>..<seed+1> KVD_MODEL_OPS=<index+1>` (a
//!   watch failure found at the end of a segment replays the same way, since the watches of
//!   a segment are checked before the Reopen that ends it or at the end).
//! - The other tests run small fixed sequences, named for the behaviour they pin down,
//!   through the same harness, after asserting the model's replies (and for watches the
//!   engine's events) by hand.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod model;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvd::quota::RawQuotaConfig;
use kvd::{
    AgentState, AlarmAction, AlarmMember, AlarmRequest, AlarmResponse, AlarmType,
    CompactionRequest, CompactionResponse, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Error, EventType, KeyValue, LeaseGrantRequest,
    LeaseGrantResponse, LeaseKeepAliveResponse, LeaseLeasesResponse, LeaseRevokeResponse,
    LeaseTimeToLiveResponse, PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp,
    ResponseHeader, ResponseOp, SortOrder, SortTarget, TxnRequest, TxnResponse, WatchCreateRequest,
};
use model::ops::{QuotaOp, Reply, StreamKind};
use model::watch::WatchLog;
use model::{Coverage, Limits, Model, Op, Seq, Trace, decode, generate, run};

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
    check_traced(name, limits, ops).0
}

/// [`check`], also returning what the run observed (hashes, how each watch ended).
fn check_traced(name: &str, limits: Limits, ops: Vec<Op>) -> (Vec<Reply>, Trace) {
    let replies = model_replies(limits, &ops);
    let seq = Seq {
        label: format!("fixed sequence `{name}`"),
        limits,
        ops,
    };
    let dir = tempfile::tempdir().unwrap();
    let trace = run(&seq, dir.path());
    (replies, trace)
}

fn grant(id: i64, ttl: i64) -> Op {
    Op::LeaseGrant(LeaseGrantRequest { ttl, id })
}

fn put_lease(key: &'static str, value: &'static str, lease: i64) -> Op {
    Op::Put(PutRequest {
        lease,
        ..PutRequest::new(key, value)
    })
}

fn rput_lease(key: &'static str, lease: i64) -> RequestOp {
    RequestOp::Put(PutRequest {
        lease,
        ..PutRequest::new(key, "v")
    })
}

fn advance_ms(ms: u64) -> Op {
    Op::AdvanceClock(Duration::from_millis(ms))
}

fn time_to_live(id: i64) -> Op {
    Op::LeaseTimeToLive { id, keys: true }
}

fn watch(stream: StreamKind, req: WatchCreateRequest) -> Op {
    Op::Watch { stream, req }
}

fn from(start_revision: i64, req: WatchCreateRequest) -> WatchCreateRequest {
    WatchCreateRequest {
        start_revision,
        ..req
    }
}

fn keys(list: &[&'static str]) -> Vec<Bytes> {
    list.iter()
        .map(|k| Bytes::from_static(k.as_bytes()))
        .collect()
}

fn ttl_reply(
    revision: i64,
    id: i64,
    ttl: i64,
    granted_ttl: i64,
    attached: &[&'static str],
) -> Reply {
    Reply::LeaseTimeToLive(Ok(LeaseTimeToLiveResponse {
        header: header(revision),
        id,
        ttl,
        granted_ttl,
        keys: keys(attached),
    }))
}

/// The log of the watch created by op `op`.
fn watch_log(trace: &Trace, op: usize) -> &WatchLog {
    trace
        .watches
        .iter()
        .find(|w| w.op == op)
        .unwrap_or_else(|| panic!("no watch created by op #{op}: {:?}", trace.watches))
}

/// (kind, key, mod revision) of each event, for hand assertions.
fn event_summary(log: &WatchLog) -> Vec<(EventType, String, i64)> {
    log.events
        .iter()
        .map(|e| {
            (
                e.kind,
                String::from_utf8_lossy(&e.kv.key).into_owned(),
                e.kv.mod_revision,
            )
        })
        .collect()
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
    let total = Mutex::new(Coverage::default());
    let started = Instant::now();
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
                    let trace = run(&seq, dir.path());
                    total.lock().unwrap().add(&trace.coverage);
                }
            });
        }
    });
    let total = total.into_inner().unwrap();
    let w = &total.watches;
    let sp = &total.space;
    // Shown with --nocapture: what the run covered.
    println!(
        "random_sequences: {} seeds, {} ops in {:.1?}; restarts {}; leases expired {} ({} with \
         keys; waited {:.1?} for expiry); watches {} (refused {}, compacted at create {}, \
         compacted while behind {}, full lists {}), {} events checked, {} grouped catch-up \
         responses, {} progress notifications",
        seeds.len(),
        total.ops,
        started.elapsed(),
        total.restarts,
        total.expired_leases,
        total.expired_with_keys,
        total.expiry_wait,
        w.created,
        w.refused,
        w.compacted_at_create,
        w.compacted_while_behind,
        w.full,
        w.events,
        w.grouped_responses,
        w.progress,
    );
    println!(
        "  space: {} NOSPACE replies (latched {}, filesystem reserve {}, quota certain {}, \
         quota engine's call {}); accepted under a quota: certain {} (after a measurement {}), \
         engine's call {}, after a disarm {}; {} disarms, {} defrags, {} measurements, {} \
         refused under CORRUPT",
        total.no_space,
        sp.refused_latched,
        sp.refused_fs,
        sp.refused_must,
        sp.refused_either,
        sp.accepted_must,
        sp.accepted_measured,
        sp.accepted_either,
        sp.accepted_after_disarm,
        sp.disarms,
        total.defrags,
        total.measurements,
        sp.refused_corrupt,
    );
    println!(
        "  quota: {} requests applied, {} refused as invalid, {} writes and records refused by \
         a limit ({} naming another over-limit role than the documented first); {} recounts \
         compared with the engine's report (up to {} rows)",
        total.quota_applied,
        total.quota_request_refused,
        total.quota_exceeded,
        total.limit_order_divergences,
        total.recounts,
        total.rows_max,
    );
    let q = &total.queue;
    println!(
        "  prepare queue: {} bursts ({} not sent: timing-dependent), {} Puts, {} refused ({} at \
         the bound, {} for the role's share), {} admitted beside others, {} bursts all \
         admitted, {} of several roles; {} reports compared",
        q.bursts,
        q.skipped,
        q.writes,
        q.refused,
        q.refused_at_bound,
        q.refused_for_share,
        q.admitted_beside_others,
        q.all_admitted,
        q.multi_role,
        q.reports,
    );
    assert!(total.ops >= seeds.len() * ops * 9 / 10, "{total:?}");
    // Every category is exercised, or the run proves less than it claims.
    if ops >= 1000 && seeds.len() >= 8 {
        let exercised = [
            ("restarts", total.restarts),
            ("NOSPACE replies", total.no_space),
            ("quota refusals certain for the model", sp.refused_must),
            ("filesystem reserve refusals", sp.refused_fs),
            ("writes accepted after a disarm", sp.accepted_after_disarm),
            ("writes the model knew must fit", sp.accepted_must),
            ("writes a measurement showed must fit", sp.accepted_measured),
            (
                "writes the engine refused where the model could not tell",
                sp.refused_either,
            ),
            ("defrags", total.defrags),
            ("CORRUPT refusals", sp.refused_corrupt),
            ("limit refusals", total.quota_exceeded),
            (
                "invalid registry or record requests",
                total.quota_request_refused,
            ),
            ("registry and record requests applied", total.quota_applied),
            ("prepare queue bursts", q.bursts),
            ("prepare queue refusals", q.refused),
            ("prepare queue refusals at the bound", q.refused_at_bound),
            ("prepare queue refusals for a share", q.refused_for_share),
            ("bursts with every Put admitted", q.all_admitted),
            ("bursts of several roles", q.multi_role),
        ];
        for (what, count) in exercised {
            assert!(count > 0, "no {what} in this run: {total:?}");
        }
        assert!(
            total.ops >= 10_000,
            "a CI run checks at least 10,000 operations"
        );
    }
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
        first.hashes, second.hashes,
        "two engines fed seed 1001 answered HashKV differently"
    );
}

#[test]
fn generated_sequences_retry_and_reuse_operation_ids_and_the_engine_applies_once() {
    let seq = generate(11, 3_000);
    let mut firsts: std::collections::BTreeMap<&str, &Op> = Default::default();
    let (mut retries, mut reuses) = (0, 0);
    for op in &seq.ops {
        if let Op::Once { id, op } = op {
            match firsts.get(id.as_str()) {
                Some(first) if **first == **op => retries += 1,
                Some(_) => reuses += 1,
                None => {
                    firsts.insert(id, op);
                }
            }
        }
    }
    assert!(
        retries >= 20 && reuses >= 5,
        "retries {retries}, reuses {reuses}"
    );
    // The engine agrees with the model on every reply and revision (exactly-once included).
    let dir = tempfile::tempdir().unwrap();
    run(&seq, dir.path());
}

// ---- The model alone ----------------------------------------------------------------------

#[test]
fn model_revisions_and_generations() {
    // A fresh store is at 1 and the first write makes 2. Put a@2, put a@3,
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
    // One revision per write txn: txn{range a; put a; range a} at 22 → range 22, put 23,
    // range 23 (new value).
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
    // etcd's sort quirk: s1(v3), s2(v3), s3(v2), s4(v1); target VERSION, limit 2: NONE →
    // [s3, s1] (only the first 3 keys are looked at), ASCEND → [s4, s3].
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
    // etcd 3.4.23 on a fresh store: compact −5 → compacted; 0 → OK; 0 again → compacted;
    // 1 → OK; 2 → future. After compact 3, rev 2 fails, rev 3 reads, future checked first.
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
    // etcd 3.4.23 with 128 max ops: 129 puts rejected; 128 ranges accepted; 2 + nested 127
    // rejected.
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
    for seed in 0..8 {
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
                Reply::LeaseGrant(Ok(r)) if r.id == 0 => "grant auto id".to_owned(),
                Reply::LeaseGrant(Ok(_)) => "grant ok".to_owned(),
                Reply::LeaseRevoke(Ok(_)) => "revoke ok".to_owned(),
                Reply::LeaseKeepAlive(Ok(r)) if r.ttl > 0 => "keep-alive ok".to_owned(),
                Reply::LeaseKeepAlive(Ok(_)) => "keep-alive unknown".to_owned(),
                Reply::LeaseTimeToLive(Ok(r)) if !r.keys.is_empty() => "ttl with keys".to_owned(),
                Reply::LeaseTimeToLive(Ok(r)) if r.ttl < 0 => "ttl unknown".to_owned(),
                Reply::LeaseTimeToLive(Ok(_)) => "ttl ok".to_owned(),
                Reply::LeaseLeases(Ok(r)) if r.leases.len() > 1 => "leases several".to_owned(),
                Reply::LeaseLeases(Ok(_)) => "leases".to_owned(),
                Reply::AdvanceClock(expired) if !expired.is_empty() => "expiry".to_owned(),
                Reply::AdvanceClock(_) => "clock".to_owned(),
                Reply::Watch => "watch".to_owned(),
                Reply::SettleWatches => "settle".to_owned(),
                Reply::Alarm(Ok(r)) if r.alarms.is_empty() => "alarm nothing".to_owned(),
                Reply::Alarm(Ok(_)) => "alarm listed".to_owned(),
                Reply::Defrag(Ok(_)) => "defrag".to_owned(),
                Reply::MeasureSpace => "measure".to_owned(),
                Reply::SetFreeSpace => "free space".to_owned(),
                Reply::Quota(Ok(_)) => "quota ok".to_owned(),
                Reply::QueueBurst(None) => "queue burst not sent".to_owned(),
                Reply::QueueBurst(Some(answers))
                    if answers
                        .iter()
                        .any(|a| matches!(a, Err(Error::TooManyRequests { .. }))) =>
                {
                    "queue refusal".to_owned()
                }
                Reply::QueueBurst(Some(_)) => "queue burst admitted".to_owned(),
                Reply::Put(Err(e))
                | Reply::DeleteRange(Err(e))
                | Reply::Txn(Err(e))
                | Reply::Range(Err(e))
                | Reply::Compact(Err(e))
                | Reply::HashKv(Err(e))
                | Reply::LeaseGrant(Err(e))
                | Reply::LeaseRevoke(Err(e))
                | Reply::LeaseKeepAlive(Err(e))
                | Reply::LeaseTimeToLive(Err(e))
                | Reply::LeaseLeases(Err(e))
                | Reply::Alarm(Err(e))
                | Reply::Defrag(Err(e))
                | Reply::Quota(Err(e)) => {
                    let text = format!("{e:?}");
                    text.split('(').next().unwrap_or_default().to_owned()
                }
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
        "grant ok",
        "grant auto id",
        "revoke ok",
        "keep-alive ok",
        "keep-alive unknown",
        "ttl with keys",
        "ttl unknown",
        "ttl ok",
        "leases several",
        "expiry",
        "clock",
        "watch",
        "settle",
        "LeaseNotFound",
        "LeaseExists",
        "LeaseTtlTooLarge",
        "alarm nothing",
        "alarm listed",
        "defrag",
        "measure",
        "free space",
        "quota ok",
        "NoSpace",
        "Corrupt",
        "QuotaExceeded",
        "QuotaRequest",
        "queue refusal",
        "queue burst admitted",
    ] {
        assert!(
            seen.contains(want),
            "no `{want}` in 8 × 1500 generated ops; seen: {seen:?}"
        );
    }
}

// ---- Fixed sequences through the engine ---------------------------------------------------

#[test]
fn txn_nested_compare_sees_start_state() {
    // Compares see the state before the txn: `put nc` then a nested `version(nc) == 0`
    // compare takes the nested success branch, and the nested range (run after the put)
    // sees nc.
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
    // Inside a txn a negative revision is compared with the compaction revision
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
    // etcd 3.4.23: put t9 + delete [t, ∞) is accepted and the delete removes t9 too.
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
    // Validation before duplicate keys, before the size limit, before the apply-time
    // pre-checks, where Puts are checked before Ranges.
    let limits = Limits {
        max_txn_ops: 4,
        max_request_bytes: 512,
        ..Limits::default()
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
    // The pre-checks run on the chosen branches recursively, whatever ops come before
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
    // A nested Range below the compaction revision fails the whole txn before the Put
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
    // Missing keys fail value compares and are all-zero for the others; a range
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
    let mut ops = vec![grant(7, 60), put_lease("p1", "b", 7), put("p2", "c")];
    for cmp in compares {
        ops.push(Op::Txn(txn(vec![cmp], vec![rget("p1")], vec![rget("p2")])));
    }
    let r = check("txn_compare_rules", Limits::default(), ops);
    let outcomes: Vec<bool> = r[3..]
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
    let mut ops = vec![
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
    // The leases come first, so that the indices below are those of the ops above.
    let mut with_leases = vec![grant(5, 60), grant(i64::MIN, 60)];
    with_leases.append(&mut ops);
    let r = check("put_flags_and_errors", Limits::default(), with_leases);
    let r = &r[2..];
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
    // etcd's key_index.go example shifted by one revision: put k@2, put k@3, del k@4,
    // put k@5, del k@6.
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

// ---- Leases -------------------------------------------------------------------------------

#[test]
fn model_lease_rules() {
    // TTLs below 2 s are raised to it, above 9e9 refused; an existing id is refused; a
    // grant moves no revision. The list is soonest deadline first (ties by id).
    let ops = vec![
        grant(0, 1),
        grant(4, 0),
        grant(4, 10),
        grant(5, -5),
        grant(6, 9_000_000_001),
        grant(6, 9_000_000_000),
        grant(-1, 10),
        Op::LeaseLeases,
        advance_ms(2_000),
        Op::LeaseLeases,
        Op::LeaseRevoke(4),
        Op::LeaseKeepAlive(4),
        time_to_live(4),
    ];
    let r = model_replies(Limits::default(), &ops);
    let granted = |id, ttl| {
        Reply::LeaseGrant(Ok(LeaseGrantResponse {
            header: header(1),
            id,
            ttl,
        }))
    };
    assert_eq!(
        r[0],
        granted(0, 2),
        "the model answers id 0 for an engine-chosen id"
    );
    assert_eq!(r[1], granted(4, 2));
    assert_eq!(r[2], Reply::LeaseGrant(Err(Error::LeaseExists)));
    assert_eq!(r[3], granted(5, 2));
    assert_eq!(r[4], Reply::LeaseGrant(Err(Error::LeaseTtlTooLarge)));
    assert_eq!(r[5], granted(6, 9_000_000_000));
    assert_eq!(r[6], granted(-1, 10));
    let leases = |ids: Vec<i64>| {
        Reply::LeaseLeases(Ok(LeaseLeasesResponse {
            header: header(1),
            leases: ids,
        }))
    };
    assert_eq!(r[7], leases(vec![4, 5, -1, 6]));
    assert_eq!(r[8], Reply::AdvanceClock(vec![4, 5]));
    assert_eq!(r[9], leases(vec![-1, 6]));
    assert_eq!(r[10], Reply::LeaseRevoke(Err(Error::LeaseNotFound)));
    assert_eq!(
        r[11],
        Reply::LeaseKeepAlive(Ok(LeaseKeepAliveResponse {
            header: header(1),
            id: 4,
            ttl: 0
        }))
    );
    assert_eq!(r[12], ttl_reply(1, 4, -1, 0, &[]));
}

#[test]
fn lease_grant_rules_and_engine_chosen_ids() {
    // Through the engine: the harness takes the id the engine picks for id 0 (positive and
    // unused) into the model, so the lease list and its expiry are compared too.
    let ops = vec![
        grant(0, 1),
        grant(0, 30),
        grant(4, 0),
        grant(4, 10),
        grant(5, -5),
        grant(6, 9_000_000_001),
        grant(6, 9_000_000_000),
        grant(-1, 10),
        Op::LeaseLeases,
        advance_ms(2_000),
        Op::LeaseLeases,
        Op::Reopen,
        Op::LeaseLeases,
        advance_ms(10_000),
        Op::LeaseLeases,
    ];
    check(
        "lease_grant_rules_and_engine_chosen_ids",
        Limits::default(),
        ops,
    );
}

#[test]
fn lease_expiry_deletes_keys_in_one_revision() {
    // An expired lease is revoked through the revoke path: its keys deleted in
    // key order, in one revision; keep-alive renews to a full TTL from now.
    let prefix_s = WatchCreateRequest {
        prev_kv: true,
        ..WatchCreateRequest::prefix("s")
    };
    let ops = vec![
        grant(1, 5),
        grant(2, 50),
        put_lease("s2", "v", 1),
        put_lease("s1", "v", 1),
        put_lease("l1", "v", 2),
        watch(StreamKind::Eager, prefix_s),
        advance_ms(3_000),
        Op::LeaseKeepAlive(1),
        advance_ms(4_000),
        time_to_live(1),
        advance_ms(1_000),
        Op::Range(RangeRequest::prefix("s")),
        time_to_live(1),
        Op::LeaseLeases,
        time_to_live(2),
    ];
    let (r, trace) = check_traced(
        "lease_expiry_deletes_keys_in_one_revision",
        Limits::default(),
        ops,
    );
    assert_eq!(
        r[7],
        Reply::LeaseKeepAlive(Ok(LeaseKeepAliveResponse {
            header: header(4),
            id: 1,
            ttl: 5
        }))
    );
    assert_eq!(r[9], ttl_reply(4, 1, 1, 5, &["s1", "s2"]));
    assert_eq!(r[10], Reply::AdvanceClock(vec![1]));
    assert_eq!(r[11], range_ok(5, vec![], false, 0));
    assert_eq!(r[12], ttl_reply(5, 1, -1, 0, &[]));
    assert_eq!(
        r[13],
        Reply::LeaseLeases(Ok(LeaseLeasesResponse {
            header: header(5),
            leases: vec![2]
        }))
    );
    assert_eq!(r[14], ttl_reply(5, 2, 42, 50, &["l1"]));
    let log = watch_log(&trace, 5);
    assert_eq!(
        event_summary(log),
        vec![
            (EventType::Delete, "s1".to_owned(), 5),
            (EventType::Delete, "s2".to_owned(), 5)
        ]
    );
    let prev: Vec<Option<(i64, i64)>> = log
        .events
        .iter()
        .map(|e| e.prev_kv.as_ref().map(|kv| (kv.mod_revision, kv.lease)))
        .collect();
    assert_eq!(prev, vec![Some((3, 1)), Some((2, 1))]);
}

#[test]
fn expiry_revokes_soonest_deadline_first_ties_by_id() {
    // Several leases due at one clock step: kvd revokes them soonest deadline first, ties by
    // id (its documented order; etcd leaves it open), one revision per lease with keys.
    let all = WatchCreateRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..WatchCreateRequest::default()
    };
    let ops = vec![
        grant(9, 4),
        grant(3, 6),
        grant(8, 4),
        grant(5, 5),
        put_lease("a", "v", 9),
        put_lease("b", "v", 3),
        put_lease("c", "v", 8),
        put_lease("d", "v", 9),
        watch(StreamKind::Lazy, all.clone()),
        Op::LeaseLeases,
        advance_ms(10_000),
        watch(StreamKind::Eager, from(1, all)),
    ];
    let (r, trace) = check_traced(
        "expiry_revokes_soonest_deadline_first_ties_by_id",
        Limits::default(),
        ops,
    );
    assert_eq!(
        r[9],
        Reply::LeaseLeases(Ok(LeaseLeasesResponse {
            header: header(5),
            leases: vec![8, 9, 5, 3]
        }))
    );
    assert_eq!(r[10], Reply::AdvanceClock(vec![8, 9, 5, 3]));
    let deletes = vec![
        (EventType::Delete, "c".to_owned(), 6),
        (EventType::Delete, "a".to_owned(), 7),
        (EventType::Delete, "d".to_owned(), 7),
        (EventType::Delete, "b".to_owned(), 8),
    ];
    assert_eq!(event_summary(watch_log(&trace, 8)), deletes);
    assert_eq!(event_summary(watch_log(&trace, 11)).len(), 8);
}

#[test]
fn put_with_unknown_lease_changes_nothing() {
    // A Put naming a lease that does not exist fails with LeaseNotFound, alone or
    // in a txn (whose other ops are then not applied either); nothing changes.
    let ops = vec![
        grant(5, 60),
        put_lease("k", "v", 99),
        Op::Txn(txn(
            vec![],
            vec![rput("first", "v"), rput_lease("second", 99)],
            vec![],
        )),
        Op::Txn(txn(
            vec![],
            vec![
                rput_lease("a", 5),
                RequestOp::Txn(txn(vec![], vec![rput_lease("b", 99)], vec![])),
            ],
            vec![],
        )),
        Op::LeaseRevoke(99),
        Op::Range(RangeRequest {
            range_end: Bytes::from_static(b"\0"),
            ..RangeRequest::key("\0")
        }),
        time_to_live(5),
        // The branch not taken may name any lease.
        Op::Txn(txn(
            vec![Compare::new(
                "k",
                CompareResult::Equal,
                CompareTarget::Version(1),
            )],
            vec![rput_lease("s", 99)],
            vec![rput_lease("f", 5)],
        )),
        time_to_live(5),
    ];
    let r = check(
        "put_with_unknown_lease_changes_nothing",
        Limits::default(),
        ops,
    );
    assert_eq!(r[1], Reply::Put(Err(Error::LeaseNotFound)));
    assert_eq!(r[2], Reply::Txn(Err(Error::LeaseNotFound)));
    assert_eq!(r[3], Reply::Txn(Err(Error::LeaseNotFound)));
    assert_eq!(r[4], Reply::LeaseRevoke(Err(Error::LeaseNotFound)));
    assert_eq!(r[5], range_ok(1, vec![], false, 0));
    assert_eq!(r[6], ttl_reply(1, 5, 60, 60, &[]));
    assert!(!txn_reply(&r[7]).succeeded);
    assert_eq!(r[8], ttl_reply(2, 5, 60, 60, &["f"]));
}

#[test]
fn lease_and_key_checks_follow_etcd_order() {
    // A standalone Put checks the lease before the key `ignore_value` needs; inside a
    // txn each Put checks the key first, then its lease, one Put after the other.
    let ignore_value = |key: &'static str, lease| PutRequest {
        ignore_value: true,
        lease,
        ..PutRequest::new(key, "")
    };
    let ops = vec![
        grant(5, 60),
        Op::Put(ignore_value("missing", 99)),
        Op::Put(ignore_value("missing", 5)),
        Op::Txn(txn(
            vec![],
            vec![RequestOp::Put(ignore_value("missing", 99))],
            vec![],
        )),
        Op::Txn(txn(
            vec![],
            vec![
                rput_lease("a", 99),
                RequestOp::Put(ignore_value("missing", 0)),
            ],
            vec![],
        )),
        Op::Txn(txn(
            vec![],
            vec![
                RequestOp::Put(ignore_value("missing", 0)),
                rput_lease("a", 99),
            ],
            vec![],
        )),
        put_lease("present", "v", 5),
        Op::Put(ignore_value("present", 99)),
        Op::Txn(txn(
            vec![],
            vec![RequestOp::Put(ignore_value("present", 99))],
            vec![],
        )),
        Op::Put(PutRequest {
            ignore_lease: true,
            ..PutRequest::new("present", "v2")
        }),
        Op::Range(RangeRequest::key("present")),
    ];
    let r = check(
        "lease_and_key_checks_follow_etcd_order",
        Limits::default(),
        ops,
    );
    assert_eq!(r[1], Reply::Put(Err(Error::LeaseNotFound)));
    assert_eq!(r[2], Reply::Put(Err(Error::KeyNotFound)));
    assert_eq!(r[3], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[4], Reply::Txn(Err(Error::LeaseNotFound)));
    assert_eq!(r[5], Reply::Txn(Err(Error::KeyNotFound)));
    assert_eq!(r[7], Reply::Put(Err(Error::LeaseNotFound)));
    assert_eq!(r[8], Reply::Txn(Err(Error::LeaseNotFound)));
    let mut present = kv("present", 2, 3, 2, "v2");
    present.lease = 5;
    assert_eq!(r[10], range_ok(3, vec![present], false, 1));
}

#[test]
fn lease_attach_detach_and_ignore_lease() {
    // A Put with lease L attaches (moving the key off another lease), lease 0 detaches,
    // ignore_lease keeps; a delete detaches, also inside the txn that attached (the "\0"
    // quirk); a revoke deletes only the keys still attached; no keys, no revision.
    let all = WatchCreateRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        prev_kv: true,
        ..WatchCreateRequest::default()
    };
    let ops = vec![
        grant(5, 60),
        grant(6, 60),
        put_lease("kept", "v", 5),
        put_lease("dropped", "v", 5),
        put_lease("moved", "v", 5),
        Op::Put(PutRequest {
            ignore_lease: true,
            ..PutRequest::new("kept", "v2")
        }),
        put("dropped", "v2"),
        put_lease("moved", "v2", 6),
        Op::Txn(txn(
            vec![],
            vec![rput_lease("t", 6), rdel("t", "\0")],
            vec![],
        )),
        time_to_live(5),
        time_to_live(6),
        Op::LeaseRevoke(5),
        Op::LeaseRevoke(6),
        grant(7, 60),
        Op::LeaseRevoke(7),
        watch(StreamKind::Lazy, from(1, all)),
    ];
    let (r, trace) = check_traced(
        "lease_attach_detach_and_ignore_lease",
        Limits::default(),
        ops,
    );
    assert_eq!(r[9], ttl_reply(8, 5, 60, 60, &["kept"]));
    assert_eq!(r[10], ttl_reply(8, 6, 60, 60, &["moved"]));
    let revoked = |revision| {
        Reply::LeaseRevoke(Ok(LeaseRevokeResponse {
            header: header(revision),
        }))
    };
    assert_eq!(r[11], revoked(9));
    assert_eq!(r[12], revoked(10));
    assert_eq!(r[14], revoked(10), "no keys, no revision");
    let events = event_summary(watch_log(&trace, 15));
    assert_eq!(
        events[6..],
        [
            (EventType::Put, "t".to_owned(), 8),
            (EventType::Delete, "t".to_owned(), 8),
            (EventType::Delete, "kept".to_owned(), 9),
            (EventType::Delete, "moved".to_owned(), 10),
        ]
    );
}

#[test]
fn leases_survive_reopen_with_full_ttl_and_keys() {
    // After a restart every lease has its full TTL again from now, with its keys.
    let ops = vec![
        grant(3, 10),
        put_lease("x", "v", 3),
        advance_ms(8_000),
        watch(StreamKind::Eager, WatchCreateRequest::key("x")),
        Op::Reopen,
        time_to_live(3),
        advance_ms(9_000),
        time_to_live(3),
        advance_ms(1_000),
        get("x"),
        watch(StreamKind::Eager, from(2, WatchCreateRequest::key("x"))),
        Op::Reopen,
        Op::LeaseLeases,
    ];
    let (r, trace) = check_traced(
        "leases_survive_reopen_with_full_ttl_and_keys",
        Limits::default(),
        ops,
    );
    assert_eq!(r[5], ttl_reply(2, 3, 10, 10, &["x"]));
    assert_eq!(r[7], ttl_reply(2, 3, 1, 10, &["x"]));
    assert_eq!(r[8], Reply::AdvanceClock(vec![3]));
    assert_eq!(r[9], range_ok(3, vec![], false, 0));
    assert!(watch_log(&trace, 3).events.is_empty());
    assert_eq!(
        event_summary(watch_log(&trace, 10)),
        vec![
            (EventType::Put, "x".to_owned(), 2),
            (EventType::Delete, "x".to_owned(), 3)
        ]
    );
}

#[test]
fn keep_alive_postpones_expiry_and_ttl_truncates() {
    // Keep-alive gives a full TTL from now (0 for an unknown lease); TimeToLive
    // reports whole seconds left, truncated; expiry happens at the deadline, not before.
    let ops = vec![
        grant(1, 3),
        put_lease("k", "v", 1),
        advance_ms(1_500),
        time_to_live(1),
        Op::LeaseKeepAlive(1),
        advance_ms(2_500),
        time_to_live(1),
        Op::LeaseKeepAlive(99),
        advance_ms(250),
        advance_ms(250),
        Op::LeaseKeepAlive(1),
        time_to_live(1),
    ];
    let r = check(
        "keep_alive_postpones_expiry_and_ttl_truncates",
        Limits::default(),
        ops,
    );
    assert_eq!(r[3], ttl_reply(2, 1, 1, 3, &["k"]));
    let keep_alive = |revision, id, ttl| {
        Reply::LeaseKeepAlive(Ok(LeaseKeepAliveResponse {
            header: header(revision),
            id,
            ttl,
        }))
    };
    assert_eq!(r[4], keep_alive(2, 1, 3));
    assert_eq!(r[6], ttl_reply(2, 1, 0, 3, &["k"]));
    assert_eq!(r[7], keep_alive(2, 99, 0));
    assert_eq!(r[8], Reply::AdvanceClock(vec![]));
    assert_eq!(r[9], Reply::AdvanceClock(vec![1]));
    assert_eq!(r[10], keep_alive(3, 1, 0));
    assert_eq!(r[11], ttl_reply(3, 1, -1, 0, &[]));
}

// ---- Watches ------------------------------------------------------------------------------

#[test]
fn watch_from_compacted_revision_is_canceled() {
    // A start below the compaction revision gets created, then canceled with the
    // compaction revision; a start at it replays from it. prev_kv is omitted where
    // `mod_revision - 1` is compacted, and for a Put that creates its key.
    let k = || WatchCreateRequest::key("k");
    let ops = vec![
        put("k", "1"),
        put("k", "2"),
        put("k", "3"),
        put("k", "4"),
        put("k", "5"),
        compact(4),
        watch(StreamKind::Eager, from(3, k())),
        watch(
            StreamKind::Eager,
            from(
                4,
                WatchCreateRequest {
                    prev_kv: true,
                    ..k()
                },
            ),
        ),
        watch(
            StreamKind::Lazy,
            from(
                4,
                WatchCreateRequest {
                    no_put: true,
                    ..WatchCreateRequest::prefix("k")
                },
            ),
        ),
        del("k"),
        put("k", "6"),
    ];
    let (_, trace) = check_traced(
        "watch_from_compacted_revision_is_canceled",
        Limits::default(),
        ops,
    );
    let canceled = watch_log(&trace, 6);
    assert_eq!((canceled.compacted, canceled.events.len()), (Some(4), 0));
    let replay = watch_log(&trace, 7);
    assert_eq!(
        event_summary(replay),
        vec![
            (EventType::Put, "k".to_owned(), 4),
            (EventType::Put, "k".to_owned(), 5),
            (EventType::Put, "k".to_owned(), 6),
            (EventType::Delete, "k".to_owned(), 7),
            (EventType::Put, "k".to_owned(), 8),
        ]
    );
    let prev: Vec<Option<i64>> = replay
        .events
        .iter()
        .map(|e| e.prev_kv.as_ref().map(|kv| kv.mod_revision))
        .collect();
    assert_eq!(prev, vec![None, Some(4), Some(5), Some(6), None]);
    assert_eq!(replay.compacted, None);
    assert_eq!(
        event_summary(watch_log(&trace, 8)),
        vec![(EventType::Delete, "k".to_owned(), 7)]
    );
}

#[test]
fn watch_refusals_and_ids() {
    // An empty range and a negative start are refused (created and canceled, id -1);
    // automatic ids count from 0 per stream; an explicit id is used as given.
    let ops = vec![
        put("a", "1"),
        watch(
            StreamKind::Eager,
            WatchCreateRequest {
                range_end: Bytes::from_static(b"a"),
                ..WatchCreateRequest::key("b")
            },
        ),
        watch(StreamKind::Eager, from(-1, WatchCreateRequest::key("a"))),
        watch(StreamKind::Eager, WatchCreateRequest::key("a")),
        watch(
            StreamKind::Eager,
            WatchCreateRequest {
                watch_id: 1 << 32,
                ..WatchCreateRequest::key("a")
            },
        ),
        watch(StreamKind::Eager, WatchCreateRequest::key("a")),
        watch(StreamKind::Lazy, WatchCreateRequest::key("a")),
        watch(StreamKind::Lazy, WatchCreateRequest::default()),
        put("a", "2"),
        put("\0", "3"),
    ];
    let (_, trace) = check_traced("watch_refusals_and_ids", Limits::default(), ops);
    let ids: Vec<(i64, bool, usize)> = (1..=7)
        .map(|op| {
            let log = watch_log(&trace, op);
            (log.id, log.refused, log.events.len())
        })
        .collect();
    assert_eq!(
        ids,
        vec![
            (-1, true, 0),
            (-1, true, 0),
            (0, false, 1),
            (1 << 32, false, 1),
            (1, false, 1),
            (0, false, 1),
            (1, false, 1),
        ]
    );
}

#[test]
fn watch_sees_txn_revoke_and_expiry_changes_in_order() {
    // The events of one write request come in change order (a txn's op order; a
    // revoke's key order), one revision at a time; the "\0" quirk puts and deletes one key
    // in one revision.
    let all = WatchCreateRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        prev_kv: true,
        ..WatchCreateRequest::default()
    };
    let ops = vec![
        grant(1, 5),
        watch(StreamKind::Eager, all.clone()),
        Op::Txn(txn(
            vec![],
            vec![rput("x", "1"), rput_lease("b", 1), rput_lease("a", 1)],
            vec![],
        )),
        put_lease("c", "v", 1),
        Op::LeaseRevoke(1),
        Op::Txn(txn(vec![], vec![rput("t9", "1"), rdel("t", "\0")], vec![])),
        grant(2, 3),
        put_lease("k", "v", 2),
        advance_ms(3_000),
        watch(
            StreamKind::Lazy,
            from(
                1,
                WatchCreateRequest {
                    no_put: true,
                    ..all.clone()
                },
            ),
        ),
        watch(
            StreamKind::Eager,
            from(
                4,
                WatchCreateRequest {
                    no_delete: true,
                    ..all
                },
            ),
        ),
    ];
    let (_, trace) = check_traced(
        "watch_sees_txn_revoke_and_expiry_changes_in_order",
        Limits::default(),
        ops,
    );
    let e = |kind, key: &str, rev| (kind, key.to_owned(), rev);
    use EventType::{Delete, Put};
    let everything = vec![
        e(Put, "x", 2),
        e(Put, "b", 2),
        e(Put, "a", 2),
        e(Put, "c", 3),
        e(Delete, "a", 4),
        e(Delete, "b", 4),
        e(Delete, "c", 4),
        e(Put, "t9", 5),
        e(Delete, "t9", 5),
        e(Delete, "x", 5),
        e(Put, "k", 6),
        e(Delete, "k", 7),
    ];
    assert_eq!(event_summary(watch_log(&trace, 1)), everything);
    let deletes: Vec<_> = everything
        .iter()
        .filter(|(kind, _, _)| *kind == Delete)
        .cloned()
        .collect();
    assert_eq!(event_summary(watch_log(&trace, 9)), deletes);
    assert_eq!(
        event_summary(watch_log(&trace, 10)),
        vec![e(Put, "t9", 5), e(Put, "k", 6)]
    );
}

#[test]
fn watch_from_the_past_across_reopens_and_compactions() {
    // Catch-up from the history written before a restart, at and above the compaction
    // revision, with filters; a future start waits for its revision.
    let mut ops = Vec::new();
    for i in 0..12 {
        ops.push(put(["a/1", "a/2", "b"][i % 3], ["1", "2"][i % 2]));
        if i % 4 == 3 {
            ops.push(del("a/1"));
        }
    }
    ops.extend([
        Op::Reopen,
        compact(6),
        watch(
            StreamKind::Eager,
            WatchCreateRequest {
                key: Bytes::new(),
                range_end: Bytes::from_static(b"\0"),
                start_revision: 6,
                prev_kv: true,
                ..WatchCreateRequest::default()
            },
        ),
        watch(
            StreamKind::Lazy,
            from(
                7,
                WatchCreateRequest {
                    no_delete: true,
                    prev_kv: true,
                    ..WatchCreateRequest::prefix("a/")
                },
            ),
        ),
        watch(
            StreamKind::Eager,
            from(18, WatchCreateRequest::prefix("a/")),
        ),
        put("a/1", "x"),
        put("a/2", "y"),
        put("b", "z"),
        Op::Reopen,
        watch(StreamKind::Lazy, from(6, WatchCreateRequest::key("b"))),
        compact(12),
        put("b", "w"),
    ]);
    check(
        "watch_from_the_past_across_reopens_and_compactions",
        Limits::default(),
        ops,
    );
}

#[test]
fn lazy_watch_falls_behind_and_catches_up_from_history() {
    // WATCH-3: a consumer that does not read holds at most 128 responses; the watch then
    // catches up from the history (grouped responses) and loses nothing.
    let mut ops = vec![
        watch(
            StreamKind::Lazy,
            WatchCreateRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                prev_kv: true,
                ..WatchCreateRequest::default()
            },
        ),
        watch(StreamKind::Lazy, from(1, WatchCreateRequest::prefix("k"))),
    ];
    for i in 0..300 {
        ops.push(put(["k0", "k1", "k2", "j"][i % 4], "v"));
    }
    let (_, trace) = check_traced(
        "lazy_watch_falls_behind_and_catches_up_from_history",
        Limits::default(),
        ops,
    );
    assert_eq!(watch_log(&trace, 0).events.len(), 300);
    assert_eq!(watch_log(&trace, 1).events.len(), 225);
    assert!(
        trace.coverage.watches.grouped_responses > 0,
        "{:?}",
        trace.coverage
    );
}

#[test]
fn watch_behind_a_compaction_is_canceled_after_a_prefix() {
    // WATCH-4: a watch that fell behind (its consumer did not read) and whose next revision
    // a compaction then passed is canceled with the compaction revision, after the events it
    // had been given (a prefix ending at a revision boundary).
    let mut ops = vec![watch(
        StreamKind::Lazy,
        WatchCreateRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..WatchCreateRequest::default()
        },
    )];
    for i in 0..300 {
        ops.push(put(["k0", "k1", "k2"][i % 3], "v"));
    }
    ops.push(compact(301));
    let (_, trace) = check_traced(
        "watch_behind_a_compaction_is_canceled_after_a_prefix",
        Limits::default(),
        ops,
    );
    let log = watch_log(&trace, 0);
    assert_eq!(log.compacted, Some(301));
    assert!(
        !log.events.is_empty() && log.events.len() < 300,
        "{} events",
        log.events.len()
    );
}

#[test]
fn watch_prev_kv_skips_a_put_that_recreates_its_key() {
    // No prev_kv for a Put that creates its key, even when the same txn deleted the
    // key's previous generation first (the "\0" quirk of the duplicate-key check lets a
    // txn do that).
    let ops = vec![
        put("k", "1"),
        watch(
            StreamKind::Eager,
            WatchCreateRequest {
                prev_kv: true,
                ..WatchCreateRequest::key("k")
            },
        ),
        Op::Txn(txn(vec![], vec![rdel("k", "\0"), rput("k", "2")], vec![])),
        put("k", "3"),
    ];
    let (_, trace) = check_traced(
        "watch_prev_kv_skips_a_put_that_recreates_its_key",
        Limits::default(),
        ops,
    );
    let log = watch_log(&trace, 1);
    let got: Vec<(EventType, i64, Option<i64>)> = log
        .events
        .iter()
        .map(|e| {
            (
                e.kind,
                e.kv.mod_revision,
                e.prev_kv.as_ref().map(|kv| kv.mod_revision),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (EventType::Delete, 3, Some(2)),
            (EventType::Put, 3, None),
            (EventType::Put, 4, Some(3)),
        ]
    );
}

// ---- The model's own sizes, costs and accounting ------------------------------------------

#[test]
fn model_request_size_follows_the_wire_rules() {
    use model::wire::{Raft, raft_entry, raft_entry_len};
    // etcd 3.4.23 under the default 1,572,864-byte limit: key `big` with a 1,572,836-byte
    // value is accepted, with 1,572,838 bytes refused.
    let big = |len| PutRequest::new("big", vec![b'v'; len]);
    assert_eq!(raft_entry_len(Raft::Put(&big(1_572_836))), 1_572_863);
    assert_eq!(raft_entry_len(Raft::Put(&big(1_572_838))), 1_572_865);
    // The whole entry of a small Put, byte by byte: the header (field 100, a 10-byte id),
    // then the Put (field 4) with key (1) and value (2).
    let id = [0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    let mut want = vec![0xa2, 0x06, 0x0b, 0x08];
    want.extend(id);
    want.extend([0x22, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v']);
    assert_eq!(raft_entry(Raft::Put(&PutRequest::new("k", "v"))), want);
    // A negative int64 takes ten bytes; a oneof operand is written even when 0; defaults
    // are omitted; an empty message that is set is written.
    let with_lease = PutRequest {
        lease: -1,
        ..PutRequest::new("k", "v")
    };
    assert_eq!(raft_entry_len(Raft::Put(&with_lease)), want.len() + 11);
    let compare = |target| TxnRequest {
        compare: vec![Compare::new("k", CompareResult::Equal, target)],
        ..TxnRequest::default()
    };
    let version0 = raft_entry_len(Raft::Txn(&compare(CompareTarget::Version(0))));
    let version1 = raft_entry_len(Raft::Txn(&compare(CompareTarget::Version(1))));
    assert_eq!(
        version0, version1,
        "`version = 0` is two bytes, as `version = 1`"
    );
    // Compare { key "k" (3 bytes), version (2) } in TxnRequest.compare (2 more) in the Txn
    // field (2 more) after the 14-byte header.
    assert_eq!(version0, 14 + 2 + 2 + 3 + 2);
    let nested_empty = TxnRequest {
        success: vec![RequestOp::Txn(TxnRequest::default())],
        ..TxnRequest::default()
    };
    // RequestOp { request_txn: {} } is 2 bytes, inside success (2 more), inside the field.
    assert_eq!(raft_entry_len(Raft::Txn(&nested_empty)), 14 + 2 + 2 + 2);
    let compact = CompactionRequest {
        revision: 0,
        physical: false,
    };
    assert_eq!(raft_entry_len(Raft::Compaction(&compact)), 14 + 2);
}

#[test]
fn model_costs_are_etcds() {
    use model::space::{put_cost, txn_cost};
    assert_eq!(put_cost(b"key", b"value"), 256 + 3 + 5);
    let put = |k: &'static str, v: &'static str| RequestOp::Put(PutRequest::new(k, v));
    let txn = TxnRequest {
        compare: vec![],
        // 264 + 264 = 528 against the nested txn's own larger branch, 265.
        success: vec![put("ka", "123456"), put("kb", "123456"), rdel("a", "")],
        failure: vec![RequestOp::Txn(TxnRequest {
            success: vec![put("k", "12345678")],
            failure: vec![put("k", "1")],
            ..TxnRequest::default()
        })],
    };
    assert_eq!(txn_cost(&txn), 528);
    let nested_only = TxnRequest {
        success: vec![RequestOp::Txn(TxnRequest {
            success: vec![put("n", "")],
            ..TxnRequest::default()
        })],
        ..TxnRequest::default()
    };
    assert_eq!(
        txn_cost(&nested_only),
        257,
        "nested txns cost (etcd 3.6.14)"
    );
    assert_eq!(txn_cost(&TxnRequest::default()), 0);
}

#[test]
fn model_owner_of_a_key_follows_the_namespace_rule() {
    use model::accounts::{Entry, Registry, owner, with_ancestors};
    let entry = Entry {
        limits: [("kv_keys".to_owned(), 1000)].into(),
        ..Entry::default()
    };
    let registry: Registry = [("a".to_owned(), entry.clone()), ("a/b/c".to_owned(), entry)].into();
    // The table of docs/design/quota.md.
    for (key, want) in [
        ("/a/b/c/x", "a/b/c"),
        ("/a/b/x", "a"),
        ("/a/b", "a"),
        ("/ab/x", "*"),
        ("x", "*"),
        ("/", "*"),
        ("", "*"),
    ] {
        assert_eq!(owner(key.as_bytes(), &registry), want, "owner of {key:?}");
    }
    assert_eq!(with_ancestors("a/b/c"), ["a/b/c", "a/b", "a"]);
    assert_eq!(with_ancestors("*"), ["*"]);
}

fn quota_op(op: QuotaOp) -> Op {
    Op::Quota(op)
}

fn raw_config(role: &str, guarantees: &[(&str, f64)], limits: &[(&str, f64)]) -> RawQuotaConfig {
    let map = |pairs: &[(&str, f64)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
    RawQuotaConfig {
        role: role.to_owned(),
        guarantees: map(guarantees),
        limits: map(limits),
    }
}

fn amounts(pairs: &[(&str, f64)]) -> std::collections::BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

fn update(configs: Vec<RawQuotaConfig>, force: bool) -> Op {
    quota_op(QuotaOp::UpdateQuota { configs, force })
}

fn record(kind: char, id: &str, role: &str, agent: &str, pairs: &[(&str, f64)]) -> Op {
    let (id, role, agent, resources) = (id.into(), role.into(), agent.into(), amounts(pairs));
    quota_op(match kind {
        'r' => QuotaOp::Reserve {
            id,
            role,
            agent,
            resources,
        },
        _ => QuotaOp::Allocate {
            id,
            role,
            agent,
            resources,
        },
    })
}

/// The worked example of docs/design/quota.md: `ml` guarantees 2 cpus and may use 8; r1
/// reserves 4 cpus for `ml`, r2 1 cpu and 512 mem for `ml/team`; x1 allocates 6 cpus to `ml`,
/// drawing 4 from r1.
fn ml_example() -> Vec<Op> {
    vec![
        quota_op(QuotaOp::RegisterAgent {
            id: "a1".into(),
            state: AgentState::Registered,
            resources: amounts(&[("cpus", 16.0), ("mem", 4096.0)]),
        }),
        update(
            vec![raw_config("ml", &[("cpus", 2.0)], &[("cpus", 8.0)])],
            false,
        ),
        record('r', "r1", "ml", "a1", &[("cpus", 4.0)]),
        record('r', "r2", "ml/team", "a1", &[("cpus", 1.0), ("mem", 512.0)]),
        record('x', "x1", "ml", "a1", &[("cpus", 6.0)]),
        record('x', "x2", "ml", "a1", &[("cpus", 2.0)]),
        record('x', "x3", "ml/team", "a1", &[("cpus", 2.5)]),
    ]
}

#[test]
fn model_consumption_of_the_worked_example() {
    use model::accounts::Usage;
    let mut m = Model::new(Limits::default());
    let replies: Vec<Reply> = ml_example().iter().map(|op| m.apply(op)).collect();
    assert!(
        replies[..5].iter().all(|r| *r == Reply::Quota(Ok(0))),
        "{replies:?}"
    );
    let usage = m.usage();
    let u = |role: &str, resource: &str| usage[&(role.to_owned(), resource.to_owned())];
    let c = |allocated: i64, reserved: i64, reserved_in_use: i64| Usage {
        allocated: allocated * 1000,
        reserved: reserved * 1000,
        reserved_in_use: reserved_in_use * 1000,
        offered: 0,
    };
    assert_eq!(u("ml/team", "cpus"), c(0, 1, 0));
    assert_eq!(u("ml/team", "mem"), c(0, 512, 0));
    assert_eq!(u("ml", "cpus"), c(6, 5, 4));
    assert_eq!(u("ml", "mem"), c(0, 512, 0));
    assert_eq!(u("ml", "cpus").consumed(), 7000);
    assert_eq!(
        replies[5],
        Reply::Quota(Err(Error::QuotaExceeded(
            "kvd: quota exceeded for role 'ml': cpus consumption 7 + request 2 > limit 8".into()
        )))
    );
    assert_eq!(
        replies[6],
        Reply::Quota(Err(Error::QuotaExceeded(
            "kvd: quota exceeded for role 'ml': cpus consumption 7 + request 1.5 > limit 8".into()
        ))),
        "x3 draws 1 from r2; the other 1.5 is over ml's limit"
    );
}

#[test]
fn model_update_quota_phases_and_messages() {
    let mut m = Model::new(Limits::default());
    let refusal = |text: &str| Reply::Quota(Err(Error::QuotaRequest(text.to_owned())));
    // Keys written while no role has an entry belong to `*`; an entry for `t` moves them,
    // and its limit is checked against what moved (docs/design/quota.md).
    m.apply(&put("/t/a", "1234"));
    m.apply(&put("/t/b", "1234"));
    let cases = [
        (
            update(vec![raw_config("t", &[], &[("kv_keys", 1.0)])], false),
            refusal(
                "Invalid QuotaConfig: Role 't' is already consuming 'kv_bytes:528; kv_keys:2'; \
                 this is more than the requested limits 'kv_keys:1' (use 'force' flag to \
                 bypass this check)",
            ),
        ),
        (
            update(vec![raw_config("/dev", &[], &[("cpus", 1.0)])], false),
            refusal(
                "Invalid QuotaConfig: Invalid 'QuotaConfig.role': Role '/dev' cannot start \
                 with a slash",
            ),
        ),
        (
            update(
                vec![raw_config("d", &[("cpus", 2.0)], &[("cpus", 1.0)])],
                false,
            ),
            refusal(
                "Invalid QuotaConfig: 'QuotaConfig.guarantees' { cpus: 2 } is not contained \
                 within the 'QuotaConfig.limits' { cpus: 1 }",
            ),
        ),
        (
            update(vec![raw_config("a/b", &[("cpus", 2.0)], &[])], true),
            refusal(
                "Invalid QuotaConfig: Invalid quota configuration. Parent role 'a' with \
                 guarantees ({}) does not contain the sum of its children's guarantees \
                 (cpus:2)",
            ),
        ),
        (
            update(vec![raw_config("ops", &[("cpus", 100.0)], &[])], false),
            refusal(
                "Invalid QuotaConfig: total quota guarantees 'cpus:100' exceed cluster \
                 capacity 'kv_bytes:2147483648' (use 'force' \
                 flag to bypass this check)",
            ),
        ),
        (
            update(vec![raw_config("ops", &[("cpus", 100.0)], &[])], true),
            Reply::Quota(Ok(0)),
        ),
        (
            update(
                vec![
                    raw_config("a", &[("cpus", 2.0)], &[]),
                    raw_config("a/b", &[("cpus", 2.0)], &[]),
                ],
                true,
            ),
            Reply::Quota(Ok(0)),
        ),
        // Existing guarantees over capacity fail any batch without force.
        (
            update(vec![raw_config("t", &[], &[("kv_keys", 3.0)])], false),
            refusal(
                "Invalid QuotaConfig: total quota guarantees 'cpus:102' exceed cluster \
                 capacity 'kv_bytes:2147483648' (use 'force' \
                 flag to bypass this check)",
            ),
        ),
        (
            update(vec![raw_config("t", &[], &[("kv_keys", 3.0)])], true),
            Reply::Quota(Ok(0)),
        ),
    ];
    for (op, want) in cases {
        assert_eq!(m.apply(&op), want, "{op:?}");
    }
    let usage = m.usage();
    assert_eq!(
        usage[&("t".to_owned(), "kv_keys".to_owned())].allocated,
        2000
    );
    assert!(!usage.contains_key(&("*".to_owned(), "kv_keys".to_owned())));
    assert_eq!(
        m.accounts().registry.keys().collect::<Vec<_>>(),
        ["a", "a/b", "ops", "t"]
    );
}

// ---- Space, alarms and the quota registry through the engine ------------------------------

fn alarm(action: AlarmAction, member_id: u64, alarm: AlarmType) -> Op {
    Op::Alarm(AlarmRequest {
        action,
        member_id,
        alarm,
    })
}

fn alarm_reply(revision: i64, alarms: &[(u64, AlarmType)]) -> Reply {
    Reply::Alarm(Ok(AlarmResponse {
        header: header(revision),
        alarms: alarms
            .iter()
            .map(|&(member_id, alarm)| AlarmMember { member_id, alarm })
            .collect(),
    }))
}

#[test]
fn nospace_refuses_costly_writes_until_disarmed_and_compaction_and_defrag_help() {
    let quota = 512 << 10;
    let limits = Limits {
        quota_backend_bytes: quota,
        ..Limits::default()
    };
    let half = Op::Put(PutRequest::new("h", vec![b'h'; (quota / 2) as usize]));
    let ops = vec![
        put("a", "1"),
        // Twice its cost can never fit under the quota: refused, and NOSPACE is raised.
        half.clone(),
        put("b", "1"),
        Op::LeaseGrant(LeaseGrantRequest { ttl: 100, id: 5 }),
        // Cost 0: deletes, compactions and a delete-only txn work under NOSPACE.
        del("a"),
        Op::Txn(txn(vec![], vec![rdel("b", "")], vec![])),
        compact(3),
        Op::Defrag,
        Op::Range(RangeRequest::key("a")),
        alarm(AlarmAction::Get, 0, AlarmType::None),
        // Disarm: only a Deactivate clears it; then small writes fit again.
        alarm(AlarmAction::Deactivate, 0, AlarmType::NoSpace),
        Op::MeasureSpace,
        put("c", "1"),
        half,
        alarm(AlarmAction::Deactivate, 0, AlarmType::NoSpace),
        Op::Reopen,
        put("d", "1"),
    ];
    let r = check("nospace_story", limits, ops);
    assert!(matches!(r[0], Reply::Put(Ok(_))));
    assert_eq!(r[1], Reply::Put(Err(Error::NoSpace)));
    assert_eq!(r[2], Reply::Put(Err(Error::NoSpace)));
    assert_eq!(r[3], Reply::LeaseGrant(Err(Error::NoSpace)));
    assert!(matches!(&r[4], Reply::DeleteRange(Ok(d)) if d.deleted == 1));
    assert!(matches!(r[5], Reply::Txn(Ok(_))));
    assert!(matches!(r[6], Reply::Compact(Ok(_))));
    assert_eq!(r[7], Reply::Defrag(Ok(header(3))));
    assert_eq!(r[9], alarm_reply(3, &[(0, AlarmType::NoSpace)]));
    assert_eq!(r[10], alarm_reply(3, &[(0, AlarmType::NoSpace)]));
    assert!(matches!(r[12], Reply::Put(Ok(_))), "{:?}", r[12]);
    assert_eq!(r[13], Reply::Put(Err(Error::NoSpace)));
    assert!(matches!(r[16], Reply::Put(Ok(_))));
}

#[test]
fn filesystem_reserve_refuses_what_does_not_fit_and_raises_nospace() {
    let reserve = model::space::fs_reserve(Some(2 << 30));
    assert_eq!(reserve, 256 << 20, "an eighth of the 2 GiB default quota");
    let ops = vec![
        Op::SetFreeSpace(Some(reserve + 300)),
        // 256 + 1 + 43 = 300 fits exactly; 301 does not.
        Op::Put(PutRequest::new("k", vec![b'v'; 43])),
        Op::Put(PutRequest::new("k", vec![b'v'; 44])),
        put("k", "1"),
        Op::SetFreeSpace(None),
        put("k", "1"),
        alarm(AlarmAction::Deactivate, 0, AlarmType::NoSpace),
        put("k", "1"),
        Op::SetFreeSpace(Some(reserve + 63)),
        Op::LeaseGrant(LeaseGrantRequest { ttl: 100, id: 5 }),
        Op::SetFreeSpace(Some(reserve + 64)),
        alarm(AlarmAction::Deactivate, 0, AlarmType::NoSpace),
        Op::LeaseGrant(LeaseGrantRequest { ttl: 100, id: 5 }),
    ];
    let r = check("filesystem_reserve", Limits::default(), ops);
    assert!(matches!(r[1], Reply::Put(Ok(_))));
    assert_eq!(r[2], Reply::Put(Err(Error::NoSpace)));
    assert_eq!(r[3], Reply::Put(Err(Error::NoSpace)), "latched");
    assert_eq!(r[5], Reply::Put(Err(Error::NoSpace)), "still latched");
    assert!(
        matches!(r[7], Reply::Put(Ok(_))),
        "an unreadable figure refuses nothing"
    );
    assert_eq!(r[9], Reply::LeaseGrant(Err(Error::NoSpace)));
    assert!(matches!(r[12], Reply::LeaseGrant(Ok(_))));
}

#[test]
fn corrupt_refuses_every_write_and_holds_lease_expiry() {
    let corrupt = |action| alarm(action, 3, AlarmType::Corrupt);
    let ops = vec![
        grant(7, 5),
        put_lease("k", "v", 7),
        corrupt(AlarmAction::Activate),
        put("k", "w"),
        del("k"),
        compact(2),
        Op::LeaseRevoke(7),
        Op::Quota(QuotaOp::Repair),
        // Reads work; the lease is due but not revoked while CORRUPT holds.
        advance_ms(10_000),
        get("k"),
        Op::Txn(txn(vec![], vec![rget("k")], vec![])),
        Op::Defrag,
        corrupt(AlarmAction::Deactivate),
        get("k"),
    ];
    let r = check("corrupt", Limits::default(), ops);
    for i in [3, 4, 5, 6, 7] {
        let refused = match &r[i] {
            Reply::Put(Err(e))
            | Reply::DeleteRange(Err(e))
            | Reply::Compact(Err(e))
            | Reply::LeaseRevoke(Err(e))
            | Reply::Quota(Err(e)) => *e == Error::Corrupt,
            _ => false,
        };
        assert!(refused, "op {i}: {:?}", r[i]);
    }
    assert_eq!(r[8], Reply::AdvanceClock(vec![]));
    let leased = KeyValue {
        lease: 7,
        ..kv("k", 2, 2, 1, "v")
    };
    assert_eq!(r[9], range_ok(2, vec![leased], false, 1));
    assert!(matches!(r[10], Reply::Txn(Ok(_))));
    assert_eq!(
        r[13],
        range_ok(3, vec![], false, 0),
        "expired once CORRUPT was cleared"
    );
}

#[test]
fn quota_worked_example_and_namespace_moves_through_the_engine() {
    let mut ops = ml_example();
    ops.extend([
        put("/t/a", "1234"),
        put("/t/b", "1234"),
        update(vec![raw_config("t", &[], &[("kv_keys", 1.0)])], false),
        update(vec![raw_config("t", &[], &[("kv_keys", 3.0)])], false),
        put("/t/c", "1"),
        put("/t/d", "1"),
        Op::Reopen,
        put("/t/d", "1"),
        // The agent is recovered after the restart, so the capacity holds none of ml's
        // guaranteed cpus and UPDATE_QUOTA is refused until it registers again.
        update(vec![raw_config("t", &[], &[])], false),
        quota_op(QuotaOp::RegisterAgent {
            id: "a1".into(),
            state: AgentState::Registered,
            resources: amounts(&[("cpus", 16.0), ("mem", 4096.0)]),
        }),
        update(vec![raw_config("t", &[], &[])], false),
        put("/t/d", "1"),
        quota_op(QuotaOp::Release("x1".into())),
        quota_op(QuotaOp::Unreserve("r1".into())),
        quota_op(QuotaOp::Repair),
    ]);
    let r = check("quota_worked_example", Limits::default(), ops);
    assert!(matches!(&r[9], Reply::Quota(Err(Error::QuotaRequest(_)))));
    assert_eq!(r[10], Reply::Quota(Ok(0)));
    assert!(matches!(r[11], Reply::Put(Ok(_))));
    let third = "kvd: quota exceeded for role 't': kv_keys consumption 3 + request 1 > limit 3";
    assert_eq!(r[12], Reply::Put(Err(Error::QuotaExceeded(third.into()))));
    assert_eq!(
        r[14],
        Reply::Put(Err(Error::QuotaExceeded(third.into()))),
        "after restart"
    );
    assert!(
        matches!(&r[15], Reply::Quota(Err(Error::QuotaRequest(m))) if m.contains("capacity")),
        "{:?}",
        r[15]
    );
    assert_eq!(r[16], Reply::Quota(Ok(0)), "registered again");
    assert_eq!(r[17], Reply::Quota(Ok(0)));
    assert!(matches!(r[18], Reply::Put(Ok(_))), "no entry, no limit");
    assert_eq!(
        r[21],
        Reply::Quota(Ok(0)),
        "nothing drifted: repair changes nothing"
    );
}

#[test]
fn independent_recount_reports_a_corrupted_counter() {
    use model::drift::{Drift, compare, reported};
    let dir = tempfile::tempdir().unwrap();
    let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    let mut m = Model::new(Limits::default());
    let mut ops = ml_example();
    ops.extend([put("/ml/k", "v"), put("other", "v")]);
    for op in &ops {
        let engine_reply = match op {
            Op::Quota(QuotaOp::RegisterAgent {
                id,
                state,
                resources,
            }) => engine.register_agent(id, *state, resources.clone()).is_ok(),
            Op::Quota(QuotaOp::UpdateQuota { configs, force }) => {
                engine.update_quota(configs.clone(), *force).is_ok()
            }
            Op::Quota(QuotaOp::Reserve {
                id,
                role,
                agent,
                resources,
            }) => engine.reserve(id, role, agent, resources.clone()).is_ok(),
            Op::Quota(QuotaOp::Allocate {
                id,
                role,
                agent,
                resources,
            }) => engine.allocate(id, role, agent, resources.clone()).is_ok(),
            Op::Put(p) => engine.put(p.clone()).is_ok(),
            other => panic!("not in this test: {other:?}"),
        };
        let model_reply = m.apply(op);
        let model_ok = matches!(model_reply, Reply::Quota(Ok(_)) | Reply::Put(Ok(_)));
        assert_eq!(engine_reply, model_ok, "{op:?}: {model_reply:?}");
    }
    let usage = m.usage();
    let roles = m.accounts().listed_roles(&usage);
    let registry = &m.accounts().registry;
    let good = reported(&engine.roles().unwrap());
    assert_eq!(compare(&good, &usage, &roles, registry), vec![]);
    let key = |role: &str, resource: &str| (role.to_owned(), resource.to_owned());

    // One milli-unit too many on one counter.
    let mut bad = good.clone();
    bad.usage.get_mut(&key("ml", "kv_bytes")).unwrap().allocated += 1;
    let drift = compare(&bad, &usage, &roles, registry);
    let one_row = |d: &[Drift], r: &str, res: &str| matches!(d, [Drift::Row { role, resource, .. }] if role == r && resource == res);
    assert!(one_row(&drift, "ml", "kv_bytes"), "{drift:?}");
    // A release that was never uncharged: reserved_in_use left behind.
    let mut bad = good.clone();
    bad.usage
        .get_mut(&key("ml", "cpus"))
        .unwrap()
        .reserved_in_use += 1000;
    let drift = compare(&bad, &usage, &roles, registry);
    assert!(one_row(&drift, "ml", "cpus"), "{drift:?}");
    // A row that went missing, and a role that should not be there.
    let mut bad = good.clone();
    bad.usage.remove(&key("ml/team", "mem"));
    bad.usage
        .insert(key("ghost", "cpus"), usage[&key("ml", "cpus")]);
    bad.roles.insert("ghost".to_owned());
    let drift = compare(&bad, &usage, &roles, registry);
    assert_eq!(drift.len(), 3, "{drift:?}");
    assert!(drift.contains(&Drift::Listed {
        role: "ghost".into(),
        reported: true
    }));
    // An entry whose limit changed.
    let mut bad = good;
    bad.entries
        .get_mut("ml")
        .unwrap()
        .limits
        .insert("cpus".into(), 9000);
    assert!(matches!(
        &compare(&bad, &usage, &roles, registry)[..],
        [Drift::Entry { role, .. }] if role == "ml"
    ));
    engine.close().unwrap();
}

// ---- The write prepare queue --------------------------------------------------------------

/// A queue burst: for each (role, n), `n` Puts of new keys under `/<role>/` (`""`: keys of
/// no role's namespace, which belong to `*`), named after `tag`, one role after the other.
fn queue_burst(tag: &str, groups: &[(&str, usize)]) -> Op {
    let mut puts = Vec::new();
    for (role, n) in groups {
        for k in 0..*n {
            let key = if role.is_empty() {
                format!("{tag}{k}")
            } else {
                format!("/{role}/{tag}{k}")
            };
            puts.push(PutRequest::new(key, "q"));
        }
    }
    Op::QueueBurst(puts)
}

/// Which Puts of a burst's reply were admitted (every other one must be a queue refusal).
fn admitted(reply: &Reply) -> Vec<bool> {
    let Reply::QueueBurst(Some(answers)) = reply else {
        panic!("a burst that was sent: {reply:?}")
    };
    answers
        .iter()
        .map(|a| match a {
            Ok(_) => true,
            Err(Error::TooManyRequests { retry_after_ms: 0 }) => false,
            Err(e) => panic!("an admission or a queue refusal: {e:?}"),
        })
        .collect()
}

fn yes_no(admitted: usize, refused: usize) -> Vec<bool> {
    [vec![true; admitted], vec![false; refused]].concat()
}

/// Registers `a`, `x` and `t` (a write of `*`).
fn queue_roles() -> Op {
    let limit = [("kv_keys", 100.0)];
    update(
        ["a", "x", "t"]
            .iter()
            .map(|r| raw_config(r, &[], &limit))
            .collect(),
        false,
    )
}

#[test]
fn queue_refusals_follow_the_share_and_the_bound() {
    let limits = Limits {
        prepare_queue_length: 8,
        ..Limits::default()
    };
    let ops = vec![
        queue_roles(),
        advance_ms(11_000),
        // 2: `*` went idle: `a` alone holds at most half of 8.
        queue_burst("p", &[("a", 6)]),
        // 3: `a` is active (others 1): 8 / 2.
        queue_burst("p", &[("x", 5)]),
        // 4: `a` and `x` are active: 8 / 3.
        queue_burst("p", &[("t", 3)]),
        put("k1", "v"),
        // 6-7: every role 9 s old, still active: `a` beside `x`, `t` and `*` gets 8 / 4.
        advance_ms(9_000),
        queue_burst("r", &[("a", 3)]),
        // 8-9: all idle: `a` alone gets 4, `x` beside it 4, and `t` finds the queue full.
        advance_ms(11_000),
        queue_burst("s", &[("a", 4), ("x", 4), ("t", 2)]),
        // 10-11: all idle again: `*` alone, then `x` beside it; all admitted.
        advance_ms(11_000),
        queue_burst("u", &[("", 3), ("x", 1)]),
        // 12-13: a reopened engine knows no role: `a` alone again, not beside `*` and `x`.
        Op::Reopen,
        queue_burst("v", &[("a", 5)]),
    ];
    let (r, trace) = check_traced("queue shares and bound", limits, ops.clone());
    assert_eq!(
        (trace.coverage.queue.bursts, trace.coverage.queue.skipped),
        (7, 0)
    );
    assert_eq!(
        admitted(&r[2]),
        yes_no(4, 2),
        "PREP-2: a lone role gets half"
    );
    assert_eq!(admitted(&r[3]), yes_no(4, 1), "beside one active role");
    assert_eq!(admitted(&r[4]), yes_no(2, 1), "beside two");
    assert_eq!(admitted(&r[7]), yes_no(2, 1), "beside three, 9 s after");
    assert_eq!(
        admitted(&r[9]),
        [yes_no(8, 0), yes_no(0, 2)].concat(),
        "PREP-1: the third role finds the queue full"
    );
    assert_eq!(admitted(&r[11]), yes_no(4, 0));
    assert_eq!(
        admitted(&r[13]),
        yes_no(4, 1),
        "the reopened queue forgot the roles"
    );
    let mut model = Model::new(limits);
    for op in &ops {
        model.apply(op);
    }
    let stats = model.queue_stats();
    assert_eq!((stats.refused_bound, stats.refused_share), (2, 6));
    // What Engine::prepare_queue reports after the reopen (the harness compared it after
    // every op): only this engine's refusals.
    let roles: Vec<(String, usize, u64)> = model
        .queue_roles()
        .into_iter()
        .map(|q| (q.role, q.queued, q.refused))
        .collect();
    assert_eq!(roles, [("a".to_owned(), 0, 1)]);
}

#[test]
fn queue_counts_every_admitted_write_by_its_first_written_key() {
    let limits = Limits {
        prepare_queue_length: 8,
        max_request_bytes: 4096,
        ..Limits::default()
    };
    // A Txn whose compare fails runs its failure branch (a Put under `/a/`) but belongs to
    // the owner of its first written key, in the success branch (`x`).
    let txn_of_x = Op::Txn(txn(
        vec![Compare::new(
            "nope",
            CompareResult::Equal,
            CompareTarget::Version(5),
        )],
        vec![rput("/x/s", "1")],
        vec![rput("/a/f", "1")],
    ));
    let too_large = Op::Put(PutRequest::new("/t/big", vec![b'b'; 5000]));
    let value_provided = Op::Put(PutRequest {
        ignore_value: true,
        ..PutRequest::new("/x/v", "v")
    });
    let ops = vec![
        queue_roles(),
        advance_ms(11_000),
        // 2-4: a Txn of `x` and a compaction (`*`): `a` beside two roles gets 8 / 3.
        txn_of_x,
        compact(0),
        queue_burst("p", &[("a", 4)]),
        // 5-8: a revoke refused at apply (`*`) and a Put refused for its size (`t`) were
        // admitted first: 8 / 3 again.
        advance_ms(11_000),
        Op::LeaseRevoke(99),
        too_large,
        queue_burst("r", &[("a", 4)]),
        // 9-12: a Put refused by validation (`x`) never was: beside `*` alone, 8 / 2.
        advance_ms(11_000),
        compact(0),
        value_provided,
        queue_burst("s", &[("a", 5)]),
    ];
    let (r, trace) = check_traced("queue roles of writes", limits, ops);
    assert_eq!(
        (trace.coverage.queue.bursts, trace.coverage.queue.skipped),
        (3, 0)
    );
    assert!(
        matches!(&r[2], Reply::Txn(Ok(t)) if !t.succeeded),
        "{:?}",
        r[2]
    );
    assert_eq!(admitted(&r[4]), yes_no(2, 2), "the Txn belongs to x");
    assert_eq!(r[6], Reply::LeaseRevoke(Err(Error::LeaseNotFound)));
    assert_eq!(r[7], Reply::Put(Err(Error::RequestTooLarge)));
    assert_eq!(
        admitted(&r[8]),
        yes_no(2, 2),
        "refused after admission: counted"
    );
    assert_eq!(r[11], Reply::Put(Err(Error::ValueProvided)));
    assert_eq!(
        admitted(&r[12]),
        yes_no(4, 1),
        "refused by validation: not counted"
    );
}

#[test]
fn queue_a_write_refused_at_the_bound_leaves_its_role_idle() {
    let limits = Limits {
        prepare_queue_length: 12,
        ..Limits::default()
    };
    let ops = vec![
        queue_roles(),
        advance_ms(11_000),
        // 2: `a` alone gets 6, `x` beside it 6, and `t` finds the queue full.
        queue_burst("p", &[("a", 6), ("x", 6), ("t", 1)]),
        // 3: at once: `*` beside `a` and `x` only gets 12 / 3 (12 / 4 if `t`'s refusal
        // had made it active).
        queue_burst("r", &[("", 5)]),
    ];
    let (r, trace) = check_traced("queue refusal leaves its role idle", limits, ops);
    assert_eq!(
        (trace.coverage.queue.bursts, trace.coverage.queue.skipped),
        (2, 0)
    );
    assert_eq!(admitted(&r[2]), [yes_no(12, 0), yes_no(0, 1)].concat());
    assert_eq!(admitted(&r[3]), yes_no(4, 1));
}

#[test]
fn queue_activity_lasts_10_s_and_is_gone_by_11() {
    let limits = Limits {
        prepare_queue_length: 8,
        ..Limits::default()
    };
    let ops = vec![
        queue_roles(),
        advance_ms(11_000),
        put("/x/1", "v"),
        // 3-4: a write of `t` 9.5 s later: `x` is still active then.
        advance_ms(9_500),
        put("/t/1", "v"),
        // 5-6: 2 s on, only 2 s after the engine last looked: `x` (11.5 s) is idle all the
        // same, `t` is not: `a` beside one role gets 8 / 2 (8 / 3 beside two).
        advance_ms(2_000),
        queue_burst("p", &[("a", 5)]),
        // 7-8: `t` 9.5 s old and `a` 7.5 s old still count: `x` gets 8 / 3.
        advance_ms(7_500),
        queue_burst("r", &[("x", 5)]),
    ];
    let (r, trace) = check_traced("queue activity window", limits, ops);
    assert_eq!(
        (trace.coverage.queue.bursts, trace.coverage.queue.skipped),
        (2, 0)
    );
    assert_eq!(admitted(&r[6]), yes_no(4, 1));
    assert_eq!(admitted(&r[8]), yes_no(2, 3));
}

#[test]
fn model_queue_rule_and_its_uncertain_second() {
    use model::queue::{Queue, Refusal};
    let second = Duration::from_secs(1);
    let mut q = Queue::new(7);
    let at = Duration::ZERO;
    // A lone role: max(1, 7 / 2) = 3.
    assert_eq!(q.share("a", at), 3);
    for _ in 0..3 {
        assert_eq!(q.admit("a", at), Ok(()));
    }
    assert_eq!(q.admit("a", at), Err(Refusal::Share));
    // Beside `a` (queued): 7 / 2 = 3; then beside two: 7 / 3 = 2, but the bound is 7.
    for _ in 0..3 {
        assert_eq!(q.admit("b", at), Ok(()));
    }
    assert_eq!(q.admit("b", at), Err(Refusal::Share));
    assert_eq!(q.admit("c", at), Ok(()));
    assert_eq!(q.total(), 7);
    assert_eq!(q.admit("c", at), Err(Refusal::Bound));
    for role in ["a", "a", "a", "b", "b", "b", "c"] {
        q.release(role);
    }
    assert_eq!(q.total(), 0);
    // Idle roles count for 10 s; between 10 and 11 s the engine may or may not count them.
    assert_eq!(
        q.share("d", 9 * second),
        1,
        "a, b and c still active: 7 / 4"
    );
    assert_eq!(q.uncertain("d", 9 * second), None);
    assert_eq!(q.uncertain("d", 10 * second), Some("a"));
    assert_eq!(q.uncertain("a", 10 * second), Some("b"));
    assert_eq!(q.uncertain("d", 11 * second), None);
    assert_eq!(q.share("d", 11 * second), 3, "alone again");
    let roles: Vec<(String, u64)> = q.roles().into_iter().map(|r| (r.role, r.refused)).collect();
    let want = [("a", 1), ("b", 1), ("c", 1)].map(|(r, n)| (r.to_owned(), n));
    assert_eq!(roles, want);
}
