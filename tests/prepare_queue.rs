//! The allocation prepare queue through the engine's public API (ACCT-3, ACCT-4, ACCT-6):
//! N allocations preparing and the next refused, START and RELEASE freeing a slot, `offered`
//! shown, checked against limits and moved to `allocated` by START, the queue length
//! persisted across restarts and changed at run time, the fair share between roles on the
//! engine clock, and the exact count under concurrent ALLOCATEs from several roles. Every
//! engine runs on a manual clock, so the 10 s activity window moves only when a test says.
//! No timing thresholds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kvd::quota::RawQuotaConfig;
use kvd::{
    ALLOCATION_ACTIVE_WINDOW, AccountingRequest, AgentState, AllocationPrepareQueueReplaced,
    Config, Counters, Engine, Error, ManualClock, RecordKind,
};

fn config(length: Option<u64>) -> Config {
    Config {
        cache_size_bytes: 4 << 20,
        allocation_prepare_queue_length: length,
        clock: Arc::new(ManualClock::new()),
        ..Config::default()
    }
}

fn cpus(n: f64) -> BTreeMap<String, f64> {
    BTreeMap::from([("cpus".to_owned(), n)])
}

/// Opens an engine with a queue of `length` and one agent, `a1`.
fn open(dir: &tempfile::TempDir, length: Option<u64>) -> Engine {
    let engine = Engine::open(dir.path(), config(length)).unwrap();
    engine
        .register_agent("a1", AgentState::Registered, cpus(1_000.0))
        .unwrap();
    engine
}

fn limit(role: &str, cpus: f64) -> RawQuotaConfig {
    RawQuotaConfig {
        role: role.to_owned(),
        limits: BTreeMap::from([("cpus".to_owned(), cpus)]),
        ..RawQuotaConfig::default()
    }
}

/// Returns the `cpus` counters of `role`.
fn counters(engine: &Engine, role: &str) -> Counters {
    engine
        .roles()
        .unwrap()
        .into_iter()
        .find(|r| r.role == role)
        .and_then(|r| r.resources.get("cpus").copied())
        .unwrap_or_default()
}

/// Returns the number of allocations preparing.
fn preparing(engine: &Engine) -> u64 {
    engine.allocation_prepare_queue().unwrap().preparing
}

/// Asserts that `refused` failed with the full-queue message `message` and changed nothing.
fn assert_refused_unchanged(
    engine: &Engine,
    refused: impl FnOnce() -> kvd::Result<()>,
    message: &str,
) {
    let before = (
        engine.roles().unwrap(),
        engine.allocation_prepare_queue().unwrap(),
    );
    let err = refused().unwrap_err();
    assert!(err.is_allocation_prepare_queue_full(), "{err}");
    assert_eq!(err.to_string(), message);
    let after = (
        engine.roles().unwrap(),
        engine.allocation_prepare_queue().unwrap(),
    );
    assert_eq!(before, after, "a refused ALLOCATE changed something");
}

#[test]
fn n_allocations_prepare_and_the_next_is_refused_changing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, Some(4));
    for (i, role) in ["a", "b", "c", "d"].iter().enumerate() {
        engine
            .prepare_allocation(&format!("x{i}"), role, "a1", cpus(1.0))
            .unwrap();
    }
    assert_eq!(preparing(&engine), 4);
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("x5", "e", "a1", cpus(1.0)),
        "kvd: prepare queue is full: 4 allocations preparing, limit 4",
    );
    // A running allocation does not queue.
    engine.allocate("y1", "e", "a1", cpus(1.0)).unwrap();
    let queue = engine.allocation_prepare_queue().unwrap();
    assert_eq!((queue.length, queue.preparing), (4, 4));
    assert_eq!(
        queue.by_role.values().copied().collect::<Vec<_>>(),
        [1, 1, 1, 1]
    );
    assert!(engine.consumption_drift().unwrap().is_empty());
}

