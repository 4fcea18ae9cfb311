//! The quota registry and the consumption tables through the engine: per-role limits on the
//! built-in resources, the namespace rule, nested roles, reservations and allocations,
//! persistence, and the conservation property (every consumption row equals a recount,
//! and a refused request changes nothing) over random sequences with restarts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use kvd::quota::RawQuotaConfig;
use kvd::{
    AgentState, CompactionRequest, Config, DeleteRangeRequest, Engine, Error, KV_BYTES, KV_KEYS,
    PutRequest, RangeRequest, RequestOp, TxnRequest,
};

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

#[test]
fn registry_and_records_survive_restart() {
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
        .allocate("a1", "p", "agent-1", resources(&[("cpus", 2.0)]))
        .unwrap();
    let roles = engine.roles().unwrap();
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(engine.roles().unwrap(), roles);
    assert_eq!(engine.get_quota().unwrap().len(), 1);
    assert!(engine.consumption_drift().unwrap().is_empty());
}

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

const ROLES: [&str; 5] = ["a", "a/b", "a/b/c", "x", "*"];
const KEYS: [&str; 8] = [
    "/a/1", "/a/b/1", "/a/b/2", "/a/b/c/1", "/x/1", "/x/y/1", "free", "/z/1",
];

#[test]
fn conservation_holds_and_refusals_change_nothing_over_random_sequences() {
    let seeds: u64 = std::env::var("KVD_QUOTA_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let steps: u64 = std::env::var("KVD_QUOTA_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let (mut quota_refusals, mut request_refusals, mut applied) = (0, 0, 0);
    for seed in 0..seeds {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Engine::open(dir.path(), config()).unwrap();
        let mut rng = Rng(seed + 1);
        engine
            .register_agent("ag", AgentState::Registered, resources(&[("cpus", 100.0)]))
            .unwrap();
        let mut record = 0;
        for step in 0..steps {
            let before = (engine.hash_kv(0).unwrap(), engine.roles().unwrap());
            let result: Result<(), Error> = match rng.below(12) {
                0..=3 => {
                    let size = rng.below(300) as usize;
                    engine
                        .put(PutRequest::new(rng.pick(&KEYS).to_owned(), vec![1u8; size]))
                        .map(drop)
                }
                4 => engine
                    .delete_range(DeleteRangeRequest::key(rng.pick(&KEYS).to_owned()))
                    .map(drop),
                5 => {
                    let ops = (0..1 + rng.below(3))
                        .map(|i| {
                            RequestOp::Put(PutRequest::new(format!("{}{i}", rng.pick(&KEYS)), "v"))
                        })
                        .collect();
                    engine
                        .txn(TxnRequest {
                            success: ops,
                            ..TxnRequest::default()
                        })
                        .map(drop)
                }
                6 => {
                    let current = engine.status().unwrap().header.revision;
                    let revision = current - rng.below(5) as i64;
                    engine
                        .compact(CompactionRequest {
                            revision,
                            physical: rng.below(2) == 0,
                        })
                        .map(drop)
                }
                7 => {
                    let role = rng.pick(&ROLES[..4]);
                    let config = match rng.below(4) {
                        0 => RawQuotaConfig {
                            role: role.to_owned(),
                            ..RawQuotaConfig::default()
                        },
                        1 => limits(role, &[(KV_KEYS, rng.below(6) as f64)]),
                        2 => limits(
                            role,
                            &[(KV_BYTES, (rng.below(4000) + 300) as f64), ("cpus", 20.0)],
                        ),
                        _ => limits(role, &[("cpus", rng.below(30) as f64)]),
                    };
                    engine.update_quota(vec![config], rng.below(3) == 0)
                }
                8 => {
                    record += 1;
                    let role = rng.pick(&ROLES[..4]);
                    engine.reserve(
                        &format!("r{record}"),
                        role,
                        "ag",
                        resources(&[("cpus", rng.below(8) as f64)]),
                    )
                }
                9 => {
                    record += 1;
                    let role = rng.pick(&ROLES[..4]);
                    engine.allocate(
                        &format!("a{record}"),
                        role,
                        "ag",
                        resources(&[("cpus", rng.below(8) as f64)]),
                    )
                }
                10 => {
                    let id = format!(
                        "{}{}",
                        if rng.below(2) == 0 { "a" } else { "r" },
                        rng.below(record + 1)
                    );
                    if id.starts_with('a') {
                        engine.release(&id)
                    } else {
                        engine.unreserve(&id)
                    }
                }
                _ => {
                    engine.close().unwrap();
                    engine = Engine::open(dir.path(), config()).unwrap();
                    Ok(())
                }
            };
            match &result {
                Ok(()) => applied += 1,
                Err(Error::QuotaExceeded(_)) => quota_refusals += 1,
                Err(_) => request_refusals += 1,
            }
            if let Err(e) = &result {
                let after = (engine.hash_kv(0).unwrap(), engine.roles().unwrap());
                assert_eq!(
                    before, after,
                    "seed {seed} step {step}: refused ({e}) but something changed"
                );
            }
            let drift = engine.consumption_drift().unwrap();
            assert!(
                drift.is_empty(),
                "seed {seed} step {step}: consumption drifted: {drift:?}"
            );
        }
        // The persisted rows agree after a restart too.
        engine.close().unwrap();
        let engine = Engine::open(dir.path(), config()).unwrap();
        assert!(
            engine.consumption_drift().unwrap().is_empty(),
            "seed {seed} after reopen"
        );
        assert_eq!(
            engine.repair_consumption().unwrap(),
            0,
            "repair is a no-op when nothing drifted"
        );
        let _ = engine.range(&RangeRequest::prefix("/"));
    }
    println!(
        "applied {applied}, refused by a limit {quota_refusals}, refused otherwise {request_refusals}"
    );
    assert!(
        quota_refusals > 0 && request_refusals > 0 && applied > 0,
        "the sequences exercise every outcome"
    );
}
