//! The encoding of one history record: the key-value written at a revision, or a tombstone.
//!
//! Owns: the bytes stored as values of the `history` table.
//!
//! Layout (all integers big-endian):
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | flags: bit 0 = tombstone; other bits zero |
//! | 1 | 8 | create revision (0 for a tombstone) |
//! | 9 | 8 | version (0 for a tombstone) |
//! | 17 | 8 | lease (0 for a tombstone) |
//! | 25 | 4 | key length `n` |
//! | 29 | n | key |
//! | 29 + n | rest | value (empty for a tombstone) |
//!
//! Invariants:
//! - REC-1: `decode(encode(r)) == r`.
//! - REC-2: `decode` is total: any bytes give a record or `Corrupted`, never a panic.
//! - REC-3: the records of one [`Decoder`] share its buffers: their keys and values are
//!   slices of them, so decoding n records allocates for their bytes once per 4 MiB (or per
//!   larger record), not once or twice per record, and copies each record's bytes once; a
//!   buffer lives while any record in it does.
//!
//! Contact points: written by `mvcc::write`, read by every reader of history.

use bytes::Bytes;

use crate::api::KeyValue;
use crate::error::StorageError;

const FLAG_TOMBSTONE: u8 = 1;
const HEADER_BYTES: usize = 29;

/// The fields of a record other than its value, borrowed from the stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHead<'a> {
    /// The key.
    pub key: &'a [u8],
    /// True for a deletion.
    pub tombstone: bool,
    /// The create revision of the key's generation.
    pub create_revision: i64,
    /// The version of the key after this change.
    pub version: i64,
    /// The lease attached by this change.
    pub lease: i64,
    /// The length of the value.
    pub value_len: usize,
    value_offset: usize,
}

impl RecordHead<'_> {
    /// Returns the value in `bytes`, the record this head was decoded from.
    pub fn value_in<'b>(&self, bytes: &'b [u8]) -> &'b [u8] {
        &bytes[self.value_offset..]
    }

    /// Returns the record's space cost: etcd's Put cost for a put, 0 for a tombstone.
    pub fn cost(&self) -> u32 {
        if self.tombstone {
            0
        } else {
            put_cost(self.key.len(), self.value_len)
        }
    }
}

/// Returns etcd's cost of a Put of a key and a value of these lengths (SPACE-1), saturated
/// to `u32` (requests are far smaller).
pub fn put_cost(key_len: usize, value_len: usize) -> u32 {
    u32::try_from(256 + key_len + value_len).unwrap_or(u32::MAX)
}

/// One decoded history record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key.
    pub key: Bytes,
    /// True for a deletion.
    pub tombstone: bool,
    /// The create revision of the key's generation.
    pub create_revision: i64,
    /// The version of the key after this change.
    pub version: i64,
    /// The lease attached by this change.
    pub lease: i64,
    /// The value.
    pub value: Bytes,
}

impl Record {
    /// Returns the tombstone record of `key`.
    pub fn tombstone(key: Bytes) -> Record {
        Record {
            key,
            tombstone: true,
            create_revision: 0,
            version: 0,
            lease: 0,
            value: Bytes::new(),
        }
    }

