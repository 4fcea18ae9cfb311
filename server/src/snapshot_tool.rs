//! `kvd snapshot save|restore|status`: snapshots on the command line, in etcd's format (a
//! bbolt file that etcdctl and etcd read) or kvd's own dump, both followed by etcd's
//! 32-byte SHA-256 trailer.
//!
//! Invariants:
//! - SNAPTOOL-1: `save` writes `FILE.part`, checks the trailer against the bytes received,
//!   fsyncs and only then renames to `FILE`; on any failure `FILE.part` is removed and
//!   `FILE` is untouched.
//! - SNAPTOOL-2: `restore` refuses a data directory that exists and is not empty (what
//!   killed restores left in it, `.restoring-<pid>`, does not count), checks the trailer
//!   unless told to skip it (a file without one is refused unless skipping, as etcdctl
//!   does), reads the whole file before writing, and on any failure leaves no directory it
//!   created. The engine's restore functions build the database under a temporary name and
//!   rename it into place (SNAP-4), so this holds for a kill or a crash too.
//! - SNAPTOOL-3: the format is recognised from the bytes (bbolt's magic at offset 16, or
//!   kvd's `KVDDUMP1`), never from the file name.
//!
//! Contact points: `bin/kvd.rs` parses the flags; the engine's `etcd_snapshot` and
//! `snapshot` modules read and write the images; `server::snapshot` names the metadata
//! that picks the format over the wire.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::pb::etcdserverpb::SnapshotRequest;
use crate::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::snapshot::SNAPSHOT_FORMAT_HEADER;

/// A snapshot file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// etcd's: a bbolt database with etcd 3.4's buckets.
    Etcd,
    /// kvd's own dump of its tables.
    Kvd,
}

impl Format {
    /// Returns the format's name, as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Etcd => "etcd",
            Format::Kvd => "kvd",
        }
    }

    /// Recognises the format of `db` (SNAPTOOL-3).
    pub fn detect(db: &[u8]) -> Option<Format> {
        if db.starts_with(kvd::dump_magic()) {
            return Some(Format::Kvd);
        }
        let magic = db.get(16..20)?;
        (magic == kvd::bbolt::MAGIC.to_le_bytes()).then_some(Format::Etcd)
    }
}

/// Bytes of etcd's SHA-256 trailer.
const TRAILER_BYTES: usize = 32;

/// What `save` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    /// Bytes in the file, trailer included.
    pub bytes: u64,
}

/// Streams a snapshot from `endpoint` (`http://host:port`) into `file` (SNAPTOOL-1).
pub async fn save(endpoint: &str, file: &Path, format: Format) -> Result<Saved, String> {
    let part = part_path(file);
    let result = save_to(endpoint, &part, format).await;
    match result {
        Ok(saved) => std::fs::rename(&part, file)
            .map(|()| saved)
            .map_err(|e| format!("rename {} to {}: {e}", part.display(), file.display())),
        Err(e) => Err(e),
    }
    .inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })
}