#[test]
fn start_or_release_frees_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, Some(2));
    engine
        .prepare_allocation("a1", "a", "a1", cpus(1.0))
        .unwrap();
    engine
        .prepare_allocation("b1", "b", "a1", cpus(1.0))
        .unwrap();
    let full = "kvd: prepare queue is full: 2 allocations preparing, limit 2";
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("c1", "c", "a1", cpus(1.0)),
        full,
    );
    engine.start_allocation("a1").unwrap();
    assert_eq!(preparing(&engine), 1);
    engine
        .prepare_allocation("c1", "c", "a1", cpus(1.0))
        .unwrap();
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("c2", "c", "a1", cpus(1.0)),
        full,
    );
    engine.release("b1").unwrap();
    engine
        .prepare_allocation("b2", "b", "a1", cpus(1.0))
        .unwrap();
    assert_eq!(preparing(&engine), 2);
    // Releasing a running allocation frees no slot, since it held none.
    engine.release("a1").unwrap();
    assert_eq!(preparing(&engine), 2);
    let start_twice = engine.start_allocation("a1").unwrap_err();
    assert_eq!(start_twice.to_string(), "Unknown allocation 'a1'");
    engine.start_allocation("c1").unwrap();
    let running = engine.start_allocation("c1").unwrap_err();
    assert_eq!(running.to_string(), "Allocation 'c1' is not preparing");
    assert!(engine.consumption_drift().unwrap().is_empty());
}

#[test]
fn offered_is_shown_checked_against_limits_and_moves_to_allocated_on_start() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, None);
    engine.update_quota(vec![limit("ml", 8.0)], false).unwrap();
    engine.reserve("r1", "ml", "a1", cpus(4.0)).unwrap();
    // Draws the 4 reserved cpus: all 6 are offered, none consumed, 6 held.
    engine
        .prepare_allocation("x1", "ml", "a1", cpus(6.0))
        .unwrap();
    let c = counters(&engine, "ml");
    assert_eq!(
        (c.allocated, c.reserved, c.reserved_in_use, c.offered),
        (0, 4_000, 4_000, 6_000)
    );
    assert_eq!((c.consumed(), c.held()), (0, 6_000));
    let over = engine.allocate("x2", "ml", "a1", cpus(3.0)).unwrap_err();
    assert_eq!(
        over.to_string(),
        "kvd: quota exceeded for role 'ml': cpus consumption 0 + offered 6 + request 3 > limit 8"
    );
    let over = engine.reserve("r2", "ml", "a1", cpus(3.0)).unwrap_err();
    assert!(matches!(over, Error::QuotaExceeded(_)), "{over}");
    let over = engine
        .prepare_allocation("x2", "ml", "a1", cpus(3.0))
        .unwrap_err();
    assert!(matches!(over, Error::QuotaExceeded(_)), "{over}");
    // The reservation a preparing allocation draws on is in use.
    assert_eq!(
        engine.unreserve("r1").unwrap_err().to_string(),
        "Reservation 'r1' is in use by allocations"
    );
    // A limit below what the role holds needs force, as below its consumption.
    assert!(engine.update_quota(vec![limit("ml", 5.0)], false).is_err());
    engine.allocate("x2", "ml", "a1", cpus(2.0)).unwrap();
    engine.start_allocation("x1").unwrap();
    let c = counters(&engine, "ml");
    assert_eq!(
        (c.allocated, c.offered, c.consumed(), c.held()),
        (8_000, 0, 8_000, 8_000)
    );
    assert!(engine.consumption_drift().unwrap().is_empty());
    // Releasing a preparing allocation gives its offered and its draws back.
    engine.release("x2").unwrap();
    engine
        .prepare_allocation("x3", "ml", "a1", cpus(2.0))
        .unwrap();
    engine.release("x3").unwrap();
    engine.release("x1").unwrap();
    engine.unreserve("r1").unwrap();
    assert_eq!(counters(&engine, "ml"), Counters::default());
    // Only allocations can be prepared.
    let reservation = engine
        .record(RecordKind::Reservation, "r3", "ml", "a1", cpus(1.0), true)
        .unwrap_err();
    assert_eq!(
        reservation.to_string(),
        "Only an allocation can be prepared"
    );
}