    /// Returns the record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.key.len() + self.value.len());
        self.encode_into(&mut out);
        out
    }

    /// Appends the encoding to `out` (a caller's reused buffer).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.reserve(HEADER_BYTES + self.key.len() + self.value.len());
        out.push(if self.tombstone { FLAG_TOMBSTONE } else { 0 });
        out.extend_from_slice(&self.create_revision.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.lease.to_be_bytes());
        // Keys are bounded by the request-size limit, far below 4 GiB.
        let key_len = u32::try_from(self.key.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&key_len.to_be_bytes());
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.value);
    }

    /// Decodes `bytes` (REC-2).
    pub fn decode(bytes: &[u8]) -> Result<Record, StorageError> {
        let head = Record::decode_head(bytes)?;
        // One allocation for key and value: both are slices of one copy of the record.
        let owned = Bytes::copy_from_slice(&bytes[HEADER_BYTES..]);
        let key_len = head.key.len();
        Ok(Record {
            key: owned.slice(..key_len),
            tombstone: head.tombstone,
            create_revision: head.create_revision,
            version: head.version,
            lease: head.lease,
            value: owned.slice(head.value_offset - HEADER_BYTES..),
        })
    }

    /// Returns the fields other than the value, without copying anything (for rebuilding
    /// the index, compaction and hashing).
    pub fn decode_head(bytes: &[u8]) -> Result<RecordHead<'_>, StorageError> {
        let corrupted = |what: &str| StorageError::Corrupted(format!("history record: {what}"));
        if bytes.len() < HEADER_BYTES {
            return Err(corrupted("shorter than its header"));
        }
        if bytes[0] & !FLAG_TOMBSTONE != 0 {
            return Err(corrupted("unknown flags"));
        }
        let int = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            i64::from_be_bytes(b)
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[25..29]);
        let key_len = u32::from_be_bytes(len) as usize;
        let key_end = HEADER_BYTES
            .checked_add(key_len)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| corrupted("key length past the end"))?;
        Ok(RecordHead {
            key: &bytes[HEADER_BYTES..key_end],
            tombstone: bytes[0] & FLAG_TOMBSTONE != 0,
            create_revision: int(1),
            version: int(9),
            lease: int(17),
            value_len: bytes.len() - key_end,
            value_offset: key_end,
        })
    }

    /// Returns the record as etcd's KeyValue at `mod_revision`; a tombstone carries only the
    /// key and the mod revision, as etcd's delete events do.
    pub fn into_key_value(self, mod_revision: i64) -> KeyValue {
        KeyValue {
            key: self.key,
            create_revision: self.create_revision,
            mod_revision,
            version: self.version,
            value: self.value,
            lease: self.lease,
        }
    }
}

/// Decodes many records into shared buffers (REC-3), for a Range that returns many: a
/// record decoded alone costs an allocation for its bytes and another for the shared header
/// its key and value slices need, which a Range of 1,000 keys paid 2,000 times.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The buffers already filled.
    full: Vec<Bytes>,
    /// The buffer being filled: sized when it is started and never grown, so no record's
    /// bytes are copied twice.
    chunk: Vec<u8>,
    /// Each pushed record's fields and where its key and value lie.
    heads: Vec<DecodedHead>,
}

#[derive(Debug)]
struct DecodedHead {
    tombstone: bool,
    create_revision: i64,
    version: i64,
    lease: i64,
    /// The buffer holding the key and value: an index into `full`, or `full.len()` for the
    /// buffer being filled.
    chunk: usize,
    /// The key's start in that buffer; the value follows it.
    start: usize,
    key_len: usize,
    end: usize,
}

impl Decoder {
    /// Returns a decoder expecting about `records` records.
    pub fn with_capacity(records: usize) -> Decoder {
        Decoder {
            full: Vec::new(),
            chunk: Vec::new(),
            heads: Vec::with_capacity(records),
        }
    }

    /// Decodes `bytes` (REC-2) as the next record; nothing is kept if they are corrupted.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        let head = Record::decode_head(bytes)?;
        let len = bytes.len() - HEADER_BYTES;
        if self.chunk.capacity() - self.chunk.len() < len {
            // A new buffer for this record and, at this record's size, the ones still
            // expected (most Ranges return records of one shape), within
            // DECODER_CHUNK_BYTES unless this record alone is larger.
            let expected = self
                .heads
                .capacity()
                .saturating_sub(self.heads.len())
                .max(1);
            let size = len
                .saturating_mul(expected)
                .min(DECODER_CHUNK_BYTES.max(len));
            let filled = std::mem::replace(&mut self.chunk, Vec::with_capacity(size));
            if !filled.is_empty() {
                self.full.push(Bytes::from(filled));
            }
        }
        let start = self.chunk.len();
        self.chunk.extend_from_slice(&bytes[HEADER_BYTES..]);
        self.heads.push(DecodedHead {
            tombstone: head.tombstone,
            create_revision: head.create_revision,
            version: head.version,
            lease: head.lease,
            chunk: self.full.len(),
            start,
            key_len: head.key.len(),
            end: self.chunk.len(),
        });
        Ok(())
    }

    /// Returns the records pushed, in the order pushed.
    pub fn finish(self) -> Vec<Record> {
        let mut chunks = self.full;
        chunks.push(Bytes::from(self.chunk));
        self.heads
            .into_iter()
            .map(|head| {
                let shared = &chunks[head.chunk];
                let value_start = head.start + head.key_len;
                Record {
                    key: shared.slice(head.start..value_start),
                    tombstone: head.tombstone,
                    create_revision: head.create_revision,
                    version: head.version,
                    lease: head.lease,
                    value: shared.slice(value_start..head.end),
                }
            })
            .collect()
    }
}

