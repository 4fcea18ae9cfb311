//! The quota registry and the consumption tables through the engine: per-role limits on the
//! built-in resources, the namespace rule, nested roles, reservations and allocations,
//! persistence, and conservation (every counter equals an independent recount, and a
//! refused request changes nothing) over random sequences with restarts.
//!
//! Nothing here trusts the engine's own recount: after a restart the counters are compared
//! with figures fixed before it (by hand in the fixed tests, by the reference model of
//! `tests/model` in the random one), because open rebuilds the counters from the engine's
//! recount and would agree with itself by construction.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod model;

use std::collections::BTreeMap;

use kvd::quota::RawQuotaConfig;
use kvd::{
    AgentState, CompactionRequest, Config, Counters, DeleteRangeRequest, Engine, Error, KV_BYTES,
    KV_KEYS, PutRequest, RequestOp, TxnRequest,
};
use model::ops::{Op, QuotaOp, Seq};
use model::rng::{Source, SplitMix64};
use model::{Limits, Model};

fn config() -> Config {
    Config {
        cache_size_bytes: 4 << 20,
        ..Config::default()
    }
}

fn limits(role: &str, pairs: &[(&str, f64)]) -> RawQuotaConfig {
    RawQuotaConfig {
        role: role.to_owned(),
        limits: pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        ..RawQuotaConfig::default()
    }
}

fn resources(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

/// Returns the consumed amount (in units) of `resource` for `role`.
fn consumed(engine: &Engine, role: &str, resource: &str) -> f64 {
    engine
        .roles()
        .unwrap()
        .into_iter()
        .find(|r| r.role == role)
        .and_then(|r| {
            r.resources
                .get(resource)
                .map(|c| c.consumed() as f64 / 1000.0)
        })
        .unwrap_or(0.0)
}

#[test]
fn kv_limits_refuse_writes_with_a_clear_message_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .update_quota(
            vec![limits("dev", &[(KV_KEYS, 2.0), (KV_BYTES, 10_000.0)])],
            false,
        )
        .unwrap();
    engine.put(PutRequest::new("/dev/a", "1")).unwrap();
    engine.put(PutRequest::new("/dev/b", "1")).unwrap();
    engine
        .put(PutRequest::new("/dev/a", "overwrite is not a new key"))
        .unwrap();
    let before = engine.status().unwrap().header.revision;
    let err = engine.put(PutRequest::new("/dev/c", "1")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kvd: quota exceeded for role 'dev': kv_keys consumption 2 + request 1 > limit 2"
    );
    assert!(matches!(err, Error::QuotaExceeded(_)));
    let big = engine
        .put(PutRequest::new("/dev/a", vec![0u8; 20_000]))
        .unwrap_err();
    assert!(big.to_string().contains("kv_bytes"), "{big}");
    assert_eq!(
        engine.status().unwrap().header.revision,
        before,
        "refusals change nothing"
    );
    assert!(
        engine.status().unwrap().alarms.is_empty(),
        "a role limit does not raise NOSPACE"
    );
    engine.put(PutRequest::new("/other/x", "free")).unwrap();
    engine
        .delete_range(DeleteRangeRequest::key("/dev/a"))
        .unwrap();
    engine.put(PutRequest::new("/dev/c", "1")).unwrap();
    assert_eq!(consumed(&engine, "dev", KV_KEYS), 2.0);
}

#[test]
fn txn_puts_are_checked_on_the_branch_that_runs() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .update_quota(vec![limits("t", &[(KV_KEYS, 1.0)])], false)
        .unwrap();
    let two = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest::new("/t/a", "1")),
            RequestOp::Put(PutRequest::new("/t/b", "1")),
        ],
        failure: vec![],
        ..TxnRequest::default()
    };
    assert!(matches!(
        engine.txn(two.clone()).unwrap_err(),
        Error::QuotaExceeded(_)
    ));
    let not_taken = TxnRequest {
        compare: vec![kvd::Compare::new(
            "/t/x",
            kvd::CompareResult::Equal,
            kvd::CompareTarget::Version(5),
        )],
        success: two.success,
        failure: vec![RequestOp::Put(PutRequest::new("/t/a", "1"))],
    };
    assert!(
        !engine.txn(not_taken).unwrap().succeeded,
        "the failure branch fits"
    );
}

