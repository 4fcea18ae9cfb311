//! Exactly-once writes by operation id and Mesos reconciliation through the engine's public
//! API: a retry gets the recorded response and is not applied again (OPER-2), across a
//! restart and while the first attempt is still in flight; another request under the same
//! id is refused and changes nothing; refused writes record nothing (OPER-3); retention by
//! count and age on a manual clock (OPER-4); compaction and defrag keep the records; the
//! agent states and their persistence; and every row and column of Mesos's task and
//! operation reconciliation tables (RECON-1, RECON-2). No timing thresholds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use kvd::{
    AccountingRequest, AgentState, CompactionRequest, Config, DeleteRangeRequest, Engine, Error,
    Faults, LeaseGrantRequest, MANUAL_CLOCK_EPOCH, ManualClock, OperationQuery, OperationState,
    PutRequest, RangeRequest, RecordKind, Retention, TaskQuery, TaskState, TxnRequest,
    WriteOptions,
};

fn config(clock: &Arc<ManualClock>) -> Config {
    Config {
        cache_size_bytes: 4 << 20,
        clock: clock.clone(),
        ..Config::default()
    }
}

fn once(id: &str) -> WriteOptions {
    WriteOptions::with_operation_id(id)
}

fn cpus(n: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([("cpus".to_owned(), n)])
}

fn revision(engine: &Engine) -> i64 {
    engine.status().unwrap().header.revision
}

fn version(engine: &Engine, key: &str) -> i64 {
    engine
        .range(&RangeRequest::key(key.to_owned()))
        .unwrap()
        .kvs[0]
        .version
}

fn allocated_cpus(engine: &Engine, role: &str) -> i64 {
    engine
        .roles()
        .unwrap()
        .into_iter()
        .find(|r| r.role == role)
        .and_then(|r| r.resources.get("cpus").copied())
        .map_or(0, |c| c.allocated)
}

#[test]
fn a_retry_gets_the_recorded_response_and_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let put = PutRequest {
        prev_kv: true,
        ..PutRequest::new("k", "v1")
    };
    let first = engine.put_with(put.clone(), &once("p1")).unwrap();
    engine.put(PutRequest::new("other", "x")).unwrap();
    let retry = engine.put_with(put, &once("p1")).unwrap();
    assert_eq!(retry, first, "the recorded response, revision included");
    assert_eq!((revision(&engine), version(&engine, "k")), (3, 1));

    let txn = TxnRequest {
        compare: vec![],
        success: vec![kvd::RequestOp::Put(PutRequest::new("t", "1"))],
        failure: vec![],
    };
    let first = engine.txn_with(txn.clone(), &once("t1")).unwrap();
    assert_eq!(engine.txn_with(txn, &once("t1")).unwrap(), first);
    let grant = LeaseGrantRequest { ttl: 60, id: 0 };
    let lease = engine.lease_grant_with(grant, &once("g1")).unwrap();
    assert_eq!(engine.lease_grant_with(grant, &once("g1")).unwrap(), lease);
    assert_eq!(
        engine.lease_leases().unwrap().leases.len(),
        1,
        "granted once"
    );
    let del = DeleteRangeRequest::key("t");
    let deleted = engine.delete_range_with(del.clone(), &once("d1")).unwrap();
    engine.put(PutRequest::new("t", "again")).unwrap();
    assert_eq!(engine.delete_range_with(del, &once("d1")).unwrap(), deleted);
    assert_eq!(engine.range(&RangeRequest::key("t")).unwrap().count, 1);
    let revoke = engine.lease_revoke_with(lease.id, &once("r1")).unwrap();
    assert_eq!(
        engine.lease_revoke_with(lease.id, &once("r1")).unwrap(),
        revoke
    );
    let compact = CompactionRequest {
        revision: 3,
        physical: true,
    };
    let compacted = engine.compact_with(compact, &once("c1")).unwrap();
    assert_eq!(
        engine.compact_with(compact, &once("c1")).unwrap(),
        compacted
    );

    // The same across a restart (the table survives it).
    let before = revision(&engine);
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let again = engine
        .put_with(
            PutRequest {
                prev_kv: true,
                ..PutRequest::new("k", "v1")
            },
            &once("p1"),
        )
        .unwrap();
    assert_eq!(again.header.revision, 2);
    assert_eq!(revision(&engine), before, "nothing applied again");
}

