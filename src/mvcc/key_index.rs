//! The history of one key in memory: its generations and their revisions (etcd's keyIndex).
//!
//! A generation is one life of a key: from the Put that creates it to the tombstone that
//! ends it. A key that was never deleted has one open generation; every delete closes the
//! current generation with a tombstone revision and opens a new, empty one.
//!
//! Worked example (etcd's, with 3.6 compaction semantics). History: put@1, put@2, del@3,
//! put@4, del@5. The index holds:
//!
//! ```text
//! generations: {1, 2, 3(t)}, {4, 5(t)}, {}
//! ```
//!
//! - `compact(2)` keeps `{2, 3(t)}, {4, 5(t)}, {}`: of the revisions at or below 2 only the
//!   newest of the generation alive at 2 stays;
//! - `compact(4)` keeps `{4, 5(t)}, {}`: the first generation ended before 4;
//! - `compact(5)` keeps `{5(t)}, {}`: a tombstone exactly at the compaction revision stays
//!   (etcd 3.6) until a later compaction;
//! - `compact(6)` empties the index: the key is gone.
//!
//! Invariants:
//! - KI-1: revisions across all generations are strictly increasing.
//! - KI-2: every generation but the last is closed (its last revision is a tombstone), and
//!   is non-empty; only the last may be empty.
//! - KI-3: after `compact(c)`, no revision `r` with `r.main < c` remains unless it is the newest
//!   revision at or below `c` of the generation alive at `c` (the negative space of
//!   compaction).
//!
//! - KI-4: `costs` and `revs` of a generation have the same length, and a tombstone costs 0.
//!
//! Debug builds check KI-1, KI-2 and KI-4 after every change and KI-3 after every compaction
//! ([`KeyIndex::debug_check`]).
//!
//! Contact points: `mvcc::index` holds one per key.

use super::Revision;

/// One life of a key: revisions from creation to (optionally) its tombstone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Generation {
    /// Number of Puts in this generation (not reduced by compaction).
    version: i64,
    /// Main revision of the Put that created this generation.
    created: i64,
    /// Revisions in this generation, oldest first; the last is a tombstone if closed.
    revs: Vec<Revision>,
    /// The space cost of each revision in `revs` (etcd's Put cost; 0 for a tombstone), for
    /// the consumption tables.
    costs: Vec<u32>,
}

/// The generations of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyIndex {
    generations: Vec<Generation>,
}

/// The state of a key at a revision, as the index knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The revision of the newest change at or below the asked revision.
    pub modified: Revision,
    /// The create revision of its generation.
    pub created: i64,
    /// The key's version at that change.
    pub version: i64,
}

impl KeyIndex {
    /// Returns an empty index.
    pub fn new() -> KeyIndex {
        KeyIndex::default()
    }

    /// Records a Put at `rev`.
    ///
    /// ```
    /// let mut ki = kvd::KeyIndex::new();
    /// ki.put(kvd::Revision::new(2, 0), 300);
    /// assert_eq!(ki.get(2).map(|f| f.version), Some(1));
    /// assert_eq!(ki.retained_cost(), 300);
    /// ```
    pub fn put(&mut self, rev: Revision, cost: u32) {
        debug_assert!(self.last_revision().is_none_or(|last| last < rev), "KI-1");
        if self.generations.is_empty() {
            // Most keys never get a second generation: no spare capacity.
            self.generations.reserve_exact(1);
            self.generations.push(Generation::default());
        }
        if let Some(generation) = self.generations.last_mut() {
            if generation.revs.is_empty() {
                generation.created = rev.main;
            }
            generation.revs.push(rev);
            generation.costs.push(cost);
            generation.version += 1;
        }
        self.debug_check(None);
    }

    /// Records the Put at `rev` of a key first seen while rebuilding the index, whose
    /// generation was created at `created` and has reached `version`.
    pub fn restore(&mut self, rev: Revision, created: i64, version: i64, cost: u32) {
        debug_assert!(self.generations.is_empty());
        self.generations.reserve_exact(1);
        self.generations.push(Generation {
            version,
            created,
            revs: vec![rev],
            costs: vec![cost],
        });
    }

    /// Records a delete at `rev`. Returns false (and changes nothing) if the key is not
    /// alive, which callers treat as a bug.
    pub fn tombstone(&mut self, rev: Revision) -> bool {
        if !self.is_alive() {
            return false;
        }
        self.put(rev, 0);
        self.generations.push(Generation::default());
        self.debug_check(None);
        true
    }

    /// Records a tombstone at `rev` for a key first seen, while rebuilding the index, as a
    /// lone tombstone (a compaction at exactly `rev` kept it).
    pub fn restore_tombstone(&mut self, rev: Revision) {
        debug_assert!(self.generations.is_empty());
        self.generations.push(Generation {
            version: 1,
            created: rev.main,
            revs: vec![rev],
            costs: vec![0],
        });
        self.generations.push(Generation::default());
    }

