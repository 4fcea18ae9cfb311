//! Tools for a stopped data directory: `kvd check` and `kvd defrag --data-dir`.
//!
//! Invariants:
//! - OFFLINE-1: each tool opens the directory as an engine does, so the directory lock
//!   (STORE-3) refuses a directory a running kvd holds, with `Locked`; it closes the engine
//!   before it returns.
//! - OFFLINE-2: [`check_data_dir`] reads every stored byte through a decoder: redb's
//!   integrity check over the file, the index rebuild over every history record head and
//!   the row tables' loaders at open, HashKV over every record up to the current revision,
//!   a range that decodes every live key-value, and the consumption recount.
//!
//! Contact points: `kvd check`, `kvd defrag --data-dir` (`server/src/bin/kvd.rs`).

use std::path::Path;

use super::{Config, Engine};
use crate::api::RangeRequest;
use crate::error::Result;
use crate::storage::check::{self, Integrity};

/// What [`check_data_dir`] found; `ok()` says whether it found nothing wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// True if redb had to repair the file (after an unclean shutdown this is expected).
    pub repaired: bool,
    /// The current revision.
    pub revision: i64,
    /// The compaction revision.
    pub compact_revision: i64,
    /// Live keys, each decoded whole.
    pub keys: i64,
    /// HashKV at the current revision.
    pub hash_kv: u32,
    /// Consumption rows whose counters differ from a recount.
    pub drift_rows: usize,
}

impl CheckReport {
    /// Returns true if nothing is wrong (a repair after a crash is not wrong).
    pub fn ok(&self) -> bool {
        self.drift_rows == 0
    }
}

/// Checks the stopped data directory `dir` (OFFLINE-1, OFFLINE-2). A damage found by a
/// decoder or by redb gives an error that `is_corrupted()`.
pub fn check_data_dir(dir: &Path, config: Config) -> Result<CheckReport> {
    let integrity = check::check_integrity(dir)?;
    let engine = Engine::open(dir, config)?;
    let status = engine.status()?;
    let all = engine.range(&RangeRequest {
        range_end: vec![0u8].into(),
        ..RangeRequest::key(vec![0u8])
    })?;
    let hash = engine.hash_kv(0)?;
    let drift_rows = engine.consumption_drift()?.len();
    let report = CheckReport {
        repaired: integrity == Integrity::Repaired,
        revision: status.header.revision,
        compact_revision: hash.compact_revision,
        keys: all.count,
        hash_kv: hash.hash,
        drift_rows,
    };
    engine.close()?;
    Ok(report)
}

/// What [`defrag_data_dir`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineDefrag {
    /// The database file's length before.
    pub size_before: u64,
    /// The database file's length after.
    pub size_after: u64,
    /// HashKV before the defrag.
    pub hash_kv_before: u32,
    /// HashKV after it (equal unless something is wrong).
    pub hash_kv_after: u32,
}

/// Defragments the stopped data directory `dir` (OFFLINE-1): the engine's defrag, with
/// HashKV taken before and after.
pub fn defrag_data_dir(dir: &Path, config: Config) -> Result<OfflineDefrag> {
    let engine = Engine::open(dir, config)?;
    let before = engine.hash_kv(0)?.hash;
    let defrag = engine.defrag()?;
    let after = engine.hash_kv(0)?.hash;
    engine.close()?;
    Ok(OfflineDefrag {
        size_before: defrag.db_size_before,
        size_after: defrag.db_size_after,
        hash_kv_before: before,
        hash_kv_after: after,
    })
}
