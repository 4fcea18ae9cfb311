//! The big-endian reader every row decoder of the engine's domains builds on: fixed-width
//! integers, length-prefixed byte strings and the end check, each failure a `Corrupted`
//! naming the row kind.
//!
//! Invariants:
//! - CODEC-1: every read is total: too few bytes, a count beyond the input or trailing bytes
//!   give `Corrupted`, never a panic and never an allocation larger than the input (STORE-4).
//!
//! Also the protobuf field writers that `bbolt::proto` (etcd's files) and `mvcc::wire` (a
//! Range's answer) share: varints, and int64 and bytes fields left out when zero or empty.
//!
//! Contact points: `accounting::codec` and `operations::codec`; `bbolt::proto` and
//! `mvcc::wire` for the writers.

use crate::error::StorageError;

/// Reads one stored value front to back.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    /// What the value is, for error messages ("accounting row", "operations row").
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Returns a reader of `bytes`, a value of kind `what`.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { bytes, what }
    }

    /// Returns the error for a bad value: `what` says what is wrong.
    pub fn corrupted(&self, why: &str) -> StorageError {
        StorageError::Corrupted(format!("{}: {why}", self.what))
    }

    /// Takes the next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        if self.bytes.len() < n {
            return Err(self.corrupted("truncated"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    /// Takes a byte.
    pub fn u8(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    /// Takes a big-endian u32.
    pub fn u32(&mut self) -> Result<u32, StorageError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(b))
    }

    /// Takes a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, StorageError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(b))
    }

    /// Takes a big-endian i64.
    pub fn i64(&mut self) -> Result<i64, StorageError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(i64::from_be_bytes(b))
    }

    /// Takes a u32 count of elements that each take at least one byte: a larger count than
    /// the bytes left is corrupt (CODEC-1).
    pub fn count(&mut self) -> Result<usize, StorageError> {
        let n = self.u32()? as usize;
        if n > self.bytes.len() {
            return Err(self.corrupted("count beyond the value"));
        }
        Ok(n)
    }

    /// Takes a u32 length and that many bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], StorageError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Takes a u32 length and that many bytes of UTF-8.
    pub fn string(&mut self) -> Result<String, StorageError> {
        let raw = self.bytes()?;
        String::from_utf8(raw.to_vec()).map_err(|_| self.corrupted("string is not UTF-8"))
    }

    /// Checks that nothing is left.
    pub fn end(&self) -> Result<(), StorageError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.corrupted("trailing bytes"))
        }
    }
}

/// Protobuf's varint wire type.
const PROTO_WIRE_VARINT: u64 = 0;
/// Protobuf's length-delimited wire type.
pub(crate) const PROTO_WIRE_BYTES: u64 = 2;

/// Appends `v` as a protobuf varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends an int64 field (two's-complement varint), nothing for 0.
pub(crate) fn put_int_field(out: &mut Vec<u8>, field: u64, v: i64) {
    if v != 0 {
        put_varint(out, (field << 3) | PROTO_WIRE_VARINT);
        put_varint(out, v as u64);
    }
}

/// Appends a bytes field, nothing when empty.
pub(crate) fn put_bytes_field(out: &mut Vec<u8>, field: u64, v: &[u8]) {
    if !v.is_empty() {
        put_varint(out, (field << 3) | PROTO_WIRE_BYTES);
        put_varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }
}
