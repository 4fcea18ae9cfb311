//! A streamed dump of one read snapshot: every table's rows, written into caller-sized
//! chunks as the caller asks for them, so a snapshot of any size goes out without a copy on
//! disk and without holding more than one chunk (and one row) in memory.
//!
//! Format (version 1, all integers big-endian):
//! - the magic `KVDDUMP1` (8 bytes);
//! - records, each a tag byte and its fields:
//!   - `1` meta: key length (u32), key, value length (u32), value;
//!   - `2` row of a registered table: table name length (u16), name, key length (u32), key,
//!     value length (u32), value;
//!   - `3` history: the 16-byte revision key, record length (u32), record;
//! - the end tag `0`, then zero bytes up to a multiple of [`DUMP_ALIGN_BYTES`] (etcdctl
//!   recognises a snapshot with its SHA-256 trailer by `length % 512 == 32`).
//!
//! Meta values (8-byte integers) and rows go out without their seals, each checked as it is
//! read (ROW-1), so a dump is the same whatever schema version the source has; a restore
//! seals them again and writes this build's schema version (a dump of a newer one is
//! refused). History records go out as stored, with their checksums (REC-4), each checked
//! first by the store's `HistoryCheck` (COPY-1), so a dump of a damaged store fails instead of
//! carrying the damage into a backup.
//!
//! Meta rows come first, then each registered table in registration order, then history in
//! revision order; rows of a table in key order.
//!
//! Invariants:
//! - DUMP-1: every byte comes from the one [`Snapshot`] the dump was made from, so the dump
//!   is a consistent image of one committed state, whatever commits meanwhile.
//! - DUMP-2: [`Dump::fill`] appends whole records until the chunk reaches the size asked
//!   for; it holds at most one scan batch of history keys (none of their values) between
//!   calls. Small tables (meta, registered row tables) are read whole when their turn comes,
//!   as defrag reads them.
//! - DUMP-3: dropping the dump ends its read transaction (STORE-5), so a stalled reader
//!   stops pinning pages as soon as its dump is dropped.
//!
//! - DUMP-4: [`restore`] is total: a dump that is truncated, has an unknown tag or a bad
//!   length gives `Corrupted`, never a panic, and leaves no database behind.
//!
//! Contact points: `engine::snapshot` wraps it for Maintenance.Snapshot and for restoring.

use std::ops::Bound;
use std::path::Path;

use super::{
    DB_FILE_NAME, HISTORY, HistoryCheck, META, MetaKey, REVISION_KEY_BYTES, RevisionKey, RowTable,
    SCHEMA_VERSION, Snapshot, open_error, seal, storage_error,
};
use crate::error::StorageError;
use redb::{ReadableTable, TableDefinition};

/// The first bytes of a dump.
pub const DUMP_MAGIC: &[u8; 8] = b"KVDDUMP1";
const TAG_END: u8 = 0;
const TAG_META: u8 = 1;
const TAG_ROW: u8 = 2;
const TAG_HISTORY: u8 = 3;
/// A dump's length is a multiple of this.
pub const DUMP_ALIGN_BYTES: usize = 512;
/// History rows written per commit when restoring.
const RESTORE_ROWS_PER_COMMIT: usize = 10_000;

/// Where the dump is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Magic,
    Meta,
    /// The registered table at this index.
    Rows(usize),
    /// History after this key (none: from the start).
    History(Option<RevisionKey>),
    End,
    Done,
}

/// A dump in progress (see the module documentation).
pub struct Dump {
    snapshot: Snapshot,
    row_tables: Vec<RowTable>,
    check_history: Option<HistoryCheck>,
    phase: Phase,
    /// Bytes appended so far, for the final alignment.
    written: u64,
}