#[test]
fn the_queue_length_survives_restarts_and_a_start_flag_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, Some(3));
    let replaced = AllocationPrepareQueueReplaced {
        previous: None,
        length: 3,
    };
    assert_eq!(
        engine.allocation_prepare_queue_replaced().unwrap(),
        Some(replaced)
    );
    engine.update_quota(vec![limit("ml", 10.0)], false).unwrap();
    engine
        .prepare_allocation("x1", "ml", "a1", cpus(2.0))
        .unwrap();
    let roles = engine.roles().unwrap();
    engine.close().unwrap();

    // Without the flag: the persisted length, and the preparing allocation still offered.
    let engine = open(&dir, None);
    assert_eq!(engine.allocation_prepare_queue_replaced().unwrap(), None);
    let queue = engine.allocation_prepare_queue().unwrap();
    assert_eq!((queue.length, queue.preparing), (3, 1));
    assert_eq!(engine.roles().unwrap(), roles);
    assert_eq!(counters(&engine, "ml").offered, 2_000);
    engine.update_prepare_queue(1).unwrap();
    engine.close().unwrap();

    // The run-time change was persisted too.
    let engine = open(&dir, None);
    assert_eq!(engine.allocation_prepare_queue().unwrap().length, 1);
    assert!(
        engine
            .prepare_allocation("x2", "other", "a1", cpus(1.0))
            .unwrap_err()
            .is_allocation_prepare_queue_full()
    );
    engine.close().unwrap();

    // With the flag: it replaces the persisted length, and says so.
    let engine = open(&dir, Some(5));
    let replaced = AllocationPrepareQueueReplaced {
        previous: Some(1),
        length: 5,
    };
    assert_eq!(
        engine.allocation_prepare_queue_replaced().unwrap(),
        Some(replaced)
    );
    assert_eq!(engine.allocation_prepare_queue().unwrap().length, 5);
    engine.start_allocation("x1").unwrap();
    engine.close().unwrap();
    let engine = open(&dir, None);
    assert_eq!(engine.allocation_prepare_queue().unwrap().length, 5);
    assert_eq!(counters(&engine, "ml").allocated, 2_000);
    assert!(engine.consumption_drift().unwrap().is_empty());
}

#[test]
fn lowering_the_length_at_run_time_refuses_new_entries_and_cancels_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, Some(4));
    for (id, role) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
        engine
            .prepare_allocation(id, role, "a1", cpus(1.0))
            .unwrap();
    }
    engine.update_prepare_queue(2).unwrap();
    assert_eq!(preparing(&engine), 4, "lowering cancels nothing");
    let over = "kvd: prepare queue is full: 4 allocations preparing, limit 2";
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("c1", "c", "a1", cpus(1.0)),
        over,
    );
    engine.start_allocation("a1").unwrap();
    engine.start_allocation("b1").unwrap();
    let at_limit = "kvd: prepare queue is full: 2 allocations preparing, limit 2";
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("c1", "c", "a1", cpus(1.0)),
        at_limit,
    );
    engine.release("a2").unwrap();
    engine
        .prepare_allocation("c1", "c", "a1", cpus(1.0))
        .unwrap();
    assert_eq!(preparing(&engine), 2);
    // 0 turns the queue off: no bound and no share.
    engine.update_prepare_queue(0).unwrap();
    for i in 0..10 {
        engine
            .prepare_allocation(&format!("c{}", i + 2), "c", "a1", cpus(1.0))
            .unwrap();
    }
    assert_eq!(preparing(&engine), 12);
}

