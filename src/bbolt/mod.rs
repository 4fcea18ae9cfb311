//! etcd's snapshot format: a bbolt v1.3.6 database file holding etcd 3.4's buckets, written
//! from kvd's history ([`write`]) and read back into it ([`read`]).
//!
//! Owns: bbolt's page layout (pages, metas, leaf and branch elements, bucket headers), the
//! FNV-1a meta checksum, and the hand-written protobuf encodings of the etcd messages stored
//! in the buckets (`mvccpb.KeyValue`, `leasepb.Lease`, `etcdserverpb.AlarmMember`,
//! `authpb.User`, `authpb.Role`).
//!
//! Format facts used here (bbolt native order is little-endian on every platform kvd runs
//! on; every integer etcd stores inside keys and values is big-endian):
//! - page `n` starts at `n × page_size`; pages 0 and 1 are metas; a node larger than a page
//!   runs on over `overflow` contiguous pages that have no header;
//! - page header: `id` u64, `flags` u16 (branch 1, leaf 2, meta 4, freelist 0x10), `count`
//!   u16, `overflow` u32;
//! - meta (at page offset 16): magic `0xED0CDAED`, version 2, page size, flags, root bucket
//!   header (root pgid, sequence), freelist pgid (`u64::MAX` = none, etcd's choice on
//!   Linux), high-water pgid, txid, FNV-1a 64 of the 56 bytes before the checksum;
//! - leaf element: flags u32 (1 = sub-bucket), pos u32 (from the element to its key), ksize,
//!   vsize; branch element: pos, ksize, child pgid; keys sorted bytewise;
//! - bucket value: root pgid u64 (0 = inline: a leaf page follows inside the value),
//!   sequence u64.
//!
//! Invariants:
//! - BBOLT-1: the writer's files satisfy every check of the reader (`read::Reader::open`
//!   and its walk), and every page id they reference is below the high-water mark.
//! - BBOLT-2: the reader is total: any bytes give entries or a [`BboltError`], never a
//!   panic, and a walk visits each page at most once.
//!
//! Contact points: `engine::etcd_snapshot` streams [`write::EtcdWriter`] for
//! Maintenance.Snapshot and restores from [`read::Reader`].

pub mod proto;
pub mod read;
pub mod status;
pub mod write;

/// bbolt's magic number.
pub const MAGIC: u32 = 0xED0C_DAED;
/// bbolt's file format version.
pub const VERSION: u32 = 2;
/// The page size kvd writes (Linux amd64's, which etcd uses).
pub const PAGE_BYTES: usize = 4096;
/// Bytes of a page header.
pub const PAGE_HEADER_BYTES: usize = 16;
/// Bytes of a leaf or branch element.
pub const ELEMENT_BYTES: usize = 16;
/// Bytes of a bucket header.
pub const BUCKET_HEADER_BYTES: usize = 16;
/// The meta's freelist pgid meaning "no freelist page".
pub const NO_FREELIST: u64 = u64::MAX;
/// Page flag of a branch page.
pub const FLAG_BRANCH: u16 = 0x01;
/// Page flag of a leaf page.
pub const FLAG_LEAF: u16 = 0x02;
/// Page flag of a meta page.
pub const FLAG_META: u16 = 0x04;
/// Leaf element flag of a sub-bucket.
pub const FLAG_BUCKET: u32 = 0x01;
/// Most elements in one node (bbolt refuses 0xFFFF).
pub const NODE_ELEMENTS_MAX: usize = 0xFFFE;
/// Largest total size of a bucket that is written inline (bbolt's `pageSize / 4`).
pub const INLINE_BUCKET_BYTES_MAX: usize = PAGE_BYTES / 4;
/// etcd's bucket of the MVCC history.
pub const BUCKET_KEY: &[u8] = b"key";
/// etcd's bucket of the consistent index and the compaction revisions.
pub const BUCKET_META: &[u8] = b"meta";
/// etcd's bucket of leases.
pub const BUCKET_LEASE: &[u8] = b"lease";
/// etcd's bucket of alarms.
pub const BUCKET_ALARM: &[u8] = b"alarm";
/// etcd's bucket of members.
pub const BUCKET_MEMBERS: &[u8] = b"members";
/// etcd's bucket of the cluster version.
pub const BUCKET_CLUSTER: &[u8] = b"cluster";
/// etcd's bucket of the auth enabled flag and the auth revision.
pub const BUCKET_AUTH: &[u8] = b"auth";
/// etcd's bucket of users: name → `authpb.User`.
pub const BUCKET_AUTH_USERS: &[u8] = b"authUsers";
/// etcd's bucket of roles: name → `authpb.Role`.
pub const BUCKET_AUTH_ROLES: &[u8] = b"authRoles";
/// `auth` key of the enabled flag (one byte, 0 or 1).
pub const AUTH_ENABLED: &[u8] = b"authEnabled";
/// `auth` key of the auth revision (8-byte big-endian).
pub const AUTH_REVISION: &[u8] = b"authRevision";
/// `meta` key of the last applied raft index (8-byte big-endian).
pub const META_CONSISTENT_INDEX: &[u8] = b"consistent_index";
/// `meta` key of the scheduled compaction revision (a 17-byte revision key).
pub const META_SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
/// `meta` key of the finished compaction revision (a 17-byte revision key).
pub const META_FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
/// Bytes of a revision key of the `key` bucket: main, `_`, sub.
pub const ETCD_REVISION_BYTES: usize = 17;
/// The byte between main and sub in a revision key.
pub const REVISION_SEPARATOR: u8 = b'_';
/// The suffix marking a tombstone's revision key.
pub const TOMBSTONE_MARK: u8 = b't';
/// The cluster version written to `cluster` (etcd 3.4's major.minor.0).
pub const CLUSTER_VERSION: &[u8] = b"3.4.0";

