//! Request and response types of the engine, mirroring etcd's `etcdserverpb` and `mvccpb`
//! messages without depending on protobuf.
//!
//! Owns: the plain data the engine takes and returns. No behaviour lives here beyond small
//! constructors and the request-size estimate that admission needs.
//!
//! Invariants:
//! - API-1: field names and meanings are etcd's, so the server maps
//!   them one-to-one; where etcd's wire form has a quirk that a type can express more
//!   precisely (a compare's operand lives in the variant of its target), the server resolves
//!   the quirk when it translates.
//! - API-2: `encoded_len` functions return the protobuf-encoded length of the message as etcd
//!   would marshal it inside its raft entry, so the request-size limit matches etcd's.
//!
//! Contact points: `engine` consumes requests and produces responses; `server` (later)
//! translates to and from protobuf.

use bytes::Bytes;

/// The header every response carries. The engine fills `revision`; the server adds the
/// cluster and member ids.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let put = engine.put(kvd::PutRequest::new("k", "v")).unwrap();
/// assert_eq!(put.header, kvd::ResponseHeader { revision: 2 });
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseHeader {
    /// The store revision after the request (etcd's `header.revision`).
    pub revision: i64,
}

/// One key at one revision, as etcd's `mvccpb.KeyValue`.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// engine.put(kvd::PutRequest::new("k", "v1")).unwrap();
/// engine.put(kvd::PutRequest::new("k", "v2")).unwrap();
/// let kv = &engine.range(&kvd::RangeRequest::key("k")).unwrap().kvs[0];
/// assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValue {
    /// The key bytes.
    pub key: Bytes,
    /// Main revision of the Put that created the current generation of the key.
    pub create_revision: i64,
    /// Main revision of the last change to the key.
    pub mod_revision: i64,
    /// Number of Puts in the current generation (1 on creation).
    pub version: i64,
    /// The value bytes.
    pub value: Bytes,
    /// The lease attached to the key, 0 for none.
    pub lease: i64,
}

/// Sort order of a Range (etcd's `RangeRequest.SortOrder`).
///
/// ```
/// let newest_first = kvd::RangeRequest {
///     sort_order: kvd::SortOrder::Descend,
///     sort_target: kvd::SortTarget::Mod,
///     ..kvd::RangeRequest::prefix("jobs/")
/// };
/// assert_eq!(newest_first.sort_order, kvd::SortOrder::Descend);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SortOrder {
    /// Natural key order, no sort requested.
    #[default]
    None,
    /// Ascending by the sort target.
    Ascend,
    /// Descending by the sort target.
    Descend,
}

/// What a Range sorts by (etcd's `RangeRequest.SortTarget`).
///
/// ```
/// assert_eq!(kvd::SortTarget::default(), kvd::SortTarget::Key);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum SortTarget {
    /// The key bytes.
    #[default]
    Key,
    /// The version.
    Version,
    /// The create revision.
    Create,
    /// The mod revision.
    Mod,
    /// The value bytes.
    Value,
}

/// A read of a key or a key range at a revision (etcd's `RangeRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RangeRequest {
    /// The first key of the range; must not be empty.
    pub key: Bytes,
    /// Empty for a single key, `"\0"` for every key from `key`, else the exclusive end.
    pub range_end: Bytes,
    /// Maximum number of keys returned; 0 or less means no limit.
    pub limit: i64,
    /// The revision to read at; 0 or less means the current revision.
    pub revision: i64,
    /// Sort order.
    pub sort_order: SortOrder,
    /// Sort target.
    pub sort_target: SortTarget,
    /// Serializable read; equivalent to linearizable on a single node.
    pub serializable: bool,
    /// Return keys without values.
    pub keys_only: bool,
    /// Return only the count.
    pub count_only: bool,
    /// Drop keys whose mod revision is below this (0 = no filter).
    pub min_mod_revision: i64,
    /// Drop keys whose mod revision is above this (0 = no filter).
    pub max_mod_revision: i64,
    /// Drop keys whose create revision is below this (0 = no filter).
    pub min_create_revision: i64,
    /// Drop keys whose create revision is above this (0 = no filter).
    pub max_create_revision: i64,
}