    /// Returns true if the key exists at the newest revision recorded (uncommitted ones
    /// included).
    pub fn is_alive(&self) -> bool {
        self.generations.last().is_some_and(|g| !g.revs.is_empty())
    }

    /// Returns true if nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.generations.iter().all(|g| g.revs.is_empty())
    }

    /// Returns the newest revision recorded.
    pub fn last_revision(&self) -> Option<Revision> {
        self.generations
            .iter()
            .rev()
            .find_map(|g| g.revs.last().copied())
    }

    /// Returns the key's state at main revision `at`, or `None` if it does not exist then.
    pub fn get(&self, at: i64) -> Option<Found> {
        let generation = self.find_generation(at)?;
        let newer = generation
            .revs
            .iter()
            .rev()
            .take_while(|r| r.main > at)
            .count();
        let index = generation.revs.len().checked_sub(newer + 1)?;
        let version = generation.version - newer as i64;
        Some(Found {
            modified: generation.revs[index],
            created: generation.created,
            version,
        })
    }

    /// Returns the generation alive at `at`, if the key exists at `at`.
    fn find_generation(&self, at: i64) -> Option<&Generation> {
        let last = self.generations.len().checked_sub(1)?;
        for (i, generation) in self.generations.iter().enumerate().rev() {
            let (Some(first), Some(tomb)) = (generation.revs.first(), generation.revs.last())
            else {
                continue;
            };
            if i != last && tomb.main <= at {
                // This generation ended at or before `at`; so did every older one.
                return None;
            }
            if first.main <= at {
                return Some(generation);
            }
        }
        None
    }

    /// Returns true if `rev` is recorded.
    pub fn contains(&self, rev: Revision) -> bool {
        self.generations
            .iter()
            .any(|g| g.revs.binary_search(&rev).is_ok())
    }

    /// Returns the summed cost of every revision still held.
    pub fn retained_cost(&self) -> u64 {
        self.generations
            .iter()
            .flat_map(|g| &g.costs)
            .map(|c| u64::from(*c))
            .sum()
    }

    /// Drops what a compaction at `at` makes unreachable (KI-3). Returns the summed cost of
    /// the dropped revisions.
    ///
    /// ```
    /// use kvd::{KeyIndex, Revision};
    /// let mut ki = KeyIndex::new();
    /// ki.put(Revision::new(1, 0), 10);
    /// ki.put(Revision::new(2, 0), 20);
    /// assert_eq!(ki.compact(2), 10);
    /// assert!(!ki.contains(Revision::new(1, 0)));
    /// assert!(ki.contains(Revision::new(2, 0)));
    /// ```
    pub fn compact(&mut self, at: i64) -> u64 {
        let Some(last) = self.generations.len().checked_sub(1) else {
            return 0;
        };
        // The first generation that is still open at `at`, or was closed by a tombstone at
        // or after `at` (etcd 3.6 keeps a tombstone exactly at `at`).
        let mut first_kept = last;
        for (i, generation) in self.generations.iter().enumerate().take(last) {
            if generation.revs.last().is_some_and(|tomb| tomb.main >= at) {
                first_kept = i;
                break;
            }
        }
        let mut released: u64 = self
            .generations
            .drain(..first_kept)
            .flat_map(|g| g.costs)
            .map(u64::from)
            .sum();
        if let Some(generation) = self.generations.first_mut() {
            // Keep the newest revision at or below `at` and everything above it.
            let at_or_below = generation.revs.iter().take_while(|r| r.main <= at).count();
            if at_or_below > 1 {
                generation.revs.drain(..at_or_below - 1);
                released += generation
                    .costs
                    .drain(..at_or_below - 1)
                    .map(u64::from)
                    .sum::<u64>();
            }
        }
        self.debug_check(Some(at));
        released
    }

    /// Asserts KI-1, KI-2 and KI-4, and KI-3 for a compaction at `compacted_at`, in debug
    /// builds (a no-op in release builds).
    fn debug_check(&self, compacted_at: Option<i64>) {
        if !cfg!(debug_assertions) {
            return;
        }
        let last = self.generations.len().saturating_sub(1);
        let mut previous: Option<Revision> = None;
        for (i, generation) in self.generations.iter().enumerate() {
            debug_assert_eq!(generation.revs.len(), generation.costs.len(), "KI-4");
            for rev in &generation.revs {
                debug_assert!(previous.is_none_or(|p| p < *rev), "KI-1");
                previous = Some(*rev);
            }
            if i < last {
                debug_assert!(
                    !generation.revs.is_empty(),
                    "KI-2: an empty closed generation"
                );
                debug_assert_eq!(generation.costs.last(), Some(&0), "KI-2/KI-4: no tombstone");
            }
        }
        if let Some(at) = compacted_at {
            // KI-3: at most one revision below `at` remains: the newest at or below `at` of
            // the first generation, and then nothing else of that generation is at or below.
            let below: Vec<(usize, usize)> = self
                .generations
                .iter()
                .enumerate()
                .flat_map(|(g, generation)| {
                    generation
                        .revs
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.main < at)
                        .map(move |(r, _)| (g, r))
                })
                .collect();
            debug_assert!(
                below.len() <= 1,
                "KI-3: {} revisions below {at}",
                below.len()
            );
            debug_assert!(below.iter().all(|&(g, r)| g == 0 && r == 0), "KI-3");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// Builds etcd's worked example: put@1, put@2, del@3, put@4, del@5.
    fn example() -> KeyIndex {
        let mut ki = KeyIndex::new();
        ki.put(rev(1), 1);
        ki.put(rev(2), 1);
        assert!(ki.tombstone(rev(3)));
        ki.put(rev(4), 1);
        assert!(ki.tombstone(rev(5)));
        ki
    }

    fn revisions(ki: &KeyIndex) -> Vec<Vec<i64>> {
        ki.generations
            .iter()
            .map(|g| g.revs.iter().map(|r| r.main).collect())
            .collect()
    }

    #[test]
    fn key_index_reads_each_generation() {
        let ki = example();
        assert_eq!(ki.get(0), None);
        let at1 = ki.get(1).map(|f| (f.modified.main, f.created, f.version));
        assert_eq!(at1, Some((1, 1, 1)));
        let at2 = ki.get(2).map(|f| (f.modified.main, f.created, f.version));
        assert_eq!(at2, Some((2, 1, 2)));
        assert_eq!(ki.get(3), None, "deleted at 3");
        let at4 = ki.get(4).map(|f| (f.modified.main, f.created, f.version));
        assert_eq!(
            at4,
            Some((4, 4, 1)),
            "recreated: a new generation at version 1"
        );
        assert_eq!(ki.get(5), None);
        assert_eq!(ki.get(100), None);
    }

    #[test]
    fn key_index_compaction_follows_etcd_worked_example() {
        let cases: [(i64, Vec<Vec<i64>>); 5] = [
            (1, vec![vec![1, 2, 3], vec![4, 5], vec![]]),
            (2, vec![vec![2, 3], vec![4, 5], vec![]]),
            (4, vec![vec![4, 5], vec![]]),
            (5, vec![vec![5], vec![]]),
            (6, vec![vec![]]),
        ];
        for (at, want) in cases {
            let mut ki = example();
            ki.compact(at);
            assert_eq!(revisions(&ki), want, "compact({at})");
            assert_eq!(
                ki.is_empty(),
                at == 6,
                "compact({at}) empties the key only above its last tombstone"
            );
        }
    }

    #[test]
    fn key_index_compaction_at_tombstone_keeps_it_until_next_compaction() {
        let mut ki = example();
        assert_eq!(ki.compact(3), 2, "the two puts of the first generation");
        assert_eq!(revisions(&ki), vec![vec![3], vec![4, 5], vec![]]);
        assert_eq!(ki.get(3), None, "the kept tombstone is not a live key");
        assert_eq!(ki.compact(4), 0, "a tombstone costs nothing");
        assert_eq!(revisions(&ki), vec![vec![4, 5], vec![]]);
    }

    #[test]
    fn key_index_compaction_keeps_reads_at_or_above_the_compaction_revision() {
        let mut ki = KeyIndex::new();
        for main in 1..=10 {
            ki.put(rev(main), 1);
        }
        let before: Vec<_> = (4..=12).map(|at| ki.get(at)).collect();
        assert_eq!(ki.compact(4), 3);
        assert_eq!(ki.retained_cost(), 7);
        let after: Vec<_> = (4..=12).map(|at| ki.get(at)).collect();
        assert_eq!(before, after);
        // KI-3: nothing below 4 remains.
        assert!((1..4).all(|main| !ki.contains(rev(main))));
        assert_eq!(
            ki.get(4).map(|f| f.version),
            Some(4),
            "version survives compaction"
        );
    }

    #[test]
    fn key_index_restores_lone_tombstone_and_compacted_put() {
        let mut ki = KeyIndex::new();
        ki.restore_tombstone(rev(5));
        assert!(!ki.is_alive());
        assert_eq!(ki.get(5), None);
        ki.put(rev(7), 1);
        assert_eq!(ki.get(7).map(|f| (f.created, f.version)), Some((7, 1)));
        let mut ki = KeyIndex::new();
        ki.restore(rev(9), 3, 4, 1);
        ki.put(rev(10), 1);
        assert_eq!(ki.get(10).map(|f| (f.created, f.version)), Some((3, 5)));
    }

    #[test]
    fn key_index_refuses_tombstone_of_dead_key() {
        let mut ki = KeyIndex::new();
        assert!(!ki.tombstone(rev(1)));
        ki.put(rev(2), 1);
        assert!(ki.tombstone(rev(3)));
        assert!(!ki.tombstone(rev(4)));
    }
}
