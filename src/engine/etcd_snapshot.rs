//! Snapshots in etcd's format: Maintenance.Snapshot's etcd image of one read snapshot
//! ([`Engine::etcd_snapshot_stream`], written by `bbolt::write`), and a data directory made
//! from an etcd snapshot ([`restore_etcd_snapshot`], read by `bbolt::read`).
//!
//! The mapping (kvd → etcd; the import is its inverse):
//! - each history record `(main, sub)` → `key` bucket entry `main(8 BE) _ sub(8 BE)` (`t`
//!   appended for a tombstone) → `mvccpb.KeyValue` (a tombstone holds only the key);
//! - meta `applied_index` → `consistent_index`; the scheduled and finished compaction
//!   revisions → `scheduledCompactRev` and `finishedCompactRev` as revision keys;
//! - each lease row → `lease` bucket, id (8 BE) → `leasepb.Lease` {ID, TTL};
//! - each alarm → `alarm` bucket, `AlarmMember` → empty;
//! - this member → `members` (hex id → JSON) and `cluster` (`clusterVersion` → `3.4.0`).
//!
//! On import, the current revision is the larger of the last `key` entry's main and the
//! compaction revision (etcd's rule), and the compaction revision is the larger of the
//! scheduled and finished ones (etcd resumes a scheduled compaction on start).
//!
//! Invariants:
//! - ETCDSNAP-1: one stream reads one snapshot, as SNAP-1: the file is the committed state
//!   at [`EtcdSnapshotStream::revision`].
//! - ETCDSNAP-2: [`restore_etcd_snapshot`] writes the database only after the whole file
//!   has been read and checked; on any error the directory is left as it was (and a
//!   directory it created is removed).
//!
//! Contact points: `server::maintenance` streams it, `kvd snapshot restore|status` import
//! and inspect.

use std::path::Path;

use super::Engine;
use crate::bbolt::proto::{decode_key_value, decode_lease, encode_alarm, encode_lease};
use crate::bbolt::read::Reader;
use crate::bbolt::write::{Entry, EtcdWriter};
use crate::bbolt::{self, BboltError, invalid, parse_etcd_revision_key};
use crate::error::{Error, Result, StorageError};
use crate::mvcc::Revision;
use crate::mvcc::record::Record;
use crate::storage::dump::DumpBuilder;
use crate::storage::{MetaKey, Snapshot};

/// The member a snapshot names in its `members` bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdMember {
    /// The member id.
    pub id: u64,
    /// The member name.
    pub name: String,
    /// The advertised peer URLs.
    pub peer_urls: Vec<String>,
    /// The advertised client URLs.
    pub client_urls: Vec<String>,
}

/// A snapshot in etcd's format being streamed (see the module documentation).
#[derive(Debug)]
pub struct EtcdSnapshotStream {
    writer: EtcdWriter<Snapshot>,
    revision: i64,
}

impl EtcdSnapshotStream {
    /// Returns the revision of the state the stream holds (ETCDSNAP-1).
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Returns the exact length of the file, without etcd's SHA-256 trailer.
    pub fn size(&self) -> u64 {
        self.writer.total_bytes()
    }

