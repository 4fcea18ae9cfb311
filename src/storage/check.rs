//! redb's integrity check of a stopped data directory's database file, for `kvd check`.
//!
//! Invariants:
//! - CHECK-1: the check holds the directory lock (STORE-3) for its whole run, so it never
//!   runs beside a kvd or an `Engine` on the same directory: it fails with `Locked`.
//! - CHECK-2: a missing database file is an error, never created: the check does not make
//!   a database where there was none.
//!
//! Contact points: `Engine::check_data_dir` runs it before the engine-level checks.

use std::path::Path;

use super::{DB_FILE_NAME, lock_directory, open_error};
use crate::error::StorageError;

/// What redb found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// Every page and checksum verified.
    Clean,
    /// The file failed the check and redb repaired it (as it does after a crash).
    Repaired,
}

/// Runs redb's integrity check on `dir`'s database file (CHECK-1, CHECK-2); a file redb
/// cannot repair gives `Corrupted`.
pub fn check_integrity(dir: &Path) -> Result<Integrity, StorageError> {
    let path = dir.join(DB_FILE_NAME);
    if !path.is_file() {
        return Err(StorageError::Io(format!(
            "{} does not exist: not a kvd data directory",
            path.display()
        )));
    }
    let _lock = lock_directory(dir)?;
    let mut db = redb::Database::open(&path).map_err(|e| open_error(&path, e.into()))?;
    let clean = db
        .check_integrity()
        .map_err(|e| StorageError::Corrupted(format!("{}: {e}", path.display())))?;
    Ok(if clean {
        Integrity::Clean
    } else {
        Integrity::Repaired
    })
}
