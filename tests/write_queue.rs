//! The write prepare queue (PREP-1..5, `docs/design/load-soothing.md`): its bound, the
//! refusal and its retry hint, and fairness between roles, with commits held back by the
//! fault backend so the queue really fills.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use kvd::quota::RawQuotaConfig;
use kvd::{
    Config, Engine, Error, Faults, ManualClock, PutRequest, RangeRequest, Result,
    WRITE_DURATION_BOUNDS_MICROS,
};

/// How long a test waits for one answer before it fails.
const ANSWER_WAIT: Duration = Duration::from_secs(30);

fn open(dir: &std::path::Path, queue: usize, faults: &Arc<Faults>) -> Engine {
    let config = Config {
        prepare_queue_length: queue,
        faults: Some(faults.clone()),
        ..Config::default()
    };
    Engine::open(dir, config).unwrap()
}

/// Gives each role a registry entry, so keys under `/<role>/` belong to it.
fn register(engine: &Engine, roles: &[String]) {
    let configs = roles
        .iter()
        .map(|role| RawQuotaConfig {
            role: role.clone(),
            guarantees: BTreeMap::new(),
            limits: BTreeMap::from([("kv_keys".to_owned(), 1e6)]),
        })
        .collect();
    engine.update_quota(configs, false).unwrap();
}

/// Submits a Put without waiting; the answer arrives on the returned channel.
fn submit(engine: &Engine, key: &str) -> mpsc::Receiver<Result<i64>> {
    let (tx, rx) = mpsc::channel();
    engine.submit_put(
        PutRequest::new(key.to_owned(), "v"),
        Box::new(move |result| {
            let _ = tx.send(result.map(|r| r.header.revision));
        }),
    );
    rx
}

/// Holds the log syncs back until dropped, so a failing assert cannot leave the engine's
/// threads (and the test) waiting forever.
struct Held(Arc<Faults>);

impl Held {
    fn new(faults: &Arc<Faults>) -> Held {
        faults.hold_log_syncs();
        Held(faults.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.release_log_syncs();
    }
}

fn answer(rx: &mpsc::Receiver<Result<i64>>) -> Result<i64> {
    rx.recv_timeout(ANSWER_WAIT).expect("an answer")
}

fn exists(engine: &Engine, key: &str) -> bool {
    !engine
        .range(&RangeRequest::key(key.to_owned()))
        .unwrap()
        .kvs
        .is_empty()
}

#[test]
fn a_full_queue_refuses_exactly_the_writes_past_its_bound() {
    const N: usize = 8;
    const EXTRA: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let engine = open(dir.path(), N, &faults);
    // One role per write, so no role's share binds before the bound itself (PREP-2).
    let roles: Vec<String> = (0..N + EXTRA).map(|i| format!("r{i}")).collect();
    register(&engine, &roles);
    let before = engine.status().unwrap().header.revision;
    let held = Held::new(&faults);
    let pending: Vec<_> = roles
        .iter()
        .map(|r| (format!("/{r}/k"), submit(&engine, &format!("/{r}/k"))))
        .collect();
    // The refusals are answered at once, before anything is committed.
    let mut refused = Vec::new();
    let mut admitted = Vec::new();
    for (key, rx) in pending {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Err(err)) => {
                assert!(err.is_too_many_requests(), "{err:?}");
                assert_eq!(err.to_string(), "etcdserver: too many requests");
                let hint = err.retry_after_ms().expect("a retry hint");
                assert!((1..=5_000).contains(&hint), "hint {hint} ms");
                refused.push(key);
            }
            Ok(Ok(revision)) => panic!("{key} committed at {revision} while syncs are held"),
            Err(_) => admitted.push((key, rx)),
        }
    }
    assert_eq!(refused.len(), EXTRA, "refused: {refused:?}");
    assert_eq!(admitted.len(), N);
    assert_eq!(engine.apply_stats().unwrap().queue_depth, N, "PREP-1");
    drop(held);
    for (key, rx) in &admitted {
        answer(rx).unwrap_or_else(|e| panic!("{key}: {e}"));
    }
    // PREP-3: nothing of a refused write is visible; every admitted one is, one revision each.
    for key in &refused {
        assert!(!exists(&engine, key), "{key} was refused but is visible");
    }
    for (key, _) in &admitted {
        assert!(exists(&engine, key), "{key} missing");
    }
    assert_eq!(engine.status().unwrap().header.revision, before + N as i64);
    let queue = engine.prepare_queue().unwrap();
    let refusals: u64 = queue.iter().map(|q| q.refused).sum();
    assert_eq!(refusals, EXTRA as u64);
    assert!(queue.iter().all(|q| q.queued == 0), "{queue:?}");
    engine.close().unwrap();
}

