//! Translation between the protobuf messages of etcd's API and the engine's `kvd::api` types,
//! in both directions, in one place.
//!
//! Owns: etcd's wire quirks that the engine's types express more precisely.
//!
//! Invariants:
//! - CONV-1: a compare's operand is read from the `target_union` field that matches its
//!   target; if another field (or none) is set, the operand is 0 or empty, as etcd reads it.
//! - CONV-2: enum values etcd does not define are translated to a request that behaves as etcd
//!   behaves with them: an unknown compare result holds whenever a key exists for a VALUE
//!   target and always otherwise; an unknown compare target compares as "equal"; an unknown
//!   sort order sorts nothing and an unknown sort target sorts by key.
//! - CONV-3: a Txn is checked as etcd's gRPC layer checks it, on the request as received,
//!   before any conversion (operation count, empty compare keys, empty keys, put flags, an
//!   empty `RequestOp` as `etcdserver: key not found`, in etcd's order). So a compare the
//!   conversion drops as always true (CONV-2) is still refused for an empty key and still
//!   counts towards `--max-txn-ops`.
//! - CONV-4: only the top-level response header carries the cluster id, member id and raft
//!   term; headers of the responses inside a Txn carry only the revision, and nested Txns an
//!   all-zero header, as etcd's do.
//!
//! - CONV-5: Status names this member as the leader (`leader == header.member_id`, so
//!   `etcdctl endpoint status` shows IS LEADER = true) and reports raft term 1; `raftIndex`
//!   and `raftAppliedIndex` are the engine's applied index plus [`RAFT_BOOTSTRAP_ENTRIES`],
//!   so they are never 0 and start where a fresh etcd starts (4).
//! - CONV-6: watch filters etcd does not define are ignored, as etcd ignores them;
//!   `fragment` is ignored (kvd never splits a watch response).
//! - CONV-7: every Lease and Watch response carries the full header (cluster id, member id,
//!   raft term) at the revision the engine gives, including 0 for a watch canceled because
//!   its start was compacted, as etcd's.
//!
//! Contact points: the services in `server/kv.rs`, `lease.rs`, `watch.rs` and
//! `maintenance.rs`.

use bytes::Bytes;

use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::range_request::{SortOrder, SortTarget};
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::response_op::Response;
use crate::pb::etcdserverpb::watch_create_request::FilterType;
use crate::pb::mvccpb;
use kvd as api;
use kvd::Error;

/// etcd's raft term, constant for a single member that never holds an election.
pub const RAFT_TERM: u64 = 1;
/// The raft entries a fresh single-member etcd has applied before its first request: its
/// own member's ConfChange, the new leader's empty entry, the member attributes and the
/// cluster version. Status counts kvd's applied writes from there (CONV-5).
pub const RAFT_BOOTSTRAP_ENTRIES: u64 = 4;

/// The identity that goes into every top-level response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderIds {
    /// The cluster id.
    pub cluster_id: u64,
    /// This member's id.
    pub member_id: u64,
}

impl HeaderIds {
    /// Returns a full response header at `revision`.
    pub fn header(&self, revision: i64) -> pb::ResponseHeader {
        pb::ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: RAFT_TERM,
        }
    }

    /// Returns a header without a revision, as etcd's MemberList answers.
    pub fn header_without_revision(&self) -> pb::ResponseHeader {
        self.header(0)
    }
}

