//! The write prepare queue: admission of writes into the bounded set of writes admitted and
//! not yet answered, fair between the roles that own them (`engine::lanes` holds the apply
//! thread's side: batches taken round-robin across roles).
//!
//! A write belongs to the role that owns its first written key (`quota::charged_role`: the
//! deepest role with a registry entry whose namespace prefixes the key, else `*`); writes
//! without a key (compaction, leases, alarms, operator calls) belong to `*`. A role is
//! *active* while it has a write in the queue or had one admitted in the last
//! [`ACTIVE_WINDOW`] of engine time (counted to within [`PRUNE_INTERVAL`]).
//!
//! Invariants:
//! - PREP-1: at most `capacity` writes are in the queue at any moment: a write is counted
//!   from its admission until its completion ran, and a write is admitted only if the count
//!   is below `capacity` (the check and the count are one step under the queue's lock).
//! - PREP-2: no role holds more than `max(1, capacity / active roles)` slots, counting the
//!   admitting role as active; a role that is the only active one holds at most
//!   `max(1, capacity / 2)`, so the first write of any other role finds room.
//! - PREP-3: a refused write changes nothing but its role's refusal counter.
//! - PREP-5: every admitted write is counted once, at its release, in its role's duration
//!   histogram: the engine clock's time from its admission to its completion
//!   ([`WRITE_DURATION_BOUNDS_MICROS`]; a refused write is not counted).
//!
//! The file names only `crate::sync` and `crate::clock`, so `loom-tests/` compiles it as it
//! is and checks PREP-1 with admissions, refusals and releases racing.
//!
//! Contact points: `Engine::enqueue` admits (PREP-1..3); the slot's release runs inside each
//! write's completion; `engine::lanes` orders what was admitted (PREP-4).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::clock::Clock;
use crate::sync::{self, Arc, Mutex, Name};

/// How long a role counts as active after its last admitted write.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(10);
/// How often idle roles are dropped from the active set.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(1);
/// Bounds of the retry hint given with a refusal.
pub const RETRY_AFTER_MIN_MS: u64 = 1;
/// The longest retry hint.
pub const RETRY_AFTER_MAX_MS: u64 = 5_000;
/// The hint when no drain rate has been measured yet.
const RETRY_AFTER_UNKNOWN_MS: u64 = 100;
/// The window over which the drain rate is measured.
const DRAIN_WINDOW: Duration = Duration::from_millis(200);
/// Upper bounds of the write-duration histogram's buckets, in microseconds: 0.1 ms to 10 s
/// in steps of 1, 2.5 and 5; one more bucket holds the longer ones (PREP-5).
pub const WRITE_DURATION_BOUNDS_MICROS: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
/// Buckets of the write-duration histogram: one per bound and one above them.
pub const WRITE_DURATION_BUCKETS: usize = WRITE_DURATION_BOUNDS_MICROS.len() + 1;

/// A refusal: the queue (or the role's share of it) is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    /// When a retry is likely to find room, from the queue's drain rate.
    pub retry_after_ms: u64,
}

/// One role's figures, for `/roles` and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleQueue {
    /// The role.
    pub role: String,
    /// Its writes in the queue now.
    pub queued: usize,
    /// Its writes refused since the engine opened.
    pub refused: u64,
}

/// One role's write durations, from admission to completion (PREP-5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleDurations {
    /// The role.
    pub role: String,
    /// Writes completed since the engine opened, per bucket (not cumulative): bucket `i`
    /// holds those that took at most `WRITE_DURATION_BOUNDS_MICROS[i]` and more than the
    /// bound before; the last holds those above every bound.
    pub buckets: [u64; WRITE_DURATION_BUCKETS],
    /// Their durations added up, in microseconds.
    pub sum_micros: u64,
}

/// What a role did since open, kept whether or not it is active.
#[derive(Debug, Default)]
struct Totals {
    /// Its refused writes (PREP-3).
    refused: u64,
    /// Its completed writes' durations (PREP-5).
    durations: Durations,
}

#[derive(Debug, Default)]
struct Durations {
    buckets: [u64; WRITE_DURATION_BUCKETS],
    sum_micros: u64,
}

impl Durations {
    fn record(&mut self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let bucket = WRITE_DURATION_BOUNDS_MICROS.partition_point(|bound| *bound < micros);
        self.buckets[bucket] += 1;
        self.sum_micros = self.sum_micros.saturating_add(micros);
    }
}

#[derive(Debug)]
struct Active {
    queued: usize,
    last_admit: Duration,
}

#[derive(Debug, Default)]
struct State {
    total: usize,
    /// Roles that are active (or were, until the next prune).
    active: BTreeMap<Name, Active>,
    /// Refusals and durations since open, by role; never pruned.
    totals: BTreeMap<Name, Totals>,
    last_prune: Duration,
    /// Completions in the current drain window, when it began, and the last full window's
    /// rate (writes per second).
    drained: u64,
    window_start: Duration,
    rate: Option<f64>,
}