impl RangeRequest {
    /// Returns a request for the single key `key` at the current revision.
    ///
    /// ```
    /// let req = kvd::RangeRequest::key("a");
    /// assert!(req.range_end.is_empty());
    /// ```
    pub fn key(key: impl Into<Bytes>) -> RangeRequest {
        RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        }
    }

    /// Returns a request for every key that starts with `prefix`, computing `range_end`
    /// as etcd's clients do.
    ///
    /// ```
    /// let req = kvd::RangeRequest::prefix("a/");
    /// assert_eq!(&req.range_end[..], b"a0");
    /// ```
    pub fn prefix(prefix: impl Into<Bytes>) -> RangeRequest {
        let key: Bytes = prefix.into();
        let range_end = prefix_end(&key);
        RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        bytes_field(1, &self.key)
            + bytes_field(2, &self.range_end)
            + int_field(3, self.limit)
            + int_field(4, self.revision)
            + int_field(5, self.sort_order as i64)
            + int_field(6, self.sort_target as i64)
            + bool_field(7, self.serializable)
            + bool_field(8, self.keys_only)
            + bool_field(9, self.count_only)
            + int_field(10, self.min_mod_revision)
            + int_field(11, self.max_mod_revision)
            + int_field(12, self.min_create_revision)
            + int_field(13, self.max_create_revision)
    }
}

/// Returns the `range_end` that selects every key starting with `prefix`, as etcd's
/// clients compute it (`"\0"` when every byte is 0xFF or the prefix is empty).
///
/// ```
/// assert_eq!(&kvd::prefix_end(b"ab")[..], b"ac");
/// assert_eq!(&kvd::prefix_end(b"a\xff")[..], b"b");
/// assert_eq!(&kvd::prefix_end(b"\xff")[..], b"\0");
/// ```
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

/// The answer to a Range (etcd's `RangeResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// for k in ["a", "b", "c"] { engine.put(kvd::PutRequest::new(k, "v")).unwrap(); }
/// let got = engine.range(&kvd::RangeRequest { limit: 2, ..kvd::RangeRequest::key("a") }).unwrap();
/// assert_eq!(got.count, 1);
/// let all = engine.range(&kvd::RangeRequest { limit: 2, range_end: "\0".into(), ..kvd::RangeRequest::key("a") }).unwrap();
/// assert_eq!((all.kvs.len(), all.more, all.count), (2, true, 3));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// Header; `revision` is the current store revision, whatever revision was read.
    pub header: ResponseHeader,
    /// The keys, after filters, sort and limit.
    pub kvs: Vec<KeyValue>,
    /// True if the limit cut the result short.
    pub more: bool,
    /// The number of keys in the range at the read revision, before filters and limit.
    pub count: i64,
}

/// A write of one key (etcd's `PutRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PutRequest {
    /// The key; must not be empty.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// The lease to attach, 0 for none.
    pub lease: i64,
    /// Return the previous key-value.
    pub prev_kv: bool,
    /// Keep the current value (the key must exist, `value` must be empty).
    pub ignore_value: bool,
    /// Keep the current lease (the key must exist, `lease` must be 0).
    pub ignore_lease: bool,
}

impl PutRequest {
    /// Returns a plain Put of `value` at `key`.
    ///
    /// ```
    /// let req = kvd::PutRequest::new("k", "v");
    /// assert_eq!(&req.value[..], b"v");
    /// ```
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> PutRequest {
        PutRequest {
            key: key.into(),
            value: value.into(),
            ..PutRequest::default()
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        bytes_field(1, &self.key)
            + bytes_field(2, &self.value)
            + int_field(3, self.lease)
            + bool_field(4, self.prev_kv)
            + bool_field(5, self.ignore_value)
            + bool_field(6, self.ignore_lease)
    }
}

/// The answer to a Put (etcd's `PutResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let first = engine.put(kvd::PutRequest { prev_kv: true, ..kvd::PutRequest::new("k", "v") }).unwrap();
/// assert!(first.prev_kv.is_none(), "a new key has no previous value");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutResponse {
    /// Header; `revision` is the revision of the write.
    pub header: ResponseHeader,
    /// The previous key-value, if asked for and the key existed.
    pub prev_kv: Option<KeyValue>,
}

/// A delete of a key or a range (etcd's `DeleteRangeRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DeleteRangeRequest {
    /// The first key; must not be empty.
    pub key: Bytes,
    /// Same conventions as [`RangeRequest::range_end`].
    pub range_end: Bytes,
    /// Return the deleted key-values.
    pub prev_kv: bool,
}