/// Writes a snapshot of the stopped data directory `dir` into `file`, with the trailer
/// (SNAPTOOL-1; the engine's directory lock refuses a directory a running kvd holds).
pub fn save_offline(dir: &Path, file: &Path, format: Format) -> Result<Saved, String> {
    let part = part_path(file);
    let result = save_offline_to(dir, &part, format).and_then(|saved| {
        std::fs::rename(&part, file)
            .map(|()| saved)
            .map_err(|e| format!("rename {} to {}: {e}", part.display(), file.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

fn save_offline_to(dir: &Path, part: &Path, format: Format) -> Result<Saved, String> {
    let engine = kvd::Engine::open(dir, kvd::Config::default()).map_err(|e| e.to_string())?;
    let mut source: Box<dyn crate::snapshot::ChunkSource> = match format {
        Format::Etcd => Box::new(
            engine
                .etcd_snapshot_stream(&kvd::EtcdMember::default())
                .map_err(|e| e.to_string())?,
        ),
        Format::Kvd => Box::new(engine.snapshot_stream().map_err(|e| e.to_string())?),
    };
    let mut out = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(part)
        .map_err(|e| format!("create {}: {e}", part.display()))?;
    let mut hasher = sha2::Sha256::new();
    let mut bytes: u64 = 0;
    let mut chunk = Vec::with_capacity(crate::snapshot::SNAPSHOT_CHUNK_BYTES);
    loop {
        chunk.clear();
        let more = source
            .next_chunk(&mut chunk, crate::snapshot::SNAPSHOT_CHUNK_BYTES)
            .map_err(|e| e.to_string())?;
        hasher.update(&chunk);
        bytes += chunk.len() as u64;
        out.write_all(&chunk)
            .map_err(|e| format!("write {}: {e}", part.display()))?;
        if !more {
            break;
        }
    }
    out.write_all(&hasher.finalize())
        .and_then(|()| out.sync_all())
        .map_err(|e| format!("write {}: {e}", part.display()))?;
    drop(source);
    engine.close().map_err(|e| e.to_string())?;
    Ok(Saved {
        bytes: bytes + TRAILER_BYTES as u64,
    })
}

fn part_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".part");
    PathBuf::from(name)
}

async fn save_to(endpoint: &str, part: &Path, format: Format) -> Result<Saved, String> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("connect to {endpoint}: {e}"))?;
    let mut client = MaintenanceClient::new(channel).max_decoding_message_size(64 << 20);
    let mut request = tonic::Request::new(SnapshotRequest {});
    request.metadata_mut().insert(
        SNAPSHOT_FORMAT_HEADER,
        tonic::metadata::MetadataValue::from_static(format.name()),
    );
    let mut stream = client
        .snapshot(request)
        .await
        .map_err(|s| format!("snapshot: {}", s.message()))?
        .into_inner();
    let mut out = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(part)
        .map_err(|e| format!("create {}: {e}", part.display()))?;
    // The last 32 bytes received are the trailer; hash everything before them.
    let mut hasher = sha2::Sha256::new();
    let mut tail: Vec<u8> = Vec::with_capacity(2 * TRAILER_BYTES);
    let mut bytes: u64 = 0;
    while let Some(message) = stream
        .message()
        .await
        .map_err(|s| format!("snapshot stream: {}", s.message()))?
    {
        let blob = message.blob;
        bytes += blob.len() as u64;
        out.write_all(&blob)
            .map_err(|e| format!("write {}: {e}", part.display()))?;
        tail.extend_from_slice(&blob);
        if tail.len() > TRAILER_BYTES {
            let spill = tail.len() - TRAILER_BYTES;
            hasher.update(&tail[..spill]);
            tail.drain(..spill);
        }
    }
    if tail.len() != TRAILER_BYTES || bytes % 512 != TRAILER_BYTES as u64 {
        return Err(format!("sha256 checksum not found [bytes: {bytes}]"));
    }
    if hasher.finalize().as_slice() != tail.as_slice() {
        return Err("the snapshot's SHA-256 trailer does not match its bytes".into());
    }
    out.sync_all()
        .map_err(|e| format!("fsync {}: {e}", part.display()))?;
    Ok(Saved { bytes })
}

/// Splits `file` into the database and its trailer, checking the trailer unless
/// `skip_hash_check` (SNAPTOOL-2).
fn checked_body(file: &[u8], skip_hash_check: bool) -> Result<&[u8], String> {
    let has_trailer = file.len() % 512 == TRAILER_BYTES;
    if !has_trailer {
        if skip_hash_check {
            return Ok(file);
        }
        return Err("snapshot missing hash but --skip-hash-check=false".into());
    }
    let (db, trailer) = file.split_at(file.len() - TRAILER_BYTES);
    if !skip_hash_check {
        let got = sha2::Sha256::digest(db);
        if got.as_slice() != trailer {
            return Err(format!(
                "expected sha256 {}, got {}",
                hex(trailer),
                hex(got.as_slice())
            ));
        }
    }
    Ok(db)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `restore` made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The format read.
    pub format: Format,
    /// The current revision of the restored store.
    pub revision: i64,
    /// History entries written.
    pub history_entries: u64,
    /// From an etcd snapshot: the auth users and roles imported, and whether auth is on.
    pub auth: Option<(u64, u64, bool)>,
}

/// Creates a kvd data directory `data_dir` from the snapshot `file` (SNAPTOOL-2).
pub fn restore(file: &Path, data_dir: &Path, skip_hash_check: bool) -> Result<Restored, String> {
    if data_dir.exists() {
        let mut entries =
            std::fs::read_dir(data_dir).map_err(|e| format!("read {}: {e}", data_dir.display()))?;
        if entries.any(|entry| !matches!(entry, Ok(ref e) if is_restore_leftover(e))) {
            return Err(format!("data-dir {:?} exists and is not empty", data_dir));
        }
    }
    let bytes = std::fs::read(file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let db = checked_body(&bytes, skip_hash_check)?;
    let format = Format::detect(db).ok_or_else(|| {
        format!(
            "{}: neither an etcd snapshot (bbolt) nor a kvd snapshot",
            file.display()
        )
    })?;
    // The engine leaves nothing behind on an error, nor on a kill (SNAP-4).
    let result = match format {
        Format::Etcd => kvd::restore_etcd_snapshot(db, data_dir).map(|s| Restored {
            format,
            revision: s.revision,
            history_entries: s.history_entries,
            auth: Some((s.auth_users, s.auth_roles, s.auth_enabled)),
        }),
        Format::Kvd => kvd::snapshot_summary(db).and_then(|summary| {
            kvd::restore_snapshot(db, data_dir).map(|()| Restored {
                format,
                revision: i64::try_from(summary.current_revision).unwrap_or(i64::MAX),
                history_entries: summary.history_records,
                auth: None,
            })
        }),
    };
    result.map_err(|e| format!("restore {}: {e}", file.display()))
}

/// Whether `entry` of a data directory is the temporary directory of a killed restore into
/// it (`.restoring-<pid>`, engine SNAP-4), which the next restore removes.
fn is_restore_leftover(entry: &std::fs::DirEntry) -> bool {
    let name = entry.file_name();
    let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(".restoring-")) else {
        return false;
    };
    !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && entry.file_type().is_ok_and(|t| t.is_dir())
}

/// What `status` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusReport {
    /// The format.
    pub format: Format,
    /// For etcd's format, etcdctl's CRC-32C of the buckets; 0 for kvd's.
    pub hash: u32,
    /// The revision the snapshot holds.
    pub revision: i64,
    /// etcd: entries over all buckets (etcdctl's totalKey); kvd: history records and rows.
    pub total_keys: u64,
    /// The image's bytes, without the trailer.
    pub total_size: u64,
    /// Whether the file ends with a trailer that matches it (None: no trailer).
    pub hash_ok: Option<bool>,
}

