//! The storage layer: the only module that names `redb`.
//!
//! Owns: the database file and its tables, the data-directory lock, durability, the
//! poisoned state, and file sizes.
//!
//! Tables (see `docs/design/on-disk-format.md`):
//! - `history`: 16-byte big-endian revision `(main, sub)` → an encoded record (`mvcc::record`).
//!   Revisions only grow, so the hot write path appends.
//! - `meta`: a name → 8-byte big-endian integer (schema version, current revision, scheduled
//!   and finished compaction revisions, applied index, the log's position), sealed but for
//!   the schema version, which an older build must read as it is (`seal::UNSEALED_META`).
//! - registered row tables ([`RowTable`]): byte key → byte value, for the layers above
//!   (leases, alarms, auth, the quota registry, consumption, operation ids), written in the
//!   same transaction as the data they describe, each value sealed.
//!
//! Seals (`seal`, ROW-1, ROW-2): every row and meta value but the schema version is stored
//! with a CRC-32 of its table, key and value, checked by every read here.
//!
//! Invariants:
//! - STORE-1: a write batch is committed whole or not at all; a batch that fails part way is
//!   aborted and the store is poisoned.
//! - STORE-2: after any error from redb on the write path, every later write returns
//!   `StorageError::Poisoned` until the data directory is reopened (redb repairs on open).
//!   Reads go on serving the last committed state, unless the failure was a durable redb
//!   commit (a checkpoint batch, a compaction or defrag step): redb then latches the error
//!   and refuses every transaction, and reads return `Poisoned` too until reopen.
//! - STORE-3: one [`Store`] per data directory: `LOCK` in the directory is held with an
//!   exclusive file lock for the store's lifetime.
//! - STORE-6: a data directory whose database is missing or empty beside a log, or whose log
//!   is shorter than any log kvd makes, is refused as damaged: no log is made and nothing
//!   replayed, so it is never taken for a new one. A missing log is not refused: a cleanly
//!   closed database needs none (a copy of it alone is whole), and nothing in the database
//!   tells that apart from one whose log was deleted after a crash (STORE-7 does).
//! - STORE-7: from each open until the clean close after it, the database's durable state
//!   says it needs its log (`wal_in_use`); an open that finds that mark and no log is
//!   refused as damaged before anything is changed, unless the caller accepts losing the
//!   writes since the last checkpoint (`StoreOptions::accept_missing_log`). A clean close
//!   clears the mark in a durable commit; a close after a poisoning error leaves it.
//! - STORE-4: decoders of stored bytes are total: bad bytes give `Corrupted`, never a panic.
//! - STORE-5: a [`Snapshot`] is one redb read transaction; callers keep it for one request
//!   only, because a long reader pins every page freed after it began.
//!
//! Contact points: `engine::apply` writes its batches through [`Store::write_logged`] (and the
//! clean stop's checkpoint through [`Store::write`]); readers use
//! [`Store::snapshot`]; `mvcc::record` encodes the values stored in `history`.

use std::fs::{self, File};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};

use redb::{
    Database, Durability, ReadOnlyTable, ReadTransaction, ReadableDatabase, ReadableTable,
    TableDefinition, TableHandle, WriteTransaction,
};

pub mod check;
mod db_file;
pub mod defrag;
pub mod dump;
pub mod faults;
pub(crate) mod seal;
pub mod timings;
pub mod wal;

use crate::error::StorageError;
use crate::sync::{Arc, Mutex, RwLock, lock};
use db_file::FileControl;
use faults::Faults;
use wal::{LogPosition, LogRecord, LogWriter, Op, OpLog};

/// The name of the database file inside the data directory.
pub const DB_FILE_NAME: &str = "kvd.redb";
/// The name of the lock file inside the data directory.
pub const LOCK_FILE_NAME: &str = "LOCK";
/// The schema version this build writes: 2 since history records carry checksums (REC-4), 3
/// since rows and meta values do (ROW-1).
pub const SCHEMA_VERSION: u64 = 3;
/// The oldest schema version this build reads, and raises to [`SCHEMA_VERSION`] at open: 1,
/// whose history records have no checksums (they stay readable, unchecked). Rows and meta
/// values of versions 1 and 2 are sealed as the version is raised (ROW-2). Once raised, an
/// older build refuses the file with its schema error instead of reading bytes it does not
/// know as damaged.
const SCHEMA_VERSION_OLDEST: u64 = 1;
/// The first schema version whose rows and meta values are sealed (ROW-1).
const SCHEMA_VERSION_SEALED: u64 = 3;
/// Bytes of a history key: big-endian main then big-endian sub.
pub const REVISION_KEY_BYTES: usize = 16;

/// A row of a registered table: key bytes and value bytes.
pub type Row = (Vec<u8>, Vec<u8>);

/// A history key.
pub type RevisionKey = [u8; REVISION_KEY_BYTES];

/// Checks one stored history record under its key (the layer above knows the format: REC-4),
/// for the copies that pass records on as they are (dumps, defrag, backups: COPY-1).
pub type HistoryCheck = fn(&RevisionKey, &[u8]) -> Result<(), StorageError>;

const HISTORY: TableDefinition<RevisionKey, &[u8]> = TableDefinition::new("history");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// Names of the integers kept in the meta table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaKey {
    /// The schema version of the file.
    SchemaVersion,
    /// The main revision of the last write.
    CurrentRevision,
    /// The compaction revision recorded before any deletion of a compaction.
    ScheduledCompactRevision,
    /// The compaction revision whose deletions all committed.
    FinishedCompactRevision,
    /// The number of write requests applied.
    AppliedIndex,
    /// The sequence number of the last batch commit (`wal`).
    WalSeq,
    /// Where the record after that batch's goes in the log (`wal`).
    WalOffset,
    /// The log epoch: one per open (WAL-2).
    WalEpoch,
    /// 1 from an open until the clean close after it: the durable state then needs the log
    /// (STORE-7).
    WalInUse,
}

/// Every meta key, in code order (`MetaKey::code` is the index).
const META_KEYS: [MetaKey; 9] = [
    MetaKey::SchemaVersion,
    MetaKey::CurrentRevision,
    MetaKey::ScheduledCompactRevision,
    MetaKey::FinishedCompactRevision,
    MetaKey::AppliedIndex,
    MetaKey::WalSeq,
    MetaKey::WalOffset,
    MetaKey::WalEpoch,
    MetaKey::WalInUse,
];

impl MetaKey {
    fn name(self) -> &'static str {
        match self {
            MetaKey::SchemaVersion => seal::UNSEALED_META,
            MetaKey::CurrentRevision => "current_revision",
            MetaKey::ScheduledCompactRevision => "scheduled_compact_revision",
            MetaKey::FinishedCompactRevision => "finished_compact_revision",
            MetaKey::AppliedIndex => "applied_index",
            MetaKey::WalSeq => "wal_seq",
            MetaKey::WalOffset => "wal_offset",
            MetaKey::WalEpoch => "wal_epoch",
            MetaKey::WalInUse => "wal_in_use",
        }
    }

    /// Returns the key's code in log records.
    fn code(self) -> u8 {
        match self {
            MetaKey::SchemaVersion => 0,
            MetaKey::CurrentRevision => 1,
            MetaKey::ScheduledCompactRevision => 2,
            MetaKey::FinishedCompactRevision => 3,
            MetaKey::AppliedIndex => 4,
            MetaKey::WalSeq => 5,
            MetaKey::WalOffset => 6,
            MetaKey::WalEpoch => 7,
            MetaKey::WalInUse => 8,
        }
    }

    fn from_code(code: u8) -> Option<MetaKey> {
        META_KEYS.get(usize::from(code)).copied()
    }
}