    /// Appends the next bytes to `out`, at least `chunk_bytes` of them unless the file
    /// ends; returns false once the whole file has been appended.
    pub fn next_chunk(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> Result<bool> {
        Ok(self.writer.fill(out, chunk_bytes)?)
    }
}

impl Engine {
    /// Starts streaming a consistent image of the database in etcd's snapshot format (a
    /// bbolt file with etcd 3.4's buckets), naming `member` as its one member.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let mut stream = engine.etcd_snapshot_stream(&kvd::EtcdMember::default()).unwrap();
    /// let mut file = Vec::new();
    /// while stream.next_chunk(&mut file, 32 * 1024).unwrap() {}
    /// assert_eq!(file.len() as u64, stream.size());
    /// assert_eq!(kvd::etcd_snapshot_status(&file).unwrap().revision, 2);
    /// ```
    pub fn etcd_snapshot_stream(&self, member: &EtcdMember) -> Result<EtcdSnapshotStream> {
        let shared = self.shared()?;
        let snapshot = shared.reads.store.snapshot()?;
        let meta = |key| -> Result<Option<i64>> {
            Ok(snapshot
                .get_meta(key)?
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX)))
        };
        let revision = meta(MetaKey::CurrentRevision)?.unwrap_or(1).max(1);
        let mut meta_bucket: Vec<Entry> = Vec::new();
        let applied = snapshot.get_meta(MetaKey::AppliedIndex)?.unwrap_or(0);
        meta_bucket.push((
            bbolt::META_CONSISTENT_INDEX.to_vec(),
            applied.to_be_bytes().to_vec(),
        ));
        for (key, name) in [
            (
                MetaKey::FinishedCompactRevision,
                bbolt::META_FINISHED_COMPACT,
            ),
            (
                MetaKey::ScheduledCompactRevision,
                bbolt::META_SCHEDULED_COMPACT,
            ),
        ] {
            if let Some(rev) = meta(key)?.filter(|r| *r > 0) {
                meta_bucket.push((name.to_vec(), bbolt::etcd_revision_key(rev, 0, false)));
            }
        }
        meta_bucket.sort();
        let mut leases = Vec::new();
        for (key, value) in snapshot.rows(crate::lease::LEASES_TABLE)? {
            let id = i64::from_be_bytes(be8(&key, "lease id")?);
            let ttl = i64::from_be_bytes(be8(&value, "lease TTL")?);
            leases.push((key, encode_lease(id, ttl)));
        }
        let mut alarms = Vec::new();
        for (key, _) in snapshot.rows(crate::alarm::ALARMS_TABLE)? {
            let (id, kind) = key
                .split_first_chunk::<8>()
                .ok_or_else(|| corrupted_row("alarm"))?;
            let kind = *kind.first().ok_or_else(|| corrupted_row("alarm"))?;
            alarms.push((
                encode_alarm(u64::from_be_bytes(*id), i32::from(kind)),
                Vec::new(),
            ));
        }
        alarms.sort();
        let members = vec![(format!("{:x}", member.id).into_bytes(), member_json(member))];
        let cluster = vec![(b"clusterVersion".to_vec(), bbolt::CLUSTER_VERSION.to_vec())];
        let buckets = vec![
            (bbolt::BUCKET_ALARM.to_vec(), alarms),
            (bbolt::BUCKET_CLUSTER.to_vec(), cluster),
            (bbolt::BUCKET_LEASE.to_vec(), leases),
            (bbolt::BUCKET_MEMBERS.to_vec(), members),
            (bbolt::BUCKET_META.to_vec(), meta_bucket),
        ];
        let writer = EtcdWriter::new(snapshot, buckets)?;
        Ok(EtcdSnapshotStream { writer, revision })
    }
}

fn be8(bytes: &[u8], what: &str) -> Result<[u8; 8]> {
    bytes.try_into().map_err(|_| corrupted_row(what))
}

fn corrupted_row(what: &str) -> Error {
    StorageError::Corrupted(format!("{what} row of the wrong length")).into()
}