impl std::fmt::Debug for Dump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dump")
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Dump {
    /// Starts a dump of `snapshot` with the registered `row_tables`, checking each history
    /// record with `check_history` (COPY-1).
    pub fn new(
        snapshot: Snapshot,
        row_tables: Vec<RowTable>,
        check_history: Option<HistoryCheck>,
    ) -> Dump {
        Dump {
            snapshot,
            row_tables,
            check_history,
            phase: Phase::Magic,
            written: 0,
        }
    }

    /// Returns the snapshot the dump reads.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Appends whole records to `out` until it holds at least `chunk_bytes` or the dump is
    /// complete (DUMP-2). Returns false once the end tag has been written.
    pub fn fill(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> Result<bool, StorageError> {
        let before = out.len();
        let more = self.fill_records(out, chunk_bytes)?;
        self.written += (out.len() - before) as u64;
        if self.phase == Phase::Done && !self.written.is_multiple_of(DUMP_ALIGN_BYTES as u64) {
            let pad = DUMP_ALIGN_BYTES - (self.written % DUMP_ALIGN_BYTES as u64) as usize;
            out.resize(out.len() + pad, 0);
            self.written += pad as u64;
        }
        Ok(more)
    }

    fn fill_records(
        &mut self,
        out: &mut Vec<u8>,
        chunk_bytes: usize,
    ) -> Result<bool, StorageError> {
        while out.len() < chunk_bytes {
            self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Magic => {
                    out.extend_from_slice(DUMP_MAGIC);
                    Phase::Meta
                }
                Phase::Meta => {
                    self.dump_meta(out)?;
                    Phase::Rows(0)
                }
                Phase::Rows(index) => match self.row_tables.get(index).copied() {
                    Some(table) => {
                        self.dump_rows(table, out)?;
                        Phase::Rows(index + 1)
                    }
                    None => Phase::History(None),
                },
                Phase::History(after) => self.dump_history(after, out, chunk_bytes)?,
                Phase::End => {
                    out.push(TAG_END);
                    Phase::Done
                }
                Phase::Done => return Ok(false),
            };
        }
        Ok(self.phase != Phase::Done)
    }

    fn dump_meta(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let meta = self.snapshot.txn.open_table(META).map_err(storage_error)?;
        for entry in meta.iter().map_err(storage_error)? {
            let (key, value) = entry.map_err(storage_error)?;
            let value = seal::read_meta(key.value(), value.value())?;
            out.push(TAG_META);
            put_bytes(out, key.value().as_bytes());
            put_bytes(out, &value.to_be_bytes());
        }
        Ok(())
    }

    fn dump_rows(&self, table: RowTable, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let name = table.name.as_bytes();
        let name_len = u16::try_from(name.len()).map_err(|_| {
            StorageError::Corrupted(format!("row table name of {} bytes", name.len()))
        })?;
        for (key, value) in self.snapshot.rows(table)? {
            out.push(TAG_ROW);
            out.extend_from_slice(&name_len.to_be_bytes());
            out.extend_from_slice(name);
            put_bytes(out, &key);
            put_bytes(out, &value);
        }
        Ok(())
    }

    /// Appends history records after `after` until the chunk is full; returns the next phase.
    fn dump_history(
        &self,
        after: Option<RevisionKey>,
        out: &mut Vec<u8>,
        chunk_bytes: usize,
    ) -> Result<Phase, StorageError> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = after;
        let mut more = false;
        let history = &self.snapshot.history;
        for entry in history
            .range((from, Bound::Unbounded))
            .map_err(storage_error)?
        {
            if out.len() >= chunk_bytes {
                more = true;
                break;
            }
            let (key, value) = entry.map_err(storage_error)?;
            let key = key.value();
            if let Some(check) = self.check_history {
                check(&key, value.value())?;
            }
            out.push(TAG_HISTORY);
            out.extend_from_slice(&key);
            put_bytes(out, value.value());
            last = Some(key);
        }
        Ok(if more {
            Phase::History(last)
        } else {
            Phase::End
        })
    }
}

/// Appends a u32 length and the bytes.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    // Keys and values are bounded by the request size limit, far below 4 GiB.
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Builds a dump record by record, for images made from something other than a store (an
/// etcd snapshot being imported): the magic first, [`DumpBuilder::finish`] last.
#[derive(Debug)]
pub struct DumpBuilder {
    image: Vec<u8>,
}

impl Default for DumpBuilder {
    fn default() -> Self {
        DumpBuilder::new()
    }
}

impl DumpBuilder {
    /// Returns a builder holding the magic.
    pub fn new() -> DumpBuilder {
        DumpBuilder {
            image: DUMP_MAGIC.to_vec(),
        }
    }

    /// Adds a meta integer.
    pub fn meta(&mut self, key: super::MetaKey, value: u64) {
        self.image.push(TAG_META);
        put_bytes(&mut self.image, key.name().as_bytes());
        put_bytes(&mut self.image, &value.to_be_bytes());
    }

    /// Adds a row of a registered table.
    pub fn row(&mut self, table: RowTable, key: &[u8], value: &[u8]) {
        let name = table.name.as_bytes();
        self.image.push(TAG_ROW);
        // Registered table names are short constants.
        self.image
            .extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_be_bytes());
        self.image.extend_from_slice(name);
        put_bytes(&mut self.image, key);
        put_bytes(&mut self.image, value);
    }

    /// Adds a history record.
    pub fn history(&mut self, key: &RevisionKey, record: &[u8]) {
        self.image.push(TAG_HISTORY);
        self.image.extend_from_slice(key);
        put_bytes(&mut self.image, record);
    }

    /// Returns the image with its end tag.
    pub fn finish(mut self) -> Vec<u8> {
        self.image.push(TAG_END);
        self.image
    }
}