impl DeleteRangeRequest {
    /// Returns a delete of the single key `key`.
    ///
    /// ```
    /// let req = kvd::DeleteRangeRequest::key("k");
    /// assert!(req.range_end.is_empty());
    /// ```
    pub fn key(key: impl Into<Bytes>) -> DeleteRangeRequest {
        DeleteRangeRequest {
            key: key.into(),
            ..DeleteRangeRequest::default()
        }
    }

    /// Returns a delete of every key that starts with `prefix`.
    ///
    /// ```
    /// let req = kvd::DeleteRangeRequest::prefix("a/");
    /// assert_eq!(&req.range_end[..], b"a0");
    /// ```
    pub fn prefix(prefix: impl Into<Bytes>) -> DeleteRangeRequest {
        let key: Bytes = prefix.into();
        let range_end = prefix_end(&key);
        DeleteRangeRequest {
            key,
            range_end,
            prev_kv: false,
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        bytes_field(1, &self.key) + bytes_field(2, &self.range_end) + bool_field(3, self.prev_kv)
    }
}

/// The answer to a DeleteRange (etcd's `DeleteRangeResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let nothing = engine.delete_range(kvd::DeleteRangeRequest::key("missing")).unwrap();
/// assert_eq!((nothing.deleted, nothing.header.revision), (0, 1), "no change, no new revision");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteRangeResponse {
    /// Header; the new revision if anything was deleted, else the current one.
    pub header: ResponseHeader,
    /// The number of keys deleted.
    pub deleted: i64,
    /// The deleted key-values, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

/// The comparison of a Txn compare (etcd's `Compare.CompareResult`).
///
/// ```
/// use kvd::{Compare, CompareResult, CompareTarget};
/// let newer_than_10 = Compare::new("k", CompareResult::Greater, CompareTarget::Mod(10));
/// assert_eq!(newer_than_10.result, CompareResult::Greater);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CompareResult {
    /// The key's field equals the operand.
    #[default]
    Equal,
    /// The key's field is greater than the operand.
    Greater,
    /// The key's field is less than the operand.
    Less,
    /// The key's field differs from the operand.
    NotEqual,
}

/// What a compare looks at, with its operand (etcd's `Compare.target` and `target_union`).
///
/// ```
/// let exists = kvd::CompareTarget::Create(0);
/// assert_eq!(exists, kvd::CompareTarget::Create(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CompareTarget {
    /// The key's version.
    Version(i64),
    /// The key's create revision.
    Create(i64),
    /// The key's mod revision.
    Mod(i64),
    /// The key's value, compared bytewise.
    Value(Bytes),
    /// The key's lease.
    Lease(i64),
}

impl Default for CompareTarget {
    fn default() -> CompareTarget {
        CompareTarget::Version(0)
    }
}

/// One condition of a Txn (etcd's `Compare`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Compare {
    /// The key; must not be empty.
    pub key: Bytes,
    /// Optional range end: the compare must hold for every key in the range.
    pub range_end: Bytes,
    /// The comparison.
    pub result: CompareResult,
    /// The target field and operand.
    pub target: CompareTarget,
}

impl Compare {
    /// Returns a compare of `key`'s `target` against its operand with `result`.
    ///
    /// ```
    /// use kvd::{Compare, CompareResult, CompareTarget};
    /// let c = Compare::new("k", CompareResult::Equal, CompareTarget::Version(0));
    /// assert_eq!(&c.key[..], b"k");
    /// ```
    pub fn new(key: impl Into<Bytes>, result: CompareResult, target: CompareTarget) -> Compare {
        Compare {
            key: key.into(),
            range_end: Bytes::new(),
            result,
            target,
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        // The operand is a oneof member, which protobuf writes even when it is zero.
        let (target, operand) = match &self.target {
            CompareTarget::Version(v) => (0, oneof_int_field(4, *v)),
            CompareTarget::Create(v) => (1, oneof_int_field(5, *v)),
            CompareTarget::Mod(v) => (2, oneof_int_field(6, *v)),
            CompareTarget::Value(v) => (3, 1 + varint_len(v.len() as u64) + v.len()),
            CompareTarget::Lease(v) => (4, oneof_int_field(8, *v)),
        };
        int_field(1, self.result as i64)
            + int_field(2, target)
            + bytes_field(3, &self.key)
            + operand
            + bytes_field(64, &self.range_end)
    }
}

/// One operation of a Txn branch (etcd's `RequestOp`).
///
/// ```
/// let op = kvd::RequestOp::Put(kvd::PutRequest::new("k", "v"));
/// assert!(matches!(op, kvd::RequestOp::Put(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestOp {
    /// A read.
    Range(RangeRequest),
    /// A write.
    Put(PutRequest),
    /// A delete.
    DeleteRange(DeleteRangeRequest),
    /// A nested transaction.
    Txn(TxnRequest),
}