/// A malformed bbolt file or etcd bucket entry (BBOLT-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BboltError(pub String);

impl std::fmt::Display for BboltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd snapshot: {}", self.0)
    }
}

impl std::error::Error for BboltError {}

impl From<BboltError> for crate::error::StorageError {
    fn from(e: BboltError) -> Self {
        crate::error::StorageError::Corrupted(e.to_string())
    }
}

/// Returns an error with `what`.
pub(crate) fn invalid(what: impl Into<String>) -> BboltError {
    BboltError(what.into())
}

/// Returns bbolt's meta checksum: FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Returns etcd's 17-byte revision key of `(main, sub)`, with the tombstone mark if `tombstone`.
pub fn etcd_revision_key(main: i64, sub: i64, tombstone: bool) -> Vec<u8> {
    let mut key = Vec::with_capacity(ETCD_REVISION_BYTES + 1);
    key.extend_from_slice(&main.to_be_bytes());
    key.push(REVISION_SEPARATOR);
    key.extend_from_slice(&sub.to_be_bytes());
    if tombstone {
        key.push(TOMBSTONE_MARK);
    }
    key
}

/// Parses etcd's revision key into `(main, sub, tombstone)`.
pub fn parse_etcd_revision_key(key: &[u8]) -> Result<(i64, i64, bool), BboltError> {
    let tombstone = match key.len() {
        ETCD_REVISION_BYTES => false,
        18 if key[ETCD_REVISION_BYTES] == TOMBSTONE_MARK => true,
        _ => return Err(invalid(format!("bad revision key of {} bytes", key.len()))),
    };
    if key[8] != REVISION_SEPARATOR {
        return Err(invalid("revision key without its `_` separator"));
    }
    let int = |from: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&key[from..from + 8]);
        i64::from_be_bytes(b)
    };
    Ok((int(0), int(9), tombstone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_the_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn revision_keys_round_trip() {
        let key = etcd_revision_key(2, 0, false);
        assert_eq!(key, [0, 0, 0, 0, 0, 0, 0, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_etcd_revision_key(&key), Ok((2, 0, false)));
        let t = etcd_revision_key(5, 3, true);
        assert_eq!(t.len(), 18);
        assert_eq!(parse_etcd_revision_key(&t), Ok((5, 3, true)));
        assert!(parse_etcd_revision_key(&key[..16]).is_err());
        let mut bad = key.clone();
        bad[8] = b'x';
        assert!(parse_etcd_revision_key(&bad).is_err());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests_format;
