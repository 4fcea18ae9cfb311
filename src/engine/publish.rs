//! The published revision: the newest revision whose commit is durable, which is all a
//! reader may see.
//!
//! Invariants:
//! - PUB-1: the value only grows (ENG-2).
//! - PUB-2: `publish` is a release store and `load` an acquire load, so a reader that loads
//!   revision `r` also sees every memory effect made before `r` was published, by the apply
//!   thread and by the thread that published it (the commit that holds `r`, the index
//!   entries up to `r`).
//!
//! Contact points: the thread that finishes a batch publishes after it is durable (the commit
//! thread, or the apply thread or a lone writer's thread through `commit::finish_inline`);
//! readers load before they
//! look anything up. `loom-tests/` models this protocol with loom's atomics.

use crate::sync::{AtomicI64, Ordering};

/// The newest revision readers may see.
#[derive(Debug)]
pub struct Published {
    revision: AtomicI64,
}

impl Published {
    /// Returns a cell holding `revision`.
    pub fn new(revision: i64) -> Published {
        Published {
            revision: AtomicI64::new(revision),
        }
    }

    /// Makes `revision` visible to readers. Called only by the commit thread, after the
    /// commit that holds `revision` is durable (PUB-2, COMMIT-1).
    pub fn publish(&self, revision: i64) {
        let previous = self.revision.load(Ordering::Relaxed);
        assert!(
            revision >= previous,
            "PUB-1: published revision went from {previous} to {revision}"
        );
        self.revision.store(revision, Ordering::Release);
    }

    /// Returns the newest revision a reader may see.
    pub fn load(&self) -> i64 {
        self.revision.load(Ordering::Acquire)
    }
}
