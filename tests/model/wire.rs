//! The size etcd checks against `--max-request-bytes`, computed by the model on its own: the
//! write is marshalled as etcd's raft entry (`InternalRaftRequest`) with this file's protobuf
//! writer, and the size is the length of those bytes. Nothing here calls kvd's size helpers.
//!
//! The protobuf (proto3) wire rules this writer follows:
//! - a field is a key, the varint `field_number << 3 | wire_type`, then its payload: wire
//!   type 0 (a varint) for int64, uint64, bool and enums, wire type 2 (a varint length, then
//!   the bytes) for bytes and embedded messages;
//! - a varint carries 7 bits per byte, least significant group first, the high bit set on
//!   every byte but the last; an int64 is the varint of its two's complement, so a negative
//!   one takes 10 bytes;
//! - a plain scalar field holding its default (0, false, empty bytes) is not written;
//! - an embedded message that is set is written even when empty (key and a zero length), and
//!   so is a member of a `oneof` that is set, even when it holds its default value (etcd's
//!   generated code writes `Compare.version = 0` as the two bytes `0x20 0x00`).
//!
//! The messages, with the field numbers of etcd's `rpc.proto` (kept in this repository under
//! `server/proto/etcdserverpb/`) and of its `raft_internal.proto`:
//! - `InternalRaftRequest { header = 100; put = 4; delete_range = 5; txn = 6; compaction = 7;
//!   lease_grant = 8; lease_revoke = 9; alarm = 10 }` and `RequestHeader { uint64 ID = 1 }`
//!   (no user name and no auth revision without authentication). etcd's request ids carry
//!   the member id in their top 16 bits, so the varint is up to 10 bytes long; etcd 3.4.23
//!   accepts a Put of key `big` with a 1,572,836-byte value and refuses one of 1,572,838
//!   under the default 1,572,864-byte limit, which only a 10-byte id gives, so the model's id
//!   has its top bit set.
//! - `PutRequest { key = 1; value = 2; lease = 3; prev_kv = 4; ignore_value = 5;
//!   ignore_lease = 6 }`, `DeleteRangeRequest { key = 1; range_end = 2; prev_kv = 3 }`,
//!   `RangeRequest { key = 1; range_end = 2; limit = 3; revision = 4; sort_order = 5;
//!   sort_target = 6; serializable = 7; keys_only = 8; count_only = 9; min_mod_revision = 10;
//!   max_mod_revision = 11; min_create_revision = 12; max_create_revision = 13 }`,
//!   `Compare { result = 1; target = 2; key = 3; oneof { version = 4; create_revision = 5;
//!   mod_revision = 6; value = 7; lease = 8 }; range_end = 64 }`, `RequestOp { oneof {
//!   request_range = 1; request_put = 2; request_delete_range = 3; request_txn = 4 } }`,
//!   `TxnRequest { repeated compare = 1; repeated success = 2; repeated failure = 3 }`,
//!   `CompactionRequest { revision = 1; physical = 2 }`, `LeaseGrantRequest { TTL = 1;
//!   ID = 2 }`, `LeaseRevokeRequest { ID = 1 }`, `AlarmRequest { action = 1; uint64 memberID =
//!   2; alarm = 3 }`.
//! - For the answer of a Range, which the engine can also give in wire form:
//!   `RangeResponse { repeated kvs = 2 }` and `mvccpb.KeyValue { key = 1; create_revision =
//!   2; mod_revision = 3; version = 4; value = 5; lease = 6 }`.
//! - The enums by number: SortOrder NONE 0, ASCEND 1, DESCEND 2; SortTarget KEY 0, VERSION 1,
//!   CREATE 2, MOD 3, VALUE 4; CompareResult EQUAL 0, GREATER 1, LESS 2, NOT_EQUAL 3;
//!   CompareTarget VERSION 0, CREATE 1, MOD 2, VALUE 3, LEASE 4; AlarmAction GET 0, ACTIVATE 1,
//!   DEACTIVATE 2; AlarmType NONE 0, NOSPACE 1, CORRUPT 2.

use kvd::{
    AlarmAction, AlarmRequest, AlarmType, CompactionRequest, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, KeyValue, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp,
    SortOrder, SortTarget, TxnRequest,
};

/// The request id the model's raft entries carry: top bit set, so its varint is 10 bytes.
pub const RAFT_REQUEST_ID: u64 = 0x8000_0000_0000_0001;