/// Writes a new database record by record, committing every [`RESTORE_ROWS_PER_COMMIT`]
/// rows, for images read from something other than a dump (an etcd snapshot being
/// imported), so the whole image need not be in memory. Until [`RestoreWriter::finish`]
/// returns, the file is not a database to open: a caller that fails part way removes it.
pub struct RestoreWriter {
    db: redb::Database,
    txn: Option<redb::WriteTransaction>,
    in_txn: usize,
}

impl std::fmt::Debug for RestoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreWriter")
            .field("in_txn", &self.in_txn)
            .finish_non_exhaustive()
    }
}

impl RestoreWriter {
    /// Creates the database file in `dir`, which must not hold one.
    pub fn create(dir: &Path) -> Result<RestoreWriter, StorageError> {
        let path = dir.join(DB_FILE_NAME);
        if path.exists() {
            return Err(StorageError::Io(format!(
                "restore: {} exists already",
                path.display()
            )));
        }
        let db = redb::Builder::new()
            .create(&path)
            .map_err(|e| open_error(&path, e.into()))?;
        let txn = db.begin_write().map_err(storage_error)?;
        Ok(RestoreWriter {
            db,
            txn: Some(txn),
            in_txn: 0,
        })
    }

    fn txn(&mut self) -> Result<&mut redb::WriteTransaction, StorageError> {
        if self.in_txn == RESTORE_ROWS_PER_COMMIT {
            if let Some(txn) = self.txn.take() {
                txn.commit().map_err(storage_error)?;
            }
            self.in_txn = 0;
        }
        if self.txn.is_none() {
            self.txn = Some(self.db.begin_write().map_err(storage_error)?);
        }
        self.in_txn += 1;
        self.txn
            .as_mut()
            .ok_or_else(|| StorageError::Io("restore: no write transaction".into()))
    }

    /// Writes a meta integer.
    pub fn meta(&mut self, key: super::MetaKey, value: u64) -> Result<(), StorageError> {
        let txn = self.txn()?;
        let mut meta = txn.open_table(META).map_err(storage_error)?;
        meta.insert(key.name(), &seal::meta(key.name(), value)[..])
            .map_err(storage_error)?;
        Ok(())
    }

    /// Writes a row of a registered table.
    pub fn row(&mut self, table: RowTable, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        let txn = self.txn()?;
        let mut t = txn.open_table(table.definition()).map_err(storage_error)?;
        t.insert(key, seal::seal(table.name, key, value).as_slice())
            .map_err(storage_error)?;
        Ok(())
    }

    /// Writes a history record.
    pub fn history(&mut self, key: &RevisionKey, record: &[u8]) -> Result<(), StorageError> {
        let txn = self.txn()?;
        let mut history = txn.open_table(HISTORY).map_err(storage_error)?;
        history.insert(key, record).map_err(storage_error)?;
        Ok(())
    }

    /// Commits the last rows and closes the database.
    pub fn finish(mut self) -> Result<(), StorageError> {
        let txn = self.txn()?;
        // The engine expects the history table to exist even in an empty database.
        txn.open_table(HISTORY).map_err(storage_error)?;
        if let Some(txn) = self.txn.take() {
            txn.commit().map_err(storage_error)?;
        }
        self.db.close().map_err(storage_error)
    }
}

/// What a dump holds, for `kvd snapshot status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// The meta `current_revision` (0 if absent).
    pub current_revision: u64,
    /// The meta `finished_compact_revision` (0 if absent).
    pub compact_revision: u64,
    /// History records.
    pub history_records: u64,
    /// Rows of registered tables.
    pub rows: u64,
}