impl RequestOp {
    pub(crate) fn encoded_len(&self) -> usize {
        match self {
            RequestOp::Range(r) => message_field(1, r.encoded_len()),
            RequestOp::Put(r) => message_field(2, r.encoded_len()),
            RequestOp::DeleteRange(r) => message_field(3, r.encoded_len()),
            RequestOp::Txn(r) => message_field(4, r.encoded_len()),
        }
    }
}

/// The answer to one operation of a Txn (etcd's `ResponseOp`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let txn = kvd::TxnRequest { success: vec![kvd::RequestOp::Put(kvd::PutRequest::new("k", "v"))], ..Default::default() };
/// let resp = engine.txn(txn).unwrap();
/// assert!(matches!(resp.responses[0], kvd::ResponseOp::Put(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseOp {
    /// The answer to a read.
    Range(RangeResponse),
    /// The answer to a write.
    Put(PutResponse),
    /// The answer to a delete.
    DeleteRange(DeleteRangeResponse),
    /// The answer to a nested transaction.
    Txn(TxnResponse),
}

/// A transaction (etcd's `TxnRequest`): if every compare holds, run `success`, else `failure`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TxnRequest {
    /// The conditions, ANDed.
    pub compare: Vec<Compare>,
    /// The operations run when every compare holds.
    pub success: Vec<RequestOp>,
    /// The operations run otherwise.
    pub failure: Vec<RequestOp>,
}

impl TxnRequest {
    /// Returns true if no operation of either branch (nested ones included) writes.
    ///
    /// ```
    /// use kvd::{RequestOp, RangeRequest, TxnRequest};
    /// let txn = TxnRequest { success: vec![RequestOp::Range(RangeRequest::key("k"))], ..Default::default() };
    /// assert!(txn.is_read_only());
    /// ```
    pub fn is_read_only(&self) -> bool {
        self.success
            .iter()
            .chain(&self.failure)
            .all(|op| matches!(op, RequestOp::Range(_)))
    }

    pub(crate) fn encoded_len(&self) -> usize {
        let compares: usize = self
            .compare
            .iter()
            .map(|c| message_field(1, c.encoded_len()))
            .sum();
        let success: usize = self
            .success
            .iter()
            .map(|o| message_field(2, o.encoded_len()))
            .sum();
        let failure: usize = self
            .failure
            .iter()
            .map(|o| message_field(3, o.encoded_len()))
            .sum();
        compares + success + failure
    }
}

/// The answer to a Txn (etcd's `TxnResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let empty = engine.txn(kvd::TxnRequest::default()).unwrap();
/// assert!(empty.succeeded && empty.responses.is_empty());
/// assert_eq!(empty.header.revision, 1);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnResponse {
    /// Header; the new revision if anything changed, else the current one. Nested
    /// transactions carry an all-zero header, as etcd's do.
    pub header: ResponseHeader,
    /// True if every compare held.
    pub succeeded: bool,
    /// One response per operation of the branch that ran.
    pub responses: Vec<ResponseOp>,
}

/// A compaction (etcd's `CompactionRequest`).
///
/// ```
/// let wait_for_deletes = kvd::CompactionRequest { revision: 100, physical: true };
/// assert!(wait_for_deletes.physical);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CompactionRequest {
    /// Revisions below this one are dropped (the newest revision of each live key at or
    /// below it is kept).
    pub revision: i64,
    /// Wait until the superseded revisions are physically deleted.
    pub physical: bool,
}

/// The answer to a compaction.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let resp = engine.compact(kvd::CompactionRequest { revision: 1, physical: false }).unwrap();
/// assert_eq!(resp.header.revision, 1, "compaction never moves the revision");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionResponse {
    /// Header; compaction never moves the revision.
    pub header: ResponseHeader,
}

