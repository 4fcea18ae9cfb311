//! redb's integrity check of a stopped data directory's database file, for `kvd check`.
//!
//! Invariants:
//! - CHECK-1: the check holds the directory lock (STORE-3) for its whole run, so it never
//!   runs beside a kvd or an `Engine` on the same directory: it fails with `Locked`.
//! - CHECK-2: a missing database file is an error, never created: the check does not make
//!   a database where there was none.
//! - CHECK-3: a file of an older schema is refused with `OlderSchema`, before anything but
//!   redb's own repair has touched it, unless the caller asked for [`OlderSchema::Raise`]:
//!   the engine's open raises the version (ROW-2), after which the build that wrote the file
//!   refuses it, and a check must not take a directory from the build that serves it.
//!
//! Contact points: `Engine::check_data_dir` runs it before the engine-level checks.

use std::path::Path;

use redb::{ReadableDatabase, TableError};

use super::{
    DB_FILE_NAME, META, MetaKey, SCHEMA_VERSION, lock_directory, open_error, seal, storage_error,
};
use crate::error::StorageError;

/// What a check does with a database file of an older schema than this build's (CHECK-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OlderSchema {
    /// Refuse it with `StorageError::OlderSchema`, changing nothing.
    Refuse,
    /// Let the engine's open raise it, as a start of kvd would.
    Raise,
}

/// What redb found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// Every page and checksum verified.
    Clean,
    /// The file failed the check and redb repaired it (as it does after a crash).
    Repaired,
}

/// Runs redb's integrity check on `dir`'s database file (CHECK-1, CHECK-2); a file redb
/// cannot repair gives `Corrupted`, and one of an older schema `OlderSchema` unless `older`
/// lets it be raised (CHECK-3).
pub fn check_integrity(dir: &Path, older: OlderSchema) -> Result<Integrity, StorageError> {
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
    if older == OlderSchema::Refuse
        && let Some(found) = schema_version(&db)?.filter(|&found| found < SCHEMA_VERSION)
    {
        return Err(StorageError::OlderSchema {
            found,
            current: SCHEMA_VERSION,
        });
    }
    Ok(if clean {
        Integrity::Clean
    } else {
        Integrity::Repaired
    })
}

/// Reads the schema version of `db`, `None` in a file that has none yet.
fn schema_version(db: &redb::Database) -> Result<Option<u64>, StorageError> {
    let txn = db.begin_read().map_err(storage_error)?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(storage_error(e)),
    };
    let name = MetaKey::SchemaVersion.name();
    let stored = meta.get(name).map_err(storage_error)?;
    stored
        .map(|bytes| seal::meta_any(name, bytes.value()))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Store;
    use crate::storage::tests::{options, rewrite_as_schema};

    #[test]
    fn a_file_of_an_older_schema_is_refused_and_left_older_unless_it_may_be_raised() {
        let dir = tempfile::tempdir().unwrap();
        let open_and_close = || {
            Store::open(dir.path(), &options())
                .unwrap()
                .close()
                .unwrap()
        };
        let check = |older| check_integrity(dir.path(), older);
        open_and_close();
        assert_eq!(
            check(OlderSchema::Refuse),
            Ok(Integrity::Clean),
            "this build's schema"
        );
        rewrite_as_schema(dir.path(), 2);
        let refused = Err(StorageError::OlderSchema {
            found: 2,
            current: SCHEMA_VERSION,
        });
        assert_eq!(check(OlderSchema::Refuse), refused, "CHECK-3");
        assert_eq!(
            check(OlderSchema::Refuse),
            refused,
            "the refusal raised nothing"
        );
        assert!(check(OlderSchema::Raise).is_ok());
        open_and_close();
        assert_eq!(
            check(OlderSchema::Refuse),
            Ok(Integrity::Clean),
            "raised by the open"
        );
    }
}