#[test]
fn an_operator_call_retried_is_charged_once() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    engine
        .register_agent("a1", AgentState::Registered, cpus(100.0))
        .unwrap();
    let allocate = AccountingRequest::Record {
        kind: RecordKind::Allocation,
        id: "x1".into(),
        role: "ml".into(),
        agent: "a1".into(),
        resources: cpus(2.0),
        prepare: false,
    };
    engine
        .apply_accounting_with(allocate.clone(), &once("alloc-1"))
        .unwrap();
    // Without the id the same call is refused: the record exists.
    assert!(engine.apply_accounting(allocate.clone()).is_err());
    engine
        .apply_accounting_with(allocate.clone(), &once("alloc-1"))
        .unwrap();
    assert_eq!(
        allocated_cpus(&engine, "ml"),
        2_000,
        "milli-cpus, charged once"
    );
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    engine
        .apply_accounting_with(allocate, &once("alloc-1"))
        .unwrap();
    assert_eq!(allocated_cpus(&engine, "ml"), 2_000);
}

#[test]
fn the_same_id_for_another_request_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    engine
        .put_with(PutRequest::new("k", "v1"), &once("o"))
        .unwrap();
    let err = engine
        .put_with(PutRequest::new("k", "v2"), &once("o"))
        .unwrap_err();
    assert!(matches!(err, Error::OperationIdReused(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "kvd: operation id 'o' was already used for a different request"
    );
    let err = engine
        .delete_range_with(DeleteRangeRequest::key("k"), &once("o"))
        .unwrap_err();
    assert!(
        matches!(err, Error::OperationIdReused(_)),
        "another kind too"
    );
    assert_eq!(revision(&engine), 2);
    assert_eq!(
        &engine.range(&RangeRequest::key("k")).unwrap().kvs[0].value[..],
        b"v1"
    );
    for bad in [String::new(), "x".repeat(257)] {
        let err = engine
            .put_with(PutRequest::new("k", "v3"), &once(&bad))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    assert_eq!(revision(&engine), 2);
}

#[test]
fn a_refused_write_records_nothing_and_its_retry_is_evaluated_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let limits = BTreeMap::from([("kv_keys".to_owned(), 1.0)]);
    let quota = |limits| {
        vec![kvd::quota::RawQuotaConfig {
            role: "dev".into(),
            limits,
            ..Default::default()
        }]
    };
    engine.update_quota(quota(limits), false).unwrap();
    engine.put(PutRequest::new("/dev/a", "v")).unwrap();
    let err = engine
        .put_with(PutRequest::new("/dev/b", "v"), &once("b"))
        .unwrap_err();
    assert!(matches!(err, Error::QuotaExceeded(_)), "{err:?}");
    let none = engine
        .reconcile_operations(vec![], "")
        .unwrap()
        .into_iter()
        .find(|s| s.operation_id == "b");
    assert_eq!(none, None, "a refused write is not recorded");
    engine
        .update_quota(quota(BTreeMap::from([("kv_keys".to_owned(), 5.0)])), false)
        .unwrap();
    let put = engine
        .put_with(PutRequest::new("/dev/b", "v"), &once("b"))
        .unwrap();
    assert_eq!(put.header.revision, revision(&engine), "applied this time");
}

#[test]
fn a_retry_while_the_first_attempt_is_in_flight_waits_for_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let faults = Arc::new(Faults::new());
    let engine = Engine::open(
        dir.path(),
        Config {
            faults: Some(faults.clone()),
            ..config(&clock)
        },
    )
    .unwrap();
    engine.put(PutRequest::new("warm", "up")).unwrap();
    faults.hold_log_syncs();
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let tx = tx.clone();
        engine.submit_put_with(
            PutRequest::new("k", "v"),
            &once("held"),
            Box::new(move |r| tx.send(r).unwrap()),
        );
    }
    // Neither is answered while the first attempt's commit is held. A reconciliation is
    // answered in apply order, after the same commit: it sees the operation finished.
    let engine = Arc::new(engine);
    let reconciling = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let query = OperationQuery {
                operation_id: "held".into(),
                agent_id: None,
            };
            engine.reconcile_operations(vec![query], "")
        })
    };
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "held");
    faults.release_log_syncs();
    let seen = reconciling.join().unwrap().unwrap();
    assert_eq!(seen[0].state, OperationState::Finished, "{seen:?}");
    let a = rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    let b = rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
    assert_eq!(a, b);
    assert_eq!((revision(&engine), version(&engine, "k")), (3, 1));
}