/// Returns a header with only `revision` set, as etcd puts inside a Txn (CONV-4).
fn inner_header(revision: i64) -> pb::ResponseHeader {
    pb::ResponseHeader {
        revision,
        ..pb::ResponseHeader::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

/// Returns the engine's Range request for `req`.
pub fn range_request(req: pb::RangeRequest) -> api::RangeRequest {
    api::RangeRequest {
        key: req.key,
        range_end: req.range_end,
        limit: req.limit,
        revision: req.revision,
        sort_order: sort_order(req.sort_order),
        sort_target: sort_target(req.sort_target),
        serializable: req.serializable,
        keys_only: req.keys_only,
        count_only: req.count_only,
        min_mod_revision: req.min_mod_revision,
        max_mod_revision: req.max_mod_revision,
        min_create_revision: req.min_create_revision,
        max_create_revision: req.max_create_revision,
    }
}

fn sort_order(value: i32) -> api::SortOrder {
    match SortOrder::try_from(value) {
        Ok(SortOrder::None) => api::SortOrder::None,
        Ok(SortOrder::Ascend) => api::SortOrder::Ascend,
        Ok(SortOrder::Descend) => api::SortOrder::Descend,
        // CONV-2: etcd sorts neither way for an order it does not know.
        Err(_) => api::SortOrder::None,
    }
}

fn sort_target(value: i32) -> api::SortTarget {
    match SortTarget::try_from(value) {
        Ok(SortTarget::Key) => api::SortTarget::Key,
        Ok(SortTarget::Version) => api::SortTarget::Version,
        Ok(SortTarget::Create) => api::SortTarget::Create,
        Ok(SortTarget::Mod) => api::SortTarget::Mod,
        Ok(SortTarget::Value) => api::SortTarget::Value,
        // CONV-2: etcd has no sorter for a target it does not know; key order remains.
        Err(_) => api::SortTarget::Key,
    }
}

/// Returns the engine's Put request for `req`.
pub fn put_request(req: pb::PutRequest) -> api::PutRequest {
    api::PutRequest {
        key: req.key,
        value: req.value,
        lease: req.lease,
        prev_kv: req.prev_kv,
        ignore_value: req.ignore_value,
        ignore_lease: req.ignore_lease,
    }
}

/// Returns the engine's DeleteRange request for `req`.
pub fn delete_range_request(req: pb::DeleteRangeRequest) -> api::DeleteRangeRequest {
    api::DeleteRangeRequest {
        key: req.key,
        range_end: req.range_end,
        prev_kv: req.prev_kv,
    }
}

/// Returns the engine's compaction request for `req`.
pub fn compaction_request(req: &pb::CompactionRequest) -> api::CompactionRequest {
    api::CompactionRequest {
        revision: req.revision,
        physical: req.physical,
    }
}

/// Returns the engine's watch create request for `req` (CONV-6 for the filters).
pub fn watch_create_request(req: pb::WatchCreateRequest) -> api::WatchCreateRequest {
    let has = |filter: FilterType| req.filters.contains(&(filter as i32));
    api::WatchCreateRequest {
        no_put: has(FilterType::Noput),
        no_delete: has(FilterType::Nodelete),
        key: req.key,
        range_end: req.range_end,
        start_revision: req.start_revision,
        progress_notify: req.progress_notify,
        prev_kv: req.prev_kv,
        watch_id: req.watch_id,
    }
}

/// Returns the engine's Txn request for `req`, or the first error etcd's gRPC layer reports
/// for it (CONV-3). `max_txn_ops` is the server's `--max-txn-ops`.
pub fn txn_request(req: pb::TxnRequest, max_txn_ops: usize) -> Result<api::TxnRequest, Error> {
    if let Some(err) = first_invalid(&req, max_txn_ops) {
        return Err(err);
    }
    txn_level(req)
}

/// Returns the engine's Txn request for `req` without CONV-3's check, so that the fuzz
/// harness can compare that check with the engine's own (VAL-1). An empty operation is
/// still refused with `etcdserver: key not found`.
pub(crate) fn txn_level(req: pb::TxnRequest) -> Result<api::TxnRequest, Error> {
    Ok(api::TxnRequest {
        compare: req.compare.into_iter().filter_map(compare).collect(),
        success: req
            .success
            .into_iter()
            .map(request_op)
            .collect::<Result<_, _>>()?,
        failure: req
            .failure
            .into_iter()
            .map(request_op)
            .collect::<Result<_, _>>()?,
    })
}

fn request_op(op: pb::RequestOp) -> Result<api::RequestOp, Error> {
    match op.request {
        Some(Request::RequestRange(r)) => Ok(api::RequestOp::Range(range_request(r))),
        Some(Request::RequestPut(r)) => Ok(api::RequestOp::Put(put_request(r))),
        Some(Request::RequestDeleteRange(r)) => {
            Ok(api::RequestOp::DeleteRange(delete_range_request(r)))
        }
        Some(Request::RequestTxn(t)) => Ok(api::RequestOp::Txn(txn_level(t)?)),
        None => Err(Error::KeyNotFound),
    }
}

/// Returns true if a branch of `req`, or of a Txn nested in it, holds an operation with no
/// request set.
pub(crate) fn contains_empty_op(req: &pb::TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .any(|op| match &op.request {
            None => true,
            Some(Request::RequestTxn(t)) => contains_empty_op(t),
            Some(_) => false,
        })
}

/// Returns the first error etcd's gRPC-layer Txn check reports, walking the request in
/// etcd's order (operation count, compare keys, then each op of `success` and `failure`,
/// nested Txns with the remaining budget), with an empty op reported where it stands.
fn first_invalid(req: &pb::TxnRequest, max_txn_ops: usize) -> Option<Error> {
    let count = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if count > max_txn_ops {
        return Some(Error::TooManyTxnOps);
    }
    if req.compare.iter().any(|c| c.key.is_empty()) {
        return Some(Error::KeyNotProvided);
    }
    req.success
        .iter()
        .chain(&req.failure)
        .find_map(|op| match &op.request {
            None => Some(Error::KeyNotFound),
            Some(Request::RequestRange(r)) => r.key.is_empty().then_some(Error::KeyNotProvided),
            Some(Request::RequestPut(p)) => invalid_put(p),
            Some(Request::RequestDeleteRange(d)) => {
                d.key.is_empty().then_some(Error::KeyNotProvided)
            }
            Some(Request::RequestTxn(t)) => first_invalid(t, max_txn_ops - count),
        })
}

fn invalid_put(p: &pb::PutRequest) -> Option<Error> {
    if p.key.is_empty() {
        Some(Error::KeyNotProvided)
    } else if p.ignore_value && !p.value.is_empty() {
        Some(Error::ValueProvided)
    } else if p.ignore_lease && p.lease != 0 {
        Some(Error::LeaseProvided)
    } else {
        None
    }
}

/// Returns the engine's compare for `c`, or `None` for a compare that etcd evaluates as
/// always true (CONV-2), which drops out of the conjunction.
fn compare(c: pb::Compare) -> Option<api::Compare> {
    let target = CompareTarget::try_from(c.target).ok();
    let result = CompareResult::try_from(c.result).ok();
    let (result, target) = match (target, result) {
        (Some(target), Some(result)) => (known_result(result), operand(target, c.target_union)),
        // An unknown result holds whenever etcd gets as far as comparing a key's field. For a
        // VALUE target that needs at least one key in the range; "create revision ≠ 0" says
        // exactly that, also for a range with no keys (compared against 0).
        (Some(CompareTarget::Value), None) => {
            (api::CompareResult::NotEqual, api::CompareTarget::Create(0))
        }
        (Some(_), None) | (None, None) | (None, Some(CompareResult::Equal)) => return None,
        // An unknown target compares as "equal" (etcd leaves its comparison at 0), so any
        // result other than EQUAL never holds: "version < 0" never holds either.
        (None, Some(_)) => (api::CompareResult::Less, api::CompareTarget::Version(0)),
    };
    Some(api::Compare {
        key: c.key,
        range_end: c.range_end,
        result,
        target,
    })
}

fn known_result(result: CompareResult) -> api::CompareResult {
    match result {
        CompareResult::Equal => api::CompareResult::Equal,
        CompareResult::Greater => api::CompareResult::Greater,
        CompareResult::Less => api::CompareResult::Less,
        CompareResult::NotEqual => api::CompareResult::NotEqual,
    }
}

/// Returns the target with its operand taken from the matching oneof field (CONV-1).
fn operand(target: CompareTarget, union: Option<TargetUnion>) -> api::CompareTarget {
    match (target, union) {
        (CompareTarget::Version, Some(TargetUnion::Version(v))) => api::CompareTarget::Version(v),
        (CompareTarget::Version, _) => api::CompareTarget::Version(0),
        (CompareTarget::Create, Some(TargetUnion::CreateRevision(v))) => {
            api::CompareTarget::Create(v)
        }
        (CompareTarget::Create, _) => api::CompareTarget::Create(0),
        (CompareTarget::Mod, Some(TargetUnion::ModRevision(v))) => api::CompareTarget::Mod(v),
        (CompareTarget::Mod, _) => api::CompareTarget::Mod(0),
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => api::CompareTarget::Value(v),
        (CompareTarget::Value, _) => api::CompareTarget::Value(Bytes::new()),
        (CompareTarget::Lease, Some(TargetUnion::Lease(v))) => api::CompareTarget::Lease(v),
        (CompareTarget::Lease, _) => api::CompareTarget::Lease(0),
    }
}

// ---------------------------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------------------------

/// Returns etcd's `KeyValue` for `kv`.
pub fn key_value(kv: api::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

fn range_response(resp: api::RangeResponse, header: pb::ResponseHeader) -> pb::RangeResponse {
    pb::RangeResponse {
        header: Some(header),
        kvs: resp.kvs.into_iter().map(key_value).collect(),
        more: resp.more,
        count: resp.count,
        encoded_kvs: Bytes::new(),
    }
}

fn put_response(resp: api::PutResponse, header: pb::ResponseHeader) -> pb::PutResponse {
    pb::PutResponse {
        header: Some(header),
        prev_kv: resp.prev_kv.map(key_value),
    }
}

fn delete_range_response(
    resp: api::DeleteRangeResponse,
    header: pb::ResponseHeader,
) -> pb::DeleteRangeResponse {
    pb::DeleteRangeResponse {
        header: Some(header),
        deleted: resp.deleted,
        prev_kvs: resp.prev_kvs.into_iter().map(key_value).collect(),
    }
}

fn txn_response(resp: api::TxnResponse, header: pb::ResponseHeader) -> pb::TxnResponse {
    pb::TxnResponse {
        header: Some(header),
        succeeded: resp.succeeded,
        responses: resp.responses.into_iter().map(response_op).collect(),
    }
}

fn response_op(op: api::ResponseOp) -> pb::ResponseOp {
    let response = match op {
        api::ResponseOp::Range(r) => {
            let header = inner_header(r.header.revision);
            Response::ResponseRange(range_response(r, header))
        }
        api::ResponseOp::Put(r) => {
            let header = inner_header(r.header.revision);
            Response::ResponsePut(put_response(r, header))
        }
        api::ResponseOp::DeleteRange(r) => {
            let header = inner_header(r.header.revision);
            Response::ResponseDeleteRange(delete_range_response(r, header))
        }
        api::ResponseOp::Txn(t) => {
            let header = inner_header(t.header.revision);
            Response::ResponseTxn(txn_response(t, header))
        }
    };
    pb::ResponseOp {
        response: Some(response),
    }
}

impl HeaderIds {
    /// Returns etcd's Put response for `resp`.
    pub fn put(&self, resp: api::PutResponse) -> pb::PutResponse {
        let header = self.header(resp.header.revision);
        put_response(resp, header)
    }

    /// Returns etcd's DeleteRange response for `resp`.
    pub fn delete_range(&self, resp: api::DeleteRangeResponse) -> pb::DeleteRangeResponse {
        let header = self.header(resp.header.revision);
        delete_range_response(resp, header)
    }

    /// Returns etcd's Txn response for `resp` (CONV-4 for the nested responses).
    pub fn txn(&self, resp: api::TxnResponse) -> pb::TxnResponse {
        let header = self.header(resp.header.revision);
        txn_response(resp, header)
    }

    /// Returns etcd's compaction response for `resp`.
    pub fn compaction(&self, resp: api::CompactionResponse) -> pb::CompactionResponse {
        pb::CompactionResponse {
            header: Some(self.header(resp.header.revision)),
        }
    }

    /// Returns etcd's Status response for the engine's `status` (CONV-5): this member is
    /// the leader; `raftIndex` and `raftAppliedIndex` are the engine's applied index counted
    /// from etcd's bootstrap entries.
    pub fn status(&self, status: api::Status, reported: &ReportedStatus) -> pb::StatusResponse {
        let raft_index = status.applied_index.saturating_add(RAFT_BOOTSTRAP_ENTRIES);
        pb::StatusResponse {
            header: Some(self.header(status.header.revision)),
            version: reported.version.to_owned(),
            db_size: size_i64(status.db_size),
            leader: self.member_id,
            raft_index,
            raft_term: RAFT_TERM,
            raft_applied_index: raft_index,
            errors: Vec::new(),
            db_size_in_use: size_i64(status.db_size_in_use),
            is_learner: false,
            storage_version: reported.storage_version.to_owned(),
            db_size_quota: reported.quota_bytes,
            downgrade_info: None,
        }
    }

    /// Returns etcd's HashKV response for `resp`.
    pub fn hash_kv(&self, resp: api::HashKvResponse) -> pb::HashKvResponse {
        pb::HashKvResponse {
            header: Some(self.header(resp.header.revision)),
            hash: resp.hash,
            compact_revision: resp.compact_revision,
            hash_revision: resp.hash_revision,
        }
    }

    /// Returns etcd's LeaseGrant response for `resp`.
    pub fn lease_grant(&self, resp: api::LeaseGrantResponse) -> pb::LeaseGrantResponse {
        pb::LeaseGrantResponse {
            header: Some(self.header(resp.header.revision)),
            id: resp.id,
            ttl: resp.ttl,
            error: String::new(),
        }
    }

    /// Returns etcd's LeaseRevoke response for `resp`.
    pub fn lease_revoke(&self, resp: api::LeaseRevokeResponse) -> pb::LeaseRevokeResponse {
        pb::LeaseRevokeResponse {
            header: Some(self.header(resp.header.revision)),
        }
    }

    /// Returns etcd's LeaseKeepAlive response for `resp`.
    pub fn lease_keep_alive(
        &self,
        resp: api::LeaseKeepAliveResponse,
    ) -> pb::LeaseKeepAliveResponse {
        pb::LeaseKeepAliveResponse {
            header: Some(self.header(resp.header.revision)),
            id: resp.id,
            ttl: resp.ttl,
        }
    }

    /// Returns etcd's LeaseTimeToLive response for `resp`.
    pub fn lease_time_to_live(
        &self,
        resp: api::LeaseTimeToLiveResponse,
    ) -> pb::LeaseTimeToLiveResponse {
        pb::LeaseTimeToLiveResponse {
            header: Some(self.header(resp.header.revision)),
            id: resp.id,
            ttl: resp.ttl,
            granted_ttl: resp.granted_ttl,
            keys: resp.keys,
        }
    }

    /// Returns etcd's LeaseLeases response for `resp`.
    pub fn lease_leases(&self, resp: api::LeaseLeasesResponse) -> pb::LeaseLeasesResponse {
        pb::LeaseLeasesResponse {
            header: Some(self.header(resp.header.revision)),
            leases: resp
                .leases
                .into_iter()
                .map(|id| pb::LeaseStatus { id })
                .collect(),
        }
    }

    /// Returns etcd's WatchResponse for `resp` (CONV-7).
    pub fn watch(&self, resp: api::WatchResponse) -> pb::WatchResponse {
        pb::WatchResponse {
            header: Some(self.header(resp.header.revision)),
            watch_id: resp.watch_id,
            created: resp.created,
            canceled: resp.canceled,
            compact_revision: resp.compact_revision,
            cancel_reason: resp.cancel_reason,
            fragment: false,
            events: resp.events.into_iter().map(event).collect(),
        }
    }
}

/// Returns etcd's `Event` for `e`.
fn event(e: api::Event) -> mvccpb::Event {
    let kind = match e.kind {
        api::EventType::Put => mvccpb::event::EventType::Put,
        api::EventType::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: kind as i32,
        kv: Some(key_value(e.kv)),
        prev_kv: e.prev_kv.map(key_value),
    }
}

/// What Status reports beside the engine's own numbers.
#[derive(Debug, Clone, Copy)]
pub struct ReportedStatus<'a> {
    /// The server version.
    pub version: &'a str,
    /// The storage version (etcd 3.6's field).
    pub storage_version: &'a str,
    /// The space quota in bytes, 0 if disabled.
    pub quota_bytes: i64,
}

/// Converts a byte count to protobuf's int64, saturating (a file cannot reach 2^63 bytes).
fn size_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pb_compare(target: i32, result: i32, union: Option<TargetUnion>) -> pb::Compare {
        pb::Compare {
            result,
            target,
            key: Bytes::from_static(b"k"),
            range_end: Bytes::new(),
            target_union: union,
        }
    }

    fn put_op(key: &'static [u8]) -> pb::RequestOp {
        let put = pb::PutRequest {
            key: Bytes::from_static(key),
            ..pb::PutRequest::default()
        };
        pb::RequestOp {
            request: Some(Request::RequestPut(put)),
        }
    }

    fn empty_op() -> pb::RequestOp {
        pb::RequestOp { request: None }
    }

    #[test]
    fn txn_compare_with_empty_key_and_unknown_target_is_refused() {
        // CONV-3: etcd refuses the empty key before it looks at the target.
        for (target, result) in [(8, CompareResult::Equal as i32), (0, 9), (8, 9)] {
            let compare = pb::Compare {
                key: Bytes::new(),
                ..pb_compare(target, result, None)
            };
            let req = pb::TxnRequest {
                compare: vec![compare],
                success: vec![put_op(b"k")],
                failure: vec![],
            };
            assert_eq!(
                txn_request(req, 128),
                Err(Error::KeyNotProvided),
                "target {target} result {result}"
            );
        }
    }

    #[test]
    fn dropped_compares_count_towards_max_txn_ops() {
        let dropped = pb_compare(8, CompareResult::Equal as i32, None);
        assert!(compare(dropped.clone()).is_none(), "CONV-2 drops it");
        let req = pb::TxnRequest {
            compare: vec![dropped; 3],
            success: vec![put_op(b"k")],
            failure: vec![],
        };
        assert_eq!(txn_request(req.clone(), 2), Err(Error::TooManyTxnOps));
        assert!(txn_request(req, 3).is_ok());
    }

    #[test]
    fn compare_operand_comes_from_the_field_matching_the_target() {
        let c = pb_compare(
            CompareTarget::Version as i32,
            CompareResult::Equal as i32,
            Some(TargetUnion::ModRevision(5)),
        );
        assert_eq!(
            compare(c).map(|c| c.target),
            Some(api::CompareTarget::Version(0))
        );
        let c = pb_compare(
            CompareTarget::Mod as i32,
            CompareResult::Greater as i32,
            Some(TargetUnion::ModRevision(5)),
        );
        let got = compare(c).map(|c| (c.result, c.target));
        assert_eq!(
            got,
            Some((api::CompareResult::Greater, api::CompareTarget::Mod(5)))
        );
        let c = pb_compare(
            CompareTarget::Value as i32,
            CompareResult::Equal as i32,
            None,
        );
        assert_eq!(
            compare(c).map(|c| c.target),
            Some(api::CompareTarget::Value(Bytes::new()))
        );
    }

    #[test]
    fn unknown_compare_enums_behave_as_etcd_evaluates_them() {
        // Unknown result, non-VALUE target: always true, so the compare drops out.
        assert!(compare(pb_compare(CompareTarget::Mod as i32, 9, None)).is_none());
        // Unknown result, VALUE target: true exactly when a key exists.
        let c = compare(pb_compare(CompareTarget::Value as i32, 9, None));
        let got = c.map(|c| (c.result, c.target));
        assert_eq!(
            got,
            Some((api::CompareResult::NotEqual, api::CompareTarget::Create(0)))
        );
        // Unknown target with EQUAL: always true.
        assert!(compare(pb_compare(9, CompareResult::Equal as i32, None)).is_none());
        // Unknown target with another result: never true.
        let c = compare(pb_compare(9, CompareResult::Greater as i32, None));
        let got = c.map(|c| (c.result, c.target));
        assert_eq!(
            got,
            Some((api::CompareResult::Less, api::CompareTarget::Version(0)))
        );
    }

    #[test]
    fn empty_request_op_is_key_not_found() {
        let txn = pb::TxnRequest {
            success: vec![put_op(b"a"), empty_op()],
            ..Default::default()
        };
        assert_eq!(txn_request(txn, 128), Err(Error::KeyNotFound));
    }

    #[test]
    fn errors_etcd_checks_before_an_empty_op_win() {
        let too_many = pb::TxnRequest {
            success: vec![empty_op()],
            failure: (0..3).map(|_| put_op(b"a")).collect(),
            ..Default::default()
        };
        assert_eq!(txn_request(too_many, 2), Err(Error::TooManyTxnOps));
        let empty_key_first = pb::TxnRequest {
            success: vec![put_op(b""), empty_op()],
            ..Default::default()
        };
        assert_eq!(
            txn_request(empty_key_first, 128),
            Err(Error::KeyNotProvided)
        );
        let empty_op_first = pb::TxnRequest {
            success: vec![empty_op(), put_op(b"")],
            ..Default::default()
        };
        assert_eq!(txn_request(empty_op_first, 128), Err(Error::KeyNotFound));
    }

    #[test]
    fn nested_empty_op_is_found() {
        let nested = pb::TxnRequest {
            failure: vec![empty_op()],
            ..Default::default()
        };
        let txn = pb::TxnRequest {
            success: vec![pb::RequestOp {
                request: Some(Request::RequestTxn(nested)),
            }],
            ..Default::default()
        };
        assert_eq!(txn_request(txn, 128), Err(Error::KeyNotFound));
    }

    #[test]
    fn watch_filters_map_and_unknown_ones_are_ignored() {
        let req = pb::WatchCreateRequest {
            key: Bytes::from_static(b"k"),
            filters: vec![FilterType::Nodelete as i32, 7],
            ..pb::WatchCreateRequest::default()
        };
        let got = watch_create_request(req);
        assert_eq!((got.no_put, got.no_delete), (false, true));
        let req = pb::WatchCreateRequest {
            filters: vec![FilterType::Noput as i32],
            ..pb::WatchCreateRequest::default()
        };
        let got = watch_create_request(req);
        assert_eq!((got.no_put, got.no_delete), (true, false));
    }

    #[test]
    fn compacted_watch_cancel_keeps_revision_zero_and_the_ids() {
        let ids = HeaderIds {
            cluster_id: 7,
            member_id: 9,
        };
        let resp = api::WatchResponse {
            watch_id: 3,
            canceled: true,
            compact_revision: 5,
            ..api::WatchResponse::default()
        };
        let got = ids.watch(resp);
        assert_eq!(
            got.header,
            Some(pb::ResponseHeader {
                cluster_id: 7,
                member_id: 9,
                revision: 0,
                raft_term: RAFT_TERM,
            })
        );
        assert_eq!(
            (got.watch_id, got.canceled, got.compact_revision),
            (3, true, 5)
        );
    }

    #[test]
    fn delete_events_carry_the_delete_type() {
        let e = api::Event {
            kind: api::EventType::Delete,
            kv: api::KeyValue {
                key: Bytes::from_static(b"k"),
                mod_revision: 4,
                ..api::KeyValue::default()
            },
            prev_kv: None,
        };
        let got = event(e);
        assert_eq!(got.r#type, mvccpb::event::EventType::Delete as i32);
        assert_eq!(got.kv.map(|kv| kv.mod_revision), Some(4));
        assert!(got.prev_kv.is_none());
    }

    #[test]
    fn inner_headers_carry_only_the_revision() {
        let ids = HeaderIds {
            cluster_id: 7,
            member_id: 9,
        };
        let inner = api::RangeResponse {
            header: api::ResponseHeader { revision: 4 },
            ..api::RangeResponse::default()
        };
        let nested = api::TxnResponse::default();
        let resp = api::TxnResponse {
            header: api::ResponseHeader { revision: 5 },
            succeeded: true,
            responses: vec![api::ResponseOp::Range(inner), api::ResponseOp::Txn(nested)],
        };
        let got = ids.txn(resp);
        let top = got.header.unwrap_or_default();
        assert_eq!(
            (top.cluster_id, top.member_id, top.revision, top.raft_term),
            (7, 9, 5, 1)
        );
        let Some(Response::ResponseRange(range)) = &got.responses[0].response else {
            panic!("expected a range response");
        };
        assert_eq!(range.header, Some(inner_header(4)));
        let Some(Response::ResponseTxn(txn)) = &got.responses[1].response else {
            panic!("expected a txn response");
        };
        assert_eq!(txn.header, Some(pb::ResponseHeader::default()));
    }
}