#[test]
fn fair_share_follows_the_roles_active_on_the_engine_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let config = Config {
        clock: clock.clone(),
        ..config(Some(6))
    };
    let engine = Engine::open(dir.path(), config).unwrap();
    engine
        .register_agent("a1", AgentState::Registered, cpus(1_000.0))
        .unwrap();
    // Alone, a role holds at most half the queue: 3 of 6.
    for i in 0..3 {
        engine
            .prepare_allocation(&format!("a{i}"), "a", "a1", cpus(1.0))
            .unwrap();
    }
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("a3", "a", "a1", cpus(1.0)),
        "kvd: prepare queue is full: 3 allocations preparing for role 'a', limit 3 \
         (half of 6 while no other role is active)",
    );
    for i in 0..3 {
        engine.start_allocation(&format!("a{i}")).unwrap();
    }
    // b and c have one admitted each, then start it: all three stay active for the window.
    for role in ["b", "c"] {
        engine
            .prepare_allocation(&format!("{role}0"), role, "a1", cpus(1.0))
            .unwrap();
        engine.start_allocation(&format!("{role}0")).unwrap();
    }
    clock.advance(Duration::from_secs(5));
    engine
        .prepare_allocation("a3", "a", "a1", cpus(1.0))
        .unwrap();
    engine
        .prepare_allocation("a4", "a", "a1", cpus(1.0))
        .unwrap();
    assert_refused_unchanged(
        &engine,
        || engine.prepare_allocation("a5", "a", "a1", cpus(1.0)),
        "kvd: prepare queue is full: 2 allocations preparing for role 'a', limit 2 \
         (its share of 6 among 3 active roles)",
    );
    // Once b's and c's admissions are out of the window, a is alone again: half of 6.
    clock.advance(ALLOCATION_ACTIVE_WINDOW - Duration::from_secs(4));
    engine
        .prepare_allocation("a5", "a", "a1", cpus(1.0))
        .unwrap();
    assert!(
        engine
            .prepare_allocation("a6", "a", "a1", cpus(1.0))
            .unwrap_err()
            .is_allocation_prepare_queue_full()
    );
    // The first request of another role finds room.
    engine
        .prepare_allocation("b1", "b", "a1", cpus(1.0))
        .unwrap();
    let queue = engine.allocation_prepare_queue().unwrap();
    assert_eq!(
        queue.by_role,
        BTreeMap::from([("a".to_owned(), 3), ("b".to_owned(), 1)])
    );
}

/// A deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Below the number of roles, so both the bound (3) and the share (max(1, 3 / roles) = 1)
/// refuse.
const HAMMER_LENGTH: u64 = 3;
const HAMMER_ROLES: [&str; 4] = ["r0", "r1", "r2", "r3"];
const HAMMER_THREADS_PER_ROLE: usize = 2;
const HAMMER_STEPS: usize = 150;