#[test]
fn retention_evicts_oldest_first_by_count_and_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let retention = Retention {
        count: 3,
        age: Duration::from_secs(60),
    };
    let open = || {
        Engine::open(
            dir.path(),
            Config {
                operation_retention: retention,
                ..config(&clock)
            },
        )
        .unwrap()
    };
    let engine = open();
    for i in 0..5 {
        engine
            .put_with(
                PutRequest::new(format!("k{i}"), "v"),
                &once(&format!("o{i}")),
            )
            .unwrap();
    }
    let retained = |engine: &Engine| -> Vec<String> {
        engine
            .reconcile_operations(vec![], "")
            .unwrap()
            .into_iter()
            .map(|s| s.operation_id)
            .collect()
    };
    assert_eq!(retained(&engine), ["o2", "o3", "o4"], "oldest two evicted");
    // An evicted id is fresh again: the write is applied a second time.
    let before = revision(&engine);
    engine
        .put_with(PutRequest::new("k0", "v"), &once("o0"))
        .unwrap();
    assert_eq!(revision(&engine), before + 1);
    assert_eq!(retained(&engine), ["o0", "o3", "o4"]);
    engine.close().unwrap();

    // Across a restart the order survives; then age evicts what is older than 60 s.
    let engine = open();
    clock.advance(Duration::from_secs(30));
    engine
        .put_with(PutRequest::new("late", "v"), &once("late"))
        .unwrap();
    assert_eq!(retained(&engine), ["late", "o0", "o4"], "o3 was the oldest");
    clock.advance(Duration::from_secs(31));
    assert_eq!(
        retained(&engine),
        ["late"],
        "61 s old: gone, 31 s old: kept"
    );
    let before = revision(&engine);
    engine
        .put_with(PutRequest::new("k4", "v"), &once("o4"))
        .unwrap();
    assert_eq!(revision(&engine), before + 1, "an aged id is fresh");
    let statuses = engine.reconcile_operations(vec![], "").unwrap();
    assert_eq!(statuses.len(), 2);
}

#[test]
fn compaction_and_defrag_keep_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let first = engine
        .put_with(PutRequest::new("k", "v"), &once("keep"))
        .unwrap();
    for i in 0..20 {
        engine.put(PutRequest::new("k", format!("v{i}"))).unwrap();
    }
    engine
        .compact(CompactionRequest {
            revision: revision(&engine),
            physical: true,
        })
        .unwrap();
    engine.defrag().unwrap();
    let retry = engine
        .put_with(PutRequest::new("k", "v"), &once("keep"))
        .unwrap();
    assert_eq!(retry, first);
    assert_eq!(version(&engine, "k"), 21);
}

/// Opens an engine whose agents are a1 (registered, with allocation x1 of ml), a2
/// (unreachable), a3 (gone) and a4 (registered before a restart, so recovered now).
fn agents_engine(dir: &tempfile::TempDir, clock: &Arc<ManualClock>) -> Engine {
    let engine = Engine::open(dir.path(), config(clock)).unwrap();
    for agent in ["a1", "a2", "a3", "a4"] {
        engine
            .register_agent(agent, AgentState::Registered, cpus(10.0))
            .unwrap();
    }
    engine.allocate("x4", "ml", "a4", cpus(1.0)).unwrap();
    engine.close().unwrap();
    clock.advance(Duration::from_secs(5));
    let engine = Engine::open(dir.path(), config(clock)).unwrap();
    for agent in ["a1", "a2", "a3"] {
        engine
            .register_agent(agent, AgentState::Registered, cpus(10.0))
            .unwrap();
    }
    engine.allocate("x1", "ml", "a1", cpus(1.0)).unwrap();
    engine.mark_agent_unreachable("a2").unwrap();
    engine.mark_agent_gone("a3").unwrap();
    engine
}