/// The answer to HashKV (etcd's `HashKVResponse`, 3.6 shape).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let h = engine.hash_kv(0).unwrap();
/// assert_eq!((h.compact_revision, h.hash_revision), (-1, 1));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HashKvResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// CRC-32 (IEEE, `crc32fast`) over the history visible up to `hash_revision`.
    pub hash: u32,
    /// The compaction revision at the time of the hash.
    pub compact_revision: i64,
    /// The revision the hash covers.
    pub hash_revision: i64,
}

/// A snapshot of the engine's state, for etcd's Status.
///
/// `db_size_in_use` counts the pages redb has allocated inside the file, pages pinned by
/// readers included; it is what the space quota is measured against.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
/// let status = engine.status().unwrap();
/// assert_eq!((status.header.revision, status.applied_index), (2, 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// The compaction revision (etcd's compactMainRev; -1 if never compacted).
    pub compact_revision: i64,
    /// The length of the database file in bytes (etcd's `dbSize`).
    pub db_size: u64,
    /// Bytes the database occupies inside its file (etcd's `dbSizeInUse`).
    pub db_size_in_use: u64,
    /// The number of write requests applied since the store was created.
    pub applied_index: u64,
    /// The space quota in bytes (etcd 3.6's `dbSizeQuota`); 0 when the quota is disabled.
    pub db_size_quota: u64,
    /// The active alarms.
    pub alarms: Vec<AlarmMember>,
}

/// A lease grant (etcd's `LeaseGrantRequest`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let lease = engine.lease_grant(kvd::LeaseGrantRequest { ttl: 1, id: 0 }).unwrap();
/// assert_eq!(lease.ttl, 2, "raised to the minimum TTL");
/// assert!(lease.id > 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeaseGrantRequest {
    /// The time to live in seconds; below the minimum it is raised to it.
    pub ttl: i64,
    /// The lease id; 0 lets the engine choose one.
    pub id: i64,
}

/// The answer to a lease grant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseGrantResponse {
    /// Header; a grant does not move the revision.
    pub header: ResponseHeader,
    /// The lease id.
    pub id: i64,
    /// The granted TTL in seconds.
    pub ttl: i64,
}

/// A lease revoke (etcd's `LeaseRevokeRequest`).
///
/// ```
/// let req = kvd::LeaseRevokeRequest { id: 7 };
/// assert_eq!(req.id, 7);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeaseRevokeRequest {
    /// The lease to revoke.
    pub id: i64,
}

/// The answer to a lease revoke.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseRevokeResponse {
    /// Header; the new revision if keys were deleted.
    pub header: ResponseHeader,
}

/// The answer to a keep-alive (etcd's `LeaseKeepAliveResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// assert_eq!(engine.lease_keep_alive(12345).unwrap().ttl, 0, "unknown lease: TTL 0, no error");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseKeepAliveResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// The lease id.
    pub id: i64,
    /// The renewed TTL; 0 if the lease does not exist.
    pub ttl: i64,
}

/// The answer to TimeToLive (etcd's `LeaseTimeToLiveResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// assert_eq!(engine.lease_time_to_live(12345, false).unwrap().ttl, -1, "unknown lease");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseTimeToLiveResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// The lease id.
    pub id: i64,
    /// Seconds left; -1 if the lease does not exist.
    pub ttl: i64,
    /// The granted TTL; 0 if the lease does not exist.
    pub granted_ttl: i64,
    /// The attached keys, if asked for, in key order.
    pub keys: Vec<Bytes>,
}

/// The answer to Leases (etcd's `LeaseLeasesResponse`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// assert!(engine.lease_leases().unwrap().leases.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseLeasesResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// Every lease id, soonest expiry first.
    pub leases: Vec<i64>,
}

/// A new watch on a key or a range (etcd's `WatchCreateRequest`).
///
/// ```
/// let req = kvd::WatchCreateRequest { start_revision: 5, prev_kv: true, ..kvd::WatchCreateRequest::prefix("jobs/") };
/// assert_eq!(&req.range_end[..], b"jobs0");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchCreateRequest {
    /// The key; empty means `"\0"` (every key from the start).
    pub key: Bytes,
    /// Same conventions as [`RangeRequest::range_end`].
    pub range_end: Bytes,
    /// The first revision to report; 0 means the next revision.
    pub start_revision: i64,
    /// Send a progress response now and then when there are no events.
    pub progress_notify: bool,
    /// Drop PUT events.
    pub no_put: bool,
    /// Drop DELETE events.
    pub no_delete: bool,
    /// Attach the previous key-value to each event.
    pub prev_kv: bool,
    /// The watch id to use; 0 lets the stream choose.
    pub watch_id: i64,
}

