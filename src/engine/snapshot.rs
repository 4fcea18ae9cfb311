//! Maintenance.Snapshot's source of bytes: a streamed dump of one read snapshot
//! (`storage::dump`), handed out chunk by chunk, so the server needs neither a copy on disk
//! nor the whole image in memory.
//!
//! Invariants:
//! - SNAP-1: one stream reads one snapshot (DUMP-1): the image is the committed state at
//!   [`SnapshotStream::revision`], whatever commits while it streams.
//! - SNAP-2: a stream writes nothing and raises nothing: it cannot change the engine's state.
//!   While it lives it pins the pages freed after it began (STORE-5), so the server bounds
//!   how long a stalled stream may live and how many run at once.
//!
//! - SNAP-3: [`restore_snapshot`] turns an image back into a data directory that
//!   [`Engine::open`] opens with the image's state.
//!
//! Contact points: `server::snapshot` drives it; `storage::dump` writes and reads the bytes.

use std::path::Path;

use super::Engine;
use crate::error::Result;
use crate::storage::dump::{self, Dump};

/// A snapshot being streamed (see the module documentation).
#[derive(Debug)]
pub struct SnapshotStream {
    dump: Dump,
    revision: i64,
    size_estimate: u64,
}

impl SnapshotStream {
    /// Returns the revision of the state the stream holds (SNAP-1).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Returns the size of the database file when the stream began: an estimate of the
    /// stream's length (the dump leaves out free pages, so it is usually shorter).
    pub fn size_estimate(&self) -> u64 {
        self.size_estimate
    }

    /// Appends the next bytes to `out`, at least `chunk_bytes` of them unless the stream
    /// ends; returns false once the whole image has been appended.
    pub fn next_chunk(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> Result<bool> {
        // The dump fills `out` up to a length; the chunk counts from what it holds already.
        Ok(self.dump.fill(out, out.len().saturating_add(chunk_bytes))?)
    }
}

impl Engine {
    /// Starts streaming a consistent image of the database (SNAP-1, SNAP-2).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// let mut stream = engine.snapshot_stream().unwrap();
    /// let mut image = Vec::new();
    /// while stream.next_chunk(&mut image, 32 * 1024).unwrap() {}
    /// assert!(image.starts_with(b"KVDDUMP1"));
    /// ```
    pub fn snapshot_stream(&self) -> Result<SnapshotStream> {
        let shared = self.shared()?;
        let dump = shared.reads.store.dump()?;
        // The revision the snapshot itself holds, not the published one, which may be newer.
        let recorded = dump
            .snapshot()
            .get_meta(crate::storage::MetaKey::CurrentRevision)?
            .unwrap_or(1);
        let revision = i64::try_from(recorded).unwrap_or(i64::MAX).max(1);
        let size_estimate = shared.reads.store.file_size()?;
        Ok(SnapshotStream {
            dump,
            revision,
            size_estimate,
        })
    }
}

/// Returns what a dump image (without the SHA-256 trailer) holds, reading it through
/// without writing anything: revision, compaction revision, history records, rows.
pub fn snapshot_summary(image: &[u8]) -> Result<dump::DumpSummary> {
    Ok(dump::summarize(image)?)
}

/// Creates a database in `data_dir` (created if missing; it must hold no database) from
/// `image`, the bytes a [`SnapshotStream`] produced, without etcd's SHA-256 trailer (SNAP-3).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
/// let mut image = Vec::new();
/// let mut stream = engine.snapshot_stream().unwrap();
/// while stream.next_chunk(&mut image, 32 * 1024).unwrap() {}
/// let restored = tempfile::tempdir().unwrap();
/// kvd::restore_snapshot(&image, restored.path()).unwrap();
/// let copy = kvd::Engine::open(restored.path(), kvd::Config::default()).unwrap();
/// assert_eq!(copy.range(&kvd::RangeRequest::key("k")).unwrap().count, 1);
/// ```
pub fn restore_snapshot(image: &[u8], data_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(data_dir).map_err(|e| {
        crate::error::StorageError::Io(format!("create {}: {e}", data_dir.display()))
    })?;
    Ok(dump::restore(image, data_dir)?)
}
