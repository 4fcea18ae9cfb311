//! HashKV: a CRC-32 over the history visible up to a revision, computed in short chunks.
//!
//! The hash covers, in revision order, every record with main revision at most `rev` that a
//! compaction at the current compaction revision keeps (the index knows which), except a
//! tombstone exactly at the compaction revision (etcd 3.6 skips it so that a hash does not
//! depend on whether the tombstone was kept). For each record it feeds the 16-byte revision
//! key, then the record bytes.
//!
//! Invariants:
//! - HASH-1: the hash depends only on the logical history and the compaction revision: it is
//!   the same before and after the physical deletions of a compaction, and after a restart.
//! - HASH-2: no chunk holds a storage snapshot longer than `HASH_CHUNK_RECORDS` records.
//!
//! Contact points: `Engine::hash_kv`.

use std::ops::Bound;

use super::Revision;
use super::index::Index;
use super::record::Record;
use crate::error::StorageError;
use crate::storage::{RevisionKey, Snapshot};

/// Records hashed per storage snapshot (HASH-2).
pub const HASH_CHUNK_RECORDS: usize = 10_000;

/// A hash in progress.
#[derive(Debug)]
pub struct HashState {
    hasher: crc32fast::Hasher,
    /// The revision covered.
    pub revision: i64,
    /// The compaction revision the hash was started under.
    pub compact_revision: i64,
    next: Bound<RevisionKey>,
    done: bool,
}

impl HashState {
    /// Starts a hash of the history up to `revision` under compaction revision
    /// `compact_revision`.
    pub fn new(revision: i64, compact_revision: i64) -> HashState {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(b"history");
        HashState {
            hasher,
            revision,
            compact_revision,
            next: Bound::Unbounded,
            done: false,
        }
    }

    /// Returns true once every record up to the revision was visited.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Returns the hash.
    pub fn finish(self) -> u32 {
        self.hasher.finalize()
    }

    /// Hashes the next chunk of records from `snapshot`.
    pub fn step(&mut self, index: &Index, snapshot: &Snapshot) -> Result<(), StorageError> {
        let end = Revision::new(self.revision.saturating_add(1), 0).to_key();
        let mut last = None;
        let visited = snapshot.scan_history(
            (self.next, Bound::Excluded(end)),
            HASH_CHUNK_RECORDS,
            |key, value| {
                last = Some(*key);
                let rev = Revision::from_key(key);
                let head = Record::decode_head(key, value)?;
                if rev.main <= self.compact_revision {
                    let skip = !index.contains(head.key, rev)
                        || (head.tombstone && rev.main == self.compact_revision);
                    if skip {
                        return Ok(true);
                    }
                }
                // REC-4: the record as stored without a checksum.
                let (flags, rest) = head.hashed_parts(value);
                self.hasher.update(key);
                self.hasher.update(&[flags]);
                self.hasher.update(rest);
                Ok(true)
            },
        )?;
        match last {
            Some(key) if visited == HASH_CHUNK_RECORDS => self.next = Bound::Excluded(key),
            _ => self.done = true,
        }
        Ok(())
    }
}
