//! Snapshots in etcd's format: Maintenance.Snapshot's etcd image of one read snapshot
//! ([`Engine::etcd_snapshot_stream`], written by `bbolt::write`), and a data directory made
//! from an etcd snapshot ([`restore_etcd_snapshot`], read by `bbolt::read`).
//!
//! The mapping (kvd → etcd; the import is its inverse but for `consistent_index`, which it
//! does not read, so a restore writes no `applied_index`):
//! - each history record `(main, sub)` → `key` bucket entry `main(8 BE) _ sub(8 BE)` (`t`
//!   appended for a tombstone) → `mvccpb.KeyValue` (a tombstone holds only the key);
//! - meta `applied_index` → `consistent_index`; the scheduled and finished compaction
//!   revisions → `scheduledCompactRev` and `finishedCompactRev` as revision keys;
//! - each lease row → `lease` bucket, id (8 BE) → `leasepb.Lease` {ID, TTL};
//! - each alarm → `alarm` bucket, `AlarmMember` → empty;
//! - this member → `members` (hex id → JSON) and `cluster` (`clusterVersion` → `3.4.0`);
//! - the auth store, when it is not a fresh one (users, roles, auth enabled or a revision
//!   past 1): the enabled flag and the auth revision → `auth` (`authEnabled` → 1 byte 0/1,
//!   `authRevision` → 8 BE); each user → `authUsers`, name → `authpb.User` {name, the
//!   bcrypt hash as etcd stores it, roles, options{no_password}}; each role → `authRoles`,
//!   name → `authpb.Role` {name, keyPermission{permType, key, range_end}}.
//!
//! On import, alarms keep the member ids etcd stored (as etcd's own restore does), users'
//! roles and roles' permissions are sorted as kvd keeps them (AUTH-STORE-3), and the
//! current revision is the larger of the last `key` entry's main and the
//! compaction revision (etcd's rule), and the compaction revision is the larger of the
//! scheduled and finished ones (etcd resumes a scheduled compaction on start).
//!
//! Invariants:
//! - ETCDSNAP-1: one stream reads one snapshot, as SNAP-1: the file is the committed state
//!   at [`EtcdSnapshotStream::revision`].
//! - ETCDSNAP-2: [`restore_etcd_snapshot`] validates the metas before it creates anything,
//!   then writes records as the walk reads them into a temporary directory that is renamed
//!   into place only when the database is whole and fsynced (SNAP-4), so a kill part way
//!   leaves no partial database in the data directory; on any error it sees (a damaged page
//!   found part way, a write failure) the temporary is removed.
//!
//! Contact points: `server::maintenance` streams it, `kvd snapshot restore|status` import
//! and inspect.

use std::path::Path;

use super::Engine;
use crate::bbolt::proto::{
    decode_alarm, decode_key_value, decode_lease, decode_role, decode_user, encode_alarm,
    encode_lease, encode_role, encode_user,
};
use crate::bbolt::read::Reader;
use crate::bbolt::write::{Entry, EtcdWriter};
use crate::bbolt::{self, BboltError, invalid, parse_etcd_revision_key};
use crate::error::{Error, Result, StorageError};
use crate::mvcc::Revision;
use crate::mvcc::record::Record;
use crate::storage::dump::{DumpBuilder, RestoreWriter};
use crate::storage::{MetaKey, Snapshot};
use crate::storage::{RevisionKey, RowTable};

/// Where an import's records go: a dump image in memory, or a new database file.
trait Sink {
    fn meta(&mut self, key: MetaKey, value: u64) -> std::result::Result<(), StorageError>;
    fn row(
        &mut self,
        table: RowTable,
        key: &[u8],
        value: &[u8],
    ) -> std::result::Result<(), StorageError>;
    fn history(
        &mut self,
        key: &RevisionKey,
        record: &[u8],
    ) -> std::result::Result<(), StorageError>;
}

impl Sink for DumpBuilder {
    fn meta(&mut self, key: MetaKey, value: u64) -> std::result::Result<(), StorageError> {
        DumpBuilder::meta(self, key, value);
        Ok(())
    }

    fn row(
        &mut self,
        table: RowTable,
        key: &[u8],
        value: &[u8],
    ) -> std::result::Result<(), StorageError> {
        DumpBuilder::row(self, table, key, value);
        Ok(())
    }

    fn history(
        &mut self,
        key: &RevisionKey,
        record: &[u8],
    ) -> std::result::Result<(), StorageError> {
        DumpBuilder::history(self, key, record);
        Ok(())
    }
}

impl Sink for RestoreWriter {
    fn meta(&mut self, key: MetaKey, value: u64) -> std::result::Result<(), StorageError> {
        RestoreWriter::meta(self, key, value)
    }

    fn row(
        &mut self,
        table: RowTable,
        key: &[u8],
        value: &[u8],
    ) -> std::result::Result<(), StorageError> {
        RestoreWriter::row(self, table, key, value)
    }

