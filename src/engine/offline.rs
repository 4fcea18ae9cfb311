//! Tools for a stopped data directory: `kvd check` and `kvd defrag --data-dir`.
//!
//! Invariants:
//! - OFFLINE-1: each tool opens the directory as an engine does, so the directory lock
//!   (STORE-3) refuses a directory a running kvd holds, with `Locked`; it closes the engine
//!   before it returns.
//! - OFFLINE-2: [`check_data_dir`] reads every stored byte through a decoder: redb's
//!   integrity check over the file, the index rebuild over every history record head and
//!   the row tables' loaders at open, HashKV over every record up to the current revision,
//!   a range that decodes every live key-value, the consumption recount, and a count of the
//!   history records that carry no checksum (REC-4), every other record's checksum checked.
//! - OFFLINE-3: [`check_data_dir`] refuses a file of an older schema before it opens the
//!   engine, unless told to raise it (CHECK-3).
//!
//! Contact points: `kvd check`, `kvd defrag --data-dir` (`server/src/bin/kvd.rs`).

use std::path::Path;

use super::{Config, Engine};
use crate::api::RangeRequest;
use crate::error::Result;
pub use crate::storage::check::OlderSchema;
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
    /// History records without a checksum (written before schema version 2, REC-4): sound,
    /// but read unchecked.
    pub unchecked_records: u64,
    /// Rows of the row tables and meta values whose checksums were checked (ROW-1).
    pub checked_rows: u64,
    /// The schema version the check raised the file from (only with
    /// [`OlderSchema::Raise`]), `None` if it raised nothing.
    pub schema_raised_from: Option<u64>,
}

impl CheckReport {
    /// Returns true if nothing is wrong (a repair after a crash is not wrong).
    pub fn ok(&self) -> bool {
        self.drift_rows == 0
    }
}

