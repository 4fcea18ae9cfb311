//! The bytes of the `operations` table: one row per recorded outcome, keyed by operation id.
//! Total decoders: bad bytes give `Corrupted`, never a panic (STORE-4).
//!
//! A row is a format byte (1), the big-endian u64 sequence number, the u64 wall-clock
//! nanoseconds of the apply, the i64 revision, the 12-byte request digest, one kind byte
//! and the response. A response is its fields in declaration order: integers big-endian
//! (i64/u64), booleans one byte, byte strings a u32 length and the bytes, optional values a
//! presence byte, lists a u32 count; a Txn's responses are each a kind byte and the
//! response.

use bytes::Bytes;

use crate::api::{
    CompactionResponse, DeleteRangeResponse, KeyValue, LeaseGrantResponse, LeaseRevokeResponse,
    PutResponse, RangeResponse, ResponseHeader, ResponseOp, TxnResponse,
};
use crate::codec::Reader;
use crate::error::StorageError;

const FORMAT: u8 = 1;

fn corrupted(what: &str) -> StorageError {
    StorageError::Corrupted(format!("operations row: {what}"))
}

/// A response that can be recorded as an operation's outcome and replayed to a retry.
pub trait Recordable: Sized {
    /// The kind byte that names the response type in a row.
    const KIND: u8;
    /// Appends the response's bytes.
    fn encode(&self, out: &mut Encoder);
    /// Reads the response back; `Corrupted` on bad bytes.
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError>;
    /// The revision the response's header names (the store's revision after the write).
    fn revision(&self) -> i64;
}

/// Builds the bytes of a row.
#[derive(Debug, Default)]
pub struct Encoder {
    bytes: Vec<u8>,
}

impl Encoder {
    fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_be_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_be_bytes());
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn count(&mut self, n: usize) {
        self.bytes
            .extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.count(v.len());
        self.bytes.extend_from_slice(v);
    }
    fn header(&mut self, h: &ResponseHeader) {
        self.i64(h.revision);
    }
    fn kv(&mut self, kv: &KeyValue) {
        self.bytes(&kv.key);
        self.i64(kv.create_revision);
        self.i64(kv.mod_revision);
        self.i64(kv.version);
        self.bytes(&kv.value);
        self.i64(kv.lease);
    }
    fn kvs(&mut self, kvs: &[KeyValue]) {
        self.count(kvs.len());
        for kv in kvs {
            self.kv(kv);
        }
    }
}

/// Reads the bytes of a row: the shared reader plus the response fields.
#[derive(Debug)]
pub struct Decoder<'a> {
    reader: Reader<'a>,
}

impl<'a> Decoder<'a> {
    fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder {
            reader: Reader::new(bytes, "operations row"),
        }
    }
    fn u8(&mut self) -> Result<u8, StorageError> {
        self.reader.u8()
    }
    fn u64(&mut self) -> Result<u64, StorageError> {
        self.reader.u64()
    }
    fn i64(&mut self) -> Result<i64, StorageError> {
        self.reader.i64()
    }
    fn bool(&mut self) -> Result<bool, StorageError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(corrupted("bad boolean")),
        }
    }
    fn count(&mut self) -> Result<usize, StorageError> {
        self.reader.count()
    }
    fn bytes(&mut self) -> Result<Bytes, StorageError> {
        Ok(Bytes::copy_from_slice(self.reader.bytes()?))
    }
    fn header(&mut self) -> Result<ResponseHeader, StorageError> {
        Ok(ResponseHeader {
            revision: self.i64()?,
        })
    }
    fn kv(&mut self) -> Result<KeyValue, StorageError> {
        Ok(KeyValue {
            key: self.bytes()?,
            create_revision: self.i64()?,
            mod_revision: self.i64()?,
            version: self.i64()?,
            value: self.bytes()?,
            lease: self.i64()?,
        })
    }
    fn kvs(&mut self) -> Result<Vec<KeyValue>, StorageError> {
        let n = self.count()?;
        (0..n).map(|_| self.kv()).collect()
    }
    fn end(&self) -> Result<(), StorageError> {
        self.reader.end()
    }
}