fn task(id: &str, agent: Option<&str>) -> TaskQuery {
    TaskQuery {
        task_id: id.into(),
        agent_id: agent.map(str::to_owned),
    }
}

#[test]
fn task_reconciliation_follows_mesos_six_branches_in_both_columns() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = agents_engine(&dir, &clock);
    let unreachable_at = (MANUAL_CLOCK_EPOCH + Duration::from_secs(5)).as_nanos() as u64;
    let latest = "Reconciliation: Latest task state";
    // (query, partition-aware answer, not-partition-aware answer, message, unreachable
    // time); None = no answer at all (branch 2).
    type Row<'a> = (
        TaskQuery,
        Option<(TaskState, TaskState, &'a str, Option<u64>)>,
    );
    let rows: Vec<Row> = vec![
        // 1: known task: latest state (a live allocation is running).
        (
            task("x1", Some("a1")),
            Some((TaskState::Running, TaskState::Running, latest, None)),
        ),
        // 1 on a recovered agent: still known, still running.
        (
            task("x4", None),
            Some((TaskState::Running, TaskState::Running, latest, None)),
        ),
        // 2: unknown, agent recovered: no answer.
        (task("nope", Some("a4")), None),
        // 2: unknown, no agent given while an agent is recovered: no answer.
        (task("nope", None), None),
        // 3: unknown, agent registered.
        (
            task("nope", Some("a1")),
            Some((
                TaskState::Gone,
                TaskState::Lost,
                "Reconciliation: Task is unknown to the agent",
                None,
            )),
        ),
        // 4: unknown, agent unreachable.
        (
            task("nope", Some("a2")),
            Some((
                TaskState::Unreachable,
                TaskState::Lost,
                "Reconciliation: Task is unreachable",
                Some(unreachable_at),
            )),
        ),
        // 5: unknown, agent gone.
        (
            task("nope", Some("a3")),
            Some((
                TaskState::GoneByOperator,
                TaskState::Lost,
                "Reconciliation: Task is gone",
                None,
            )),
        ),
        // 6: unknown agent.
        (
            task("nope", Some("a9")),
            Some((
                TaskState::Unknown,
                TaskState::Lost,
                "Reconciliation: Task is unknown",
                None,
            )),
        ),
    ];
    for (query, want) in rows {
        for aware in [true, false] {
            let got = engine.reconcile_tasks(vec![query.clone()], aware).unwrap();
            match want {
                None => assert!(got.is_empty(), "{query:?}: {got:?}"),
                Some((aware_state, lost_state, message, time)) => {
                    assert_eq!(got.len(), 1, "{query:?}");
                    let state = if aware { aware_state } else { lost_state };
                    assert_eq!(got[0].state, state, "{query:?} aware={aware}");
                    assert_eq!(got[0].message, message, "{query:?}");
                    assert_eq!(got[0].unreachable_time, time, "{query:?}");
                    assert_eq!(got[0].task_id, query.task_id);
                }
            }
        }
    }
    // Branch 6 with no agent given once no agent is recovered: TASK_UNKNOWN, no agent id.
    engine
        .register_agent("a4", AgentState::Registered, cpus(10.0))
        .unwrap();
    let got = engine
        .reconcile_tasks(vec![task("nope", None)], true)
        .unwrap();
    assert_eq!(
        (got[0].state, got[0].agent_id.clone(), got[0].message),
        (TaskState::Unknown, None, "Reconciliation: Task is unknown")
    );
    // A live allocation on an unreachable agent: TASK_UNREACHABLE / TASK_LOST.
    engine.mark_agent_unreachable("a1").unwrap();
    for (aware, state) in [(true, TaskState::Unreachable), (false, TaskState::Lost)] {
        let got = engine
            .reconcile_tasks(vec![task("x1", None)], aware)
            .unwrap();
        assert_eq!((got[0].state, got[0].message), (state, latest));
        assert!(got[0].unreachable_time.is_some());
    }
    // Implicit: every live allocation, in id order.
    let all = engine.reconcile_tasks(vec![], true).unwrap();
    let ids: Vec<_> = all.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(ids, ["x1", "x4"]);
    assert_eq!(kvd::TaskStatus::REASON, "REASON_RECONCILIATION");
    assert_eq!(kvd::TaskStatus::SOURCE, "SOURCE_MASTER");
}