/// A byte-keyed table that a layer above storage registers, so that its rows commit in the
/// same transaction as the data they describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowTable {
    name: &'static str,
}

impl RowTable {
    /// Returns a table handle named `name`; the name is its identity in the file.
    pub const fn new(name: &'static str) -> RowTable {
        RowTable { name }
    }

    fn definition(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(self.name)
    }
}

/// How a commit reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitSync {
    /// Every commit is durable before it returns (one fdatasync).
    Durable,
    /// Commits stay in memory until a later durable one: for benchmarks only. A crash loses
    /// acknowledged writes.
    UnsafeNoFsync,
}

/// Options of [`Store::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// redb's page cache, in bytes.
    pub cache_size_bytes: usize,
    /// The durability of commits.
    pub sync: CommitSync,
    /// Row tables to create if missing.
    pub row_tables: Vec<RowTable>,
    /// Injected write failures (tests only).
    pub faults: Option<Arc<Faults>>,
    /// Length of the write-ahead log between checkpoints (`wal`; the file is
    /// `wal::log_file_bytes` long).
    pub wal_file_bytes: u64,
    /// The log file's least length (`wal::log_file_bytes`).
    pub wal_defrag_room_bytes: u64,
    /// Opens a database that was not closed cleanly even though its log is missing, losing
    /// the writes acknowledged since its last checkpoint (STORE-7).
    pub accept_missing_log: bool,
    /// Checks each history record a dump, defrag or backup copies (COPY-1); `None` copies
    /// them unchecked.
    pub check_history: Option<HistoryCheck>,
}

/// The open database of one data directory.
#[derive(Debug)]
pub struct Store {
    /// Swapped whole by defrag (DEFRAG-3); readers keep the one they started on.
    db: RwLock<InService>,
    row_tables: Vec<RowTable>,
    check_history: Option<HistoryCheck>,
    cache_size_bytes: usize,
    dir: PathBuf,
    state: Mutex<WriteState>,
    log: LogWriter,
    faults: Option<Arc<Faults>>,
    /// The schema version this open raised the file from, if it was older (ROW-2).
    schema_raised_from: Option<u64>,
    // Held for the lifetime of the store; dropping it releases the directory (STORE-3).
    _lock: File,
}

/// The database in service and the switch that retires its file once a defrag replaced it.
#[derive(Debug)]
struct InService {
    db: Arc<Database>,
    control: FileControl,
}

#[derive(Debug)]
struct WriteState {
    poisoned: Option<String>,
    /// Where the next batch's record goes (`wal`).
    position: LogPosition,
    /// True while a defrag copies: the log may then use its whole file before a checkpoint.
    defragging: bool,
    /// The epoch of this open (WAL-2).
    epoch: u64,
}

