//! The encoding of one history record: the key-value written at a revision, or a tombstone.
//!
//! Owns: the bytes stored as values of the `history` table.
//!
//! Layout (all integers big-endian):
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 1 | flags: bit 0 = tombstone; the other bits `0xa4` (checksummed) or zero |
//! | 1 | 8 | create revision (0 for a tombstone) |
//! | 9 | 8 | version (0 for a tombstone) |
//! | 17 | 8 | lease (0 for a tombstone) |
//! | 25 | 4 | key length `n` |
//! | 29 | n | key |
//! | 29 + n | rest, but the last 4 | value (empty for a tombstone) |
//! | end − 4 | 4 | CRC-32 of the record's 16-byte revision key, then of every byte before it |
//!
//! Every record written sets bits 2, 5 and 7 (`0xa4`) and ends with the checksum. Records
//! written before checksums (those bits clear, schema version 1) have no trailer: their
//! value is the rest of the record, and they are read unchecked. The mark is three bits
//! from zero, so no flip of one or two bits makes a checksummed record read as unchecked:
//! every other pattern is refused as unknown flags.
//!
//! Invariants:
//! - REC-1: `decode(encode(r)) == r`, at the revision key it was encoded for.
//! - REC-2: `decode` is total: any bytes give a record or `Corrupted`, never a panic.
//! - REC-3: the records of one [`Decoder`] share its buffers: their keys and values are
//!   slices of them, so decoding n records allocates for their bytes once per 4 MiB (or per
//!   larger record), not once or twice per record, and copies each record's bytes once; a
//!   buffer lives while any record in it does.
//! - REC-4: a checksummed record is returned only if its checksum matches its bytes and its
//!   revision key; every reader of history decodes through [`Record::decode_head`], so a
//!   byte changed on the disk gives `Corrupted` instead of being served. HashKV hashes a
//!   record as its checksum-less form ([`RecordHead::hashed_parts`]), so the hash of a store
//!   does not change with the format its records were written in.
//!
//! Contact points: written by `mvcc::write`, read by every reader of history.

use bytes::Bytes;

use crate::api::KeyValue;
use crate::error::StorageError;
use crate::mvcc::revision::Revision;
use crate::storage::RevisionKey;

const FLAG_TOMBSTONE: u8 = 1;
/// The mark of a record that ends with a [`CHECKSUM_BYTES`] checksum (REC-4): bits 2, 5
/// and 7, three bits from the unchecked records' zero.
const FLAG_CHECKSUM: u8 = 0xa4;
const HEADER_BYTES: usize = 29;
const CHECKSUM_BYTES: usize = 4;

/// Returns the CRC-32 of `key` followed by `body` (REC-4).
fn checksum(key: &RevisionKey, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(key);
    hasher.update(body);
    hasher.finalize()
}

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
    /// The flags byte as stored.
    flags: u8,
}

