//! The apply thread's staging area for admitted writes: one lane per role, each in admission
//! order, and the batches taken from them in turn.
//!
//! Invariants:
//! - PREP-4: the lanes keep each role's writes in admission order; a batch takes from the
//!   roles in turn (deficit round robin by request bytes, [`LANE_QUANTUM_BYTES`] per turn),
//!   so a write waits behind at most one quantum of every other active role's bytes per
//!   batch. With one role only, a batch is the lane's oldest writes, as a plain queue.
//!
//! Contact points: `Engine::enqueue` pushes a [`Queued`] (its role from the prepare queue's
//! slot) onto the mailbox; the apply thread moves everything it takes into the [`Lanes`]
//! and applies [`Lanes::next_batch`].

use std::collections::{BTreeMap, VecDeque};

use super::proposal::Proposal;
use crate::sync::Name;

/// Bytes a role's lane may send per turn of the round robin.
pub const LANE_QUANTUM_BYTES: usize = 64 * 1024;

/// A proposal taken from the mailbox, with the role its slot belongs to.
#[derive(Debug)]
pub struct Queued {
    /// The role (`*` for writes without a key and for defrag steps).
    pub role: Name,
    /// The proposal.
    pub proposal: Proposal,
}

struct Lane {
    items: VecDeque<Proposal>,
    deficit: usize,
}

/// The apply thread's staging area: one lane per role, in admission order (PREP-4).
#[derive(Default)]
pub struct Lanes {
    lanes: BTreeMap<Name, Lane>,
    /// Roles with a non-empty lane, in round-robin order.
    turn: VecDeque<Name>,
    len: usize,
}

impl Lanes {
    /// True if nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stages `items` at the back of their roles' lanes.
    pub fn stage(&mut self, items: Vec<Queued>) {
        for Queued { role, proposal } in items {
            let lane = self.lanes.entry(role.clone()).or_insert_with(|| Lane {
                items: VecDeque::new(),
                deficit: 0,
            });
            if lane.items.is_empty() {
                self.turn.push_back(role);
            }
            lane.items.push_back(proposal);
            self.len += 1;
        }
    }

    /// Takes at most `max` proposals for the next batch: all from one lane in order when
    /// only one role has work, else round robin by request bytes (PREP-4).
    pub fn next_batch(&mut self, max: usize) -> Vec<Proposal> {
        let mut batch = Vec::with_capacity(max.min(self.len));
        while batch.len() < max {
            let Some(role) = self.turn.pop_front() else {
                break;
            };
            let alone = self.turn.is_empty();
            let Some(lane) = self.lanes.get_mut(&role) else {
                continue;
            };
            lane.deficit += LANE_QUANTUM_BYTES;
            while batch.len() < max {
                let Some(front) = lane.items.front() else {
                    break;
                };
                let size = front.encoded_len().max(1);
                if !alone && size > lane.deficit {
                    break;
                }
                lane.deficit = lane.deficit.saturating_sub(size);
                if let Some(p) = lane.items.pop_front() {
                    batch.push(p);
                    self.len -= 1;
                }
            }
            if lane.items.is_empty() {
                self.lanes.remove(&role);
            } else {
                self.turn.push_back(role);
            }
        }
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PutRequest;

    fn put(role: &str, key: &str, value_len: usize) -> Queued {
        let request = PutRequest::new(key.to_owned(), "x".repeat(value_len));
        Queued {
            role: Name::from(role),
            proposal: Proposal::Put(request, Box::new(|_| {})),
        }
    }

    fn keys(batch: &[Proposal]) -> Vec<String> {
        batch
            .iter()
            .map(|p| match p {
                Proposal::Put(r, _) => String::from_utf8_lossy(&r.key).into_owned(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn one_role_is_a_plain_queue() {
        let mut lanes = Lanes::default();
        lanes.stage(
            (0..5)
                .map(|i| put("*", &format!("k{i}"), 100_000))
                .collect(),
        );
        assert_eq!(keys(&lanes.next_batch(3)), ["k0", "k1", "k2"]);
        assert_eq!(keys(&lanes.next_batch(3)), ["k3", "k4"]);
        assert!(lanes.is_empty());
    }

    #[test]
    fn a_burst_of_one_role_does_not_hold_back_another() {
        let mut lanes = Lanes::default();
        // 1,000 writes of 1 KiB from the greedy role, then one from the polite role.
        lanes.stage(
            (0..1000)
                .map(|i| put("greedy", &format!("g{i}"), 1024))
                .collect(),
        );
        lanes.stage(vec![put("polite", "p0", 10)]);
        let batch = keys(&lanes.next_batch(1024));
        let polite = batch.iter().position(|k| k == "p0").unwrap();
        // The polite write comes after at most one quantum of the greedy role's bytes.
        assert!(polite <= LANE_QUANTUM_BYTES / 1024, "polite at {polite}");
        // Each role's own writes stay in order (PREP-4).
        let greedy: Vec<&String> = batch.iter().filter(|k| k.starts_with('g')).collect();
        let expected: Vec<String> = (0..greedy.len()).map(|i| format!("g{i}")).collect();
        assert_eq!(greedy, expected.iter().collect::<Vec<_>>());
        assert_eq!(lanes.is_empty(), batch.len() == 1001);
    }
}