impl Recordable for PutResponse {
    const KIND: u8 = 1;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
        out.bool(self.prev_kv.is_some());
        if let Some(kv) = &self.prev_kv {
            out.kv(kv);
        }
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        let header = input.header()?;
        let prev_kv = if input.bool()? {
            Some(input.kv()?)
        } else {
            None
        };
        Ok(PutResponse { header, prev_kv })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for DeleteRangeResponse {
    const KIND: u8 = 2;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
        out.i64(self.deleted);
        out.kvs(&self.prev_kvs);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(DeleteRangeResponse {
            header: input.header()?,
            deleted: input.i64()?,
            prev_kvs: input.kvs()?,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for RangeResponse {
    const KIND: u8 = 3;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
        out.kvs(&self.kvs);
        out.bool(self.more);
        out.i64(self.count);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(RangeResponse {
            header: input.header()?,
            kvs: input.kvs()?,
            more: input.bool()?,
            count: input.i64()?,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for TxnResponse {
    const KIND: u8 = 4;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
        out.bool(self.succeeded);
        out.count(self.responses.len());
        for op in &self.responses {
            match op {
                ResponseOp::Range(r) => {
                    out.u8(RangeResponse::KIND);
                    r.encode(out);
                }
                ResponseOp::Put(r) => {
                    out.u8(PutResponse::KIND);
                    r.encode(out);
                }
                ResponseOp::DeleteRange(r) => {
                    out.u8(DeleteRangeResponse::KIND);
                    r.encode(out);
                }
                ResponseOp::Txn(r) => {
                    out.u8(TxnResponse::KIND);
                    r.encode(out);
                }
            }
        }
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        let header = input.header()?;
        let succeeded = input.bool()?;
        let n = input.count()?;
        let mut responses = Vec::with_capacity(n);
        for _ in 0..n {
            responses.push(match input.u8()? {
                RangeResponse::KIND => ResponseOp::Range(RangeResponse::decode(input)?),
                PutResponse::KIND => ResponseOp::Put(PutResponse::decode(input)?),
                DeleteRangeResponse::KIND => {
                    ResponseOp::DeleteRange(DeleteRangeResponse::decode(input)?)
                }
                TxnResponse::KIND => ResponseOp::Txn(TxnResponse::decode(input)?),
                _ => return Err(corrupted("unknown response kind")),
            });
        }
        Ok(TxnResponse {
            header,
            succeeded,
            responses,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for CompactionResponse {
    const KIND: u8 = 5;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(CompactionResponse {
            header: input.header()?,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for LeaseGrantResponse {
    const KIND: u8 = 6;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
        out.i64(self.id);
        out.i64(self.ttl);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(LeaseGrantResponse {
            header: input.header()?,
            id: input.i64()?,
            ttl: input.i64()?,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

impl Recordable for LeaseRevokeResponse {
    const KIND: u8 = 7;
    fn encode(&self, out: &mut Encoder) {
        out.header(&self.header);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(LeaseRevokeResponse {
            header: input.header()?,
        })
    }
    fn revision(&self) -> i64 {
        self.header.revision
    }
}

/// An operator call's outcome: the revision it was applied at and what it answered (the
/// rows a repair changed, else 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountingOutcome {
    /// The store revision when it was applied.
    pub revision: i64,
    /// The call's answer.
    pub answer: u64,
}

impl Recordable for AccountingOutcome {
    const KIND: u8 = 8;
    fn encode(&self, out: &mut Encoder) {
        out.i64(self.revision);
        out.u64(self.answer);
    }
    fn decode(input: &mut Decoder<'_>) -> Result<Self, StorageError> {
        Ok(AccountingOutcome {
            revision: input.i64()?,
            answer: input.u64()?,
        })
    }
    fn revision(&self) -> i64 {
        self.revision
    }
}

/// The fixed part of a row: everything but the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowHead {
    /// Apply order among recorded operations; eviction goes oldest first by it.
    pub seq: u64,
    /// Wall-clock nanoseconds since the Unix epoch when it was applied (engine clock).
    pub at_nanos: u64,
    /// The revision the response names.
    pub revision: i64,
    /// The digest of the request.
    pub digest: [u8; 12],
    /// The response's kind byte.
    pub kind: u8,
}

/// Encodes a row: `head` and `response`.
pub fn encode_row<R: Recordable>(head: &RowHead, response: &R) -> Vec<u8> {
    let mut out = Encoder::default();
    out.u8(FORMAT);
    out.u64(head.seq);
    out.u64(head.at_nanos);
    out.i64(head.revision);
    out.bytes.extend_from_slice(&head.digest);
    out.u8(R::KIND);
    response.encode(&mut out);
    out.bytes
}

/// Decodes a row's fixed part, returning it and a decoder over the response.
pub fn decode_head(row: &[u8]) -> Result<(RowHead, Decoder<'_>), StorageError> {
    let mut input = Decoder::new(row);
    if input.u8()? != FORMAT {
        return Err(corrupted("unknown format"));
    }
    let seq = input.u64()?;
    let at_nanos = input.u64()?;
    let revision = input.i64()?;
    let mut digest = [0u8; 12];
    digest.copy_from_slice(input.reader.take(12)?);
    let kind = input.u8()?;
    let head = RowHead {
        seq,
        at_nanos,
        revision,
        digest,
        kind,
    };
    Ok((head, input))
}

/// Decodes the response of a row whose kind is `R`'s; `Corrupted` if it is not, or if the
/// bytes are bad.
pub fn decode_response<R: Recordable>(row: &[u8]) -> Result<R, StorageError> {
    let (head, mut input) = decode_head(row)?;
    if head.kind != R::KIND {
        return Err(corrupted("response of another kind"));
    }
    let response = R::decode(&mut input)?;
    input.end()?;
    Ok(response)
}

/// Checks a whole row: its head and its response decode.
pub fn check_row(row: &[u8]) -> Result<RowHead, StorageError> {
    let (head, _) = decode_head(row)?;
    match head.kind {
        PutResponse::KIND => decode_response::<PutResponse>(row).map(drop),
        DeleteRangeResponse::KIND => decode_response::<DeleteRangeResponse>(row).map(drop),
        TxnResponse::KIND => decode_response::<TxnResponse>(row).map(drop),
        CompactionResponse::KIND => decode_response::<CompactionResponse>(row).map(drop),
        LeaseGrantResponse::KIND => decode_response::<LeaseGrantResponse>(row).map(drop),
        LeaseRevokeResponse::KIND => decode_response::<LeaseRevokeResponse>(row).map(drop),
        AccountingOutcome::KIND => decode_response::<AccountingOutcome>(row).map(drop),
        _ => Err(corrupted("unknown response kind")),
    }?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: Bytes::copy_from_slice(key.as_bytes()),
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            value: Bytes::from_static(b"v"),
            lease: 7,
        }
    }

    fn head(kind: u8) -> RowHead {
        RowHead {
            seq: 3,
            at_nanos: 9,
            revision: 5,
            digest: [1; 12],
            kind,
        }
    }

    #[test]
    fn responses_round_trip_and_bad_bytes_are_refused() {
        let txn = TxnResponse {
            header: ResponseHeader { revision: 5 },
            succeeded: true,
            responses: vec![
                ResponseOp::Range(RangeResponse {
                    header: ResponseHeader { revision: 5 },
                    kvs: vec![kv("a", 2), kv("b", 3)],
                    more: true,
                    count: 9,
                }),
                ResponseOp::Put(PutResponse {
                    header: ResponseHeader { revision: 5 },
                    prev_kv: Some(kv("c", 4)),
                }),
                ResponseOp::DeleteRange(DeleteRangeResponse {
                    header: ResponseHeader { revision: 5 },
                    deleted: 1,
                    prev_kvs: vec![kv("d", 1)],
                }),
                ResponseOp::Txn(TxnResponse::default()),
            ],
        };
        let row = encode_row(&head(TxnResponse::KIND), &txn);
        assert_eq!(decode_response::<TxnResponse>(&row).unwrap(), txn);
        assert_eq!(check_row(&row).unwrap(), head(TxnResponse::KIND));
        assert!(
            decode_response::<PutResponse>(&row).is_err(),
            "kind is checked"
        );
        for cut in 0..row.len() {
            assert!(check_row(&row[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = row.clone();
        long.push(0);
        assert!(check_row(&long).is_err(), "trailing bytes");
        let grant = LeaseGrantResponse {
            header: ResponseHeader { revision: 2 },
            id: 11,
            ttl: 60,
        };
        let row = encode_row(&head(LeaseGrantResponse::KIND), &grant);
        assert_eq!(decode_response::<LeaseGrantResponse>(&row).unwrap(), grant);
        let outcome = AccountingOutcome {
            revision: 4,
            answer: 2,
        };
        let row = encode_row(&head(AccountingOutcome::KIND), &outcome);
        assert_eq!(decode_response::<AccountingOutcome>(&row).unwrap(), outcome);
    }
}
