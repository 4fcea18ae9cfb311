//! The backend redb reads and writes a database file through: redb's own file backend, with
//! the test fault injector in front when one is set, a switch that retires the file once a
//! defrag has replaced it, and a thread that runs a checkpoint's sync off the apply thread.
//!
//! Why retire: a database a defrag replaced is closed when its last reader lets go, and redb's
//! close makes its non-durable commits durable. Between checkpoints every batch is such a
//! commit, and during a defrag there is no checkpoint (the log's defrag room), so that close
//! would write every page the writers dirtied while the copy ran and sync the file: work that
//! grows with the defrag's length, done beside the writers' log syncs, for a file that is
//! already unlinked and will never be read again.
//!
//! Why a sync thread: a checkpoint's `Immediate` commit writes the pages dirtied since the
//! last one and then syncs the file, about a millisecond on this project's disk, during which
//! the apply thread could apply nothing. The log already holds the checkpoint's batch and
//! every batch since the last durable commit (`wal`, WAL-4), so the commit need not wait for
//! its sync: the write path asks for the next sync to be deferred ([`FileControl::defer_next_sync`]),
//! and the sync thread runs it while the apply thread goes on.
//!
//! Invariants:
//! - FILE-1: until retired, every call reaches the file, through the fault injector when
//!   tests set one (FAULT-1).
//! - FILE-2: a file is retired only once its replacement's rename over it is durable (the
//!   directory synced), so no open can reach it again. From then on writes, length changes
//!   and syncs are dropped and report success; reads, locks and the close still reach the
//!   file, so readers that hold the old database finish on it (DEFRAG-3). Nothing writes to
//!   a replaced database but its close: every batch after the swap goes to the new one.
//! - FILE-3: the blocks of a file the store unlinked while it serves writes (a retired
//!   database, an abandoned defrag copy) are freed a step at a time
//!   (`SHRINK_STEP_BYTES`, `SHRINK_PAUSE` between steps) on a thread of its own, before its
//!   last descriptor closes. On ext4 the last close of an unlinked 1 GiB file freed it in
//!   one go and held the journal for about a second; every log sync waited behind it (puts
//!   stalled up to 630 ms after a 500 MiB defrag). In 8 MiB steps the longest sync beside a
//!   1 GiB file's release was 12 ms in a standalone probe; beside a retired database's, single
//!   syncs of 47–68 ms remained in two defrags of ten (`docs/benchmarks-features.md`).
//! - FILE-4: a deferred sync is ordered as a synchronous one would be: no write, length
//!   change or sync of the file starts until it has finished, and its failure is latched:
//!   every later write, length change and sync returns it (a failed `fdatasync` may have
//!   dropped the dirty pages, so no later sync can stand in for it). Only the sync the write
//!   path asked to defer is deferred; every other (compaction and defrag steps, open, close)
//!   is synchronous, after any deferred one.
//!
//! Contact points: `Store::open` and the defrag's copy open every database through [`open`];
//! `Store::swap_defragged` retires the file it replaced; `Store::write_logged` defers a
//! checkpoint's sync.

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use redb::backends::FileBackend;
use redb::{BackendError, Database, StorageBackend};

use super::faults::Faults;
use super::{open_error, open_read_write};
use crate::error::StorageError;
use crate::sync::{Arc, AtomicBool, Condvar, Mutex, Ordering, lock, wait};

/// Bytes an unlinked file is shrunk by per step (FILE-3).
pub const SHRINK_STEP_BYTES: u64 = 8 << 20;
/// The pause between two steps, so the log's syncs get the journal in between (FILE-3).
pub const SHRINK_PAUSE: Duration = Duration::from_millis(5);

/// Opens (or creates) the database at `path` through a [`DbFile`], with redb's page cache
/// at `cache_size_bytes` and `faults` in front of the file when tests set them. Returns the
/// database and the switches of its file.
pub(super) fn open(
    path: &Path,
    cache_size_bytes: usize,
    faults: Option<Arc<Faults>>,
) -> Result<(Database, FileControl), StorageError> {
    let file = open_read_write(path)?;
    let duplicate = |file: &File| {
        file.try_clone()
            .map_err(|e| super::io_error("duplicate the descriptor of", path, &e))
    };
    // FILE-3: a second descriptor, which outlives redb's once the file is retired.
    let spare = duplicate(&file)?;
    // FILE-4: a third, which the sync thread syncs.
    let synced = duplicate(&file)?;
    let inner = FileBackend::new(file).map_err(|e| open_error(path, e.into()))?;
    let control = FileControl {
        retired: Arc::new(AtomicBool::new(false)),
        syncs: Syncs::start(synced, faults.clone())
            .map_err(|e| super::io_error("start the sync thread of", path, &e))?,
    };
    let backend = DbFile {
        inner,
        faults,
        control: control.clone(),
        spare: Mutex::new(Some(spare)),
    };
    let db = redb::Builder::new()
        .set_cache_size(cache_size_bytes)
        .create_with_backend(backend)
        .map_err(|e| open_error(path, e.into()))?;
    Ok((db, control))
}

