//! Auto-compaction, as etcd's `--auto-compaction-mode` and `--auto-compaction-retention`:
//! the apply thread submits ordinary compactions through its own apply path.
//!
//! - `Periodic(retention)`: every `retention / 10` (at least one second, at most an hour) the
//!   current revision is sampled; the history is compacted at the newest sample taken at
//!   least `retention` ago.
//! - `Revision(keep)`: every five minutes the history is compacted at `current - keep`.
//!
//! Invariants:
//! - AUTO-1: time comes from the engine's clock only; the decision is a function of the
//!   samples, so a test with a manual clock replays it exactly.
//! - AUTO-2: it only proposes revisions already published and above the compaction
//!   revision; the apply path validates them like a client's.
//!
//! Contact points: `engine::apply` calls [`AutoCompactor::due`] once per loop.

use std::collections::VecDeque;
use std::time::Duration;

/// How auto-compaction picks its revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep the history of the last `retention`.
    Periodic(Duration),
    /// Keep the last `keep` revisions.
    Revision(i64),
}

/// How often revision mode compacts (etcd: every five minutes).
pub const REVISION_MODE_INTERVAL: Duration = Duration::from_secs(300);
/// Periodic mode samples at least this far apart.
const PERIODIC_SAMPLE_MIN: Duration = Duration::from_secs(1);
/// Periodic mode samples at most this far apart.
const PERIODIC_SAMPLE_MAX: Duration = Duration::from_secs(3600);
/// Samples kept, at most (retention / 10 apart, so about ten cover the window).
const SAMPLES_MAX: usize = 64;

/// The state of auto-compaction.
#[derive(Debug)]
pub struct AutoCompactor {
    mode: AutoCompaction,
    next_at: Duration,
    /// (time, revision) samples, oldest first.
    samples: VecDeque<(Duration, i64)>,
}

impl AutoCompactor {
    /// Returns a compactor starting at `now`.
    pub fn new(mode: AutoCompaction, now: Duration) -> AutoCompactor {
        let mut compactor = AutoCompactor {
            mode,
            next_at: now,
            samples: VecDeque::new(),
        };
        compactor.next_at = now + compactor.interval();
        compactor.samples.push_back((now, 0));
        compactor
    }

    fn interval(&self) -> Duration {
        match self.mode {
            AutoCompaction::Periodic(retention) => {
                (retention / 10).clamp(PERIODIC_SAMPLE_MIN, PERIODIC_SAMPLE_MAX)
            }
            AutoCompaction::Revision(_) => REVISION_MODE_INTERVAL,
        }
    }

    /// Returns the revision to compact at, if one is due at `now` given the published
    /// `current` and `compacted` revisions (AUTO-2).
    pub fn due(&mut self, now: Duration, current: i64, compacted: i64) -> Option<i64> {
        if now < self.next_at {
            return None;
        }
        self.next_at = now + self.interval();
        let target = match self.mode {
            AutoCompaction::Revision(keep) => current.saturating_sub(keep.max(0)),
            AutoCompaction::Periodic(retention) => {
                self.samples.push_back((now, current));
                while self.samples.len() > SAMPLES_MAX {
                    self.samples.pop_front();
                }
                let horizon = now.checked_sub(retention)?;
                self.samples
                    .iter()
                    .rev()
                    .find(|(at, _)| *at <= horizon)
                    .map(|(_, rev)| *rev)?
            }
        };
        (target > compacted && target <= current && target > 0).then_some(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn revision_mode_keeps_the_last_revisions_every_five_minutes() {
        let mut c = AutoCompactor::new(AutoCompaction::Revision(10), secs(0));
        assert_eq!(c.due(secs(299), 100, -1), None);
        assert_eq!(c.due(secs(300), 100, -1), Some(90));
        assert_eq!(c.due(secs(400), 200, 90), None, "not due again yet");
        assert_eq!(c.due(secs(600), 95, 90), None, "nothing new to compact");
    }

    #[test]
    fn periodic_mode_compacts_at_the_revision_sampled_a_retention_ago() {
        let mut c = AutoCompactor::new(AutoCompaction::Periodic(secs(100)), secs(0));
        let mut compacted = -1;
        let mut got = Vec::new();
        for step in 1..=30u64 {
            let now = secs(step * 10);
            let current = 1 + step as i64 * 5;
            if let Some(rev) = c.due(now, current, compacted) {
                compacted = rev;
                got.push((step * 10, rev));
            }
        }
        // At t=110 the newest sample at or before t=10 is (10, 6).
        assert_eq!(got.first(), Some(&(110, 6)));
        assert!(got.windows(2).all(|w| w[0].1 < w[1].1));
    }
}
