//! The physical half of a compaction: deleting superseded history records in bounded
//! batches, each committed on its own, resumable after a crash.
//!
//! The logical half happens when the Compact request is applied: the engine records the
//! compaction revision in the index (reads below it fail from then on), compacts the index,
//! and writes `scheduled_compact_revision` in the same commit. A [`CompactionJob`] then walks
//! the history from the start up to the compaction revision and deletes every record the
//! index no longer holds; the batch that finishes the walk writes
//! `finished_compact_revision`.
//!
//! Invariants:
//! - COMPACT-1: a record is deleted only if its revision is at or below the job's revision and
//!   the index does not hold it; the index holds every record a read at or above the
//!   compaction revision can need (KI-3), so no such read ever misses a record.
//! - COMPACT-2: deleting is idempotent, so a job interrupted by a crash is re-run from the
//!   start on open (`scheduled > finished`) and ends with the same history as an
//!   uninterrupted one.
//! - COMPACT-3: one step examines at most `limit` records, so a batch stays short.
//!
//! Contact points: the engine's apply thread runs steps between request batches.

use std::ops::Bound;

use super::Revision;
use super::index::Index;
use super::record::Record;
use crate::error::StorageError;
use crate::storage::{MetaKey, RevisionKey, WriteBatch};

/// A compaction whose superseded records are being deleted.
#[derive(Debug, Clone)]
pub struct CompactionJob {
    /// The compaction revision.
    pub revision: i64,
    next: Bound<RevisionKey>,
}

impl CompactionJob {
    /// Returns a job that walks the whole history up to `revision`.
    pub fn new(revision: i64) -> CompactionJob {
        CompactionJob {
            revision,
            next: Bound::Unbounded,
        }
    }

    /// Deletes the superseded records among the next `limit` ones (COMPACT-1, COMPACT-3).
    /// Returns true when the walk is finished, after recording the finished revision in the
    /// same batch.
    pub fn step(
        &mut self,
        index: &Index,
        batch: &mut WriteBatch<'_>,
        limit: usize,
    ) -> Result<bool, StorageError> {
        let end = Revision::new(self.revision.saturating_add(1), 0).to_key();
        let (_, last) = batch.delete_history_where(
            (self.next, Bound::Excluded(end)),
            limit,
            |key, value| {
                let rev = Revision::from_key(key);
                let head = Record::decode_head(key, value)?;
                Ok(!index.contains(head.key, rev))
            },
        )?;
        match last {
            Some(key) => {
                self.next = Bound::Excluded(key);
                Ok(false)
            }
            None => {
                let finished = u64::try_from(self.revision).unwrap_or(0);
                batch.put_meta(MetaKey::FinishedCompactRevision, finished)?;
                Ok(true)
            }
        }
    }
}