/// The switches of one database file: retiring it (FILE-2) and deferring its next sync
/// (FILE-4).
#[derive(Debug, Clone)]
pub(super) struct FileControl {
    retired: Arc<AtomicBool>,
    syncs: Arc<Syncs>,
}

impl FileControl {
    /// Drops every later write, length change and sync of the file (FILE-2).
    pub(super) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Makes the file's next sync run on the sync thread: the call returns at once, and the
    /// file's next write, length change or sync waits for it (FILE-4).
    pub(super) fn defer_next_sync(&self, on: bool) {
        lock(&self.syncs.state).defer_next = on;
    }

    /// Waits until no deferred sync is running; returns its failure if one failed (FILE-4).
    #[cfg(test)]
    pub(super) fn wait_for_syncs(&self) -> io::Result<()> {
        self.syncs.wait_idle()
    }
}

/// The file's sync thread and what it has done (FILE-4).
#[derive(Debug)]
struct Syncs {
    state: Mutex<SyncState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// True if the next sync is to be deferred.
    defer_next: bool,
    /// Deferred syncs asked for and finished: one runs while they differ.
    asked: u64,
    finished: u64,
    /// The first deferred sync's failure, latched.
    failed: Option<String>,
    /// True once the file's backend is gone: the thread ends.
    stopped: bool,
}

impl Syncs {
    /// Starts the thread that syncs `file` when asked.
    fn start(file: File, faults: Option<Arc<Faults>>) -> io::Result<Arc<Syncs>> {
        let syncs = Arc::new(Syncs {
            state: Mutex::new(SyncState::default()),
            changed: Condvar::new(),
        });
        let shared = syncs.clone();
        std::thread::Builder::new()
            .name("kvd-db-sync".into())
            .spawn(move || shared.run(&file, faults.as_deref()))?;
        Ok(syncs)
    }

    fn run(&self, file: &File, faults: Option<&Faults>) {
        let mut state = lock(&self.state);
        loop {
            if state.asked != state.finished {
                let asked = state.asked;
                drop(state);
                let synced = faults
                    .map_or(Ok(()), Faults::allow)
                    .and_then(|()| file.sync_data());
                state = lock(&self.state);
                if let Err(e) = synced {
                    state.failed.get_or_insert_with(|| e.to_string());
                }
                state.finished = asked;
                self.changed.notify_all();
            } else if state.stopped {
                return;
            } else {
                state = wait(&self.changed, state);
            }
        }
    }

    /// Waits until no deferred sync is running; returns the latched failure, if any.
    fn wait_idle(&self) -> io::Result<()> {
        let mut state = lock(&self.state);
        while state.asked != state.finished {
            state = wait(&self.changed, state);
        }
        match &state.failed {
            Some(cause) => Err(io::Error::other(format!("deferred fdatasync: {cause}"))),
            None => Ok(()),
        }
    }

    /// Hands the sync to the thread if it was asked to be deferred and the thread still
    /// runs; returns true if it was handed over.
    fn defer(&self) -> bool {
        let mut state = lock(&self.state);
        if !std::mem::take(&mut state.defer_next) || state.stopped {
            return false;
        }
        state.asked += 1;
        self.changed.notify_all();
        true
    }

    fn stop(&self) {
        lock(&self.state).stopped = true;
        self.changed.notify_all();
    }
}

/// Unlinks `path` and frees its blocks a step at a time on a thread of its own (FILE-3).
/// A missing file is not an error.
pub(super) fn remove_gradually(path: &Path) -> Result<(), StorageError> {
    let file = match File::options().write(true).open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(super::io_error("open", path, &e)),
    };
    fs::remove_file(path).map_err(|e| super::io_error("remove", path, &e))?;
    release_gradually(file);
    Ok(())
}

/// Shrinks `file`, which must be unlinked, to nothing in steps of `SHRINK_STEP_BYTES` with
/// `SHRINK_PAUSE` between them, then closes it, on a thread of its own (FILE-3). Returns the
/// thread, or `None` if none could be started: the file is then closed here, in one go.
pub(super) fn release_gradually(file: File) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("kvd-release-file".into())
        .spawn(move || {
            // A failed step leaves the rest to the last close, which frees it all at once.
            let Ok(metadata) = file.metadata() else {
                return;
            };
            let mut length = metadata.len();
            while length > 0 {
                length = length.saturating_sub(SHRINK_STEP_BYTES);
                if file.set_len(length).is_err() {
                    return;
                }
                std::thread::sleep(SHRINK_PAUSE);
            }
        })
        .ok()
}