impl WatchCreateRequest {
    /// Returns a watch of the single key `key` from the next revision.
    ///
    /// ```
    /// let req = kvd::WatchCreateRequest::key("k");
    /// assert_eq!(req.start_revision, 0);
    /// ```
    pub fn key(key: impl Into<Bytes>) -> WatchCreateRequest {
        WatchCreateRequest {
            key: key.into(),
            ..WatchCreateRequest::default()
        }
    }

    /// Returns a watch of every key starting with `prefix` from the next revision.
    ///
    /// ```
    /// let req = kvd::WatchCreateRequest::prefix("a/");
    /// assert_eq!(&req.range_end[..], b"a0");
    /// ```
    pub fn prefix(prefix: impl Into<Bytes>) -> WatchCreateRequest {
        let key: Bytes = prefix.into();
        let range_end = prefix_end(&key);
        WatchCreateRequest {
            key,
            range_end,
            ..WatchCreateRequest::default()
        }
    }
}

/// The kind of a watch event (etcd's `Event.EventType`).
///
/// ```
/// assert_ne!(kvd::EventType::Put, kvd::EventType::Delete);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventType {
    /// A Put.
    #[default]
    Put,
    /// A delete.
    Delete,
}

/// One change seen by a watch (etcd's `mvccpb.Event`).
///
/// ```
/// let e = kvd::Event::default();
/// assert_eq!(e.kind, kvd::EventType::Put);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// Put or delete.
    pub kind: EventType,
    /// The new key-value; for a delete only the key and the mod revision.
    pub kv: KeyValue,
    /// The key-value before the change, if asked for and not compacted away.
    pub prev_kv: Option<KeyValue>,
}

/// A message on a watch stream (etcd's `WatchResponse`).
///
/// ```
/// let r = kvd::WatchResponse::default();
/// assert!(!r.created && !r.canceled && r.events.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchResponse {
    /// Header: the revision of the events (live), or the current revision (catch-up,
    /// created, canceled, progress).
    pub header: ResponseHeader,
    /// The watch this is about; -1 for a stream-wide progress response or a refused create.
    pub watch_id: i64,
    /// The watch was created.
    pub created: bool,
    /// The watch ended.
    pub canceled: bool,
    /// If the watch ended because its start was compacted: the compaction revision.
    pub compact_revision: i64,
    /// Why the watch ended, if the server ended it.
    pub cancel_reason: String,
    /// The events, in revision order; all events of one revision are in one response.
    pub events: Vec<Event>,
}

/// The kinds of alarm (etcd's `AlarmType`).
///
/// ```
/// assert_eq!(kvd::AlarmType::NoSpace.name(), "NOSPACE");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlarmType {
    /// No alarm; in a GET it means every kind.
    #[default]
    None,
    /// The space quota or the filesystem reserve was hit: writes that cost space stop.
    NoSpace,
    /// An integrity check failed: every write stops.
    Corrupt,
}

impl AlarmType {
    /// Returns etcd's name of the alarm.
    pub fn name(self) -> &'static str {
        match self {
            AlarmType::None => "NONE",
            AlarmType::NoSpace => "NOSPACE",
            AlarmType::Corrupt => "CORRUPT",
        }
    }
}

/// One raised alarm (etcd's `AlarmMember`).
///
/// ```
/// let a = kvd::AlarmMember { member_id: 7, alarm: kvd::AlarmType::NoSpace };
/// assert_eq!(a.alarm, kvd::AlarmType::NoSpace);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AlarmMember {
    /// The member that raised it.
    pub member_id: u64,
    /// The kind.
    pub alarm: AlarmType,
}

/// What an alarm request does (etcd's `AlarmRequest.AlarmAction`).
///
/// ```
/// assert_eq!(kvd::AlarmAction::default(), kvd::AlarmAction::Get);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AlarmAction {
    /// List alarms (of one kind, or all with `AlarmType::None`).
    #[default]
    Get,
    /// Raise an alarm.
    Activate,
    /// Clear an alarm.
    Deactivate,
}

