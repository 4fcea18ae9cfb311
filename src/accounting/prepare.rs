//! The allocation prepare queue (Velero's prepare queue, on the consumption tables): how many
//! allocations may be *preparing* at once, across all roles, and the fair share of that
//! bound each role may hold. A preparing allocation holds its resources as the role's
//! `offered` (ACCT-3), so its quota headroom is taken from the moment it is admitted; START
//! turns it into a running one, RELEASE ends it.
//!
//! The rule (`docs/design/load-soothing.md`, "The allocation prepare queue"): with a queue
//! length `N > 0`, a role is *active* while it has an allocation preparing or had one
//! admitted in the last [`ALLOCATION_ACTIVE_WINDOW`] of engine clock. An admission is refused
//! when `N` allocations are preparing, or when its role already holds its share:
//! `max(1, N / active roles)`, counting the requesting role as active, and `max(1, N / 2)`
//! for a role that is the only active one, so that the first request of any other role finds
//! room. `N = 0` turns the queue off: no bound, no share.
//!
//! Invariants:
//! - ACCT-6: with a queue length `N > 0`, an allocation is admitted preparing only while
//!   fewer than `N` are preparing and fewer than its role's share are preparing for its role.
//!   So the count never rises above `N`; lowering `N` below the count cancels nothing, and
//!   the count then only falls (by START and RELEASE) until it is within `N` again. The
//!   count per role equals the allocation rows in the preparing state (rebuilt at open,
//!   checked after every batch in debug builds).
//! - The admission times are memory only: after a restart a role is active again only once
//!   it has an allocation preparing or a new admission (as lease deadlines, LEASE-3).
//!
//! Contact points: `records` admits and ends preparing allocations through [`PrepareQueue`]
//! inside the batch that writes their rows; `engine::apply` passes the engine clock's `now`
//! in; the queue length is the `settings` row [`super::SETTINGS_TABLE`] holds, written in the
//! transaction of the UPDATE_PREPARE_QUEUE (or at open, when the engine's configuration sets
//! it).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Accounts, SETTINGS_TABLE, codec};
use crate::error::{Error, StorageError};
use crate::storage::WriteBatch;

/// A role stays active this long after its last admission (engine clock).
pub const ALLOCATION_ACTIVE_WINDOW: Duration = Duration::from_secs(10);

pub use crate::error::ALLOCATION_RETRY_AFTER;

/// The key of the queue length's row in the settings table.
pub(super) const PREPARE_QUEUE_LENGTH_KEY: &[u8] = b"allocation_prepare_queue_length";

/// The prepare queue as the engine shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocationPrepareQueue {
    /// The queue length: at most this many allocations preparing at once; 0 is off.
    pub length: u64,
    /// Allocations preparing now, across all roles.
    pub preparing: u64,
    /// Allocations preparing now, by role (roles with none are left out).
    pub by_role: BTreeMap<String, u64>,
}

/// The queue's state: the length and the preparing allocations per role, plus when each
/// role last had one admitted.
#[derive(Debug, Default)]
pub(super) struct PrepareQueue {
    /// The length in the settings row; `None` if it was never set (the queue is off).
    stored: Option<u64>,
    length: u64,
    /// Preparing allocations per role; no zero entries.
    preparing: BTreeMap<String, u64>,
    /// The engine time of each role's last admission, pruned past the active window.
    admitted_at: BTreeMap<String, Duration>,
}

impl PrepareQueue {
    /// Returns the queue with the `stored` length and the preparing counts rebuilt from the
    /// rows.
    pub(super) fn new(stored: Option<u64>, preparing: BTreeMap<String, u64>) -> PrepareQueue {
        PrepareQueue {
            stored,
            length: stored.unwrap_or(0),
            preparing,
            admitted_at: BTreeMap::new(),
        }
    }

    pub(super) fn length(&self) -> u64 {
        self.length
    }

    pub(super) fn preparing(&self) -> &BTreeMap<String, u64> {
        &self.preparing
    }

    fn total(&self) -> u64 {
        self.preparing.values().sum()
    }

    /// Returns the refusal, if any, of one more allocation preparing for `role` at `now`
    /// (ACCT-6).
    pub(super) fn check(&self, role: &str, now: Duration) -> Result<(), Error> {
        let limit = self.length;
        if limit == 0 {
            return Ok(());
        }
        let total = self.total();
        if total >= limit {
            return Err(Error::AllocationPrepareQueueFull(format!(
                "kvd: prepare queue is full: {total} allocations preparing, limit {limit}"
            )));
        }
        let active = self.active_roles(role, now);
        let (share, why) = if active == 1 {
            (
                (limit / 2).max(1),
                format!("half of {limit} while no other role is active"),
            )
        } else {
            (
                (limit / active).max(1),
                format!("its share of {limit} among {active} active roles"),
            )
        };
        let held = self.preparing.get(role).copied().unwrap_or(0);
        if held >= share {
            return Err(Error::AllocationPrepareQueueFull(format!(
                "kvd: prepare queue is full: {held} allocations preparing for role '{role}', \
                 limit {share} ({why})"
            )));
        }
        Ok(())
    }

