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
//! - SNAP-4: a restore ([`restore_snapshot`], `restore_etcd_snapshot`) is atomic with respect
//!   to a crash: the database is built under a temporary name that is not a data directory
//!   (`<DIR>.restoring-<pid>` beside a missing `DIR`; `DIR/.restoring-<pid>/` inside an
//!   existing one), fsynced, then renamed into place and the directory holding the new name
//!   fsynced. A crash or a kill at any point leaves either `DIR` as it was (missing, or
//!   without a database) or `DIR` with the whole database, never a part of one. Temporaries
//!   that killed restores into `DIR` left are removed by the next restore into `DIR`.
//!
//! Contact points: `server::snapshot` drives it; `storage::dump` writes and reads the bytes;
//! `etcd_snapshot` builds through `restore_atomically`.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::Engine;
use crate::error::{Result, StorageError};
use crate::storage::DB_FILE_NAME;
use crate::storage::defrag::sync_dir;
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
/// The database appears in `data_dir` whole or not at all, even if the process is killed
/// part way (SNAP-4).
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
    restore_atomically(data_dir, |building| Ok(dump::restore(image, building)?))
}

/// The infix of a restore's temporary directory: `<DIR>.restoring-<pid>` beside `DIR`, or
/// `.restoring-<pid>` inside it (SNAP-4).
const RESTORING: &str = ".restoring-";

/// Builds a data directory at `data_dir` through `build`, which writes [`DB_FILE_NAME`]
/// into the (new, empty) directory it is given, and moves the result into place only once
/// it is whole and durable (SNAP-4). On any error nothing of the attempt stays behind.
///
/// - `data_dir` missing: built in `<data_dir>.restoring-<pid>` beside it (its parent is
///   created if need be), then that directory is renamed to `data_dir`.
/// - `data_dir` an existing directory (it must hold no database): built in
///   `data_dir/.restoring-<pid>/`, then the database file is renamed into `data_dir`; the
///   directory itself is kept, so a mount point or a directory prepared with its own owner
///   and mode can be restored into.
pub(super) fn restore_atomically<T>(
    data_dir: &Path,
    build: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    match std::fs::metadata(data_dir) {
        Ok(meta) if meta.is_dir() => restore_into_existing(data_dir, build),
        Ok(_) => Err(io("restore", data_dir, "not a directory").into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => restore_into_new(data_dir, build),
        Err(e) => Err(io("restore", data_dir, e).into()),
    }
}

fn restore_into_new<T>(data_dir: &Path, build: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let name = data_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| {
            io(
                "restore",
                data_dir,
                "not a directory name kvd can restore to",
            )
        })?;
    let parent = match data_dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io("create", &parent, e))?;
    let prefix = format!("{name}{RESTORING}");
    remove_stale_temporaries(&parent, &prefix);
    let building = parent.join(format!("{prefix}{}", std::process::id()));
    std::fs::create_dir(&building).map_err(|e| io("create", &building, e))?;
    let built = build(&building).and_then(|value| {
        sync_file(&building.join(DB_FILE_NAME))?;
        sync_dir(&building)?;
        // A directory created meanwhile is replaced only if it is empty.
        std::fs::rename(&building, data_dir).map_err(|e| {
            io(
                "restore",
                data_dir,
                format!("rename {} to it: {e}", building.display()),
            )
        })?;
        Ok(value)
    });
    let value = match built {
        Ok(value) => value,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&building);
            return Err(e);
        }
    };
    if let Err(e) = sync_dir(&parent) {
        // Not known to be durable: undo rather than report a restore that a crash may lose.
        let _ = std::fs::remove_dir_all(data_dir);
        return Err(e.into());
    }
    Ok(value)
}

fn restore_into_existing<T>(data_dir: &Path, build: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let target = data_dir.join(DB_FILE_NAME);
    if target.exists() {
        return Err(exists_already(&target).into());
    }
    remove_stale_temporaries(data_dir, RESTORING);
    let building = data_dir.join(format!("{RESTORING}{}", std::process::id()));
    std::fs::create_dir(&building).map_err(|e| io("create", &building, e))?;
    let source = building.join(DB_FILE_NAME);
    let built = build(&building).and_then(|value| {
        sync_file(&source)?;
        // The check above is repeated so that a database created meanwhile is not replaced.
        if target.exists() {
            return Err(exists_already(&target).into());
        }
        std::fs::rename(&source, &target).map_err(|e| {
            io(
                "restore",
                &target,
                format!("rename {} to it: {e}", source.display()),
            )
        })?;
        Ok(value)
    });
    let _ = std::fs::remove_dir_all(&building);
    let value = built?;
    if let Err(e) = sync_dir(data_dir) {
        let _ = std::fs::remove_file(&target);
        return Err(e.into());
    }
    Ok(value)
}

/// Removes what killed restores left in `dir`: entries named `<prefix><digits>` (SNAP-4).
/// Failures are ignored: a temporary that stays is not a data directory, and the one this
/// restore needs is created afterwards, which reports its own error.
fn remove_stale_temporaries(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)) else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => {
                let _ = std::fs::remove_dir_all(&path);
            }
            Ok(_) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(_) => {}
        }
    }
}

fn sync_file(path: &Path) -> std::result::Result<(), StorageError> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io("sync", path, e))
}

/// The error `storage::dump` gives for a directory that holds a database already.
fn exists_already(path: &Path) -> StorageError {
    StorageError::Io(format!("restore: {} exists already", path.display()))
}

fn io(what: &str, path: &Path, e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(format!("{what} {}: {e}", path.display()))
}