impl RecordHead<'_> {
    /// Returns the value in `bytes`, the record this head was decoded from.
    pub fn value_in<'b>(&self, bytes: &'b [u8]) -> &'b [u8] {
        &bytes[self.value_offset..self.value_offset + self.value_len]
    }

    /// Returns the whole record in `bytes`, the record this head was decoded from (and
    /// checked, REC-4), without decoding or checking it again.
    pub fn record_in(&self, bytes: &[u8]) -> Record {
        // One allocation for key and value: both are slices of one copy of the record.
        let owned =
            Bytes::copy_from_slice(&bytes[HEADER_BYTES..self.value_offset + self.value_len]);
        Record {
            key: owned.slice(..self.key.len()),
            tombstone: self.tombstone,
            create_revision: self.create_revision,
            version: self.version,
            lease: self.lease,
            value: owned.slice(self.value_offset - HEADER_BYTES..),
        }
    }

    /// Returns true if the record carries a checksum (REC-4), as every record written since
    /// schema version 2 does.
    pub fn checksummed(&self) -> bool {
        self.flags & FLAG_CHECKSUM == FLAG_CHECKSUM
    }

    /// Returns the record in `bytes` (the record this head was decoded from) as a record
    /// without a checksum stores it, in two parts: its flags byte and the bytes after it up to
    /// the end of the value. HashKV hashes these (REC-4).
    pub fn hashed_parts<'b>(&self, bytes: &'b [u8]) -> (u8, &'b [u8]) {
        (
            self.flags & !FLAG_CHECKSUM,
            &bytes[1..self.value_offset + self.value_len],
        )
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

    /// Returns the record's bytes, to be stored under the revision key `at` (REC-4).
    pub fn encode(&self, at: &RevisionKey) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(at, &mut out);
        out
    }

    /// Appends the encoding, to be stored under the revision key `at`, to `out` (a caller's
    /// reused buffer).
    pub fn encode_into(&self, at: &RevisionKey, out: &mut Vec<u8>) {
        out.reserve(HEADER_BYTES + self.key.len() + self.value.len() + CHECKSUM_BYTES);
        let start = out.len();
        let tombstone = if self.tombstone { FLAG_TOMBSTONE } else { 0 };
        out.push(tombstone | FLAG_CHECKSUM);
        out.extend_from_slice(&self.create_revision.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out.extend_from_slice(&self.lease.to_be_bytes());
        // Keys are bounded by the request-size limit, far below 4 GiB.
        let key_len = u32::try_from(self.key.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&key_len.to_be_bytes());
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.value);
        let sum = checksum(at, &out[start..]);
        out.extend_from_slice(&sum.to_be_bytes());
    }

    /// Decodes `bytes`, stored under the revision key `at` (REC-2, REC-4).
    pub fn decode(at: &RevisionKey, bytes: &[u8]) -> Result<Record, StorageError> {
        Ok(Record::decode_head(at, bytes)?.record_in(bytes))
    }

    /// Returns the fields other than the value of `bytes`, stored under the revision key
    /// `at`, without copying anything (for rebuilding the index, compaction and hashing).
    /// A checksummed record's checksum is checked (REC-4).
    pub fn decode_head<'a>(
        at: &RevisionKey,
        bytes: &'a [u8],
    ) -> Result<RecordHead<'a>, StorageError> {
        let corrupted = |what: &str| StorageError::Corrupted(format!("history record: {what}"));
        if bytes.len() < HEADER_BYTES {
            return Err(corrupted("shorter than its header"));
        }
        let flags = bytes[0];
        let checksummed = match flags & !FLAG_TOMBSTONE {
            0 => false,
            FLAG_CHECKSUM => true,
            _ => return Err(corrupted("unknown flags")),
        };
        let mut body_end = bytes.len();
        if checksummed {
            body_end = bytes
                .len()
                .checked_sub(CHECKSUM_BYTES)
                .filter(|end| *end >= HEADER_BYTES)
                .ok_or_else(|| corrupted("shorter than its header and checksum"))?;
            let mut stored = [0u8; CHECKSUM_BYTES];
            stored.copy_from_slice(&bytes[body_end..]);
            if u32::from_be_bytes(stored) != checksum(at, &bytes[..body_end]) {
                let rev = Revision::from_key(at);
                return Err(corrupted(&format!(
                    "checksum mismatch at revision ({}, {})",
                    rev.main, rev.sub
                )));
            }
        }
        let int = |offset: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[offset..offset + 8]);
            i64::from_be_bytes(b)
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[25..29]);
        let key_len = u32::from_be_bytes(len) as usize;
        let key_end = HEADER_BYTES
            .checked_add(key_len)
            .filter(|end| *end <= body_end)
            .ok_or_else(|| corrupted("key length past the end"))?;
        Ok(RecordHead {
            key: &bytes[HEADER_BYTES..key_end],
            tombstone: flags & FLAG_TOMBSTONE != 0,
            create_revision: int(1),
            version: int(9),
            lease: int(17),
            value_len: body_end - key_end,
            value_offset: key_end,
            flags,
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

    /// Decodes `bytes`, stored under the revision key `at`, as the next record (REC-2,
    /// REC-4); nothing is kept if they are corrupted.
    pub fn push(&mut self, at: &RevisionKey, bytes: &[u8]) -> Result<(), StorageError> {
        let head = Record::decode_head(at, bytes)?;
        let body_end = head.value_offset + head.value_len;
        let len = body_end - HEADER_BYTES;
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
        self.chunk.extend_from_slice(&bytes[HEADER_BYTES..body_end]);
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

/// Returns the checksummed record `record` as a build before checksums stored it: no
/// trailer, no mark (tests of the older format).
#[cfg(test)]
pub(crate) fn legacy(record: &[u8]) -> Vec<u8> {
    let mut old = record[..record.len() - CHECKSUM_BYTES].to_vec();
    old[0] &= !FLAG_CHECKSUM;
    old
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: RevisionKey = [0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1];

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
            decoder.push(&AT, &record.encode(&AT)).unwrap();
        }
        assert!(
            decoder.push(&AT, &[0x80; HEADER_BYTES]).is_err(),
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
            decoder.push(&AT, &r.encode(&AT)).unwrap();
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
        assert_eq!(Record::decode(&AT, &r.encode(&AT)), Ok(r.clone()));
        let t = Record::tombstone(Bytes::from_static(b"gone"));
        assert_eq!(Record::decode(&AT, &t.encode(&AT)), Ok(t));
    }

    #[test]
    fn record_decode_rejects_bad_bytes_without_panicking() {
        let good = Record::tombstone(Bytes::from_static(b"key")).encode(&AT);
        for len in 0..good.len() {
            // Every strict prefix is corrupted (its checksum is gone), never a panic.
            let got = Record::decode(&AT, &good[..len]);
            assert!(got.is_err(), "prefix of {len} bytes decoded");
        }
        let mut bad_flags = good.clone();
        bad_flags[0] = 0x80;
        assert!(Record::decode(&AT, &bad_flags).is_err());
        let mut huge_key = legacy(&good);
        huge_key[25..29].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Record::decode(&AT, &huge_key).is_err());
    }

    fn sample() -> Record {
        Record {
            key: Bytes::from_static(b"key"),
            tombstone: false,
            create_revision: 5,
            version: 2,
            lease: 0,
            value: Bytes::from_static(b"a value of some length"),
        }
    }

    #[test]
    fn every_changed_byte_of_a_record_or_its_revision_is_refused() {
        // REC-4: one flipped bit anywhere in the stored bytes, or a record read under
        // another revision, gives Corrupted; the untouched record decodes.
        let good = sample().encode(&AT);
        assert_eq!(good[0], 0xa4);
        assert_eq!(Record::decode(&AT, &good), Ok(sample()));
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[at] ^= 1 << bit;
                let got = Record::decode(&AT, &bad);
                assert!(
                    matches!(got, Err(StorageError::Corrupted(_))),
                    "byte {at} bit {bit}: {got:?}"
                );
                let mut head = Decoder::with_capacity(1);
                assert!(head.push(&AT, &bad).is_err());
            }
        }
        let mut elsewhere = AT;
        elsewhere[15] = 2;
        let got = Record::decode(&elsewhere, &good);
        assert_eq!(
            got,
            Err(StorageError::Corrupted(
                "history record: checksum mismatch at revision (7, 2)".into()
            ))
        );
    }

    #[test]
    fn a_record_written_before_checksums_still_decodes_and_hashes_alike() {
        let record = sample();
        let new = record.encode(&AT);
        let old = legacy(&new);
        assert_eq!(old[0], 0);
        assert_eq!(Record::decode(&AT, &old), Ok(record.clone()));
        let mut decoder = Decoder::with_capacity(2);
        decoder.push(&AT, &old).unwrap();
        decoder.push(&AT, &new).unwrap();
        assert_eq!(decoder.finish(), vec![record.clone(), record]);
        // Unchecked: a changed value byte goes unnoticed, as it always did.
        let mut changed = old.clone();
        *changed.last_mut().unwrap() ^= 1;
        assert!(Record::decode(&AT, &changed).is_ok());
        // HashKV sees the same bytes for both forms: the old form, whole.
        let (new_head, old_head) = (
            Record::decode_head(&AT, &new).unwrap(),
            Record::decode_head(&AT, &old).unwrap(),
        );
        let joined = |(flags, rest): (u8, &[u8])| [&[flags][..], rest].concat();
        assert_eq!(joined(new_head.hashed_parts(&new)), old);
        assert_eq!(joined(old_head.hashed_parts(&old)), old);
        assert_eq!(new_head.value_in(&new), b"a value of some length");
        assert_eq!(new_head.value_len, old_head.value_len);
    }
}