#[test]
fn the_count_is_exact_under_concurrent_allocates_from_several_roles() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(&dir, Some(HAMMER_LENGTH)));
    let mut threads = Vec::new();
    for (r, role) in HAMMER_ROLES.iter().enumerate() {
        for t in 0..HAMMER_THREADS_PER_ROLE {
            let engine = engine.clone();
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng((r * 16 + t) as u64 + 1);
                let (mut mine, mut admitted, mut refused) = (Vec::new(), 0, 0);
                for step in 0..HAMMER_STEPS {
                    let id = format!("{role}-{t}-{step}");
                    match rng.below(4) {
                        0 | 1 => match engine.prepare_allocation(&id, role, "a1", cpus(1.0)) {
                            Ok(()) => {
                                mine.push(id);
                                admitted += 1;
                            }
                            Err(e) if e.is_allocation_prepare_queue_full() => refused += 1,
                            Err(e) => panic!("{id}: {e}"),
                        },
                        2 if !mine.is_empty() => {
                            let pick = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            engine.start_allocation(&pick).unwrap();
                        }
                        _ if !mine.is_empty() => {
                            let pick = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            engine.release(&pick).unwrap();
                        }
                        _ => {}
                    }
                    // ACCT-6 after every answer: never above the length, and the per-role
                    // counts add up.
                    let queue = engine.allocation_prepare_queue().unwrap();
                    assert!(queue.preparing <= HAMMER_LENGTH, "{queue:?}");
                    assert_eq!(queue.by_role.values().sum::<u64>(), queue.preparing);
                }
                (*role, mine.len() as u64, admitted, refused)
            }));
        }
    }
    let mut outstanding: BTreeMap<String, u64> = BTreeMap::new();
    let (mut admitted, mut refused) = (0, 0);
    for thread in threads {
        let (role, left, a, f) = thread.join().unwrap();
        *outstanding.entry(role.to_owned()).or_default() += left;
        admitted += a;
        refused += f;
    }
    outstanding.retain(|_, n| *n > 0);
    assert!(
        admitted > HAMMER_LENGTH && refused > 0,
        "{admitted} admitted, {refused} refused"
    );
    // At the end the engine's count is exactly what the threads left preparing.
    let queue = engine.allocation_prepare_queue().unwrap();
    assert_eq!(queue.by_role, outstanding);
    assert!(queue.preparing <= HAMMER_LENGTH);
    assert!(engine.consumption_drift().unwrap().is_empty());
    // And the rows say the same after a restart.
    let engine = Arc::try_unwrap(engine).unwrap();
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config(None)).unwrap();
    assert_eq!(
        engine.allocation_prepare_queue().unwrap().by_role,
        outstanding
    );
}

#[test]
fn the_prepare_flag_travels_in_the_one_record_request() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, Some(2));
    let request = AccountingRequest::Record {
        kind: RecordKind::Allocation,
        id: "x1".into(),
        role: "ml".into(),
        agent: "a1".into(),
        resources: cpus(1.0),
        prepare: true,
    };
    engine.apply_accounting(request).unwrap();
    assert_eq!(counters(&engine, "ml").offered, 1_000);
    engine
        .apply_accounting(AccountingRequest::Start { id: "x1".into() })
        .unwrap();
    assert_eq!(counters(&engine, "ml").allocated, 1_000);
    engine
        .apply_accounting(AccountingRequest::UpdatePrepareQueue {
            allocation_prepare_queue_length: 7,
        })
        .unwrap();
    assert_eq!(engine.allocation_prepare_queue().unwrap().length, 7);
}

#[test]
fn the_worked_example_of_quota_md_with_a_preparing_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir, None);
    let ml = RawQuotaConfig {
        guarantees: cpus(2.0),
        ..limit("ml", 8.0)
    };
    engine.update_quota(vec![ml], false).unwrap();
    engine.reserve("r1", "ml", "a1", cpus(4.0)).unwrap();
    let team = BTreeMap::from([("cpus".to_owned(), 1.0), ("mem".to_owned(), 512.0)]);
    engine.reserve("r2", "ml/team", "a1", team).unwrap();
    engine
        .prepare_allocation("p1", "ml", "a1", cpus(6.0))
        .unwrap();
    let c = counters(&engine, "ml");
    assert_eq!(
        (
            c.offered,
            c.reserved,
            c.reserved_in_use,
            c.consumed(),
            c.held()
        ),
        (6_000, 5_000, 4_000, 1_000, 7_000)
    );
    assert_eq!(
        engine
            .allocate("x2", "ml", "a1", cpus(2.0))
            .unwrap_err()
            .to_string(),
        "kvd: quota exceeded for role 'ml': cpus consumption 1 + offered 6 + request 2 > limit 8"
    );
    engine.start_allocation("p1").unwrap();
    let c = counters(&engine, "ml");
    assert_eq!((c.allocated, c.offered, c.consumed()), (6_000, 0, 7_000));
}