/// Returns etcd's JSON of a member (`membership.Member`).
fn member_json(member: &EtcdMember) -> Vec<u8> {
    let list = |urls: &[String]| {
        let quoted: Vec<String> = urls.iter().map(|u| json_string(u)).collect();
        format!("[{}]", quoted.join(","))
    };
    format!(
        r#"{{"id":{},"peerURLs":{},"name":{},"clientURLs":{}}}"#,
        member.id,
        list(&member.peer_urls),
        json_string(&member.name),
        list(&member.client_urls)
    )
    .into_bytes()
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What [`restore_etcd_snapshot`] imported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EtcdRestoreSummary {
    /// The current revision of the restored store.
    pub revision: i64,
    /// The compaction revision (0 if none).
    pub compact_revision: i64,
    /// History entries imported (tombstones included).
    pub history_entries: u64,
    /// Leases imported.
    pub leases: u64,
}

/// The state of an import while the file is walked.
#[derive(Default)]
struct Import {
    image: DumpBuilder,
    summary: EtcdRestoreSummary,
    last_main: i64,
    finished: i64,
    scheduled: i64,
}

impl Import {
    fn entry(&mut self, bucket: &[u8], key: &[u8], value: &[u8]) -> Result<(), BboltError> {
        match bucket {
            bbolt::BUCKET_KEY => self.history(key, value),
            bbolt::BUCKET_META => self.meta(key, value),
            bbolt::BUCKET_LEASE => {
                let (id, ttl) = decode_lease(value)?;
                if key != id.to_be_bytes() {
                    return Err(invalid("lease row whose key is not its id"));
                }
                self.image.row(
                    crate::lease::LEASES_TABLE,
                    &id.to_be_bytes(),
                    &ttl.to_be_bytes(),
                );
                self.summary.leases += 1;
                Ok(())
            }
            // Membership, alarms raised by etcd's members and auth (kvd has none yet) are
            // not part of the imported state.
            _ => Ok(()),
        }
    }

    fn history(&mut self, key: &[u8], value: &[u8]) -> Result<(), BboltError> {
        let (main, sub, tombstone) = parse_etcd_revision_key(key)?;
        if main < 1 || sub < 0 {
            return Err(invalid(format!("revision ({main}, {sub}) out of range")));
        }
        let kv = decode_key_value(value)?;
        if kv.key.is_empty() {
            return Err(invalid(format!("entry at revision {main} without a key")));
        }
        let record = if tombstone {
            Record::tombstone(kv.key.into())
        } else {
            Record {
                key: kv.key.into(),
                tombstone: false,
                create_revision: kv.create_revision,
                version: kv.version,
                lease: kv.lease,
                value: kv.value.into(),
            }
        };
        self.image
            .history(&Revision::new(main, sub).to_key(), &record.encode());
        self.last_main = main;
        self.summary.history_entries += 1;
        Ok(())
    }

    fn meta(&mut self, key: &[u8], value: &[u8]) -> Result<(), BboltError> {
        let slot = match key {
            bbolt::META_FINISHED_COMPACT => &mut self.finished,
            bbolt::META_SCHEDULED_COMPACT => &mut self.scheduled,
            _ => return Ok(()),
        };
        let (main, _, tombstone) = parse_etcd_revision_key(value)?;
        if tombstone || main < 0 {
            return Err(invalid("bad compaction revision in meta"));
        }
        *slot = main;
        Ok(())
    }
}

/// Returns `etcdctl snapshot status`'s numbers for `file` (the trailer, if any, is left
/// out of them as etcdctl does).
pub fn etcd_snapshot_status(file: &[u8]) -> Result<bbolt::status::BboltStatus> {
    let (db, _) = bbolt::read::split_trailer(file);
    Ok(bbolt::status::status(db).map_err(StorageError::from)?)
}

/// Reads `db` (an etcd snapshot's bbolt file without its trailer) whole and returns the
/// kvd dump image with the same state, and what it holds; writes nothing.
pub fn import_etcd_snapshot(db: &[u8]) -> Result<(Vec<u8>, EtcdRestoreSummary)> {
    let reader = Reader::open(db).map_err(StorageError::from)?;
    let mut import = Import::default();
    reader
        .visit(&mut |bucket, key, value| import.entry(bucket, key, value))
        .map_err(StorageError::from)?;
    let compact = import.finished.max(import.scheduled);
    let revision = import.last_main.max(compact).max(1);
    let mut image = std::mem::take(&mut import.image);
    image.meta(MetaKey::SchemaVersion, crate::storage::SCHEMA_VERSION);
    image.meta(MetaKey::CurrentRevision, revision as u64);
    if compact > 0 {
        image.meta(MetaKey::ScheduledCompactRevision, compact as u64);
        image.meta(MetaKey::FinishedCompactRevision, compact as u64);
    }
    let summary = EtcdRestoreSummary {
        revision,
        compact_revision: compact,
        ..import.summary
    };
    Ok((image.finish(), summary))
}

/// Creates a kvd database in `data_dir` from `db`, an etcd snapshot's bbolt file without
/// its trailer (the caller checks it): the same history, compaction revision, current
/// revision and leases (ETCDSNAP-2). `data_dir` must hold no database.
pub fn restore_etcd_snapshot(db: &[u8], data_dir: &Path) -> Result<EtcdRestoreSummary> {
    let (image, summary) = import_etcd_snapshot(db)?;
    let created = !data_dir.exists();
    let result = std::fs::create_dir_all(data_dir)
        .map_err(|e| StorageError::Io(format!("create {}: {e}", data_dir.display())))
        .and_then(|()| crate::storage::dump::restore(&image, data_dir));
    if let Err(e) = result {
        if created {
            let _ = std::fs::remove_dir_all(data_dir);
        }
        return Err(e.into());
    }
    Ok(summary)
}