#[test]
fn first_entry_moves_existing_consumption_and_limits_see_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    for i in 0..5 {
        engine
            .put(PutRequest::new(format!("/team/k{i}"), "v"))
            .unwrap();
    }
    assert_eq!(
        consumed(&engine, "*", KV_KEYS),
        5.0,
        "no entry yet: charged to *"
    );
    let err = engine
        .update_quota(vec![limits("team", &[(KV_KEYS, 3.0)])], false)
        .unwrap_err();
    assert!(matches!(err, Error::QuotaRequest(_)), "{err}");
    assert!(engine.get_quota().unwrap().is_empty(), "all or nothing");
    engine
        .update_quota(vec![limits("team", &[(KV_KEYS, 3.0)])], true)
        .unwrap();
    assert_eq!(
        consumed(&engine, "team", KV_KEYS),
        5.0,
        "moved with the entry"
    );
    assert_eq!(consumed(&engine, "*", KV_KEYS), 0.0);
    // Default quota deletes the entry and moves the consumption back.
    engine
        .update_quota(
            vec![RawQuotaConfig {
                role: "team".into(),
                ..RawQuotaConfig::default()
            }],
            false,
        )
        .unwrap();
    assert!(engine.get_quota().unwrap().is_empty());
    assert_eq!(consumed(&engine, "*", KV_KEYS), 5.0);
    assert!(engine.consumption_drift().unwrap().is_empty());
}

#[test]
fn nested_roles_charge_every_ancestor() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .update_quota(
            vec![
                limits("a", &[(KV_KEYS, 3.0)]),
                limits("a/b", &[(KV_KEYS, 10.0)]),
            ],
            false,
        )
        .unwrap();
    engine.put(PutRequest::new("/a/b/1", "v")).unwrap();
    engine.put(PutRequest::new("/a/b/2", "v")).unwrap();
    engine.put(PutRequest::new("/a/x", "v")).unwrap();
    assert_eq!(consumed(&engine, "a", KV_KEYS), 3.0);
    assert_eq!(consumed(&engine, "a/b", KV_KEYS), 2.0);
    let err = engine.put(PutRequest::new("/a/b/3", "v")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("kvd: quota exceeded for role 'a'"),
        "{err}"
    );
}

#[test]
fn compaction_releases_kv_bytes_of_dropped_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .update_quota(vec![limits("c", &[(KV_BYTES, 1_000_000.0)])], false)
        .unwrap();
    for _ in 0..10 {
        engine.put(PutRequest::new("/c/k", vec![0u8; 100])).unwrap();
    }
    let per_put = (256 + 4 + 100) as f64;
    assert_eq!(consumed(&engine, "c", KV_BYTES), 10.0 * per_put);
    let revision = engine.status().unwrap().header.revision;
    engine
        .compact(CompactionRequest {
            revision,
            physical: false,
        })
        .unwrap();
    assert_eq!(
        consumed(&engine, "c", KV_BYTES),
        per_put,
        "only the live revision stays charged"
    );
}

#[test]
fn allocations_draw_on_reservations_and_respect_limits() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .register_agent(
            "agent-1",
            AgentState::Registered,
            resources(&[("cpus", 16.0), ("mem", 4096.0)]),
        )
        .unwrap();
    engine
        .update_quota(vec![limits("ml", &[("cpus", 8.0)])], false)
        .unwrap();
    engine
        .reserve("r1", "ml", "agent-1", resources(&[("cpus", 4.0)]))
        .unwrap();
    assert_eq!(
        consumed(&engine, "ml", "cpus"),
        4.0,
        "unallocated reservations count"
    );
    engine
        .allocate("a1", "ml", "agent-1", resources(&[("cpus", 6.0)]))
        .unwrap();
    assert_eq!(
        consumed(&engine, "ml", "cpus"),
        6.0,
        "4 drawn from the reservation, 2 more"
    );
    let err = engine
        .allocate("a2", "ml", "agent-1", resources(&[("cpus", 3.0)]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("quota exceeded for role 'ml': cpus consumption 6 + request 3 > limit 8"),
        "{err}"
    );
    assert!(engine.unreserve("r1").is_err(), "in use by an allocation");
    engine.release("a1").unwrap();
    assert_eq!(consumed(&engine, "ml", "cpus"), 4.0);
    engine.unreserve("r1").unwrap();
    assert_eq!(consumed(&engine, "ml", "cpus"), 0.0);
    assert!(
        engine
            .allocate("a3", "ml", "nowhere", resources(&[("cpus", 1.0)]))
            .is_err(),
        "unknown agent"
    );
    assert!(
        engine
            .allocate("a4", "bad role", "agent-1", resources(&[("cpus", 1.0)]))
            .is_err(),
        "Mesos role rules"
    );
    assert!(
        engine
            .reserve("r2", "ml", "agent-1", resources(&[("cpus", f64::NAN)]))
            .is_err()
    );
    assert!(engine.consumption_drift().unwrap().is_empty());
}