    fn history(
        &mut self,
        key: &RevisionKey,
        record: &[u8],
    ) -> std::result::Result<(), StorageError> {
        RestoreWriter::history(self, key, record)
    }
}

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
        // The writer fills `out` up to a length; the chunk counts from what it holds already.
        Ok(self
            .writer
            .fill(out, out.len().saturating_add(chunk_bytes))?)
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
    /// loop {
    ///     let mut chunk = Vec::new();
    ///     let more = stream.next_chunk(&mut chunk, 32 * 1024).unwrap();
    ///     file.extend_from_slice(&chunk);
    ///     if !more {
    ///         break;
    ///     }
    /// }
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
            let alarm = crate::alarm::decode_key(&key)?;
            let kind = match alarm.alarm {
                crate::api::AlarmType::None => 0,
                crate::api::AlarmType::NoSpace => 1,
                crate::api::AlarmType::Corrupt => 2,
            };
            // The engine raises its own alarms as member 0, which is this member on the
            // wire: the ids 0 and the member's swap, as the server's Alarm answers do.
            let id = match alarm.member_id {
                0 => member.id,
                id if id == member.id => 0,
                id => id,
            };
            alarms.push((encode_alarm(id, kind), Vec::new()));
        }
        alarms.sort();
        let members = vec![(format!("{:x}", member.id).into_bytes(), member_json(member))];
        let cluster = vec![(b"clusterVersion".to_vec(), bbolt::CLUSTER_VERSION.to_vec())];
        let mut buckets = vec![
            (bbolt::BUCKET_ALARM.to_vec(), alarms),
            (bbolt::BUCKET_CLUSTER.to_vec(), cluster),
            (bbolt::BUCKET_LEASE.to_vec(), leases),
            (bbolt::BUCKET_MEMBERS.to_vec(), members),
            (bbolt::BUCKET_META.to_vec(), meta_bucket),
        ];
        buckets.extend(auth_buckets(&snapshot)?);
        let writer = EtcdWriter::new(snapshot, buckets)?;
        Ok(EtcdSnapshotStream { writer, revision })
    }
}

/// Returns the `auth`, `authUsers` and `authRoles` buckets of the auth store in `snapshot`,
/// or none for a fresh store (an etcd starting on the file creates the same state).
fn auth_buckets(snapshot: &Snapshot) -> Result<Vec<(Vec<u8>, Vec<Entry>)>> {
    let store = crate::auth::AuthStore::load(snapshot)?;
    if store == crate::auth::AuthStore::default() {
        return Ok(Vec::new());
    }
    let meta = vec![
        (
            bbolt::AUTH_ENABLED.to_vec(),
            vec![u8::from(store.enabled())],
        ),
        (
            bbolt::AUTH_REVISION.to_vec(),
            store.revision().to_be_bytes().to_vec(),
        ),
    ];
    // The names come sorted (a BTreeMap's order is the bytewise one bbolt needs).
    let users = store
        .user_names()
        .iter()
        .filter_map(|name| store.user(name))
        .map(|user| (user.name.as_bytes().to_vec(), encode_user(user)))
        .collect();
    let roles = store
        .role_names()
        .iter()
        .filter_map(|name| store.role(name))
        .map(|role| (role.name.as_bytes().to_vec(), encode_role(role)))
        .collect();
    Ok(vec![
        (bbolt::BUCKET_AUTH.to_vec(), meta),
        (bbolt::BUCKET_AUTH_ROLES.to_vec(), roles),
        (bbolt::BUCKET_AUTH_USERS.to_vec(), users),
    ])
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
    /// Auth users imported.
    pub auth_users: u64,
    /// Auth roles imported.
    pub auth_roles: u64,
    /// Whether the imported store has auth enabled.
    pub auth_enabled: bool,
}

/// The state of an import while the file is walked.
struct Import<S: Sink> {
    sink: S,
    /// The first error of the sink, which stops the walk.
    failed: Option<StorageError>,
    summary: EtcdRestoreSummary,
    last_main: i64,
    finished: i64,
    scheduled: i64,
}

impl<S: Sink> Import<S> {
    fn new(sink: S) -> Import<S> {
        Import {
            sink,
            failed: None,
            summary: EtcdRestoreSummary::default(),
            last_main: 0,
            finished: 0,
            scheduled: 0,
        }
    }

    /// Records a sink error and returns the error that stops the walk.
    fn sunk(&mut self, result: std::result::Result<(), StorageError>) -> Result<(), BboltError> {
        result.map_err(|e| {
            self.failed = Some(e);
            invalid("the restore stopped: writing failed")
        })
    }

    /// Walks `reader` into the sink, then writes the meta integers; returns the summary.
    fn run(&mut self, reader: &Reader<'_>) -> Result<EtcdRestoreSummary> {
        let walked = reader.visit(&mut |bucket, key, value| self.entry(bucket, key, value));
        if let Some(e) = self.failed.take() {
            return Err(e.into());
        }
        walked.map_err(StorageError::from)?;
        let compact = self.finished.max(self.scheduled);
        let revision = self.last_main.max(compact).max(1);
        self.sink
            .meta(MetaKey::SchemaVersion, crate::storage::SCHEMA_VERSION)?;
        self.sink.meta(MetaKey::CurrentRevision, revision as u64)?;
        if compact > 0 {
            self.sink
                .meta(MetaKey::ScheduledCompactRevision, compact as u64)?;
            self.sink
                .meta(MetaKey::FinishedCompactRevision, compact as u64)?;
        }
        Ok(EtcdRestoreSummary {
            revision,
            compact_revision: compact,
            ..self.summary
        })
    }