/// redb's file backend behind the fault injector and the retire switch.
struct DbFile {
    inner: FileBackend,
    faults: Option<Arc<Faults>>,
    control: FileControl,
    /// A second descriptor of the file, released step by step once the retired file closes
    /// (FILE-3); dropped with the backend otherwise.
    spare: Mutex<Option<File>>,
}

impl DbFile {
    /// Returns true if the call that changes the file must be dropped (FILE-2); otherwise
    /// waits for a deferred sync (FILE-4) and asks the fault injector, whose error the call
    /// then returns (FILE-1).
    fn drop_change(&self) -> io::Result<bool> {
        if self.control.retired.load(Ordering::Acquire) {
            return Ok(true);
        }
        self.control.syncs.wait_idle()?;
        if let Some(faults) = &self.faults {
            faults.allow()?;
        }
        Ok(false)
    }
}

impl Drop for DbFile {
    fn drop(&mut self) {
        self.control.syncs.stop();
    }
}

impl fmt::Debug for DbFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbFile")
            .field("faults", &self.faults)
            .field("retired", &self.control.retired.load(Ordering::Relaxed))
            .finish()
    }
}

impl StorageBackend for DbFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.drop_change()? {
            return Ok(());
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        if self.drop_change()? {
            return Ok(());
        }
        if self.control.syncs.defer() {
            return Ok(());
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.drop_change()? {
            return Ok(());
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> io::Result<()> {
        // FILE-4: the file is closed only once its deferred sync is done.
        let synced = self.control.syncs.wait_idle();
        let closed = self.inner.close().and(synced);
        // redb never calls the backend again after `close`: the retired file's blocks can go.
        if self.control.retired.load(Ordering::Acquire)
            && let Some(spare) = lock(&self.spare).take()
        {
            release_gradually(spare);
        }
        closed
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Durability, ReadableDatabase, ReadableTable, TableDefinition};

    const TABLE: TableDefinition<'static, &str, u64> = TableDefinition::new("t");

    fn insert(db: &Database, key: &str, durability: Durability) {
        let mut txn = db.begin_write().expect("begin");
        txn.set_durability(durability).expect("durability");
        txn.open_table(TABLE)
            .expect("table")
            .insert(key, 1)
            .expect("insert");
        txn.commit().expect("commit");
    }

    /// Commits one key in a transaction of the default durability; returns the commit's
    /// outcome.
    fn commit_one(db: &Database, key: &str) -> Result<(), redb::CommitError> {
        let txn = db.begin_write().expect("begin");
        txn.open_table(TABLE)
            .expect("table")
            .insert(key, 1)
            .expect("insert");
        txn.commit()
    }

    fn keys_after_reopen(path: &Path) -> Vec<String> {
        let db = redb::Database::create(path).expect("reopen");
        let txn = db.begin_read().expect("read");
        let table = txn.open_table(TABLE).expect("table");
        table
            .iter()
            .expect("iter")
            .map(|row| row.expect("row").0.value().to_owned())
            .collect()
    }

    /// Opens a database at `path` through [`open`] and commits one durable key to it.
    fn database_with_a_durable_key(path: &Path) -> (Database, FileControl) {
        let (db, retire) = open(path, 1 << 20, None).expect("open");
        insert(&db, "durable", Durability::Immediate);
        (db, retire)
    }

    #[test]
    fn a_retired_file_drops_writes_length_changes_and_syncs_and_serves_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("file");
        let file = open_read_write(&path).expect("open");
        let control = FileControl {
            retired: Arc::new(AtomicBool::new(false)),
            syncs: Syncs::start(file.try_clone().expect("clone"), None).expect("sync thread"),
        };
        let backend = DbFile {
            inner: FileBackend::new(file).expect("backend"),
            faults: None,
            control: control.clone(),
            spare: Mutex::new(None),
        };
        backend.write(0, b"abc").expect("write");
        control.retire();
        // FILE-2: every change is dropped and reports success.
        backend.write(0, b"xyz").expect("dropped write");
        backend.set_len(1).expect("dropped length change");
        backend.sync_data().expect("dropped sync");
        let mut read = [0u8; 3];
        backend.read(0, &mut read).expect("read");
        assert_eq!(&read, b"abc");
        assert_eq!(fs::read(&path).expect("file"), b"abc");
    }

    #[test]
    fn a_deferred_sync_runs_before_the_next_change_of_the_file() {
        // FILE-4: only the sync asked for is deferred, and the commit after it finds it done.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let (db, control) = database_with_a_durable_key(&path);
        control.defer_next_sync(true);
        insert(&db, "deferred", Durability::Immediate);
        assert!(
            !lock(&control.syncs.state).defer_next,
            "the commit's sync took it"
        );
        insert(&db, "after", Durability::Immediate);
        let state = lock(&control.syncs.state);
        assert_eq!((state.asked, state.finished), (1, 1));
        assert!(state.failed.is_none());
        drop(state);
        drop(db);
        assert_eq!(keys_after_reopen(&path), ["after", "deferred", "durable"]);
    }

    #[test]
    fn a_failed_deferred_sync_fails_every_later_change_of_the_file() {
        // FILE-4. The injector lets `allowed` more writes and syncs through: the first
        // count that lets the commit through is the one that fails the sync thread's turn.
        for allowed in 0..256 {
            let dir = tempfile::tempdir().expect("tempdir");
            let faults = Arc::new(Faults::new());
            let (db, control) =
                open(&dir.path().join("db"), 1 << 20, Some(faults.clone())).expect("open");
            insert(&db, "before", Durability::Immediate);
            faults.fail_after(allowed);
            control.defer_next_sync(true);
            if commit_one(&db, "deferred").is_err() {
                continue;
            }
            let failed = control
                .wait_for_syncs()
                .expect_err("the deferred sync failed");
            assert!(
                failed.to_string().contains("deferred fdatasync"),
                "{failed}"
            );
            // Latched: a healed disk does not bring the file back.
            faults.heal();
            let error = commit_one(&db, "later").expect_err("every later change fails");
            assert!(error.to_string().contains("deferred fdatasync"), "{error}");
            return;
        }
        panic!("no commit went through");
    }

    #[test]
    fn a_close_makes_pending_commits_durable_in_a_file_in_service() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let (db, _control) = database_with_a_durable_key(&path);
        insert(&db, "pending", Durability::None);
        drop(db);
        // FILE-1: redb's close wrote the non-durable commit out, and the file kept its blocks.
        assert_eq!(keys_after_reopen(&path), ["durable", "pending"]);
    }