/// The bounded, fair queue of admitted writes.
pub struct PrepareQueue {
    capacity: usize,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl std::fmt::Debug for PrepareQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrepareQueue")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// A write's place in the queue; dropping it (in the write's completion) frees it.
#[derive(Debug)]
pub struct Slot {
    queue: Arc<PrepareQueue>,
    role: Name,
    /// The engine clock's reading at admission (PREP-5).
    admitted: Duration,
}

impl Slot {
    /// The role the write belongs to.
    pub fn role(&self) -> &Name {
        &self.role
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queue.release(&self.role, self.admitted);
    }
}

impl PrepareQueue {
    /// Returns an empty queue of `capacity` slots (at least 1) on `clock`.
    pub fn new(capacity: usize, clock: Arc<dyn Clock>) -> PrepareQueue {
        PrepareQueue {
            capacity: capacity.max(1),
            clock,
            state: Mutex::new(State::default()),
        }
    }

    /// The bound of the queue.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes in the queue now.
    pub fn depth(&self) -> usize {
        sync::lock(&self.state).total
    }

    /// Admits a write of `role` (PREP-1, PREP-2), or refuses it with a retry hint (PREP-3).
    pub fn admit(queue: &Arc<PrepareQueue>, role: &str) -> Result<Slot, Full> {
        let this = &**queue;
        let now = this.clock.now();
        let mut state = sync::lock(&this.state);
        if now.saturating_sub(state.last_prune) >= PRUNE_INTERVAL {
            state
                .active
                .retain(|_, a| a.queued > 0 || now.saturating_sub(a.last_admit) < ACTIVE_WINDOW);
            state.last_prune = now;
        }
        let held = state.active.get(role).map_or(0, |a| a.queued);
        let others = state.active.len() - usize::from(state.active.contains_key(role));
        let share = if others == 0 {
            (this.capacity / 2).max(1)
        } else {
            (this.capacity / (others + 1)).max(1)
        };
        if state.total >= this.capacity || held >= share {
            let retry_after_ms = retry_after(&state);
            let name = this.intern(&state, role);
            state.totals.entry(name).or_default().refused += 1;
            return Err(Full { retry_after_ms });
        }
        let name = this.intern(&state, role);
        let entry = state.active.entry(name.clone()).or_insert(Active {
            queued: 0,
            last_admit: now,
        });
        entry.queued += 1;
        entry.last_admit = now;
        state.total += 1;
        debug_assert!(state.total <= this.capacity, "PREP-1");
        Ok(Slot {
            queue: queue.clone(),
            role: name,
            admitted: now,
        })
    }

    /// Returns the shared name of `role`, allocating it only the first time it is seen.
    fn intern(&self, state: &State, role: &str) -> Name {
        if let Some((name, _)) = state.active.get_key_value(role) {
            return name.clone();
        }
        if let Some((name, _)) = state.totals.get_key_value(role) {
            return name.clone();
        }
        Name::from(role)
    }

    fn release(&self, role: &Name, admitted: Duration) {
        let now = self.clock.now();
        let mut state = sync::lock(&self.state);
        state.total = state.total.saturating_sub(1);
        if let Some(active) = state.active.get_mut(role) {
            active.queued = active.queued.saturating_sub(1);
        }
        let took = now.saturating_sub(admitted);
        match state.totals.get_mut(role) {
            Some(totals) => totals.durations.record(took),
            None => {
                let mut totals = Totals::default();
                totals.durations.record(took);
                state.totals.insert(role.clone(), totals);
            }
        }
        state.drained += 1;
        let elapsed = now.saturating_sub(state.window_start);
        if elapsed >= DRAIN_WINDOW {
            let rate = state.drained as f64 / elapsed.as_secs_f64();
            state.rate = Some(match state.rate {
                Some(previous) => (previous + rate) / 2.0,
                None => rate,
            });
            state.drained = 0;
            state.window_start = now;
        }
    }

    /// Every role with writes queued or refused, sorted by role.
    pub fn roles(&self) -> Vec<RoleQueue> {
        let state = sync::lock(&self.state);
        let mut roles: BTreeMap<&str, RoleQueue> = BTreeMap::new();
        for (role, active) in &state.active {
            roles.entry(role).or_default().queued = active.queued;
        }
        for (role, totals) in &state.totals {
            roles.entry(role).or_default().refused = totals.refused;
        }
        roles
            .into_iter()
            .map(|(role, mut q)| {
                q.role = role.to_owned();
                q
            })
            .filter(|q| q.queued > 0 || q.refused > 0)
            .collect()
    }

