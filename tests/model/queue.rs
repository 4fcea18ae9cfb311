//! The write prepare queue as the model knows it: which writes kvd admits and which it
//! refuses with `etcdserver: too many requests`, from the rule its design documents
//! (PREP-1, PREP-2), written without looking at how the engine keeps its figures.
//!
//! The rule, with capacity `N` (`Config::prepare_queue_length`):
//! - a write belongs to the owner of its first written key (a Put's or DeleteRange's key, a
//!   Txn's first Put or DeleteRange, success branch first, nested Txns in order), keyless
//!   writes (compaction, leases, alarms, registry and record requests) to `*`;
//! - a role is *active* while it has a write in the queue or had one admitted in the last
//!   10 s of engine time; idle roles are dropped once a second, so a role whose last
//!   admission is 10 to 11 s old may or may not still count. [`Queue::uncertain`] names such
//!   a role, and the harness sends no burst whose outcome it could change;
//! - with `others` the active roles other than the writer, the writer may hold
//!   `max(1, N / 2)` slots if `others` is 0, else `max(1, N / (others + 1))`;
//! - a write is admitted iff fewer than `N` writes are in the queue (PREP-1) and its role
//!   holds fewer than its share (PREP-2); a refused write changes nothing but its role's
//!   refusal count (PREP-3). A write holds its slot until it is answered.
//!
//! Between operations nothing is in the queue (each operation waits for its answer); only a
//! burst ([`super::ops::Op::QueueBurst`]) fills it. Every admitted write refreshes its role's
//! last admission, whatever its answer later (a write refused for its size or at apply was
//! admitted first).

use std::collections::BTreeMap;
use std::time::Duration;

use kvd::RoleQueue;

/// How long a role stays active after its last admitted write.
pub const ACTIVE_WINDOW: Duration = Duration::from_secs(10);
/// How much longer it may stay active: idle roles are dropped once a second.
pub const DROP_INTERVAL: Duration = Duration::from_secs(1);
/// kvd's default capacity (etcd's `maxGapBetweenApplyAndCommitIndex`).
pub const CAPACITY_DEFAULT: usize = 5_000;
/// The retry hint the model answers with: it cannot know the engine's drain rate, so the
/// harness checks the engine's hint is within its documented bounds and replaces it by this.
pub const HINT_UNKNOWN_MS: u64 = 0;
/// The engine's documented bounds of the retry hint.
pub const HINT_MIN_MS: u64 = 1;
/// The longest retry hint.
pub const HINT_MAX_MS: u64 = 5_000;

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue held `N` writes (PREP-1).
    Bound,
    /// The writer's role held its share (PREP-2).
    Share,
}

/// Counts of the model's decisions, for the run's report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Writes admitted into a queue that already held another write.
    pub admitted_beside_others: usize,
    /// Writes refused because the queue was full.
    pub refused_bound: usize,
    /// Writes refused because their role held its share.
    pub refused_share: usize,
}

/// The queue's state: what the rule needs to decide the next write.
#[derive(Debug, Clone)]
pub struct Queue {
    capacity: usize,
    /// When each role last had a write admitted, since the engine opened.
    last_admitted: BTreeMap<String, Duration>,
    /// Writes in the queue now, by role (non-zero only inside a burst).
    queued: BTreeMap<String, usize>,
    /// Refusals since the engine opened, by role.
    refused: BTreeMap<String, u64>,
    stats: QueueStats,
}

impl Queue {
    /// Returns an empty queue of `capacity` slots.
    pub fn new(capacity: usize) -> Queue {
        Queue {
            capacity,
            last_admitted: BTreeMap::new(),
            queued: BTreeMap::new(),
            refused: BTreeMap::new(),
            stats: QueueStats::default(),
        }
    }

    /// Returns the capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A reopen: the new engine's queue knows no role.
    pub fn reopen(&mut self) {
        self.last_admitted.clear();
        self.queued.clear();
        self.refused.clear();
    }

    /// Writes in the queue now.
    pub fn total(&self) -> usize {
        self.queued.values().sum()
    }

    fn held(&self, role: &str) -> usize {
        self.queued.get(role).copied().unwrap_or(0)
    }

    fn age(&self, role: &str, now: Duration) -> Option<Duration> {
        self.last_admitted
            .get(role)
            .map(|at| now.saturating_sub(*at))
    }

    /// Returns the roles other than `writer` that are certainly active at `now`.
    fn others(&self, writer: &str, now: Duration) -> usize {
        let mut roles: Vec<&str> = self
            .queued
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, _)| r.as_str())
            .collect();
        roles.extend(
            self.last_admitted
                .keys()
                .filter(|r| self.age(r, now).is_some_and(|a| a < ACTIVE_WINDOW))
                .map(String::as_str),
        );
        roles.sort_unstable();
        roles.dedup();
        roles.into_iter().filter(|r| *r != writer).count()
    }

    /// Returns how many slots `writer` may hold at `now`.
    pub fn share(&self, writer: &str, now: Duration) -> usize {
        match self.others(writer, now) {
            0 => (self.capacity / 2).max(1),
            others => (self.capacity / (others + 1)).max(1),
        }
    }

    /// Returns a role other than `writer`, with nothing queued, whose last admission is 10 to
    /// 11 s old at `now`: the engine may or may not count it as active, so a write of
    /// `writer` that its share decides cannot be predicted.
    pub fn uncertain(&self, writer: &str, now: Duration) -> Option<&str> {
        self.last_admitted
            .keys()
            .filter(|r| *r != writer && self.held(r) == 0)
            .find(|r| {
                self.age(r, now)
                    .is_some_and(|a| a >= ACTIVE_WINDOW && a < ACTIVE_WINDOW + DROP_INTERVAL)
            })
            .map(String::as_str)
    }

    /// Admits a write of `role` at `now` (it then holds a slot until [`Queue::release`]),
    /// or refuses it.
    pub fn admit(&mut self, role: &str, now: Duration) -> Result<(), Refusal> {
        let refusal = if self.total() >= self.capacity {
            Some(Refusal::Bound)
        } else if self.held(role) >= self.share(role, now) {
            Some(Refusal::Share)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            *self.refused.entry(role.to_owned()).or_default() += 1;
            match refusal {
                Refusal::Bound => self.stats.refused_bound += 1,
                Refusal::Share => self.stats.refused_share += 1,
            }
            return Err(refusal);
        }
        if self.total() > 0 {
            self.stats.admitted_beside_others += 1;
        }
        *self.queued.entry(role.to_owned()).or_default() += 1;
        self.last_admitted.insert(role.to_owned(), now);
        Ok(())
    }

    /// Frees a slot of `role`: its write was answered.
    pub fn release(&mut self, role: &str) {
        if let Some(n) = self.queued.get_mut(role) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.queued.remove(role);
            }
        }
    }

    /// Returns what `Engine::prepare_queue` must list: every role with writes queued or
    /// refused since the engine opened, sorted by role.
    pub fn roles(&self) -> Vec<RoleQueue> {
        let mut roles: BTreeMap<&str, RoleQueue> = BTreeMap::new();
        for (role, n) in &self.queued {
            roles.entry(role).or_default().queued = *n;
        }
        for (role, n) in &self.refused {
            roles.entry(role).or_default().refused = *n;
        }
        roles
            .into_iter()
            .map(|(role, q)| RoleQueue {
                role: role.to_owned(),
                ..q
            })
            .filter(|q| q.queued > 0 || q.refused > 0)
            .collect()
    }

    /// Returns the decisions counted so far (kept across reopens).
    pub fn stats(&self) -> &QueueStats {
        &self.stats
    }
}