    #[test]
    fn a_retired_file_still_serves_its_readers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (db, retire) = database_with_a_durable_key(&dir.path().join("db"));
        insert(&db, "pending", Durability::None);
        let reader = db.begin_read().expect("read");
        retire.retire();
        let table = reader.open_table(TABLE).expect("table");
        for key in ["durable", "pending"] {
            assert_eq!(table.get(key).expect("get").map(|v| v.value()), Some(1));
        }
    }

    #[test]
    fn an_unlinked_file_is_shrunk_to_nothing_before_it_closes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big");
        let file = File::create(&path).expect("create");
        file.set_len(3 * SHRINK_STEP_BYTES + 1).expect("grow");
        let observer = File::open(&path).expect("observer");
        fs::remove_file(&path).expect("unlink");
        release_gradually(file)
            .expect("a thread")
            .join()
            .expect("release");
        assert_eq!(observer.metadata().expect("stat").len(), 0);
    }

    /// Waits, at most 30 s, until `file` is empty; returns its length.
    fn length_once_released(file: &File) -> u64 {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let length = file.metadata().expect("stat").len();
            if length == 0 || std::time::Instant::now() > deadline {
                return length;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_retired_file_is_released_gradually_when_it_closes_and_only_then() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("db");
        let (db, retire) = database_with_a_durable_key(&path);
        let observer = File::open(&path).expect("observer");
        let length = observer.metadata().expect("stat").len();
        assert!(length > 0);
        let reader = db.begin_read().expect("read");
        retire.retire();
        drop(db);
        // FILE-2: a reader still holds the database, so the file is still whole.
        assert_eq!(observer.metadata().expect("stat").len(), length);
        drop(reader);
        // FILE-3: closed with its last reader, the file is freed step by step.
        assert_eq!(length_once_released(&observer), 0);
    }

    #[test]
    fn removing_a_missing_file_gradually_is_not_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        remove_gradually(&dir.path().join("absent")).expect("nothing to remove");
        let path = dir.path().join("present");
        fs::write(&path, b"bytes").expect("write");
        remove_gradually(&path).expect("remove");
        assert!(!path.exists());
    }

    #[test]
    fn injected_faults_fail_the_writes_of_a_file_in_service() {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Arc::new(Faults::new());
        let (db, _control) =
            open(&dir.path().join("db"), 1 << 20, Some(faults.clone())).expect("open");
        insert(&db, "before", Durability::Immediate);
        faults.fail_after(0);
        let error = commit_one(&db, "after").expect_err("a faulty file fails the commit");
        assert!(
            error.to_string().contains("injected storage fault"),
            "{error}"
        );
    }
}