fn op(id: &str, agent: Option<&str>) -> OperationQuery {
    OperationQuery {
        operation_id: id.into(),
        agent_id: agent.map(str::to_owned),
    }
}

#[test]
fn operation_reconciliation_follows_mesos_branches() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = agents_engine(&dir, &clock);
    let done = engine
        .put_with(PutRequest::new("k", "v"), &once("client-7/1"))
        .unwrap();
    engine.reserve("r1", "ml", "a1", cpus(1.0)).unwrap();
    engine
        .apply_accounting_with(
            AccountingRequest::Record {
                kind: RecordKind::Reservation,
                id: "r2".into(),
                role: "ml".into(),
                agent: "a1".into(),
                resources: cpus(1.0),
                prepare: false,
            },
            &once("client-7/reserve"),
        )
        .unwrap();
    let rows = [
        (op("client-7/1", Some("a2")), OperationState::Finished, None),
        (
            op("u", Some("a4")),
            OperationState::Recovering,
            Some("Reconciliation: Agent is recovered but has not re-registered"),
        ),
        (
            op("u", Some("a1")),
            OperationState::Unknown,
            Some("Reconciliation: Operation is unknown"),
        ),
        (
            op("u", Some("a2")),
            OperationState::Unreachable,
            Some("Reconciliation: Agent is unreachable"),
        ),
        (
            op("u", Some("a3")),
            OperationState::GoneByOperator,
            Some("Reconciliation: Agent marked gone by operator"),
        ),
        (
            op("u", Some("a9")),
            OperationState::Unknown,
            Some("Reconciliation: Both operation and agent are unknown"),
        ),
        (
            op("u", None),
            OperationState::Unknown,
            Some("Reconciliation: Operation is unknown and no 'agent_id' was provided"),
        ),
    ];
    for (query, state, message) in rows {
        let got = engine
            .reconcile_operations(vec![query.clone()], "")
            .unwrap();
        assert_eq!(got.len(), 1, "every query is answered");
        assert_eq!(
            (got[0].state, got[0].message),
            (state, message),
            "{query:?}"
        );
        assert_eq!(got[0].agent_id, query.agent_id);
    }
    let finished = engine
        .reconcile_operations(vec![op("client-7/1", None)], "")
        .unwrap();
    assert_eq!(finished[0].revision, Some(done.header.revision));
    // Implicit with a prefix: only that client's, the reservation included.
    engine
        .put_with(PutRequest::new("k2", "v"), &once("client-8/1"))
        .unwrap();
    let mine: Vec<_> = engine
        .reconcile_operations(vec![], "client-7/")
        .unwrap()
        .into_iter()
        .map(|s| s.operation_id)
        .collect();
    assert_eq!(mine, ["client-7/1", "client-7/reserve"]);
}