/// Returns every (role, resource) counter the engine reports.
fn counters(engine: &Engine) -> BTreeMap<(String, String), Counters> {
    let mut out = BTreeMap::new();
    for role in engine.roles().unwrap() {
        for (resource, c) in role.resources {
            out.insert((role.role.clone(), resource), c);
        }
    }
    out
}

fn row(
    role: &str,
    resource: &str,
    allocated: i64,
    reserved: i64,
    in_use: i64,
) -> ((String, String), Counters) {
    let counters = Counters {
        allocated: allocated * 1000,
        reserved: reserved * 1000,
        reserved_in_use: in_use * 1000,
        offered: 0,
    };
    ((role.to_owned(), resource.to_owned()), counters)
}

#[test]
fn registry_records_and_counters_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    engine
        .register_agent(
            "agent-1",
            AgentState::Registered,
            resources(&[("cpus", 16.0)]),
        )
        .unwrap();
    engine
        .update_quota(vec![limits("p", &[(KV_KEYS, 5.0), ("cpus", 4.0)])], false)
        .unwrap();
    engine.put(PutRequest::new("/p/a", "v")).unwrap();
    engine
        .reserve("r1", "p", "agent-1", resources(&[("cpus", 1.0)]))
        .unwrap();
    engine
        .allocate("a1", "p", "agent-1", resources(&[("cpus", 2.0)]))
        .unwrap();
    // Fixed by hand: /p/a costs 256 + 4 + 1 = 261 bytes and is one key, both charged to p
    // (its owner) and nothing else; a1 took r1's cpu and one more.
    let expected = BTreeMap::from([
        row("p", KV_BYTES, 261, 0, 0),
        row("p", KV_KEYS, 1, 0, 0),
        row("p", "cpus", 2, 1, 1),
    ]);
    assert_eq!(counters(&engine), expected, "before the restart");
    engine.close().unwrap();

    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(counters(&engine), expected, "after the restart");
    let quota = engine.get_quota().unwrap();
    assert_eq!(quota.len(), 1);
    assert_eq!(quota[0].role, "p");
    // The records came back too: r1 is still drawn on, and releasing a1 gives it back.
    let err = engine.unreserve("r1").unwrap_err();
    assert_eq!(err.to_string(), "Reservation 'r1' is in use by allocations");
    engine.release("a1").unwrap();
    assert_eq!(
        counters(&engine),
        BTreeMap::from([
            row("p", KV_BYTES, 261, 0, 0),
            row("p", KV_KEYS, 1, 0, 0),
            row("p", "cpus", 0, 1, 0),
        ])
    );
    engine.unreserve("r1").unwrap();
    // The agent is recovered after the restart and takes no record until it registers
    // again.
    let err = engine
        .allocate("a2", "p", "agent-1", resources(&[("cpus", 1.0)]))
        .unwrap_err();
    assert_eq!(err.to_string(), "Agent 'agent-1' is not registered");
    assert_eq!(
        engine.agents().unwrap()["agent-1"].state,
        kvd::AgentState::Recovered
    );
    let total = engine.agents().unwrap()["agent-1"].resources.clone();
    let total = total
        .iter()
        .map(|(name, value)| (name.to_owned(), value.to_f64()))
        .collect();
    engine
        .register_agent("agent-1", kvd::AgentState::Registered, total)
        .unwrap();
    // The limits came back: a fourth cpu beyond the limit of 4 is refused.
    let err = engine
        .allocate("a2", "p", "agent-1", resources(&[("cpus", 5.0)]))
        .unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err}");
}

const ROLES: [&str; 5] = ["a", "a/b", "a/b/c", "x", "*"];
const KEYS: [&str; 8] = [
    "/a/1", "/a/b/1", "/a/b/2", "/a/b/c/1", "/x/1", "/x/y/1", "free", "/z/1",
];