/// An alarm request (etcd's `AlarmRequest`).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
/// let all = engine.alarm(kvd::AlarmRequest::default()).unwrap();
/// assert!(all.alarms.is_empty());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlarmRequest {
    /// Get, activate or deactivate.
    pub action: AlarmAction,
    /// The member the alarm is about (ignored by Get).
    pub member_id: u64,
    /// The kind.
    pub alarm: AlarmType,
}

/// The answer to an alarm request (etcd's `AlarmResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlarmResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// The alarms listed, raised or cleared.
    pub alarms: Vec<AlarmMember>,
}

/// The result of a defragmentation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefragResponse {
    /// Header with the current revision.
    pub header: ResponseHeader,
    /// The database file length before.
    pub db_size_before: u64,
    /// The database file length after.
    pub db_size_after: u64,
    /// The longest time writes were paused, in microseconds.
    pub pause_micros: u64,
}

/// How far a running defragmentation is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefragProgress {
    /// True while a defragmentation runs.
    pub running: bool,
    /// Bytes of records copied so far.
    pub copied_bytes: u64,
    /// Bytes of records to copy (the in-use size when it started).
    pub total_bytes: u64,
}

/// Bytes of framing etcd's raft entry adds around a request: the request header with its
/// 64-bit id (field 100) and the oneof tag and length of the request itself.
const RAFT_ENTRY_HEADER_BYTES: usize = 14;

/// Returns the size of a request of `inner` encoded bytes inside etcd's raft entry, which is
/// what etcd checks against `--max-request-bytes` (API-2).
pub(crate) fn raft_entry_len(inner: usize) -> usize {
    RAFT_ENTRY_HEADER_BYTES + message_field(4, inner)
}

impl CompactionRequest {
    /// Returns the length of the request's protobuf encoding.
    pub fn encoded_len(&self) -> usize {
        int_field(1, self.revision) + bool_field(2, self.physical)
    }
}

impl LeaseGrantRequest {
    /// Returns the length of the request's protobuf encoding.
    pub fn encoded_len(&self) -> usize {
        int_field(1, self.ttl) + int_field(2, self.id)
    }
}

impl LeaseRevokeRequest {
    /// Returns the length of the request's protobuf encoding.
    pub fn encoded_len(&self) -> usize {
        int_field(1, self.id)
    }
}

impl AlarmRequest {
    /// Returns the length of the request's protobuf encoding.
    pub fn encoded_len(&self) -> usize {
        int_field(1, self.action as i64)
            + int_field(2, self.member_id as i64)
            + int_field(3, self.alarm as i64)
    }
}

fn varint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn tag_len(field: u32) -> usize {
    varint_len(u64::from(field) << 3)
}

fn bytes_field(field: u32, bytes: &[u8]) -> usize {
    if bytes.is_empty() {
        0
    } else {
        message_field(field, bytes.len())
    }
}

fn message_field(field: u32, len: usize) -> usize {
    tag_len(field) + varint_len(len as u64) + len
}

/// The length of an int64 member of a oneof: written even when zero (unlike a plain field).
fn oneof_int_field(field: u32, value: i64) -> usize {
    tag_len(field) + varint_len(value as u64)
}

fn int_field(field: u32, value: i64) -> usize {
    // Protobuf encodes a negative int64 as a ten-byte varint of its two's complement.
    if value == 0 {
        0
    } else {
        tag_len(field) + varint_len(value as u64)
    }
}

fn bool_field(field: u32, value: bool) -> usize {
    if value { tag_len(field) + 1 } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_compare_operand_is_counted_as_protobuf_writes_it() {
        // A oneof member is written even when zero: Version(0) and Version(1) are both a
        // one-byte tag and a one-byte varint.
        let targets: [fn(i64) -> CompareTarget; 4] = [
            CompareTarget::Version,
            CompareTarget::Create,
            CompareTarget::Mod,
            CompareTarget::Lease,
        ];
        for target in targets {
            let zero = Compare::new("k", CompareResult::Equal, target(0));
            let one = Compare::new("k", CompareResult::Equal, target(1));
            assert_eq!(zero.encoded_len(), one.encoded_len(), "{:?}", zero.target);
        }
        // result 0 (Equal) is a plain field: not written. target Version is 0: not written.
        // key "k": 3 bytes; operand: 2 bytes.
        let c = Compare::new("k", CompareResult::Equal, CompareTarget::Version(0));
        assert_eq!(c.encoded_len(), 3 + 2);
    }
}