    /// Returns how many roles are active at `now`, `role` included.
    fn active_roles(&self, role: &str, now: Duration) -> u64 {
        let recent = self
            .admitted_at
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) < ALLOCATION_ACTIVE_WINDOW)
            .map(|(r, _)| r);
        let mut active: Vec<&String> = self.preparing.keys().chain(recent).collect();
        active.sort();
        active.dedup();
        let others = active.iter().filter(|r| r.as_str() != role).count();
        1 + others as u64
    }

    /// Counts an admission for `role` at `now`.
    pub(super) fn admitted(&mut self, role: &str, now: Duration) {
        *self.preparing.entry(role.to_owned()).or_default() += 1;
        self.admitted_at
            .retain(|_, at| now.saturating_sub(*at) < ALLOCATION_ACTIVE_WINDOW);
        let at = self.admitted_at.entry(role.to_owned()).or_default();
        *at = (*at).max(now);
        debug_assert!(
            self.length == 0 || self.total() <= self.length,
            "ACCT-6: {} preparing, limit {}",
            self.total(),
            self.length
        );
    }

    /// Counts a preparing allocation of `role` that started or was released.
    pub(super) fn ended(&mut self, role: &str) {
        if let Some(count) = self.preparing.get_mut(role) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.preparing.remove(role);
            }
        }
    }
}

impl Accounts {
    /// Returns the prepare queue's length and what is preparing now.
    pub fn allocation_prepare_queue(&self) -> AllocationPrepareQueue {
        AllocationPrepareQueue {
            length: self.prepare.length(),
            preparing: self.prepare.total(),
            by_role: self.prepare.preparing().clone(),
        }
    }

    /// Returns the queue length its settings row holds, `None` if it was never set.
    pub fn stored_prepare_queue_length(&self) -> Option<u64> {
        self.prepare.stored
    }

    /// Sets the queue length and writes its row in `batch`. Lowering it cancels nothing
    /// (ACCT-6).
    pub fn set_prepare_queue_length(
        &mut self,
        length: u64,
        batch: &mut WriteBatch<'_>,
    ) -> Result<(), StorageError> {
        let row = codec::encode_setting(length);
        batch.put_row(SETTINGS_TABLE, PREPARE_QUEUE_LENGTH_KEY, &row)?;
        self.prepare.stored = Some(length);
        self.prepare.length = length;
        Ok(())
    }

    /// Returns the preparing allocations per role, counted from the records: what ACCT-6
    /// says the queue's counts equal.
    pub(super) fn count_preparing(&self) -> BTreeMap<String, u64> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for a in self.allocations.values().filter(|a| a.preparing) {
            *counts.entry(a.role.clone()).or_default() += 1;
        }
        counts
    }

    /// Returns true if the queue's counts equal the records (ACCT-6).
    pub fn prepare_queue_agrees(&self) -> bool {
        self.count_preparing() == *self.prepare.preparing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(length: u64, preparing: &[(&str, u64)]) -> PrepareQueue {
        let preparing = preparing
            .iter()
            .map(|(r, n)| ((*r).to_owned(), *n))
            .collect();
        PrepareQueue::new(Some(length), preparing)
    }

    #[test]
    fn a_lone_role_holds_half_and_leaves_room_for_the_next() {
        let now = Duration::from_secs(100);
        assert!(queue(4, &[("a", 1)]).check("a", now).is_ok());
        let refused = queue(4, &[("a", 2)]).check("a", now).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "kvd: prepare queue is full: 2 allocations preparing for role 'a', limit 2 \
             (half of 4 while no other role is active)"
        );
        // The first request of another role finds room, and the two now share 4.
        assert!(queue(4, &[("a", 2)]).check("b", now).is_ok());
        assert!(queue(4, &[("a", 2), ("b", 1)]).check("b", now).is_ok());
        let full = queue(4, &[("a", 2), ("b", 2)]).check("c", now).unwrap_err();
        assert_eq!(
            full.to_string(),
            "kvd: prepare queue is full: 4 allocations preparing, limit 4"
        );
        // Three active roles: max(1, 4 / 3) = 1 each.
        assert!(queue(4, &[("a", 1), ("b", 1)]).check("a", now).is_ok());
        assert!(
            queue(4, &[("a", 1), ("b", 1), ("c", 1)])
                .check("a", now)
                .is_err()
        );
        // A queue of 1: the one slot, whoever asks first.
        assert!(queue(1, &[]).check("a", now).is_ok());
        assert!(queue(1, &[("a", 1)]).check("b", now).is_err());
        // Off: no bound at all.
        assert!(queue(0, &[("a", 1_000)]).check("a", now).is_ok());
    }

    #[test]
    fn a_role_stays_active_for_the_window_after_an_admission() {
        let mut q = queue(6, &[]);
        for role in ["a", "b", "c"] {
            q.admitted(role, Duration::ZERO);
            q.ended(role);
        }
        assert_eq!(q.active_roles("a", Duration::from_secs(9)), 3);
        assert_eq!(q.active_roles("a", ALLOCATION_ACTIVE_WINDOW), 1);
        q.admitted("b", ALLOCATION_ACTIVE_WINDOW);
        assert_eq!(q.active_roles("a", ALLOCATION_ACTIVE_WINDOW), 2);
        // Pruned once out of the window, so the map stays as small as the active set.
        assert_eq!(q.admitted_at.len(), 1);
        // A preparing allocation keeps its role active whatever the time.
        assert_eq!(q.active_roles("a", Duration::from_secs(1_000)), 2);
        q.ended("b");
        assert!(q.preparing.is_empty());
        assert_eq!(q.active_roles("a", Duration::from_secs(1_000)), 1);
    }
}