impl Store {
    /// Opens (or creates) the store in `dir`, taking the directory lock.
    pub fn open(dir: &Path, options: &StoreOptions) -> Result<Store, StorageError> {
        if dir.exists() && !dir.is_dir() {
            return Err(StorageError::Io(format!(
                "data directory {} is not a directory",
                dir.display()
            )));
        }
        fs::create_dir_all(dir).map_err(|e| io_error("create data directory", dir, &e))?;
        let lock_file = lock_directory(dir)?;
        let path = dir.join(DB_FILE_NAME);
        let log_path = dir.join(wal::WAL_FILE_NAME);
        let log_bytes = match fs::metadata(&log_path) {
            Ok(metadata) => Some(metadata.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error("read the length of", &log_path, &e)),
        };
        let log_existed = log_bytes.is_some();
        if let Some(bytes) = log_bytes.filter(|&bytes| bytes < wal::WAL_FILE_BYTES_MIN) {
            // STORE-6: every log is made at least this long, so a shorter one was cut.
            return Err(StorageError::Corrupted(format!(
                "{} is {bytes} bytes, shorter than any log kvd makes ({}): it was truncated, \
                 and the writes acknowledged since the last checkpoint may be lost (restore \
                 the file, or the data directory from a snapshot or a backup)",
                log_path.display(),
                wal::WAL_FILE_BYTES_MIN
            )));
        }
        // STORE-6: the first open makes the database before the log, so a log beside a
        // missing or empty database is a damaged directory, not a new one.
        let db_bytes = match fs::metadata(&path) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_error("read the length of", &path, &e)),
        };
        if db_bytes == 0 && log_existed {
            return Err(StorageError::Corrupted(format!(
                "{} is missing or empty but {} exists: the data directory is damaged, not \
                 new (restore it from a snapshot or a backup)",
                path.display(),
                log_path.display()
            )));
        }
        let (db, control) = db_file::open(&path, options.cache_size_bytes, options.faults.clone())?;
        // DEFRAG-2: a leftover copy is an unfinished defrag; kvd.redb is complete. Removed
        // only once redb holds kvd.redb's lock (STORE-3), so a second process that got past
        // the directory lock (its file deleted and made again) never removes a running
        // defrag's copy.
        let leftover = dir.join(defrag::DEFRAG_FILE_NAME);
        if leftover.exists() {
            fs::remove_file(&leftover)
                .map_err(|e| io_error("remove unfinished defrag copy", &leftover, &e))?;
        }
        if !log_existed && !options.accept_missing_log && needs_log(&db)? {
            // STORE-7: the log held what redb's durable state lacks.
            return Err(StorageError::Corrupted(format!(
                "{} is missing, but {} was not closed cleanly: the writes acknowledged since \
                 its last checkpoint were only in the log (put the log back; if it is lost, \
                 `kvd check --accept-missing-log` opens the database without them)",
                log_path.display(),
                path.display()
            )));
        }
        let checkpoint_bytes = options.wal_file_bytes.max(wal::WAL_FILE_BYTES_MIN);
        let room = wal::log_file_bytes(checkpoint_bytes, options.wal_defrag_room_bytes);
        let sync = options.sync == CommitSync::Durable;
        let (log, file_bytes) =
            wal::open(dir, checkpoint_bytes, room, sync, options.faults.clone())?;
        let mut store = Store {
            db: RwLock::new(InService {
                db: Arc::new(db),
                control,
            }),
            row_tables: options.row_tables.clone(),
            check_history: options.check_history,
            cache_size_bytes: options.cache_size_bytes,
            dir: dir.to_path_buf(),
            state: Mutex::new(WriteState {
                poisoned: None,
                position: LogPosition {
                    next_seq: 1,
                    next_offset: 0,
                    chain_start: 0,
                    checkpoint_bytes,
                    file_bytes,
                },
                defragging: false,
                epoch: 0,
            }),
            log,
            faults: options.faults.clone(),
            schema_raised_from: None,
            _lock: lock_file,
        };
        store.schema_raised_from = store.initialize(&options.row_tables)?;
        store.replay()?;
        Ok(store)
    }

    /// Applies the log records redb's durable state does not hold, then starts a new epoch
    /// with the log at offset 0, in one durable commit (WAL-2, WAL-3).
    fn replay(&self) -> Result<(), StorageError> {
        let txn = self.database().begin_write().map_err(storage_error)?;
        let (epoch, last_seq) = {
            let mut meta = txn.open_table(META).map_err(storage_error)?;
            let read =
                |meta: &redb::Table<&str, &[u8]>, key: MetaKey| -> Result<u64, StorageError> {
                    match meta.get(key.name()).map_err(storage_error)? {
                        Some(bytes) => seal::read_meta(key.name(), bytes.value()),
                        None => Ok(0),
                    }
                };
            let epoch = read(&meta, MetaKey::WalEpoch)?;
            let seq = read(&meta, MetaKey::WalSeq)?;
            let offset = read(&meta, MetaKey::WalOffset)?;
            let replayed = wal::read_records_after(&self.dir, offset, seq, epoch)?;
            let last_seq = replayed.last_seq().unwrap_or(seq);
            let mut history = txn.open_table(HISTORY).map_err(storage_error)?;
            for (_, payload) in replayed.records() {
                for op in wal::decode_ops(payload)? {
                    replay_op(&txn, &mut history, &mut meta, op)?;
                }
            }
            let next_epoch = epoch.wrapping_add(1);
            for (key, value) in [
                (MetaKey::WalEpoch, next_epoch),
                (MetaKey::WalSeq, last_seq),
                (MetaKey::WalOffset, 0),
                (MetaKey::WalInUse, 1),
            ] {
                meta.insert(key.name(), &seal::meta(key.name(), value)[..])
                    .map_err(storage_error)?;
            }
            (next_epoch, last_seq)
        };
        txn.commit().map_err(storage_error)?;
        // WAL-7: redb now holds every batch up to `last_seq` durably.
        self.log.set_durable(last_seq);
        let mut state = lock(&self.state);
        state.epoch = epoch;
        state.position = LogPosition {
            next_seq: last_seq.wrapping_add(1),
            next_offset: 0,
            chain_start: 0,
            ..state.position
        };
        Ok(())
    }

    /// Creates the tables, writes the schema version on a new file and checks it on an
    /// existing one; seals the rows and meta values of a file of an older schema (ROW-2).
    /// Returns the version it raised the file from, if it was older.
    fn initialize(&self, row_tables: &[RowTable]) -> Result<Option<u64>, StorageError> {
        let txn = self.database().begin_write().map_err(storage_error)?;
        txn.open_table(HISTORY).map_err(storage_error)?;
        let name = MetaKey::SchemaVersion.name();
        let found = {
            let meta = txn.open_table(META).map_err(storage_error)?;
            let stored = meta.get(name).map_err(storage_error)?;
            stored
                .map(|bytes| seal::meta_any(name, bytes.value()))
                .transpose()?
        };
        match found {
            None | Some(SCHEMA_VERSION_SEALED..=SCHEMA_VERSION) => {}
            Some(older @ SCHEMA_VERSION_OLDEST..SCHEMA_VERSION_SEALED) => {
                seal_unsealed(&txn, older)?;
            }
            Some(found) => return Err(StorageError::UnsupportedSchema { found }),
        }
        if found != Some(SCHEMA_VERSION) {
            let mut meta = txn.open_table(META).map_err(storage_error)?;
            meta.insert(name, &seal::meta(name, SCHEMA_VERSION)[..])
                .map_err(storage_error)?;
        }
        for table in row_tables {
            txn.open_table(table.definition()).map_err(storage_error)?;
        }
        txn.commit().map_err(storage_error)?;
        Ok(found.filter(|&version| version < SCHEMA_VERSION))
    }

    /// Returns the schema version this open raised the file from, `None` if the file was of
    /// this build's version or new.
    pub fn schema_raised_from(&self) -> Option<u64> {
        self.schema_raised_from
    }

    /// Returns the data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` in one write transaction and commits it durably (STORE-1). Returns what `f`
    /// returned. An error from `f` or from the commit aborts the batch and poisons the store
    /// (STORE-2).
    pub fn write<R>(
        &self,
        f: impl FnOnce(&mut WriteBatch<'_>) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        // A durable commit holds every batch before it, but the log position stays: the
        // meta table still names the record after the last logged batch.
        self.guarded(|_| {
            let txn = self.database().begin_write().map_err(storage_error)?;
            let result = run_batch(&txn, None, f)?.0;
            txn.commit().map_err(storage_error)?;
            Ok(result)
        })
    }

    /// Runs `f` as one batch commit of the write path (`wal`): committed without I/O and
    /// returned with its log record, which the caller must write with [`Store::log`] before
    /// the batch counts as durable. When the log asks for a checkpoint the commit is durable:
    /// its sync deferred and the batch logged as any other, its record naming where the log
    /// goes on (WAL-8); or, when that cannot be, synchronous and returned with no record.
    pub fn write_logged<R>(
        &self,
        f: impl FnOnce(&mut WriteBatch<'_>) -> Result<R, StorageError>,
    ) -> Result<(R, Option<LogRecord>), StorageError> {
        self.guarded(|state| {
            let (db, control) = {
                let in_service = crate::sync::read(&self.db);
                (in_service.db.clone(), in_service.control.clone())
            };
            let mut txn = db.begin_write().map_err(storage_error)?;
            let (result, ops) = run_batch(&txn, Some(OpLog::new()), f)?;
            if self.faults.as_ref().is_some_and(|f| f.take_batch_failure()) {
                return Err(StorageError::Io("kvd: injected batch failure".into()));
            }
            let mut ops = ops.unwrap_or_default();
            let seq = state.position.next_seq;
            let len = ops.framed_len() as u64;
            let position = state.position;
            let checkpoint = position.needs_checkpoint(len, state.defragging);
            let restart = checkpoint
                .then(|| position.deferred_restart(len + wal::CONTINUE_AT_BYTES, state.defragging))
                .flatten();
            if let Some(start) = restart {
                ops.continue_at(start);
            }
            let logged = !checkpoint || restart.is_some();
            let (next_offset, chain_start) = match (checkpoint, restart) {
                (false, _) => (position.next_offset + len, position.chain_start),
                (true, Some(start)) => (start, start),
                (true, None) => (0, 0),
            };
            {
                let mut meta = txn.open_table(META).map_err(storage_error)?;
                for (key, value) in [(MetaKey::WalSeq, seq), (MetaKey::WalOffset, next_offset)] {
                    meta.insert(key.name(), &seal::meta(key.name(), value)[..])
                        .map_err(storage_error)?;
                }
            }
            if !checkpoint {
                txn.set_durability(Durability::None)
                    .map_err(|e| StorageError::Io(e.to_string()))?;
            }
            let started = std::time::Instant::now();
            let committed = if restart.is_some() {
                // WAL-8, FILE-4: the batch's record holds it until the sync is done.
                control.defer_next_sync(true);
                let committed = txn.commit();
                control.defer_next_sync(false);
                committed
            } else {
                txn.commit()
            };
            committed.map_err(storage_error)?;
            self.log.timings.backend_commit.observe(started.elapsed());
            let record = logged.then(|| ops.frame(state.epoch, seq, position.next_offset));
            state.position = LogPosition {
                next_seq: seq + 1,
                next_offset,
                chain_start,
                ..position
            };
            Ok((result, record))
        })
    }

    /// Lets the log use its whole file before the next checkpoint while a defrag copies
    /// (`on`), or only its first `wal_file_bytes` again (`wal::log_file_bytes`).
    pub fn set_defragging(&self, on: bool) {
        lock(&self.state).defragging = on;
    }

    /// Returns true if log syncs are held by injected faults (tests): the engine then always
    /// hands a batch to its commit thread, so the apply thread stays free meanwhile.
    pub fn log_syncs_held(&self) -> bool {
        self.faults.as_ref().is_some_and(|f| f.log_syncs_held())
    }

    /// Returns the log writer the commit thread makes records durable with.
    pub fn log(&self) -> &LogWriter {
        &self.log
    }

    /// Runs a write under the write state, refusing it if poisoned and poisoning on error.
    fn guarded<R>(
        &self,
        f: impl FnOnce(&mut WriteState) -> Result<R, StorageError>,
    ) -> Result<R, StorageError> {
        let mut state = lock(&self.state);
        if let Some(cause) = &state.poisoned {
            return Err(StorageError::Poisoned(cause.clone()));
        }
        match f(&mut state) {
            Ok(result) => Ok(result),
            Err(e) => {
                state.poisoned = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Refuses every later write until reopen, as after an I/O error (STORE-2).
    pub fn poison(&self, cause: &str) {
        lock(&self.state).poisoned = Some(cause.to_owned());
    }

    /// Opens a read snapshot of the last committed state (STORE-5).
    pub fn snapshot(&self) -> Result<Snapshot, StorageError> {
        let db = self.database();
        let txn = db.begin_read().map_err(storage_error)?;
        let history = txn.open_table(HISTORY).map_err(storage_error)?;
        Ok(Snapshot {
            txn,
            history,
            _db: db,
        })
    }

    /// Starts a streamed dump of a new read snapshot (`dump`, DUMP-1).
    pub fn dump(&self) -> Result<dump::Dump, StorageError> {
        Ok(dump::Dump::new(
            self.snapshot()?,
            self.row_tables.clone(),
            self.check_history,
        ))
    }

    /// Checks the seal of every row and meta value (ROW-1), reading those tables whole;
    /// returns how many it checked. For `kvd check`.
    pub fn check_seals(&self) -> Result<u64, StorageError> {
        check_seals(&self.database())
    }

    /// Returns the database in service.
    fn database(&self) -> Arc<Database> {
        crate::sync::read(&self.db).db.clone()
    }

    /// Returns the length of the database file in bytes.
    pub fn file_size(&self) -> Result<u64, StorageError> {
        let path = self.dir.join(DB_FILE_NAME);
        fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| io_error("stat", &path, &e))
    }

    /// Returns the bytes the database occupies inside its file (allocated pages, including
    /// pages pinned by readers). Waits for the writer: call it from the apply thread or
    /// when writes are idle.
    pub fn size_in_use(&self) -> Result<u64, StorageError> {
        let txn = self.database().begin_write().map_err(storage_error)?;
        let stats = txn.stats().map_err(storage_error)?;
        let bytes = stats.allocated_pages() * stats.page_size() as u64;
        txn.abort().map_err(storage_error)?;
        Ok(bytes)
    }

    /// Closes the database, returning any error redb reports on the way. Unless a write
    /// failed (STORE-2), first clears the mark that the database needs its log, in a durable
    /// commit that holds every batch before it (STORE-7).
    pub fn close(self) -> Result<(), StorageError> {
        let poisoned = lock(&self.state).poisoned.is_some();
        let unmarked = if poisoned {
            Ok(())
        } else {
            self.guarded(|_| clear_log_mark(&self.database()))
        };
        let in_service = self
            .db
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let closed = match Arc::try_unwrap(in_service.db) {
            Ok(db) => db.close().map_err(storage_error),
            // A reader still holds it: redb closes it when that reader drops it.
            Err(_) => Ok(()),
        };
        unmarked.and(closed)
    }
}

/// The tables of one write transaction, open for the duration of a batch.
pub struct WriteBatch<'t> {
    txn: &'t WriteTransaction,
    history: redb::Table<'t, RevisionKey, &'static [u8]>,
    meta: redb::Table<'t, &'static str, &'static [u8]>,
    /// The batch's changes for its log record, when it is logged (`wal`).
    log: Option<OpLog>,
    /// A buffer reused by [`WriteBatch::put_history_encoded`].
    scratch: Vec<u8>,
}

/// Runs `f` over the tables of `txn`; returns its result and the operations it logged.
fn run_batch<R>(
    txn: &WriteTransaction,
    log: Option<OpLog>,
    f: impl FnOnce(&mut WriteBatch<'_>) -> Result<R, StorageError>,
) -> Result<(R, Option<OpLog>), StorageError> {
    let history = txn.open_table(HISTORY).map_err(storage_error)?;
    let meta = txn.open_table(META).map_err(storage_error)?;
    let mut batch = WriteBatch {
        txn,
        history,
        meta,
        log,
        scratch: Vec::new(),
    };
    let result = f(&mut batch)?;
    Ok((result, batch.log.take()))
}

/// Applies one replayed log operation.
fn replay_op(
    txn: &WriteTransaction,
    history: &mut redb::Table<'_, RevisionKey, &'static [u8]>,
    meta: &mut redb::Table<'_, &'static str, &'static [u8]>,
    op: Op<'_>,
) -> Result<(), StorageError> {
    match op {
        Op::PutHistory(key, value) => {
            history.insert(&key, value).map_err(storage_error)?;
        }
        Op::DeleteHistory(key) => {
            history.remove(&key).map_err(storage_error)?;
        }
        Op::PutMeta(key, value) => {
            meta.insert(key.name(), &seal::meta(key.name(), value)[..])
                .map_err(storage_error)?;
        }
        Op::PutRow(table, key, value) => {
            let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(table);
            let mut t = txn.open_table(definition).map_err(storage_error)?;
            t.insert(key, seal::seal(table, key, value).as_slice())
                .map_err(storage_error)?;
        }
        Op::DeleteRow(table, key) => {
            let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(table);
            let mut t = txn.open_table(definition).map_err(storage_error)?;
            t.remove(key).map_err(storage_error)?;
        }
        // Where the log went on: replay has followed it already (WAL-8).
        Op::ContinueAt(_) => {}
    }
    Ok(())
}

impl WriteBatch<'_> {
    /// Appends or overwrites the history record at `key`.
    pub fn put_history(&mut self, key: &RevisionKey, record: &[u8]) -> Result<(), StorageError> {
        self.history.insert(key, record).map_err(storage_error)?;
        if let Some(log) = &mut self.log {
            log.put_history(key, record);
        }
        Ok(())
    }

    /// Writes the history record `encode` appends to an empty buffer; the buffer is reused
    /// for the batch's next record, so a batch of puts allocates one.
    pub fn put_history_encoded(
        &mut self,
        key: &RevisionKey,
        encode: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), StorageError> {
        let mut record = std::mem::take(&mut self.scratch);
        record.clear();
        encode(&mut record);
        let written = self.put_history(key, &record);
        self.scratch = record;
        written
    }

    /// Decodes the history record at `key`, as this batch sees it, straight from the
    /// stored bytes.
    pub fn decode_history<T>(
        &self,
        key: &RevisionKey,
        decode: impl FnOnce(&[u8]) -> Result<T, StorageError>,
    ) -> Result<Option<T>, StorageError> {
        decode_record(&self.history, key, decode)
    }

    /// Deletes history records in `range` for which `delete` returns true; returns how many
    /// were deleted and the last key examined. Examines at most `limit` records.
    pub fn delete_history_where(
        &mut self,
        range: impl RangeBounds<RevisionKey>,
        limit: usize,
        mut delete: impl FnMut(&RevisionKey, &[u8]) -> Result<bool, StorageError>,
    ) -> Result<(usize, Option<RevisionKey>), StorageError> {
        let mut doomed = Vec::new();
        let mut last = None;
        for entry in self
            .history
            .range(range)
            .map_err(storage_error)?
            .take(limit)
        {
            let (key, value) = entry.map_err(storage_error)?;
            let key = key.value();
            if delete(&key, value.value())? {
                doomed.push(key);
            }
            last = Some(key);
        }
        for key in &doomed {
            self.history.remove(key).map_err(storage_error)?;
            if let Some(log) = &mut self.log {
                log.delete_history(key);
            }
        }
        Ok((doomed.len(), last))
    }

    /// Sets a meta integer.
    pub fn put_meta(&mut self, key: MetaKey, value: u64) -> Result<(), StorageError> {
        self.meta
            .insert(key.name(), &seal::meta(key.name(), value)[..])
            .map_err(storage_error)?;
        if let Some(log) = &mut self.log {
            log.put_meta(key, value);
        }
        Ok(())
    }

    /// Returns the bytes this transaction has allocated in the file (pages in use, pending
    /// frees and pages pinned by readers included). Walks the trees: call it rarely.
    pub fn allocated_bytes(&self) -> Result<u64, StorageError> {
        let stats = self.txn.stats().map_err(storage_error)?;
        Ok(stats.allocated_pages() * stats.page_size() as u64)
    }

    /// Writes (`Some` value) or deletes (`None`) many rows of one table, opening it once.
    pub fn write_rows(
        &mut self,
        table: RowTable,
        rows: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<(), StorageError> {
        let mut t = self
            .txn
            .open_table(table.definition())
            .map_err(storage_error)?;
        let mut sealed = Vec::new();
        for (key, value) in rows {
            match value {
                Some(value) => {
                    sealed.clear();
                    seal::seal_into(table.name, &key, &value, &mut sealed);
                    t.insert(key.as_slice(), sealed.as_slice())
                        .map_err(storage_error)?;
                    if let Some(log) = &mut self.log {
                        log.put_row(table.name, &key, &value);
                    }
                }
                None => {
                    t.remove(key.as_slice()).map_err(storage_error)?;
                    if let Some(log) = &mut self.log {
                        log.delete_row(table.name, &key);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes a row of a registered table.
    pub fn put_row(
        &mut self,
        table: RowTable,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StorageError> {
        let mut t = self
            .txn
            .open_table(table.definition())
            .map_err(storage_error)?;
        t.insert(key, seal::seal(table.name, key, value).as_slice())
            .map_err(storage_error)?;
        if let Some(log) = &mut self.log {
            log.put_row(table.name, key, value);
        }
        Ok(())
    }

    /// Returns a row of a registered table as this batch sees it.
    pub fn get_row(&self, table: RowTable, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let t = self
            .txn
            .open_table(table.definition())
            .map_err(storage_error)?;
        let stored = t.get(key).map_err(storage_error)?;
        stored
            .map(|v| seal::open(table.name, key, v.value()).map(<[u8]>::to_vec))
            .transpose()
    }

    /// Deletes a row of a registered table; returns true if it existed.
    pub fn delete_row(&mut self, table: RowTable, key: &[u8]) -> Result<bool, StorageError> {
        let mut t = self
            .txn
            .open_table(table.definition())
            .map_err(storage_error)?;
        let removed = t.remove(key).map_err(storage_error)?.is_some();
        if let Some(log) = &mut self.log {
            log.delete_row(table.name, key);
        }
        Ok(removed)
    }
}

/// A consistent read view of the store: one redb read transaction (STORE-5).
pub struct Snapshot {
    txn: ReadTransaction,
    history: ReadOnlyTable<RevisionKey, &'static [u8]>,
    /// Keeps the file this snapshot reads alive across a defrag swap.
    _db: Arc<Database>,
}

impl Snapshot {
    /// Ends the snapshot on a thread of its own: when it holds the last reference to a
    /// database a defrag replaced, dropping it frees that database's cache and closes its
    /// file, which then writes nothing if the file was retired (FILE-2) and is freed step by
    /// step (FILE-3) (DEFRAG-3: readers still on it finish first either way).
    pub fn drop_in_background(self) {
        // If no thread can be started the snapshot is dropped here, which is only slower.
        let _ = std::thread::Builder::new()
            .name("kvd-defrag-drop".into())
            .spawn(move || drop(self));
    }

    /// Returns true if this snapshot holds the last reference to its database, which must
    /// then have been replaced by a defrag (the store holds the one in service): dropping
    /// the snapshot closes that file.
    pub fn holds_replaced_database(&self) -> bool {
        Arc::strong_count(&self._db) == 1
    }

    /// Reads the history record at `key`.
    pub fn get_history(&self, key: &RevisionKey) -> Result<Option<Vec<u8>>, StorageError> {
        self.decode_history(key, |bytes| Ok(bytes.to_vec()))
    }

    /// Decodes the history record at `key` straight from the stored bytes.
    pub fn decode_history<T>(
        &self,
        key: &RevisionKey,
        decode: impl FnOnce(&[u8]) -> Result<T, StorageError>,
    ) -> Result<Option<T>, StorageError> {
        decode_record(&self.history, key, decode)
    }

    /// Returns the key of the last history record, if there is one.
    pub fn last_history_key(&self) -> Result<Option<RevisionKey>, StorageError> {
        Ok(self
            .history
            .last()
            .map_err(storage_error)?
            .map(|(key, _)| key.value()))
    }

    /// Calls `visit` for each history record in `range`, in revision order, until it returns
    /// false or `limit` records were visited. Returns the number visited.
    pub fn scan_history(
        &self,
        range: impl RangeBounds<RevisionKey>,
        limit: usize,
        mut visit: impl FnMut(&RevisionKey, &[u8]) -> Result<bool, StorageError>,
    ) -> Result<usize, StorageError> {
        let mut visited = 0;
        for entry in self.history.range(range).map_err(storage_error)? {
            if visited == limit {
                break;
            }
            let (key, value) = entry.map_err(storage_error)?;
            visited += 1;
            if !visit(&key.value(), value.value())? {
                break;
            }
        }
        Ok(visited)
    }

    /// Reads a meta integer.
    pub fn get_meta(&self, key: MetaKey) -> Result<Option<u64>, StorageError> {
        let meta = self.txn.open_table(META).map_err(storage_error)?;
        match meta.get(key.name()).map_err(storage_error)? {
            Some(bytes) => Ok(Some(seal::read_meta(key.name(), bytes.value())?)),
            None => Ok(None),
        }
    }

    /// Returns every row of a registered table in key order.
    pub fn rows(&self, table: RowTable) -> Result<Vec<Row>, StorageError> {
        let t = self
            .txn
            .open_table(table.definition())
            .map_err(storage_error)?;
        let mut rows = Vec::new();
        for entry in t.iter().map_err(storage_error)? {
            let (k, v) = entry.map_err(storage_error)?;
            let value = seal::open(table.name, k.value(), v.value())?;
            rows.push((k.value().to_vec(), value.to_vec()));
        }
        Ok(rows)
    }
}

pub(crate) fn decode_u64(bytes: &[u8]) -> Result<u64, StorageError> {
    let array: [u8; 8] = bytes
        .try_into()
        .map_err(|_| StorageError::Corrupted(format!("meta value of {} bytes", bytes.len())))?;
    Ok(u64::from_be_bytes(array))
}

/// Seals every row of every table but `history` and every meta value of a file of schema
/// version 2 or older (`version`), in `txn` (ROW-2). Tables are listed from the file, not
/// from the registered ones, so a table this open does not register is sealed too. Refuses a
/// file whose integers are sealed already: its version was changed on the disk, and sealing
/// its rows again would bury their values under a second seal.
fn seal_unsealed(txn: &WriteTransaction, version: u64) -> Result<(), StorageError> {
    {
        let meta = txn.open_table(META).map_err(storage_error)?;
        for entry in meta.iter().map_err(storage_error)? {
            let (key, value) = entry.map_err(storage_error)?;
            if seal::is_sealed_meta(key.value(), value.value()) {
                return Err(StorageError::Corrupted(format!(
                    "schema version {version}, but the meta value {} is sealed, as only version \
                     {SCHEMA_VERSION_SEALED} and later seal it: the schema version was changed",
                    key.value()
                )));
            }
        }
    }
    let names: Vec<String> = txn
        .list_tables()
        .map_err(storage_error)?
        .map(|handle| handle.name().to_owned())
        .filter(|name| name != HISTORY.name() && name != META.name())
        .collect();
    for name in &names {
        let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
        let mut table = txn.open_table(definition).map_err(storage_error)?;
        let mut rows = Vec::new();
        for entry in table.iter().map_err(storage_error)? {
            let (key, value) = entry.map_err(storage_error)?;
            rows.push((key.value().to_vec(), value.value().to_vec()));
        }
        for (key, value) in rows {
            table
                .insert(key.as_slice(), seal::seal(name, &key, &value).as_slice())
                .map_err(storage_error)?;
        }
    }
    let mut meta = txn.open_table(META).map_err(storage_error)?;
    let mut values = Vec::new();
    for entry in meta.iter().map_err(storage_error)? {
        let (key, value) = entry.map_err(storage_error)?;
        let name = key.value().to_owned();
        let value = seal::meta_any(&name, value.value())?;
        values.push((name, value));
    }
    for (key, value) in values {
        meta.insert(key.as_str(), &seal::meta(&key, value)[..])
            .map_err(storage_error)?;
    }
    Ok(())
}

/// Checks the seal of every row of every table but `history` and of every meta value in
/// `db` (ROW-1); returns how many it checked. Reads the whole of those tables: for
/// `kvd check`.
fn check_seals(db: &Database) -> Result<u64, StorageError> {
    let txn = db.begin_read().map_err(storage_error)?;
    let mut checked = 0;
    for handle in txn.list_tables().map_err(storage_error)? {
        let name = handle.name();
        if name == HISTORY.name() {
            continue;
        }
        if name == META.name() {
            let meta = txn.open_table(META).map_err(storage_error)?;
            for entry in meta.iter().map_err(storage_error)? {
                let (key, value) = entry.map_err(storage_error)?;
                seal::read_meta(key.value(), value.value())?;
                if key.value() != seal::UNSEALED_META {
                    checked += 1;
                }
            }
            continue;
        }
        let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
        let table = txn.open_table(definition).map_err(storage_error)?;
        for entry in table.iter().map_err(storage_error)? {
            let (key, value) = entry.map_err(storage_error)?;
            seal::open(name, key.value(), value.value())?;
            checked += 1;
        }
    }
    Ok(checked)
}

/// Returns true if `db`'s durable state needs its log (STORE-7); false for a new database,
/// and for one written before the mark existed, which cannot tell.
fn needs_log(db: &Database) -> Result<bool, StorageError> {
    let txn = db.begin_read().map_err(storage_error)?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(storage_error(e)),
    };
    match meta.get(MetaKey::WalInUse.name()).map_err(storage_error)? {
        Some(bytes) => Ok(seal::meta_any(MetaKey::WalInUse.name(), bytes.value())? != 0),
        None => Ok(false),
    }
}

/// Clears `db`'s mark that it needs its log (STORE-7), in a durable commit that holds every
/// batch before it.
pub(crate) fn clear_log_mark(db: &Database) -> Result<(), StorageError> {
    let txn = db.begin_write().map_err(storage_error)?;
    {
        let mut meta = txn.open_table(META).map_err(storage_error)?;
        meta.insert(
            MetaKey::WalInUse.name(),
            &seal::meta(MetaKey::WalInUse.name(), 0)[..],
        )
        .map_err(storage_error)?;
    }
    txn.commit().map_err(storage_error)
}

/// Takes the directory lock of `dir` (STORE-3): returns the locked file, held until dropped.
pub(crate) fn lock_directory(dir: &Path) -> Result<File, StorageError> {
    let lock_path = dir.join(LOCK_FILE_NAME);
    let lock_file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_error("open lock file", &lock_path, &e))?;
    match lock_file.try_lock() {
        Ok(()) => Ok(lock_file),
        Err(fs::TryLockError::WouldBlock) => Err(StorageError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(io_error("lock data directory", &lock_path, &e)),
    }
}

/// Opens `path` for reading and writing, creating it if missing, never truncating it.
fn open_read_write(path: &Path) -> Result<File, StorageError> {
    File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_error("open", path, &e))
}

fn io_error(action: &str, path: &Path, e: &std::io::Error) -> StorageError {
    StorageError::Io(format!("{action} {}: {e}", path.display()))
}

fn open_error(path: &Path, e: redb::Error) -> StorageError {
    match e {
        redb::Error::Corrupted(what) => {
            StorageError::Corrupted(format!("{}: {what}", path.display()))
        }
        // redb reports a file that holds no redb database (a wrong magic number) as an I/O
        // error of this kind: it is damage to the data directory, not a failed read.
        redb::Error::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            StorageError::Corrupted(format!("{}: {e}", path.display()))
        }
        redb::Error::DatabaseAlreadyOpen => StorageError::Locked {
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        },
        other => StorageError::Io(format!("open {}: {other}", path.display())),
    }
}

/// Decodes the history record at `key` of `history` (a batch's or a snapshot's) straight
/// from the stored bytes.
fn decode_record<T>(
    history: &impl ReadableTable<RevisionKey, &'static [u8]>,
    key: &RevisionKey,
    decode: impl FnOnce(&[u8]) -> Result<T, StorageError>,
) -> Result<Option<T>, StorageError> {
    match history.get(key).map_err(storage_error)? {
        Some(value) => decode(value.value()).map(Some),
        None => Ok(None),
    }
}

fn storage_error(e: impl Into<redb::Error>) -> StorageError {
    match e.into() {
        redb::Error::Corrupted(what) => StorageError::Corrupted(what),
        // redb latched an earlier I/O error (a failed durable commit) and refuses every
        // transaction, reads included, until the file is reopened (STORE-2).
        redb::Error::PreviousIo => StorageError::Poisoned(
            "an earlier I/O error inside the database; reads and writes fail until the data \
             directory is reopened"
                .into(),
        ),
        other => StorageError::Io(other.to_string()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(super) const LEASES: RowTable = RowTable::new("test_leases");

    /// A durable store with one row table, [`LEASES`].
    pub(super) fn options() -> StoreOptions {
        StoreOptions {
            cache_size_bytes: 1 << 20,
            sync: CommitSync::Durable,
            row_tables: vec![LEASES],
            faults: None,
            wal_file_bytes: wal::WAL_FILE_BYTES_MIN,
            wal_defrag_room_bytes: 0,
            accept_missing_log: false,
            check_history: None,
        }
    }

    #[test]
    fn row_tables_commit_with_history_in_one_batch() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &options()).unwrap();
        store
            .write(|batch| {
                batch.put_history(&[1; 16], b"record")?;
                batch.put_row(LEASES, b"lease-1", b"ttl")?;
                batch.put_row(LEASES, b"lease-2", b"ttl")?;
                assert!(batch.delete_row(LEASES, b"lease-2")?);
                Ok(())
            })
            .unwrap();
        let snapshot = store.snapshot().unwrap();
        assert_eq!(
            snapshot.get_history(&[1; 16]).unwrap(),
            Some(b"record".to_vec())
        );
        assert_eq!(
            snapshot.rows(LEASES).unwrap(),
            vec![(b"lease-1".to_vec(), b"ttl".to_vec())]
        );
    }

    #[test]
    fn failed_batch_commits_nothing_and_poisons_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &options()).unwrap();
        let failed = store.write(|batch| {
            batch.put_row(LEASES, b"half", b"written")?;
            Err::<(), _>(StorageError::Io("disk on fire".into()))
        });
        assert!(failed.is_err());
        assert!(
            store.snapshot().unwrap().rows(LEASES).unwrap().is_empty(),
            "STORE-1"
        );
        let refused = store.write(|_| Ok(()));
        assert!(
            matches!(refused, Err(StorageError::Poisoned(_))),
            "STORE-2: {refused:?}"
        );
    }

    #[test]
    fn second_store_on_a_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _store = Store::open(dir.path(), &options()).unwrap();
        let second = Store::open(dir.path(), &options());
        assert!(
            matches!(second, Err(StorageError::Locked { .. })),
            "STORE-3"
        );
    }

    /// Rewrites every row of the table `name` without its seal (ROW-1), as a build before
    /// schema version 3 stored it.
    fn unseal_table(txn: &WriteTransaction, name: &str) {
        let definition: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
        let mut table = txn.open_table(definition).unwrap();
        let sealed: Vec<Row> = table
            .iter()
            .unwrap()
            .map(|entry| {
                let (k, v) = entry.unwrap();
                (k.value().to_vec(), v.value().to_vec())
            })
            .collect();
        for (key, value) in sealed {
            let value = seal::open(name, &key, &value).unwrap().to_vec();
            table.insert(key.as_slice(), value.as_slice()).unwrap();
        }
    }

    /// Rewrites every meta value without its seal (ROW-1), and the schema version as
    /// `version`, as a build before schema version 3 stored them.
    fn unseal_meta(txn: &WriteTransaction, version: u64) {
        let mut meta = txn.open_table(META).unwrap();
        let values: Vec<(String, u64)> = meta
            .iter()
            .unwrap()
            .map(|entry| {
                let (k, v) = entry.unwrap();
                let name = k.value().to_owned();
                let value = seal::meta_any(&name, v.value()).unwrap();
                (name, value)
            })
            .collect();
        for (name, value) in values {
            let value = if name == MetaKey::SchemaVersion.name() {
                version
            } else {
                value
            };
            meta.insert(name.as_str(), &value.to_be_bytes()[..])
                .unwrap();
        }
    }

    /// Rewrites `store`'s rows and meta values as a build of schema `version` stored them,
    /// without seals, and adds a table this open did not register (ROW-2).
    fn unseal_as_schema(store: &Store, version: u64) {
        let txn = store.database().begin_write().unwrap();
        unseal_table(&txn, LEASES.name);
        {
            let unregistered: TableDefinition<&[u8], &[u8]> = TableDefinition::new("other");
            let mut other = txn.open_table(unregistered).unwrap();
            other.insert(&b"k"[..], &b"old row"[..]).unwrap();
        }
        unseal_meta(&txn, version);
        txn.commit().unwrap();
    }

    /// Rewrites the stopped directory `dir` as a build of schema `version` (2 or later: the
    /// history records stay as they are) stored it: every row of every table and every meta
    /// value without its seal (ROW-1).
    pub(crate) fn rewrite_as_schema(dir: &Path, version: u64) {
        let store = Store::open(
            dir,
            &StoreOptions {
                row_tables: Vec::new(),
                ..options()
            },
        )
        .unwrap();
        let txn = store.database().begin_write().unwrap();
        let names: Vec<String> = txn
            .list_tables()
            .unwrap()
            .map(|handle| handle.name().to_owned())
            .filter(|name| name != HISTORY.name() && name != META.name())
            .collect();
        for name in &names {
            unseal_table(&txn, name);
        }
        unseal_meta(&txn, version);
        txn.commit().unwrap();
        // Not closed: a close writes the log mark as this build does, sealed.
        drop(store);
    }

    #[test]
    fn older_schemas_are_raised_and_their_rows_and_meta_sealed_at_open() {
        // Files of builds before history checksums (1) and before row seals (2) open, every
        // row and meta value sealed in the commit that raises the version (ROW-2), so that
        // an older build refuses the file by its schema.
        for version in [1, 2] {
            let dir = tempfile::tempdir().unwrap();
            {
                let store = Store::open(dir.path(), &options()).unwrap();
                store
                    .write(|batch| {
                        batch.put_row(LEASES, b"lease-1", b"ttl 60")?;
                        batch.put_row(LEASES, b"lease-2", b"")?;
                        batch.put_meta(MetaKey::CurrentRevision, 7)
                    })
                    .unwrap();
                unseal_as_schema(&store, version);
                assert!(
                    store.snapshot().unwrap().rows(LEASES).is_err(),
                    "ROW-1: an unsealed row is refused once the schema promises seals"
                );
                // Not closed: a close writes the log mark as this build does, sealed.
                drop(store);
            }
            let reopened = Store::open(dir.path(), &options()).unwrap();
            assert_eq!(reopened.schema_raised_from(), Some(version));
            let snapshot = reopened.snapshot().unwrap();
            assert_eq!(
                snapshot.get_meta(MetaKey::SchemaVersion),
                Ok(Some(SCHEMA_VERSION))
            );
            assert_eq!(snapshot.get_meta(MetaKey::CurrentRevision), Ok(Some(7)));
            assert_eq!(
                snapshot.rows(LEASES).unwrap(),
                vec![
                    (b"lease-1".to_vec(), b"ttl 60".to_vec()),
                    (b"lease-2".to_vec(), Vec::new()),
                ]
            );
            let sealed_metas = META_KEYS
                .iter()
                .filter(|key| **key != MetaKey::SchemaVersion)
                .filter(|key| snapshot.get_meta(**key).unwrap().is_some())
                .count() as u64;
            assert_eq!(
                reopened.check_seals(),
                Ok(sealed_metas + 3),
                "every meta value but the version, both rows and the unregistered table's row"
            );
            drop(snapshot);
            reopened.close().unwrap();
            let reopened = Store::open(dir.path(), &options()).unwrap();
            assert_eq!(reopened.schema_raised_from(), None, "raised once");
            let snapshot = reopened.snapshot().unwrap();
            let txn = reopened.database().begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                let stored = meta.get(MetaKey::SchemaVersion.name()).unwrap().unwrap();
                assert_eq!(stored.value(), &3u64.to_be_bytes()[..], "ROW-1: unsealed");
                drop(stored);
                // One bit: 3 becomes 2.
                meta.insert(MetaKey::SchemaVersion.name(), &2u64.to_be_bytes()[..])
                    .unwrap();
            }
            txn.commit().unwrap();
            drop(snapshot);
            reopened.close().unwrap();
            let Err(StorageError::Corrupted(message)) = Store::open(dir.path(), &options()) else {
                panic!("ROW-2: a sealed file whose version says 2 is refused");
            };
            assert!(
                message.contains("the schema version was changed"),
                "{message}"
            );
        }
        assert_eq!(SCHEMA_VERSION, 3);
    }

    #[test]
    fn a_changed_byte_of_a_row_or_a_meta_value_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &options()).unwrap();
        store
            .write(|batch| {
                batch.put_row(LEASES, b"lease-1", b"ttl 60")?;
                batch.put_meta(MetaKey::CurrentRevision, 7)
            })
            .unwrap();
        let before = store.check_seals().unwrap();
        let txn = store.database().begin_write().unwrap();
        {
            let mut rows = txn.open_table(LEASES.definition()).unwrap();
            let mut stored = rows.get(&b"lease-1"[..]).unwrap().unwrap().value().to_vec();
            stored[4] ^= 0x08;
            rows.insert(&b"lease-1"[..], stored.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        let refused = StorageError::Corrupted(
            "row of table test_leases at key \"lease-1\": checksum mismatch".into(),
        );
        assert_eq!(store.snapshot().unwrap().rows(LEASES), Err(refused.clone()));
        assert_eq!(
            store.write(|batch| batch.get_row(LEASES, b"lease-1")),
            Err(refused.clone())
        );
        assert_eq!(store.check_seals(), Err(refused));
        drop(store);

        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &options()).unwrap();
        store
            .write(|batch| batch.put_meta(MetaKey::CurrentRevision, 7))
            .unwrap();
        assert!(before > 0);
        let txn = store.database().begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            let name = MetaKey::CurrentRevision.name();
            let mut stored = meta.get(name).unwrap().unwrap().value().to_vec();
            stored[7] ^= 0x01;
            meta.insert(name, stored.as_slice()).unwrap();
        }
        txn.commit().unwrap();
        assert!(matches!(
            store.snapshot().unwrap().get_meta(MetaKey::CurrentRevision),
            Err(StorageError::Corrupted(_))
        ));
        assert!(store.check_seals().is_err());
    }

    /// Writes batch `n`, a history record of 1 KiB under key `n`, and makes its record
    /// durable as the commit thread would; returns the record.
    fn logged_batch(store: &Store, n: u64) -> Option<LogRecord> {
        let key = revision_key(n);
        let ((), record) = store
            .write_logged(|batch| batch.put_history(&key, &[b'v'; 1024]))
            .unwrap();
        if let Some(record) = &record {
            store.log().write(&[record]).unwrap();
            store.log().sync(&[record]).unwrap();
        }
        record
    }

    fn revision_key(n: u64) -> RevisionKey {
        let mut key = [0u8; REVISION_KEY_BYTES];
        key[..8].copy_from_slice(&n.to_be_bytes());
        key
    }

    #[test]
    fn a_checkpoint_whose_sync_never_reached_the_disk_is_replayed_from_the_log() {
        // WAL-8: a power cut before a deferred checkpoint's sync leaves the database file as
        // the durable commit before it left it; the log holds the checkpoint's batch and
        // the batches after it, in the other region.
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions {
            wal_defrag_room_bytes: 1 << 20,
            ..options()
        };
        let store = Store::open(dir.path(), &options).unwrap();
        let db_path = dir.path().join(DB_FILE_NAME);
        let mut n = 0;
        let before_checkpoint = loop {
            n += 1;
            assert!(n < 1000, "no checkpoint in 1,000 batches of 1 KiB");
            let durable = fs::read(&db_path).unwrap();
            let record = logged_batch(&store, n).expect("a logged batch");
            if record.is_checkpoint() {
                break durable;
            }
        };
        let checkpoint = n;
        assert_eq!(
            lock(&store.state).position.chain_start,
            wal::WAL_FILE_BYTES_MIN
        );
        for _ in 0..5 {
            n += 1;
            assert!(!logged_batch(&store, n).expect("logged").is_checkpoint());
        }
        // The cut: the database file as it was before the checkpoint's commit, the log as
        // it is now.
        let cut = tempfile::tempdir().unwrap();
        fs::write(cut.path().join(DB_FILE_NAME), &before_checkpoint).unwrap();
        fs::copy(
            dir.path().join(wal::WAL_FILE_NAME),
            cut.path().join(wal::WAL_FILE_NAME),
        )
        .unwrap();
        // Without the cut, the checkpoint's commit is durable once the next change waits
        // for its sync.
        store.close().unwrap();
        for reopened in [
            Store::open(cut.path(), &options).unwrap(),
            Store::open(dir.path(), &options).unwrap(),
        ] {
            let snapshot = reopened.snapshot().unwrap();
            for key in 1..=n {
                assert!(
                    snapshot.get_history(&revision_key(key)).unwrap().is_some(),
                    "batch {key} of {n} lost (the checkpoint was {checkpoint})"
                );
            }
        }
    }

    #[test]
    fn replayed_rows_and_meta_values_are_sealed() {
        // The log carries values without seals (ROW-1); replay seals them as it writes.
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), &options()).unwrap();
            let ((), record) = store
                .write_logged(|batch| {
                    batch.put_row(LEASES, b"lease-9", b"ttl 9")?;
                    batch.put_meta(MetaKey::CurrentRevision, 9)
                })
                .unwrap();
            let record = record.expect("a logged batch, not a checkpoint");
            let payload = &record.bytes[wal::RECORD_HEADER_BYTES..];
            let ops = wal::decode_ops(payload).unwrap();
            assert!(
                ops.contains(&wal::Op::PutRow(LEASES.name, b"lease-9", b"ttl 9")),
                "the log carries the row without its seal: {ops:?}"
            );
            // Replayed into a file that lacks the batch, as after a crash before its
            // checkpoint.
            let txn = store.database().begin_write().unwrap();
            txn.delete_table(LEASES.definition()).unwrap();
            {
                let mut history = txn.open_table(HISTORY).unwrap();
                let mut meta = txn.open_table(META).unwrap();
                for op in ops {
                    replay_op(&txn, &mut history, &mut meta, op).unwrap();
                }
            }
            txn.commit().unwrap();
            store.close().unwrap();
        }
        let reopened = Store::open(dir.path(), &options()).unwrap();
        let snapshot = reopened.snapshot().unwrap();
        assert_eq!(
            snapshot.rows(LEASES).unwrap(),
            vec![(b"lease-9".to_vec(), b"ttl 9".to_vec())]
        );
        assert_eq!(snapshot.get_meta(MetaKey::CurrentRevision), Ok(Some(9)));
        assert!(reopened.check_seals().is_ok());
    }

    #[test]
    fn copies_refuse_a_damaged_record_row_or_meta_value() {
        // COPY-1: a dump, a defrag and a backup copy check what they pass on as stored.
        fn refuse_bad(key: &RevisionKey, bytes: &[u8]) -> Result<(), StorageError> {
            if bytes == b"bad" {
                return Err(StorageError::Corrupted(format!("record at {key:?}")));
            }
            Ok(())
        }
        let copies = |store: &Store| -> [Result<(), StorageError>; 3] {
            let dump = store.dump().and_then(|mut dump| {
                let mut out = Vec::new();
                while dump.fill(&mut out, 1 << 16)? {}
                Ok(())
            });
            let progress = defrag::Progress::default();
            let defragged = store
                .snapshot()
                .and_then(|first| store.begin_defrag(first, &progress))
                .and_then(|target| store.abandon_defrag(Some(target)));
            let backup = store.dir().join("backup.redb");
            let copied = store
                .snapshot()
                .and_then(|snapshot| store.copy_to(&snapshot, &backup, &progress))
                .map(drop);
            [dump, defragged, copied]
        };
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            dir.path(),
            &StoreOptions {
                check_history: Some(refuse_bad),
                ..options()
            },
        )
        .unwrap();
        store
            .write(|batch| {
                batch.put_history(&[1; 16], b"good")?;
                batch.put_row(LEASES, b"lease-1", b"ttl 60")
            })
            .unwrap();
        assert_eq!(copies(&store), [Ok(()), Ok(()), Ok(())]);

        store
            .write(|batch| batch.put_history(&[2; 16], b"bad"))
            .unwrap();
        for copy in copies(&store) {
            assert_eq!(
                copy,
                Err(StorageError::Corrupted(format!(
                    "record at {:?}",
                    [2u8; 16]
                )))
            );
        }
        store
            .write(|batch| {
                batch.delete_history_where(.., usize::MAX, |_, bytes| Ok(bytes == b"bad"))?;
                Ok(())
            })
            .unwrap();
        assert_eq!(copies(&store), [Ok(()), Ok(()), Ok(())]);

        let txn = store.database().begin_write().unwrap();
        {
            let mut rows = txn.open_table(LEASES.definition()).unwrap();
            rows.insert(&b"lease-1"[..], &b"ttl 60 and no seal"[..])
                .unwrap();
        }
        txn.commit().unwrap();
        for copy in copies(&store) {
            let Err(StorageError::Corrupted(message)) = copy else {
                panic!("ROW-1: {copy:?}");
            };
            assert!(message.starts_with("row of table test_leases"), "{message}");
        }
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), &options()).unwrap();
            store
                .write(|batch| {
                    batch
                        .meta
                        .insert(MetaKey::SchemaVersion.name(), &99u64.to_be_bytes()[..])
                        .map_err(storage_error)?;
                    Ok(())
                })
                .unwrap();
            store.close().unwrap();
        }
        let reopened = Store::open(dir.path(), &options());
        assert!(matches!(
            reopened,
            Err(StorageError::UnsupportedSchema { found: 99 })
        ));
    }
}