/// Checks the stopped data directory `dir` (OFFLINE-1, OFFLINE-2). A damage found by a
/// decoder or by redb gives an error that `is_corrupted()`; a file of an older schema gives
/// `StorageError::OlderSchema` and is left as it was, unless `older` is
/// [`OlderSchema::Raise`] (OFFLINE-3).
pub fn check_data_dir(dir: &Path, config: Config, older: OlderSchema) -> Result<CheckReport> {
    let integrity = check::check_integrity(dir, older)?;
    let engine = Engine::open(dir, config)?;
    let status = engine.status()?;
    let all = engine.range(&RangeRequest {
        range_end: vec![0u8].into(),
        ..RangeRequest::key(vec![0u8])
    })?;
    let hash = engine.hash_kv(0)?;
    let drift_rows = engine.consumption_drift()?.len();
    let checked = engine.check_checksums()?;
    let report = CheckReport {
        repaired: integrity == Integrity::Repaired,
        revision: status.header.revision,
        compact_revision: hash.compact_revision,
        keys: all.count,
        hash_kv: hash.hash,
        drift_rows,
        unchecked_records: checked.unchecked,
        checked_rows: checked.rows,
        schema_raised_from: engine.schema_raised_from()?,
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
    /// The schema version the open raised the file from (ROW-2), `None` if it raised nothing.
    pub schema_raised_from: Option<u64>,
}

/// Defragments the stopped data directory `dir` (OFFLINE-1): the engine's defrag, with
/// HashKV taken before and after.
pub fn defrag_data_dir(dir: &Path, config: Config) -> Result<OfflineDefrag> {
    let engine = Engine::open(dir, config)?;
    let schema_raised_from = engine.schema_raised_from()?;
    let before = engine.hash_kv(0)?.hash;
    let defrag = engine.defrag()?;
    let after = engine.hash_kv(0)?.hash;
    engine.close()?;
    Ok(OfflineDefrag {
        size_before: defrag.db_size_before,
        size_after: defrag.db_size_after,
        hash_kv_before: before,
        hash_kv_after: after,
        schema_raised_from,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PutRequest;
    use crate::mvcc::revision::Revision;
    use crate::storage::{CommitSync, Store, StoreOptions};

    #[test]
    fn check_counts_the_records_written_before_checksums_and_hashes_them_alike() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        for i in 0..5 {
            engine.put(PutRequest::new(format!("k{i}"), "v")).unwrap();
        }
        engine.close().unwrap();
        let fresh = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse).unwrap();
        assert_eq!(fresh.unchecked_records, 0);
        assert!(fresh.checked_rows > 0, "ROW-1: at least the meta values");
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        engine
            .lease_grant(crate::api::LeaseGrantRequest { ttl: 60, id: 7 })
            .unwrap();
        engine.close().unwrap();
        let leased = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse).unwrap();
        assert_eq!(
            leased.checked_rows,
            fresh.checked_rows + 1,
            "the lease's row"
        );
        // The records of revisions 2 and 3 stored as a build before checksums stored them:
        // without the trailer, the flags byte without the mark (REC-4).
        let options = StoreOptions {
            cache_size_bytes: 1 << 20,
            sync: CommitSync::Durable,
            row_tables: Vec::new(),
            faults: None,
            wal_file_bytes: Config::default().wal_file_bytes,
            wal_defrag_room_bytes: Config::default().wal_defrag_room_bytes,
            accept_missing_log: false,
            check_history: None,
        };
        let store = Store::open(dir.path(), &options).unwrap();
        store
            .write(|batch| {
                for main in [2, 3] {
                    let key = Revision::new(main, 0).to_key();
                    let stored = batch.decode_history(&key, |b| Ok(b.to_vec()))?.unwrap();
                    batch.put_history(&key, &crate::mvcc::record::legacy(&stored))?;
                }
                Ok(())
            })
            .unwrap();
        store.close().unwrap();
        let report = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse).unwrap();
        assert_eq!(report.unchecked_records, 2);
        assert!(report.ok());
        assert_eq!(report.keys, fresh.keys);
        assert_eq!(report.hash_kv, fresh.hash_kv, "the hash sees no format");
    }

    #[test]
    fn check_leaves_a_directory_of_an_older_schema_as_it_was_unless_told_to_raise_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        for i in 0..5 {
            engine.put(PutRequest::new(format!("k{i}"), "v")).unwrap();
        }
        engine
            .lease_grant(crate::api::LeaseGrantRequest { ttl: 60, id: 7 })
            .unwrap();
        engine.close().unwrap();
        let current = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse).unwrap();
        crate::storage::tests::rewrite_as_schema(dir.path(), 2);
        for _ in 0..2 {
            let refused = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse);
            assert_eq!(
                refused.unwrap_err(),
                crate::Error::Storage(crate::StorageError::OlderSchema {
                    found: 2,
                    current: crate::storage::SCHEMA_VERSION,
                }),
                "OFFLINE-3, and the refusal raised nothing"
            );
        }
        let raised = check_data_dir(dir.path(), Config::default(), OlderSchema::Raise).unwrap();
        assert_eq!(raised.schema_raised_from, Some(2));
        assert_eq!(
            (raised.keys, raised.hash_kv, raised.checked_rows),
            (current.keys, current.hash_kv, current.checked_rows),
            "the raised file holds what it held, every row sealed again"
        );
        let again = check_data_dir(dir.path(), Config::default(), OlderSchema::Refuse).unwrap();
        assert_eq!(
            (again.hash_kv, again.schema_raised_from),
            (current.hash_kv, None)
        );
    }

    #[test]
    fn offline_defrag_reports_the_schema_it_raised() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), Config::default()).unwrap();
        engine.put(PutRequest::new("k", "v")).unwrap();
        engine.close().unwrap();
        crate::storage::tests::rewrite_as_schema(dir.path(), 2);
        let first = defrag_data_dir(dir.path(), Config::default()).unwrap();
        assert_eq!(first.schema_raised_from, Some(2));
        assert_eq!(first.hash_kv_before, first.hash_kv_after);
        let second = defrag_data_dir(dir.path(), Config::default()).unwrap();
        assert_eq!(second.schema_raised_from, None, "raised once");
    }
}