    /// Every role with a completed write since open, sorted by role, with the durations of
    /// its writes (PREP-5).
    pub fn durations(&self) -> Vec<RoleDurations> {
        let state = sync::lock(&self.state);
        state
            .totals
            .iter()
            .filter(|(_, totals)| totals.durations.buckets.iter().any(|n| *n > 0))
            .map(|(role, totals)| RoleDurations {
                role: role.to_string(),
                buckets: totals.durations.buckets,
                sum_micros: totals.durations.sum_micros,
            })
            .collect()
    }
}

/// How long until the queue has likely drained what is in it, from the last drain rate.
fn retry_after(state: &State) -> u64 {
    match state.rate {
        Some(rate) if rate > 0.0 => {
            let ms = (state.total as f64 / rate * 1000.0).ceil();
            (ms as u64).clamp(RETRY_AFTER_MIN_MS, RETRY_AFTER_MAX_MS)
        }
        _ => RETRY_AFTER_UNKNOWN_MS,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn queue(capacity: usize) -> (Arc<PrepareQueue>, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new());
        (Arc::new(PrepareQueue::new(capacity, clock.clone())), clock)
    }

    #[test]
    fn a_lone_role_gets_half_and_a_second_role_finds_room() {
        let (q, _) = queue(10);
        let greedy: Vec<Slot> = (0..5)
            .map(|_| PrepareQueue::admit(&q, "greedy").unwrap())
            .collect();
        assert!(
            PrepareQueue::admit(&q, "greedy").is_err(),
            "PREP-2: half for a lone role"
        );
        let polite = PrepareQueue::admit(&q, "polite").unwrap();
        assert_eq!(q.depth(), 6);
        // Two active roles: 5 each. The greedy one is at its share.
        assert!(PrepareQueue::admit(&q, "greedy").is_err());
        drop(polite);
        drop(greedy);
        assert_eq!(q.depth(), 0);
        let roles = q.roles();
        assert_eq!(roles.len(), 1);
        assert_eq!((roles[0].role.as_str(), roles[0].refused), ("greedy", 2));
    }

    #[test]
    fn the_bound_holds_across_many_roles() {
        let (q, _) = queue(4);
        let held: Vec<Slot> = ["a", "b", "c", "d"]
            .iter()
            .map(|r| PrepareQueue::admit(&q, r).unwrap())
            .collect();
        assert!(PrepareQueue::admit(&q, "e").is_err(), "PREP-1");
        assert_eq!(q.depth(), 4);
        drop(held);
        assert!(PrepareQueue::admit(&q, "e").is_ok());
    }

    #[test]
    fn idle_roles_stop_counting_after_the_window() {
        let (q, clock) = queue(10);
        drop(PrepareQueue::admit(&q, "old").unwrap());
        // "old" is still active: the new role gets half.
        let held: Vec<Slot> = (0..5)
            .map(|_| PrepareQueue::admit(&q, "new").unwrap())
            .collect();
        assert!(PrepareQueue::admit(&q, "new").is_err());
        clock.advance(ACTIVE_WINDOW + PRUNE_INTERVAL);
        drop(held);
        let held: Vec<Slot> = (0..5)
            .map(|_| PrepareQueue::admit(&q, "new").unwrap())
            .collect();
        assert!(PrepareQueue::admit(&q, "new").is_err(), "alone again: half");
        drop(held);
    }

    #[test]
    fn each_completed_write_is_counted_once_by_its_duration() {
        let (q, clock) = queue(4);
        let quick = PrepareQueue::admit(&q, "a").unwrap();
        let slow = PrepareQueue::admit(&q, "a").unwrap();
        assert!(
            PrepareQueue::admit(&q, "a").is_err(),
            "PREP-2: half for a lone role"
        );
        drop(quick);
        clock.advance(Duration::from_millis(3));
        let other = PrepareQueue::admit(&q, "b").unwrap();
        drop(slow);
        clock.advance(Duration::from_secs(20));
        drop(other);
        let durations = q.durations();
        let roles: Vec<&str> = durations.iter().map(|d| d.role.as_str()).collect();
        assert_eq!(roles, ["a", "b"]);
        let mut a = [0; WRITE_DURATION_BUCKETS];
        a[0] = 1; // 0 µs: at most 100 µs
        a[5] = 1; // 3 ms: above 2.5 ms, at most 5 ms
        assert_eq!(
            durations[0].buckets, a,
            "two writes; the refused one not counted"
        );
        assert_eq!(durations[0].sum_micros, 3_000);
        let mut b = [0; WRITE_DURATION_BUCKETS];
        b[WRITE_DURATION_BUCKETS - 1] = 1; // 20 s: above every bound
        assert_eq!(durations[1].buckets, b);
        assert_eq!(durations[1].sum_micros, 20_000_000);
    }

    #[test]
    fn the_retry_hint_follows_the_drain_rate() {
        let (q, clock) = queue(2);
        let a = PrepareQueue::admit(&q, "r").unwrap();
        assert_eq!(
            PrepareQueue::admit(&q, "r").unwrap_err().retry_after_ms,
            RETRY_AFTER_UNKNOWN_MS
        );
        clock.advance(Duration::from_secs(1));
        drop(a); // One write drained in one second.
        let _b = PrepareQueue::admit(&q, "r").unwrap();
        let hint = PrepareQueue::admit(&q, "r").unwrap_err().retry_after_ms;
        assert!((RETRY_AFTER_MIN_MS..=RETRY_AFTER_MAX_MS).contains(&hint));
        assert_eq!(hint, 1_000, "one queued write at one write per second");
    }
}