/// A write as etcd proposes it.
#[derive(Debug, Clone, Copy)]
pub enum Raft<'r> {
    /// `InternalRaftRequest.put`.
    Put(&'r PutRequest),
    /// `InternalRaftRequest.delete_range`.
    DeleteRange(&'r DeleteRangeRequest),
    /// `InternalRaftRequest.txn`.
    Txn(&'r TxnRequest),
    /// `InternalRaftRequest.compaction`.
    Compaction(&'r CompactionRequest),
    /// `InternalRaftRequest.lease_grant`.
    LeaseGrant(&'r LeaseGrantRequest),
    /// `InternalRaftRequest.lease_revoke`, by lease id.
    LeaseRevoke(i64),
    /// `InternalRaftRequest.alarm`.
    Alarm(&'r AlarmRequest),
}

/// Returns the length of the raft entry etcd builds for `request`: what it compares with
/// `--max-request-bytes` (a request is refused when this is larger).
pub fn raft_entry_len(request: Raft<'_>) -> usize {
    raft_entry(request).len()
}

/// Returns the bytes of the raft entry etcd builds for `request`.
pub fn raft_entry(request: Raft<'_>) -> Vec<u8> {
    let mut header = Pb::default();
    header.uint(1, RAFT_REQUEST_ID);
    let (field, body) = match request {
        Raft::Put(p) => (4, put(p)),
        Raft::DeleteRange(d) => (5, delete_range(d)),
        Raft::Txn(t) => (6, txn(t)),
        Raft::Compaction(c) => (7, compaction(c)),
        Raft::LeaseGrant(g) => (8, lease_grant(g)),
        Raft::LeaseRevoke(id) => (9, lease_revoke(id)),
        Raft::Alarm(a) => (10, alarm(a)),
    };
    let mut entry = Pb::default();
    entry.message(100, header);
    entry.message(field, body);
    entry.0
}

/// Returns the bytes of `RangeResponse.kvs` holding `kvs`: what the engine's wire form of a
/// Range's key-values must be.
pub fn range_kvs(kvs: &[KeyValue]) -> Vec<u8> {
    let mut out = Pb::default();
    for kv in kvs {
        let mut message = Pb::default();
        message.bytes(1, &kv.key);
        message.int(2, kv.create_revision);
        message.int(3, kv.mod_revision);
        message.int(4, kv.version);
        message.bytes(5, &kv.value);
        message.int(6, kv.lease);
        out.message(2, message);
    }
    out.0
}

/// Protobuf bytes under construction.
#[derive(Debug, Default)]
pub struct Pb(pub Vec<u8>);

impl Pb {
    fn varint(&mut self, mut value: u64) {
        loop {
            let low = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                self.0.push(low);
                return;
            }
            self.0.push(low | 0x80);
        }
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire_type));
    }

    /// A uint64 (or an enum, or an int64's two's complement), omitted when 0.
    fn uint(&mut self, field: u32, value: u64) {
        if value != 0 {
            self.key(field, 0);
            self.varint(value);
        }
    }

    fn int(&mut self, field: u32, value: i64) {
        self.uint(field, value as u64);
    }

    fn boolean(&mut self, field: u32, value: bool) {
        self.uint(field, u64::from(value));
    }

    fn length_delimited(&mut self, field: u32, payload: &[u8]) {
        self.key(field, 2);
        self.varint(payload.len() as u64);
        self.0.extend_from_slice(payload);
    }

    /// A plain bytes field, omitted when empty.
    fn bytes(&mut self, field: u32, value: &[u8]) {
        if !value.is_empty() {
            self.length_delimited(field, value);
        }
    }

    /// An embedded message that is set: written even when empty.
    fn message(&mut self, field: u32, body: Pb) {
        self.length_delimited(field, &body.0);
    }

    /// An int64 member of a oneof that is set: written even when 0.
    fn oneof_int(&mut self, field: u32, value: i64) {
        self.key(field, 0);
        self.varint(value as u64);
    }

    /// A bytes member of a oneof that is set: written even when empty.
    fn oneof_bytes(&mut self, field: u32, value: &[u8]) {
        self.length_delimited(field, value);
    }
}

fn put(p: &PutRequest) -> Pb {
    let mut pb = Pb::default();
    pb.bytes(1, &p.key);
    pb.bytes(2, &p.value);
    pb.int(3, p.lease);
    pb.boolean(4, p.prev_kv);
    pb.boolean(5, p.ignore_value);
    pb.boolean(6, p.ignore_lease);
    pb
}

fn delete_range(d: &DeleteRangeRequest) -> Pb {
    let mut pb = Pb::default();
    pb.bytes(1, &d.key);
    pb.bytes(2, &d.range_end);
    pb.boolean(3, d.prev_kv);
    pb
}

fn range(r: &RangeRequest) -> Pb {
    let sort_order = match r.sort_order {
        SortOrder::None => 0,
        SortOrder::Ascend => 1,
        SortOrder::Descend => 2,
    };
    let sort_target = match r.sort_target {
        SortTarget::Key => 0,
        SortTarget::Version => 1,
        SortTarget::Create => 2,
        SortTarget::Mod => 3,
        SortTarget::Value => 4,
    };
    let mut pb = Pb::default();
    pb.bytes(1, &r.key);
    pb.bytes(2, &r.range_end);
    pb.int(3, r.limit);
    pb.int(4, r.revision);
    pb.uint(5, sort_order);
    pb.uint(6, sort_target);
    pb.boolean(7, r.serializable);
    pb.boolean(8, r.keys_only);
    pb.boolean(9, r.count_only);
    pb.int(10, r.min_mod_revision);
    pb.int(11, r.max_mod_revision);
    pb.int(12, r.min_create_revision);
    pb.int(13, r.max_create_revision);
    pb
}

fn compare(c: &Compare) -> Pb {
    let result = match c.result {
        CompareResult::Equal => 0,
        CompareResult::Greater => 1,
        CompareResult::Less => 2,
        CompareResult::NotEqual => 3,
    };
    let mut pb = Pb::default();
    pb.uint(1, result);
    // The target enum, then the key, then the operand: field order, as etcd writes them.
    let target = match c.target {
        CompareTarget::Version(_) => 0,
        CompareTarget::Create(_) => 1,
        CompareTarget::Mod(_) => 2,
        CompareTarget::Value(_) => 3,
        CompareTarget::Lease(_) => 4,
    };
    pb.uint(2, target);
    pb.bytes(3, &c.key);
    match &c.target {
        CompareTarget::Version(v) => pb.oneof_int(4, *v),
        CompareTarget::Create(v) => pb.oneof_int(5, *v),
        CompareTarget::Mod(v) => pb.oneof_int(6, *v),
        CompareTarget::Value(v) => pb.oneof_bytes(7, v),
        CompareTarget::Lease(v) => pb.oneof_int(8, *v),
    }
    pb.bytes(64, &c.range_end);
    pb
}

fn request_op(op: &RequestOp) -> Pb {
    let mut pb = Pb::default();
    match op {
        RequestOp::Range(r) => pb.message(1, range(r)),
        RequestOp::Put(p) => pb.message(2, put(p)),
        RequestOp::DeleteRange(d) => pb.message(3, delete_range(d)),
        RequestOp::Txn(t) => pb.message(4, txn(t)),
    }
    pb
}

fn txn(t: &TxnRequest) -> Pb {
    let mut pb = Pb::default();
    for c in &t.compare {
        pb.message(1, compare(c));
    }
    for op in &t.success {
        pb.message(2, request_op(op));
    }
    for op in &t.failure {
        pb.message(3, request_op(op));
    }
    pb
}

fn compaction(c: &CompactionRequest) -> Pb {
    let mut pb = Pb::default();
    pb.int(1, c.revision);
    pb.boolean(2, c.physical);
    pb
}

fn lease_grant(g: &LeaseGrantRequest) -> Pb {
    let mut pb = Pb::default();
    pb.int(1, g.ttl);
    pb.int(2, g.id);
    pb
}

fn lease_revoke(id: i64) -> Pb {
    let mut pb = Pb::default();
    pb.int(1, id);
    pb
}

fn alarm(a: &AlarmRequest) -> Pb {
    let action = match a.action {
        AlarmAction::Get => 0,
        AlarmAction::Activate => 1,
        AlarmAction::Deactivate => 2,
    };
    let mut pb = Pb::default();
    pb.uint(1, action);
    pb.uint(2, a.member_id);
    pb.uint(3, alarm_type_number(a.alarm));
    pb
}

/// Returns the wire number of an alarm type (etcd's `AlarmType`).
pub fn alarm_type_number(alarm: AlarmType) -> u64 {
    match alarm {
        AlarmType::None => 0,
        AlarmType::NoSpace => 1,
        AlarmType::Corrupt => 2,
    }
}