/// A sequence dense in registry and record requests: writes, deletes, Txns, compactions,
/// quota updates, reservations and allocations and their removal, repairs and restarts.
/// A model alongside knows the revisions, to aim compactions.
fn quota_sequence(seed: u64, steps: usize) -> Seq {
    let mut rng = SplitMix64::new(seed + 1);
    let mut r = |n: u64| rng.below(n);
    let limits = Limits::default();
    let mut model = Model::new(limits);
    let mut ops = vec![Op::Quota(QuotaOp::RegisterAgent {
        id: "ag".into(),
        state: AgentState::Registered,
        resources: resources(&[("cpus", 100.0)]),
    })];
    let mut record = 0;
    while ops.len() < steps {
        let key = |r: &mut dyn FnMut(u64) -> u64| KEYS[r(KEYS.len() as u64) as usize].to_owned();
        let role = |r: &mut dyn FnMut(u64) -> u64| ROLES[r(4) as usize].to_owned();
        let op = match r(13) {
            0..=3 => {
                let size = r(300) as usize;
                Op::Put(PutRequest::new(key(&mut r), vec![1u8; size]))
            }
            4 => Op::DeleteRange(DeleteRangeRequest::key(key(&mut r))),
            5 => {
                let success = (0..1 + r(3))
                    .map(|i| RequestOp::Put(PutRequest::new(format!("{}{i}", key(&mut r)), "v")))
                    .collect();
                Op::Txn(TxnRequest {
                    success,
                    ..TxnRequest::default()
                })
            }
            6 => Op::Compact(CompactionRequest {
                revision: model.current_revision() - r(5) as i64,
                physical: r(2) == 0,
            }),
            7 => {
                let role = role(&mut r);
                let config = match r(4) {
                    0 => RawQuotaConfig {
                        role,
                        ..RawQuotaConfig::default()
                    },
                    1 => limits_of(&role, &[(KV_KEYS, r(6) as f64)]),
                    2 => limits_of(&role, &[(KV_BYTES, (r(4000) + 300) as f64), ("cpus", 20.0)]),
                    _ => limits_of(&role, &[("cpus", r(30) as f64)]),
                };
                Op::Quota(QuotaOp::UpdateQuota {
                    configs: vec![config],
                    force: r(3) == 0,
                })
            }
            8 | 9 => {
                record += 1;
                let role = role(&mut r);
                let resources = resources(&[("cpus", r(8) as f64)]);
                Op::Quota(if r(2) == 0 {
                    QuotaOp::Reserve {
                        id: format!("r{record}"),
                        role,
                        agent: "ag".into(),
                        resources,
                    }
                } else {
                    QuotaOp::Allocate {
                        id: format!("a{record}"),
                        role,
                        agent: "ag".into(),
                        resources,
                    }
                })
            }
            10 => {
                let n = r(record + 1);
                Op::Quota(if r(2) == 0 {
                    QuotaOp::Release(format!("a{n}"))
                } else {
                    QuotaOp::Unreserve(format!("r{n}"))
                })
            }
            11 => Op::Quota(QuotaOp::Repair),
            _ => Op::Reopen,
        };
        model.apply(&op);
        ops.push(op);
    }
    Seq {
        label: format!("quota sequence of seed {seed}"),
        limits,
        ops,
    }
}

fn limits_of(role: &str, pairs: &[(&str, f64)]) -> RawQuotaConfig {
    limits(role, pairs)
}

#[test]
fn consumption_equals_an_independent_recount_over_random_sequences_with_restarts() {
    let seeds: u64 = std::env::var("KVD_QUOTA_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let steps: usize = std::env::var("KVD_QUOTA_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let mut total = model::Coverage::default();
    for seed in 0..seeds {
        let seq = quota_sequence(seed, steps);
        let dir = tempfile::tempdir().unwrap();
        // After every request the harness compares the engine's counters, roles and entries
        // with the model's recount (a function of the model's history and records), and the
        // data and revisions with the model's, so a refusal that changed anything, a counter
        // off by one, or a restart that rebuilt other counters fails here.
        let trace = model::run(&seq, dir.path());
        total.add(&trace.coverage);
    }
    println!(
        "{} ops: {} registry and record requests applied, {} refused as invalid, {} refused by \
         a limit, {} restarts, {} recounts compared",
        total.ops,
        total.quota_applied,
        total.quota_request_refused,
        total.quota_exceeded,
        total.restarts,
        total.recounts,
    );
    assert!(
        total.quota_applied > 0
            && total.quota_request_refused > 0
            && total.quota_exceeded > 0
            && total.restarts > 0,
        "the sequences exercise every outcome: {total:?}"
    );
}