#[test]
fn agent_states_persist_and_a_recovered_agent_times_out_to_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = agents_engine(&dir, &clock);
    let state = |engine: &Engine, id: &str| engine.agents().unwrap()[id].state;
    assert_eq!(state(&engine, "a4"), AgentState::Recovered);
    // Capacity counts registered agents only: a4's 10 cpus are not there for a guarantee.
    let guarantee = |n: f64| {
        vec![kvd::quota::RawQuotaConfig {
            role: "g".into(),
            guarantees: cpus(n),
            ..Default::default()
        }]
    };
    let err = engine.update_quota(guarantee(15.0), false).unwrap_err();
    assert!(err.to_string().contains("capacity"), "{err}");
    // A recovered agent takes no new records until it registers again.
    assert!(engine.allocate("x9", "ml", "a4", cpus(1.0)).is_err());
    let since = engine.agents().unwrap()["a2"].unreachable_since;
    engine.close().unwrap();

    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    assert_eq!(state(&engine, "a2"), AgentState::Unreachable, "persisted");
    assert_eq!(engine.agents().unwrap()["a2"].unreachable_since, since);
    assert_eq!(state(&engine, "a3"), AgentState::Gone, "persisted");
    assert_eq!(state(&engine, "a1"), AgentState::Recovered);
    // Branch 4 still answers after the restart.
    let got = engine
        .reconcile_tasks(vec![task("nope", Some("a2"))], true)
        .unwrap();
    assert_eq!(got[0].state, TaskState::Unreachable);
    engine
        .register_agent("a1", AgentState::Registered, cpus(10.0))
        .unwrap();
    clock.advance(kvd::AGENT_REREGISTER_TIMEOUT_DEFAULT - Duration::from_secs(1));
    // The apply thread checks the timeout at the end of each turn, after the turn's writes
    // are answered. Two writes made in a burst go to the apply thread (never applied in this
    // thread): the first is applied in a turn that starts after the clock moved, and the
    // second, submitted once the first is answered, only in a later turn, so its answer
    // comes after the first turn's check.
    for key in ["tick", "tock"] {
        kvd::in_burst(|| engine.put(PutRequest::new(key, "1"))).unwrap();
    }
    assert_eq!(state(&engine, "a4"), AgentState::Recovered, "not yet");
    clock.advance(Duration::from_secs(2));
    let mut waited = 0;
    while state(&engine, "a4") != AgentState::Unreachable && waited < 200 {
        std::thread::sleep(Duration::from_millis(25));
        waited += 1;
    }
    assert_eq!(state(&engine, "a4"), AgentState::Unreachable, "timed out");
    assert_eq!(
        state(&engine, "a1"),
        AgentState::Registered,
        "re-registered in time"
    );
    let a4 = &engine.agents().unwrap()["a4"];
    let expected = MANUAL_CLOCK_EPOCH
        + Duration::from_secs(5)
        + kvd::AGENT_REREGISTER_TIMEOUT_DEFAULT
        + Duration::from_secs(1);
    assert_eq!(a4.unreachable_since, Some(expected.as_nanos() as u64));
    // Re-registering an unreachable agent makes it registered; a gone one cannot.
    engine
        .register_agent("a4", AgentState::Registered, cpus(10.0))
        .unwrap();
    assert_eq!(state(&engine, "a4"), AgentState::Registered);
    let err = engine
        .register_agent("a3", AgentState::Registered, cpus(10.0))
        .unwrap_err();
    assert!(err.to_string().contains("marked gone"), "{err}");
}

#[test]
fn marking_an_agent_gone_releases_its_records_and_their_consumption() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    engine
        .register_agent("a1", AgentState::Registered, cpus(10.0))
        .unwrap();
    engine.reserve("r1", "ml", "a1", cpus(2.0)).unwrap();
    engine.allocate("x1", "ml", "a1", cpus(3.0)).unwrap();
    assert_eq!(allocated_cpus(&engine, "ml"), 3_000);
    engine.mark_agent_gone("a1").unwrap();
    let ml = engine.roles().unwrap().into_iter().find(|r| r.role == "ml");
    let counters = ml
        .and_then(|r| r.resources.get("cpus").copied())
        .unwrap_or_default();
    assert_eq!(counters, kvd::Counters::default(), "nothing left");
    assert!(engine.reconcile_tasks(vec![], true).unwrap().is_empty());
    assert!(engine.consumption_drift().unwrap().is_empty());
    let err = engine.mark_agent_unreachable("a1").unwrap_err();
    assert!(err.to_string().contains("marked gone"), "{err}");
    let err = engine.mark_agent_gone("zz").unwrap_err();
    assert!(err.to_string().contains("Unknown agent"), "{err}");
}