impl StatusReport {
    /// Returns the report as one JSON line, with etcdctl's field names.
    pub fn json(&self) -> String {
        serde_json::json!({
            "format": self.format.name(),
            "hash": self.hash,
            "revision": self.revision,
            "totalKey": self.total_keys,
            "totalSize": self.total_size,
            "sha256Ok": self.hash_ok,
        })
        .to_string()
    }
}

/// Reads the snapshot `file` of either format and reports what it holds.
pub fn status(file: &Path) -> Result<StatusReport, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("read {}: {e}", file.display()))?;
    let hash_ok = (bytes.len() % 512 == TRAILER_BYTES).then(|| checked_body(&bytes, false).is_ok());
    // Without checking, this only splits the trailer off.
    let db = checked_body(&bytes, true)?;
    let report = |e: kvd::Error| format!("{}: {e}", file.display());
    match Format::detect(db) {
        Some(Format::Etcd) => {
            let s = kvd::etcd_snapshot_status(db).map_err(report)?;
            Ok(StatusReport {
                format: Format::Etcd,
                hash: s.hash,
                revision: s.revision,
                total_keys: s.total_keys,
                total_size: s.total_size,
                hash_ok,
            })
        }
        Some(Format::Kvd) => {
            let s = kvd::snapshot_summary(db).map_err(report)?;
            Ok(StatusReport {
                format: Format::Kvd,
                hash: 0,
                revision: i64::try_from(s.current_revision).unwrap_or(i64::MAX),
                total_keys: s.history_records + s.rows,
                total_size: db.len() as u64,
                hash_ok,
            })
        }
        None => Err(format!(
            "{}: invalid database (neither an etcd nor a kvd snapshot)",
            file.display()
        )),
    }
}