#[test]
fn a_greedy_role_cannot_crowd_out_a_polite_one() {
    const N: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let engine = open(dir.path(), N, &faults);
    register(&engine, &["greedy".to_owned(), "polite".to_owned()]);
    let held = Held::new(&faults);
    let mut greedy = Vec::new();
    let mut polite = Vec::new();
    // The greedy role floods with ten times the queue's length, the polite role writes a
    // few in between; nothing commits meanwhile, so the queue stays as full as it gets.
    for i in 0..10 * N {
        greedy.push((
            format!("/greedy/{i}"),
            submit(&engine, &format!("/greedy/{i}")),
        ));
        if i % (2 * N) == 0 {
            polite.push((
                format!("/polite/{i}"),
                submit(&engine, &format!("/polite/{i}")),
            ));
        }
        assert!(engine.apply_stats().unwrap().queue_depth <= N, "PREP-1");
    }
    drop(held);
    for (key, rx) in &polite {
        answer(rx).unwrap_or_else(|e| panic!("polite write {key} refused: {e}"));
        assert!(exists(&engine, key));
    }
    let (mut admitted, mut refused) = (0, 0);
    for (key, rx) in &greedy {
        match answer(rx) {
            Ok(_) => {
                admitted += 1;
                assert!(exists(&engine, key));
            }
            Err(Error::TooManyRequests { .. }) => {
                refused += 1;
                assert!(!exists(&engine, key), "{key} was refused but is visible");
            }
            Err(other) => panic!("{key}: {other}"),
        }
    }
    // Alone, the greedy role holds at most half; with the polite role active, its share.
    assert!(admitted <= N / 2, "greedy held {admitted} of {N}");
    assert!(refused >= 10 * N - N / 2, "greedy refused only {refused}");
    let queue = engine.prepare_queue().unwrap();
    let greedy_refusals = queue.iter().find(|q| q.role == "greedy").unwrap().refused;
    assert_eq!(greedy_refusals, refused as u64);
    assert!(
        queue.iter().all(|q| q.role != "polite" || q.refused == 0),
        "{queue:?}"
    );
    engine.close().unwrap();
}

#[test]
fn a_role_alone_leaves_half_the_queue_for_the_next_one() {
    const N: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let engine = open(dir.path(), N, &faults);
    register(&engine, &["other".to_owned()]);
    let held = Held::new(&faults);
    // Keys outside every role's namespace belong to `*`, here the only active role.
    let star: Vec<_> = (0..N).map(|i| submit(&engine, &format!("k{i}"))).collect();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for rx in star {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Err(err)) if err.is_too_many_requests() => refused += 1,
            Ok(other) => panic!("unexpected answer while syncs are held: {other:?}"),
            Err(_) => admitted.push(rx),
        }
    }
    assert_eq!((admitted.len(), refused), (N / 2, N - N / 2), "PREP-2");
    // The other half is there for the first write of another role.
    let other = submit(&engine, "/other/k");
    assert!(
        other.recv_timeout(Duration::from_millis(200)).is_err(),
        "admitted, pending"
    );
    drop(held);
    for rx in admitted.iter().chain([&other]) {
        answer(rx).unwrap();
    }
    assert_eq!(engine.apply_stats().unwrap().queue_depth, 0);
    engine.close().unwrap();
}

/// PREP-5: a write's duration runs from its admission to its answer, so the wait for its log
/// sync is in it; each admitted write is counted once in its role's histogram, and a refused
/// write in none.
#[test]
fn a_writes_duration_runs_from_admission_to_answer_and_refusals_are_not_counted() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let clock = Arc::new(ManualClock::new());
    let config = Config {
        prepare_queue_length: 1,
        faults: Some(faults.clone()),
        clock: clock.clone(),
        ..Config::default()
    };
    let engine = Engine::open(dir.path(), config).unwrap();
    register(&engine, &["team".to_owned()]);
    let held = Held::new(&faults);
    let admitted = submit(&engine, "/team/a");
    let refused = answer(&submit(&engine, "/team/b")).unwrap_err();
    assert!(refused.is_too_many_requests(), "{refused:?}");
    clock.advance(Duration::from_millis(30));
    drop(held);
    answer(&admitted).unwrap();
    let durations = engine.apply_stats().unwrap().durations;
    let team = durations
        .iter()
        .find(|d| d.role == "team")
        .unwrap_or_else(|| panic!("no durations of team in {durations:?}"));
    // 30 ms: above the 25 ms bound, at most the 50 ms one.
    let bucket = WRITE_DURATION_BOUNDS_MICROS
        .iter()
        .position(|bound| *bound == 50_000)
        .unwrap();
    let mut expected = [0; WRITE_DURATION_BOUNDS_MICROS.len() + 1];
    expected[bucket] = 1;
    assert_eq!(
        team.buckets, expected,
        "one write, the refused one not counted"
    );
    assert_eq!(team.sum_micros, 30_000);
    engine.close().unwrap();
}