/// Reads `image` (a dump, without any trailer) through to its end tag without writing
/// anything; total as [`restore`] is (DUMP-4).
pub fn summarize(image: &[u8]) -> Result<DumpSummary, StorageError> {
    let mut input = Reader { bytes: image };
    if input.take(DUMP_MAGIC.len())? != DUMP_MAGIC {
        return Err(corrupted("not a kvd dump (bad magic)"));
    }
    let mut summary = DumpSummary::default();
    loop {
        match input.take(1)?[0] {
            TAG_END => break,
            TAG_META => {
                let key = input.bytes()?;
                let value = input.bytes()?;
                let int = || super::decode_u64(value);
                if key == super::MetaKey::CurrentRevision.name().as_bytes() {
                    summary.current_revision = int()?;
                } else if key == super::MetaKey::FinishedCompactRevision.name().as_bytes() {
                    summary.compact_revision = int()?;
                }
            }
            TAG_ROW => {
                let len = u16::from_be_bytes(input.array()?);
                input.take(usize::from(len))?;
                input.bytes()?;
                input.bytes()?;
                summary.rows += 1;
            }
            TAG_HISTORY => {
                input.array::<REVISION_KEY_BYTES>()?;
                input.bytes()?;
                summary.history_records += 1;
            }
            other => return Err(corrupted(&format!("unknown record tag {other}"))),
        }
    }
    if input.bytes.iter().any(|b| *b != 0) {
        return Err(corrupted("bytes after the end of the dump"));
    }
    Ok(summary)
}

/// Reads `image` (a dump, without any trailer) into a new database file in `dir`
/// (DUMP-4). `dir` must not hold a database yet.
pub fn restore(image: &[u8], dir: &Path) -> Result<(), StorageError> {
    let path = dir.join(DB_FILE_NAME);
    if path.exists() {
        return Err(StorageError::Io(format!(
            "restore: {} exists already",
            path.display()
        )));
    }
    let result = restore_into(image, &path);
    if result.is_err() {
        // DUMP-4: a failed restore leaves nothing that could be mistaken for a database.
        let _ = std::fs::remove_file(&path);
    }
    result
}

fn restore_into(image: &[u8], path: &Path) -> Result<(), StorageError> {
    let mut input = Reader { bytes: image };
    if input.take(DUMP_MAGIC.len())? != DUMP_MAGIC {
        return Err(corrupted("not a kvd dump (bad magic)"));
    }
    let db = redb::Builder::new()
        .create(path)
        .map_err(|e| open_error(path, e.into()))?;
    let mut txn = db.begin_write().map_err(storage_error)?;
    let mut in_txn = 0;
    loop {
        let tag = input.take(1)?[0];
        match tag {
            TAG_END => break,
            TAG_META => {
                let key = std::str::from_utf8(input.bytes()?)
                    .map_err(|_| corrupted("meta key is not UTF-8"))?;
                let mut value = super::decode_u64(input.bytes()?)?;
                if key == MetaKey::SchemaVersion.name() {
                    // The restore writes this build's format (ROW-1), which reads the
                    // records of every older one.
                    if value > SCHEMA_VERSION {
                        return Err(StorageError::UnsupportedSchema { found: value });
                    }
                    value = SCHEMA_VERSION;
                }
                // The log's position describes the source's log, which a snapshot does not
                // carry: the restored directory starts one of its own (STORE-6).
                let of_the_log = [
                    MetaKey::WalEpoch,
                    MetaKey::WalSeq,
                    MetaKey::WalOffset,
                    MetaKey::WalInUse,
                ]
                .iter()
                .any(|meta_key| meta_key.name() == key);
                if !of_the_log {
                    let mut meta = txn.open_table(META).map_err(storage_error)?;
                    meta.insert(key, &seal::meta(key, value)[..])
                        .map_err(storage_error)?;
                }
            }
            TAG_ROW => {
                let len = u16::from_be_bytes(input.array()?);
                let name = std::str::from_utf8(input.take(usize::from(len))?)
                    .map_err(|_| corrupted("table name is not UTF-8"))?;
                let (key, value) = (input.bytes()?, input.bytes()?);
                let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
                let mut table = txn.open_table(definition).map_err(storage_error)?;
                table
                    .insert(key, seal::seal(name, key, value).as_slice())
                    .map_err(storage_error)?;
            }
            TAG_HISTORY => {
                let key: RevisionKey = input.array::<REVISION_KEY_BYTES>()?;
                let value = input.bytes()?;
                let mut history = txn.open_table(HISTORY).map_err(storage_error)?;
                history.insert(key, value).map_err(storage_error)?;
            }
            other => return Err(corrupted(&format!("unknown record tag {other}"))),
        }
        in_txn += 1;
        if in_txn == RESTORE_ROWS_PER_COMMIT {
            txn.commit().map_err(storage_error)?;
            txn = db.begin_write().map_err(storage_error)?;
            in_txn = 0;
        }
    }
    if input.bytes.iter().any(|b| *b != 0) {
        return Err(corrupted("bytes after the end of the dump"));
    }
    // The engine expects the history table to exist even in an empty database.
    txn.open_table(HISTORY).map_err(storage_error)?;
    txn.commit().map_err(storage_error)?;
    db.close().map_err(storage_error)
}