    fn entry(&mut self, bucket: &[u8], key: &[u8], value: &[u8]) -> Result<(), BboltError> {
        match bucket {
            bbolt::BUCKET_KEY => self.history(key, value),
            bbolt::BUCKET_META => self.meta(key, value),
            bbolt::BUCKET_LEASE => {
                let (id, ttl) = decode_lease(value)?;
                if key != id.to_be_bytes() {
                    return Err(invalid("lease row whose key is not its id"));
                }
                let written = self.sink.row(
                    crate::lease::LEASES_TABLE,
                    &id.to_be_bytes(),
                    &ttl.to_be_bytes(),
                );
                self.summary.leases += 1;
                self.sunk(written)
            }
            bbolt::BUCKET_ALARM => {
                // etcd keeps its alarms through a restore, under the member ids that
                // raised them; so does kvd (NOSPACE and CORRUPT; others are not alarms).
                let (member_id, kind) = decode_alarm(key)?;
                let alarm = match kind {
                    1 => crate::api::AlarmType::NoSpace,
                    2 => crate::api::AlarmType::Corrupt,
                    _ => return Ok(()),
                };
                let row = crate::alarm::encode_key(crate::api::AlarmMember { member_id, alarm });
                let written = self.sink.row(crate::alarm::ALARMS_TABLE, &row, &[]);
                self.sunk(written)
            }
            bbolt::BUCKET_AUTH => self.auth_meta(key, value),
            bbolt::BUCKET_AUTH_USERS => {
                let user = decode_user(value)?;
                if key != user.name.as_bytes() {
                    return Err(invalid("user row whose key is not its name"));
                }
                let written = self.sink.row(
                    crate::auth::AUTH_USERS_TABLE,
                    key,
                    &crate::auth::user_row(&user),
                );
                self.summary.auth_users += 1;
                self.sunk(written)
            }
            bbolt::BUCKET_AUTH_ROLES => {
                let role = decode_role(value)?;
                if key != role.name.as_bytes() {
                    return Err(invalid("role row whose key is not its name"));
                }
                let written = self.sink.row(
                    crate::auth::AUTH_ROLES_TABLE,
                    key,
                    &crate::auth::role_row(&role),
                );
                self.summary.auth_roles += 1;
                self.sunk(written)
            }
            // Membership is not part of the imported state.
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
            Record::tombstone(kv.key)
        } else {
            Record {
                key: kv.key,
                tombstone: false,
                create_revision: kv.create_revision,
                version: kv.version,
                lease: kv.lease,
                value: kv.value,
            }
        };
        let at = Revision::new(main, sub).to_key();
        let written = self.sink.history(&at, &record.encode(&at));
        self.last_main = main;
        self.summary.history_entries += 1;
        self.sunk(written)
    }

    /// Imports `auth`'s two keys as the `auth_meta` rows, whose values are etcd's bytes.
    fn auth_meta(&mut self, key: &[u8], value: &[u8]) -> Result<(), BboltError> {
        let row = match key {
            bbolt::AUTH_ENABLED => match value {
                [0] | [1] => {
                    self.summary.auth_enabled = value == [1];
                    crate::auth::ENABLED_KEY
                }
                _ => return Err(invalid("authEnabled is not one byte 0 or 1")),
            },
            bbolt::AUTH_REVISION => {
                if value.len() != 8 {
                    return Err(invalid("authRevision is not 8 bytes"));
                }
                crate::auth::REVISION_KEY
            }
            _ => return Ok(()),
        };
        let written = self.sink.row(crate::auth::AUTH_META_TABLE, row, value);
        self.sunk(written)
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
    let mut import = Import::new(DumpBuilder::new());
    let summary = import.run(&reader)?;
    Ok((import.sink.finish(), summary))
}

/// Creates a kvd database in `data_dir` from `db`, an etcd snapshot's bbolt file without
/// its trailer (the caller checks it): the same history, compaction revision, current
/// revision, leases, alarms and auth store (ETCDSNAP-2). `data_dir` must hold no database. Records go to the
/// database as they are read, so memory holds the file and one commit's rows. The database
/// appears in `data_dir` whole or not at all, even if the process is killed part way (SNAP-4).
pub fn restore_etcd_snapshot(db: &[u8], data_dir: &Path) -> Result<EtcdRestoreSummary> {
    let reader = Reader::open(db).map_err(StorageError::from)?;
    // SNAP-4: built under a temporary name and renamed into place once whole and durable;
    // on an error the temporary is removed with the database file in it (ETCDSNAP-2).
    super::snapshot::restore_atomically(data_dir, |building| {
        let mut import = Import::new(RestoreWriter::create(building)?);
        let summary = import.run(&reader)?;
        import.sink.finish()?;
        Ok(summary)
    })
}
