//! A Range's key-values in etcd's wire form, written straight from the stored records: the
//! bytes a protobuf encoder writes for the `kvs` field (2) of `etcdserverpb.RangeResponse`.
//!
//! Why: decoding 1,000 records into key-value structs, converting them to the server's
//! protobuf types and encoding those (two length passes over every key-value) was most of
//! the server's time per Range of 1,000 keys; here each record's bytes are copied once,
//! from the page they were read in to the answer.
//!
//! Invariants:
//! - WIRE-1: the bytes are those of the repeated field `kvs = 2` of etcd's `RangeResponse`
//!   holding each key-value in turn, each an `mvccpb.KeyValue` encoded as protobuf encoders
//!   write it: fields in number order, zero and empty fields left out, int64 as the
//!   two's-complement varint. [`KeyValueFields`] is the one place that encoding is written:
//!   `bbolt::write` and `bbolt::proto` write the KeyValues of etcd's files with it too.
//! - WIRE-2: a `keys_only` key-value has no value field; everything else is the stored
//!   record's, with the mod revision of the revision it was read at.
//!
//! Contact points: `mvcc::read::finish_range_wire`; the server writes the bytes into its
//! gRPC answer unchanged.

use crate::api::KeyValue;
use crate::codec::{PROTO_WIRE_BYTES, put_bytes_field, put_int_field, put_varint};
use crate::error::StorageError;

use super::Revision;
use super::record::Record;
use crate::storage::RevisionKey;

/// The field number of `RangeResponse.kvs` (etcd's `rpc.proto`).
pub const RANGE_RESPONSE_KVS_FIELD: u64 = 2;

/// Returns the number of bytes `v` takes as a varint.
fn varint_len(v: u64) -> usize {
    // 1 byte per started group of 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Returns the bytes of an int64 field holding `v` (none for 0), tag included.
fn int_field_len(v: i64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v as u64) }
}

/// Returns the bytes of a bytes field of `len` bytes (none when empty), tag included.
fn bytes_field_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + varint_len(len as u64) + len
    }
}

/// The fields of one `mvccpb.KeyValue`, borrowed.
pub(crate) struct KeyValueFields<'a> {
    pub key: &'a [u8],
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: &'a [u8],
    pub lease: i64,
}

impl<'a> From<&'a KeyValue> for KeyValueFields<'a> {
    fn from(kv: &'a KeyValue) -> KeyValueFields<'a> {
        KeyValueFields {
            key: &kv.key,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            value: &kv.value,
            lease: kv.lease,
        }
    }
}

impl KeyValueFields<'_> {
    fn message_len(&self) -> usize {
        bytes_field_len(self.key.len())
            + int_field_len(self.create_revision)
            + int_field_len(self.mod_revision)
            + int_field_len(self.version)
            + bytes_field_len(self.value.len())
            + int_field_len(self.lease)
    }

    /// Appends the field `field` holding this key-value (WIRE-1).
    fn put(&self, out: &mut Vec<u8>, field: u64) {
        let len = self.message_len();
        out.reserve(1 + varint_len(len as u64) + len);
        put_varint(out, (field << 3) | PROTO_WIRE_BYTES);
        put_varint(out, len as u64);
        self.put_message(out);
    }

    /// Appends the message itself, with no field key or length before it (WIRE-1).
    pub(crate) fn put_message(&self, out: &mut Vec<u8>) {
        put_bytes_field(out, 1, self.key);
        put_int_field(out, 2, self.create_revision);
        put_int_field(out, 3, self.mod_revision);
        put_int_field(out, 4, self.version);
        put_bytes_field(out, 5, self.value);
        put_int_field(out, 6, self.lease);
    }
}

/// Appends the `kvs` entry of the stored record `record`, stored under the revision key
/// `at` (its mod revision is `at`'s main; WIRE-1, WIRE-2).
pub fn put_record(
    out: &mut Vec<u8>,
    at: &RevisionKey,
    record: &[u8],
    keys_only: bool,
) -> Result<(), StorageError> {
    let head = Record::decode_head(at, record)?;
    let mod_revision = Revision::from_key(at).main;
    let value = if keys_only {
        &[][..]
    } else {
        head.value_in(record)
    };
    KeyValueFields {
        key: head.key,
        create_revision: head.create_revision,
        mod_revision,
        version: head.version,
        value,
        lease: head.lease,
    }
    .put(out, RANGE_RESPONSE_KVS_FIELD);
    Ok(())
}

/// Appends the `kvs` entry of `kv` (WIRE-1).
pub fn put_key_value(out: &mut Vec<u8>, kv: &KeyValue) {
    KeyValueFields::from(kv).put(out, RANGE_RESPONSE_KVS_FIELD);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn varint_lengths_match_the_encoder() {
        for v in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
    }

    fn key_value(value: &[u8], lease: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from_static(b"k1"),
            create_revision: 5,
            mod_revision: 9,
            version: 2,
            value: Bytes::copy_from_slice(value),
            lease,
        }
    }

    #[test]
    fn a_key_value_is_written_field_by_field() {
        let mut out = Vec::new();
        put_key_value(&mut out, &key_value(b"v", -1));
        let expect = [
            // kvs (2), length-delimited, 24 bytes.
            0x12, 24, //
            0x0a, 2, b'k', b'1', // key (1)
            0x10, 5, // create_revision (2)
            0x18, 9, // mod_revision (3)
            0x20, 2, // version (4)
            0x2a, 1, b'v', // value (5)
            0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, // lease (6): -1
        ];
        assert_eq!(out, expect);
        // Zero and empty fields are left out.
        let mut out = Vec::new();
        put_key_value(&mut out, &KeyValue::default());
        assert_eq!(out, [0x12, 0]);
    }

    #[test]
    fn a_record_is_written_as_the_key_value_it_holds() {
        let value = vec![7u8; 300];
        let record = Record {
            key: Bytes::from_static(b"k1"),
            tombstone: false,
            create_revision: 5,
            version: 2,
            lease: 3,
            value: Bytes::from(value.clone()),
        };
        let at = Revision::new(9, 0).to_key();
        let mut out = Vec::new();
        put_record(&mut out, &at, &record.encode(&at), false).unwrap();
        let mut expect = Vec::new();
        put_key_value(&mut expect, &key_value(&value, 3));
        assert_eq!(out, expect, "a value of 300 bytes: two-byte lengths");
        let mut out = Vec::new();
        put_record(&mut out, &at, &record.encode(&at), true).unwrap();
        let mut expect = Vec::new();
        put_key_value(&mut expect, &key_value(b"", 3));
        assert_eq!(out, expect, "keys_only: no value field");
        assert!(put_record(&mut out, &at, &[1, 2, 3], false).is_err());
    }
}