/// The largest buffer a [`Decoder`] starts for records of ordinary size: a Range of many
/// large records fills several rather than one that doubles, so no record is copied twice
/// and no buffer waits for a copy into one twice its size.
const DECODER_CHUNK_BYTES: usize = 4 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoder_gives_back_the_records_encoded() {
        let records = [
            Record {
                key: Bytes::from_static(b"first"),
                tombstone: false,
                create_revision: 2,
                version: 1,
                lease: 9,
                value: Bytes::from_static(b"one"),
            },
            Record::tombstone(Bytes::from_static(b"gone")),
            Record {
                key: Bytes::from_static(b"third"),
                tombstone: false,
                create_revision: 4,
                version: 3,
                lease: 0,
                value: Bytes::from(vec![7u8; 5000]),
            },
        ];
        let mut decoder = Decoder::with_capacity(1);
        for record in &records {
            decoder.push(&record.encode()).unwrap();
        }
        assert!(
            decoder.push(&[0x80; HEADER_BYTES]).is_err(),
            "corrupted bytes are refused"
        );
        assert_eq!(
            decoder.finish(),
            records.to_vec(),
            "the refused push left nothing"
        );
    }

    #[test]
    fn a_decoder_fills_several_buffers_for_records_past_its_buffer_size() {
        // Three records of 3 MiB get a buffer each (two would pass 4 MiB), a small one
        // shares the third's, and one larger than the buffer size gets one of its own size.
        let record = |i: u8, len: usize| Record {
            key: Bytes::from(vec![b'k', i]),
            tombstone: false,
            create_revision: 2,
            version: 1,
            lease: 0,
            value: Bytes::from(vec![i; len]),
        };
        let records: Vec<Record> = (0..3)
            .map(|i| record(i, 3 << 20))
            .chain([record(3, 10), record(4, DECODER_CHUNK_BYTES + 1)])
            .collect();
        let mut decoder = Decoder::with_capacity(records.len());
        for r in &records {
            decoder.push(&r.encode()).unwrap();
        }
        assert_eq!(decoder.full.len(), 3, "a buffer per 3 MiB record");
        assert_eq!(decoder.finish(), records);
    }

    #[test]
    fn record_round_trips() {
        let r = Record {
            key: Bytes::from_static(b"k"),
            tombstone: false,
            create_revision: 2,
            version: 3,
            lease: -7,
            value: Bytes::from_static(b"value"),
        };
        assert_eq!(Record::decode(&r.encode()), Ok(r.clone()));
        let t = Record::tombstone(Bytes::from_static(b"gone"));
        assert_eq!(Record::decode(&t.encode()), Ok(t));
    }

    #[test]
    fn record_decode_rejects_bad_bytes_without_panicking() {
        let good = Record::tombstone(Bytes::from_static(b"key")).encode();
        for len in 0..good.len() {
            // Every strict prefix shorter than the key is corrupted, never a panic.
            let got = Record::decode(&good[..len]);
            assert!(got.is_err(), "prefix of {len} bytes decoded");
        }
        let mut bad_flags = good.clone();
        bad_flags[0] = 0x80;
        assert!(Record::decode(&bad_flags).is_err());
        let mut huge_key = good;
        huge_key[25..29].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Record::decode(&huge_key).is_err());
    }
}