fn corrupted(what: &str) -> StorageError {
    StorageError::Corrupted(format!("snapshot dump: {what}"))
}

/// A cursor over a dump whose reads fail with `Corrupted` past the end (DUMP-4).
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(n)
            .ok_or_else(|| corrupted("truncated"))?;
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StorageError> {
        let bytes = self.take(N)?;
        bytes.try_into().map_err(|_| corrupted("truncated"))
    }

    /// Reads a u32 length and that many bytes.
    fn bytes(&mut self) -> Result<&'a [u8], StorageError> {
        let len = u32::from_be_bytes(self.array()?);
        self.take(usize::try_from(len).map_err(|_| corrupted("length"))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_or_foreign_dumps_are_corrupted() {
        let dir = tempfile::tempdir().unwrap();
        for image in [
            &b"SQLite format 3"[..],
            b"KVDDUMP1",
            b"KVDDUMP1\x03\x00",
            b"KVDDUMP1\x09",
        ] {
            let err = restore(image, dir.path()).unwrap_err();
            assert!(matches!(err, StorageError::Corrupted(_)), "{err:?}");
            assert!(!dir.path().join(DB_FILE_NAME).exists());
        }
    }

    #[test]
    fn dumps_carry_values_without_seals_and_restores_seal_them() {
        // A dump of a build before row seals (schema 2) holds the same bytes as one of this
        // build but for its version: both restore to sealed rows of this build's schema.
        use crate::storage::tests::{LEASES, options};
        let mut builder = DumpBuilder::new();
        builder.meta(MetaKey::SchemaVersion, 2);
        builder.meta(MetaKey::CurrentRevision, 5);
        builder.row(LEASES, b"lease-1", b"ttl 60");
        let image = builder.finish();
        let dir = tempfile::tempdir().unwrap();
        restore(&image, dir.path()).unwrap();
        let store = crate::storage::Store::open(dir.path(), &options()).unwrap();
        let snapshot = store.snapshot().unwrap();
        assert_eq!(
            snapshot.get_meta(MetaKey::SchemaVersion),
            Ok(Some(SCHEMA_VERSION))
        );
        assert_eq!(snapshot.get_meta(MetaKey::CurrentRevision), Ok(Some(5)));
        assert_eq!(
            snapshot.rows(LEASES).unwrap(),
            vec![(b"lease-1".to_vec(), b"ttl 60".to_vec())]
        );
        assert!(store.check_seals().is_ok());

        // Dumped again, the row and the integers go out without their seals.
        let mut dump = store.dump().unwrap();
        let mut again = Vec::new();
        while dump.fill(&mut again, 1 << 16).unwrap() {}
        drop(dump);
        let mut row = vec![TAG_ROW, 0, 11];
        row.extend_from_slice(b"test_leases");
        put_bytes(&mut row, b"lease-1");
        put_bytes(&mut row, b"ttl 60");
        let mut revision = vec![TAG_META];
        put_bytes(&mut revision, MetaKey::CurrentRevision.name().as_bytes());
        put_bytes(&mut revision, &5u64.to_be_bytes());
        for record in [row, revision] {
            assert!(
                again.windows(record.len()).any(|w| w == record.as_slice()),
                "{record:?} in the dump"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        restore(&again, dir.path()).unwrap();
        let restored = crate::storage::Store::open(dir.path(), &options()).unwrap();
        assert_eq!(
            restored.snapshot().unwrap().rows(LEASES).unwrap(),
            vec![(b"lease-1".to_vec(), b"ttl 60".to_vec())]
        );

        let mut newer = DumpBuilder::new();
        newer.meta(MetaKey::SchemaVersion, SCHEMA_VERSION + 1);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            restore(&newer.finish(), dir.path()),
            Err(StorageError::UnsupportedSchema {
                found: SCHEMA_VERSION + 1
            })
        );
        assert!(!dir.path().join(DB_FILE_NAME).exists());
    }
}
