//! Entry points for the fuzz targets in `fuzz/` and for the corpus replay test
//! (`tests/fuzz_decoders.rs`): each function takes arbitrary bytes, runs one family of the
//! engine's decoders of stored bytes on them, and checks what those decoders promise.
//!
//! Not an API: hidden from the docs, outside any compatibility promise, and free to change
//! with the fuzz targets. The server has the same kind of module for its request decoders
//! (`kvd_server::fuzzing`).
//!
//! Each function returns normally for every input; a panic is a bug found. The checks:
//! - totality (STORE-4, REC-2, WAL-5): bad bytes give `Corrupted`, never a panic;
//! - round trips (REC-1, REV-2 and the row codecs): what decodes re-encodes to bytes that
//!   decode to the same value, byte for byte where the layout has one encoding per value;
//! - the log's replay rule (WAL-2, WAL-5, WAL-8) against an oracle: [`wal_log`] builds a log
//!   from the input, some records naming where the next one starts past a gap, damages it as
//!   the input says, and `records_after` must return exactly the records that are whole, of
//!   the current epoch and in sequence.
//!
//! Contact points: `mvcc::record`, `mvcc::revision`, `lease`, `alarm`, `accounting::codec`,
//! `storage` (meta values), `storage::wal` and `bbolt` (etcd snapshots); the targets
//! `fuzz/fuzz_targets/{record,rows,wal_ops,wal_log,bbolt_read}.rs`.

use crate::accounting::codec;
use crate::alarm;
use crate::api::RangeRequest;
use crate::engine::WriteRequest;
use crate::error::{Error, StorageError};
use crate::lease;
use crate::mvcc::Revision;
use crate::mvcc::record::{Record, put_cost};
use crate::mvcc::validate;
use crate::storage::wal::{self, Op, OpLog, RECORD_HEADER_BYTES};
use crate::storage::{self, REVISION_KEY_BYTES, RevisionKey};

/// The epoch and the sequence number [`wal_ops`] frames its record with.
const WAL_OPS_EPOCH: u64 = 7;
const WAL_OPS_SEQ: u64 = 41;
/// At most this many records in a [`wal_log`] log, so one input stays fast.
const WAL_LOG_RECORDS_MAX: usize = 64;
/// Zeros after the last record of a [`wal_log`] log, as a fresh log file has.
const WAL_LOG_TAIL_BYTES: usize = 32;

/// Decodes `data` as a history record stored under its first 16 bytes as revision key
/// (zeros if shorter), and its first 32 bytes as two history keys.
///
/// Checks REC-2 (total), REC-1 (a decoded checksummed record re-encodes to exactly `data`,
/// one without a checksum to a record that decodes alike), REC-4 (a re-encoded record read
/// under another revision is refused), that `decode_head` agrees with `decode` field by
/// field and in what it refuses, the record's cost, and REV-1/REV-2 on the keys.
pub fn history_record(data: &[u8]) {
    revision_keys(data);
    let at = key_at(data, 0).unwrap_or_default();
    match (Record::decode_head(&at, data), Record::decode(&at, data)) {
        (Ok(head), Ok(record)) => {
            let encoded = record.encode(&at);
            if head.checksummed() {
                assert_eq!(encoded, data, "REC-1: re-encoding changed the bytes");
            } else {
                assert_eq!(Record::decode(&at, &encoded), Ok(record.clone()), "REC-1");
            }
            let mut elsewhere = at;
            elsewhere[15] ^= 1;
            assert!(
                Record::decode(&elsewhere, &encoded).is_err(),
                "REC-4: read under another revision"
            );
            assert_eq!(head.key, &record.key[..]);
            assert_eq!(head.tombstone, record.tombstone);
            assert_eq!(head.create_revision, record.create_revision);
            assert_eq!(head.version, record.version);
            assert_eq!(head.lease, record.lease);
            assert_eq!(head.value_len, record.value.len());
            let cost = if record.tombstone {
                0
            } else {
                put_cost(record.key.len(), record.value.len())
            };
            assert_eq!(head.cost(), cost);
            let kv = record.clone().into_key_value(i64::MAX);
            assert_eq!((kv.key, kv.value), (record.key, record.value));
            assert_eq!(kv.mod_revision, i64::MAX);
        }
        (Err(head), Err(err)) => {
            assert!(is_corrupted(&err), "REC-2: {err:?} is not Corrupted");
            assert_eq!(
                head, err,
                "decode_head and decode refuse for different reasons"
            );
        }
        // Only reached when exactly one of the two accepted, so this always fails.
        (head, record) => assert_eq!(
            head.is_ok(),
            record.is_ok(),
            "decode_head and decode disagree on whether the record is valid"
        ),
    }
}

/// Checks REV-2 on the first 16 bytes and REV-1 on the first two 16-byte keys.
fn revision_keys(data: &[u8]) {
    let (Some(a), Some(b)) = (key_at(data, 0), key_at(data, REVISION_KEY_BYTES)) else {
        return;
    };
    let (ra, rb) = (Revision::from_key(&a), Revision::from_key(&b));
    assert_eq!(ra.to_key(), a, "REV-2");
    if [ra.main, ra.sub, rb.main, rb.sub].iter().all(|v| *v >= 0) {
        assert_eq!(
            ra.cmp(&rb),
            a.cmp(&b),
            "REV-1: key order differs from revision order"
        );
    }
}

fn key_at(data: &[u8], at: usize) -> Option<RevisionKey> {
    data.get(at..at.checked_add(REVISION_KEY_BYTES)?)?
        .try_into()
        .ok()
}

/// Decodes `data` as one of the row tables' rows: the first byte picks the table (leases,
/// alarms, the quota registry, agents, reservations, allocations, a meta value, a sealed
/// row), the second is the length of the row's key, and the rest is the key then the value.
///
/// Checks that each decoder is total (STORE-4) and that a decoded row re-encodes to bytes
/// that decode to the same row (to the same bytes where the encoding is unique); a sealed
/// row or meta value that opens seals again to exactly its bytes (ROW-1).
pub fn rows(data: &[u8]) {
    let Some((&table, rest)) = data.split_first() else {
        return;
    };
    let (key, value) = split_row(rest);
    match table % 8 {
        0 => lease_row(key, value),
        1 => alarm_row(rest),
        2 => registry_row(key, value),
        3 => agent_row(key, value),
        4 => reservation_row(key, value),
        5 => allocation_row(key, value),
        6 => meta_value(rest),
        _ => sealed_row(key, value),
    }
}

/// Splits a row into its key (length in the first byte, cut at the end) and its value.
fn split_row(data: &[u8]) -> (&[u8], &[u8]) {
    let Some((&len, rest)) = data.split_first() else {
        return (&[], &[]);
    };
    rest.split_at(usize::from(len).min(rest.len()))
}

fn lease_row(key: &[u8], value: &[u8]) {
    match lease::decode_row(key, value) {
        Ok((id, ttl)) => {
            let (k, v) = lease::encode_row(id, ttl);
            assert_eq!((&k[..], &v[..]), (key, value), "lease row round trip");
        }
        Err(err) => {
            assert!(is_corrupted(&err), "lease row: {err:?}");
            assert!(
                key.len() != 8 || value.len() != 8,
                "a well-sized lease row refused"
            );
        }
    }
}

fn alarm_row(key: &[u8]) {
    match alarm::decode_key(key) {
        Ok(member) => assert_eq!(&alarm::encode_key(member)[..], key, "alarm key round trip"),
        Err(err) => assert!(is_corrupted(&err), "alarm key: {err:?}"),
    }
}

fn registry_row(key: &[u8], value: &[u8]) {
    match codec::decode_config(key, value) {
        Ok(config) => {
            let encoded = codec::encode_config(&config);
            assert_eq!(
                codec::decode_config(key, &encoded).as_ref(),
                Ok(&config),
                "registry row round trip"
            );
            let again = codec::decode_config(key, &encoded).map(|c| codec::encode_config(&c));
            assert_eq!(
                again.as_ref(),
                Ok(&encoded),
                "registry row encoding is not canonical"
            );
        }
        Err(err) => assert!(is_corrupted(&err), "registry row: {err:?}"),
    }
}

fn agent_row(key: &[u8], value: &[u8]) {
    record_id(key);
    match codec::decode_agent(value) {
        Ok(agent) => {
            let encoded = codec::encode_agent(&agent);
            assert_eq!(
                codec::decode_agent(&encoded).as_ref(),
                Ok(&agent),
                "agent row round trip"
            );
        }
        Err(err) => assert!(is_corrupted(&err), "agent row: {err:?}"),
    }
}

fn reservation_row(key: &[u8], value: &[u8]) {
    record_id(key);
    match codec::decode_reservation(value) {
        Ok(reservation) => {
            let encoded = codec::encode_reservation(&reservation);
            assert_eq!(
                codec::decode_reservation(&encoded).as_ref(),
                Ok(&reservation),
                "reservation row round trip"
            );
        }
        Err(err) => assert!(is_corrupted(&err), "reservation row: {err:?}"),
    }
}

fn allocation_row(key: &[u8], value: &[u8]) {
    record_id(key);
    match codec::decode_allocation(value) {
        Ok(allocation) => {
            let encoded = codec::encode_allocation(&allocation);
            assert_eq!(
                codec::decode_allocation(&encoded).as_ref(),
                Ok(&allocation),
                "allocation row round trip"
            );
        }
        Err(err) => assert!(is_corrupted(&err), "allocation row: {err:?}"),
    }
}

fn record_id(key: &[u8]) {
    match codec::decode_id(key) {
        Ok(id) => assert_eq!(id.as_bytes(), key, "record id round trip"),
        Err(err) => assert!(is_corrupted(&err), "record id: {err:?}"),
    }
}

fn meta_value(bytes: &[u8]) {
    const NAME: &str = "current_revision";
    match storage::seal::meta_any(NAME, bytes) {
        Ok(value) if bytes.len() == 8 => {
            assert_eq!(&value.to_be_bytes()[..], bytes, "meta value round trip");
            assert!(
                storage::seal::read_meta(NAME, bytes).is_err(),
                "ROW-1: unsealed"
            );
        }
        Ok(value) => {
            assert_eq!(
                &storage::seal::meta(NAME, value)[..],
                bytes,
                "sealed meta round trip"
            );
            assert_eq!(storage::seal::read_meta(NAME, bytes), Ok(value));
        }
        Err(err) => {
            assert!(is_corrupted(&err), "meta value: {err:?}");
            assert_ne!(bytes.len(), 8, "an 8-byte meta value refused");
        }
    }
}

fn sealed_row(key: &[u8], stored: &[u8]) {
    const TABLE: &str = "leases";
    match storage::seal::open(TABLE, key, stored) {
        Ok(value) => {
            assert_eq!(
                storage::seal::seal(TABLE, key, value),
                stored,
                "ROW-1 round trip"
            );
            assert!(
                storage::seal::open("alarms", key, stored).is_err(),
                "ROW-1: table"
            );
        }
        Err(err) => assert!(is_corrupted(&err), "sealed row: {err:?}"),
    }
}

/// Decodes `data` as the payload of a log record (WAL-5), and re-encodes what decodes.
///
/// The operations are logged again through `OpLog` and framed: the payload must come out
/// byte for byte as `data`, and `records_after` must find the framed record in its epoch
/// and not in the next one (WAL-2).
pub fn wal_ops(data: &[u8]) {
    let ops = match wal::decode_ops(data) {
        Ok(ops) => ops,
        Err(err) => {
            assert!(is_corrupted(&err), "WAL-5: {err:?} is not Corrupted");
            return;
        }
    };
    let mut log = OpLog::default();
    for op in &ops {
        match *op {
            Op::PutHistory(key, value) => log.put_history(&key, value),
            Op::DeleteHistory(key) => log.delete_history(&key),
            Op::PutMeta(key, value) => log.put_meta(key, value),
            Op::PutRow(table, key, value) => log.put_row(table, key, value),
            Op::DeleteRow(table, key) => log.delete_row(table, key),
            Op::ContinueAt(offset) => log.continue_at(offset),
        }
    }
    let record = log.frame(WAL_OPS_EPOCH, WAL_OPS_SEQ, 0);
    assert_eq!(
        record.bytes.get(RECORD_HEADER_BYTES..),
        Some(data),
        "re-logging the decoded operations changed the payload"
    );
    let found = wal::records_after(&record.bytes, 0, WAL_OPS_SEQ - 1, WAL_OPS_EPOCH);
    assert_eq!(
        found,
        vec![(WAL_OPS_SEQ, data)],
        "a framed record does not replay"
    );
    let other_epoch = wal::records_after(&record.bytes, 0, WAL_OPS_SEQ - 1, WAL_OPS_EPOCH + 1);
    assert!(
        other_epoch.is_empty(),
        "WAL-2: a record replayed in another epoch"
    );
}

/// Reads fields off the front of the input, with zeros once it runs out.
struct Input<'a> {
    bytes: &'a [u8],
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.bytes.split_at(n.min(self.bytes.len()));
        self.bytes = rest;
        head
    }

    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        let mut out = [0u8; 8];
        let head = self.take(8);
        out[..head.len()].copy_from_slice(head);
        u64::from_be_bytes(out)
    }
}

/// One record [`wal_log`] placed in its log.
struct Placed {
    seq: u64,
    current_epoch: bool,
    start: usize,
    end: usize,
    value: Vec<u8>,
    /// Where the record says the next one starts (WAL-8), if it says so.
    continues_at: Option<u64>,
}

/// How [`wal_log`] damages its log.
#[derive(Clone, Copy)]
enum Damage {
    None,
    /// The file ends here (a torn write at the end of what reached the disk).
    CutAt(usize),
    /// One byte differs (a damaged sector, or an older record's bytes).
    FlipAt(usize, u8),
}

/// Builds a log from `data`, damages it, and checks `records_after` against an oracle
/// (WAL-2, WAL-5).
///
/// Input: the damage kind, its position (u16) and the XOR mask (u8); the offset of the first
/// record (u8, up to 63 zero bytes before it); the last durable sequence number (u64) and the
/// epoch (u64); then records, each a control byte (bit 0: written in the next epoch; bits 1-2:
/// the sequence step, `+1`, `+2`, `+0` or `+1`; bit 3: the record's first operation is a
/// "continue at" naming where the next record starts, after a gap of 16 times bits 4-7 filler
/// bytes, WAL-8), a value length (u8) and the value, logged as one put-history operation. The
/// expected replay is the records up to the first one that is of another epoch, out of
/// sequence, cut off or damaged: gaps and their damage change nothing.
pub fn wal_log(data: &[u8]) {
    let mut input = Input { bytes: data };
    let (kind, position, mask) = (input.u8(), usize::from(input.u16()), input.u8().max(1));
    let lead = usize::from(input.u8() % 64);
    let (last_seq, epoch) = (input.u64(), input.u64());
    let mut log = vec![0u8; lead];
    let mut placed = Vec::new();
    let mut seq = last_seq;
    while !input.bytes.is_empty() && placed.len() < WAL_LOG_RECORDS_MAX {
        let control = input.u8();
        let len = usize::from(input.u8());
        let value = input.take(len).to_vec();
        seq = match (control >> 1) & 3 {
            1 => seq.wrapping_add(2),
            2 => seq,
            _ => seq.wrapping_add(1),
        };
        let current_epoch = control & 1 == 0;
        let record_epoch = if current_epoch {
            epoch
        } else {
            epoch.wrapping_add(1)
        };
        let mut ops = OpLog::default();
        ops.put_history(&Revision::new(0, i64::from(control)).to_key(), &value);
        let offset = u64::try_from(log.len()).unwrap_or(u64::MAX);
        let gap = usize::from(control >> 4) * 16;
        let continues_at = (control & 8 != 0).then(|| {
            let len = ops.framed_len() + wal::CONTINUE_AT_BYTES as usize;
            u64::try_from(log.len() + len + gap).unwrap_or(u64::MAX)
        });
        if let Some(next) = continues_at {
            ops.continue_at(next);
        }
        let record = ops.frame(record_epoch, seq, offset);
        let start = log.len();
        log.extend_from_slice(&record.bytes);
        placed.push(Placed {
            seq,
            current_epoch,
            start,
            end: log.len(),
            value,
            continues_at,
        });
        if continues_at.is_some() {
            // Filler that looks like nothing: replay must jump over it.
            log.resize(log.len() + gap, 0xa5);
        }
    }
    log.resize(log.len() + WAL_LOG_TAIL_BYTES, 0);
    let damage = match kind % 3 {
        0 => Damage::None,
        1 => Damage::CutAt(position % (log.len() + 1)),
        _ => Damage::FlipAt(position % log.len(), mask),
    };
    match damage {
        Damage::None => {}
        Damage::CutAt(at) => log.truncate(at),
        Damage::FlipAt(at, mask) => {
            if let Some(byte) = log.get_mut(at) {
                *byte ^= mask;
            }
        }
    }
    let expected = expected_replay(&placed, last_seq, damage);
    let lead_offset = u64::try_from(lead).unwrap_or(u64::MAX);
    let found = wal::records_after(&log, lead_offset, last_seq, epoch);
    let found_seqs: Vec<u64> = found.iter().map(|(seq, _)| *seq).collect();
    let expected_seqs: Vec<u64> = expected.iter().map(|p| p.seq).collect();
    assert_eq!(
        found_seqs, expected_seqs,
        "records_after replayed the wrong records"
    );
    for ((_, payload), placed) in found.iter().zip(&expected) {
        let ops = wal::decode_ops(payload);
        let holds = match (ops.as_deref(), placed.continues_at) {
            (Ok([Op::PutHistory(_, value)]), None) => *value == &placed.value[..],
            (Ok([Op::ContinueAt(next), Op::PutHistory(_, value)]), Some(at)) => {
                *next == at && *value == &placed.value[..]
            }
            _ => false,
        };
        assert!(
            holds,
            "a replayed payload does not hold its operations: {ops:?}"
        );
    }
}

/// Returns the records a correct replay yields: in order, up to the first that is of another
/// epoch, out of sequence, or not wholly and intactly in the file.
fn expected_replay(placed: &[Placed], last_seq: u64, damage: Damage) -> Vec<&Placed> {
    let mut expected = Vec::new();
    let mut next = last_seq.wrapping_add(1);
    for p in placed {
        let intact = match damage {
            Damage::None => true,
            Damage::CutAt(at) => p.end <= at,
            Damage::FlipAt(at, _) => !(p.start..p.end).contains(&at),
        };
        if !intact || !p.current_epoch || p.seq != next {
            break;
        }
        expected.push(p);
        next = next.wrapping_add(1);
    }
    expected
}

fn is_corrupted(err: &StorageError) -> bool {
    matches!(err, StorageError::Corrupted(_))
}

/// Returns the engine's verdict on a Range request's checks (VAL-1), as `Engine::range` runs
/// them; for the server's fuzzing.
pub fn check_range(request: &RangeRequest) -> Result<(), Error> {
    validate::check_range(request)
}

/// Reads `data` as an etcd snapshot's bbolt file, as `kvd snapshot status` and `kvd
/// snapshot restore` do.
///
/// Checks BBOLT-2 and BREAD-1 (total: entries or an error, never a panic), BREAD-2 (keys
/// strictly increase within a bucket, buckets in name order), that the status counts what
/// the walk reported, and that an accepted import gives a dump the dump reader accepts with
/// the same number of history records.
pub fn bbolt_file(data: &[u8]) {
    use crate::bbolt::read::{Reader, split_trailer};
    let (db, _) = split_trailer(data);
    let Ok(reader) = Reader::open(db) else {
        return;
    };
    let mut entries: u64 = 0;
    let mut last: Option<(Vec<u8>, Vec<u8>)> = None;
    let walked = reader.visit(&mut |bucket, key, _value| {
        if let Some((b, k)) = &last {
            assert!(
                (b.as_slice(), k.as_slice()) < (bucket, key),
                "BREAD-2: entries out of order"
            );
        }
        last = Some((bucket.to_vec(), key.to_vec()));
        entries += 1;
        Ok(())
    });
    if let Ok(status) = crate::bbolt::status::status(db) {
        assert!(walked.is_ok(), "status accepted a file the walk refused");
        assert_eq!(status.total_keys, entries);
    }
    if let Ok((image, summary)) = crate::engine::import_etcd_snapshot(db) {
        assert!(
            walked.is_ok(),
            "the import accepted a file the walk refused"
        );
        let dumped = storage::dump::summarize(&image);
        assert!(
            dumped.is_ok(),
            "the import made a dump the dump reader refuses: {dumped:?}"
        );
        let dumped = dumped.unwrap_or_default();
        assert_eq!(dumped.history_records, summary.history_entries);
        assert!(summary.revision >= 1);
    }
}

/// Returns the engine's verdict on a write request's stateless checks (VAL-1), as admission
/// runs them with `max_txn_ops`; for the server's fuzzing.
pub fn check_write(request: &WriteRequest, max_txn_ops: usize) -> Result<(), Error> {
    match request {
        WriteRequest::Put(put) => validate::check_put(put),
        WriteRequest::DeleteRange(delete) => validate::check_delete(delete),
        WriteRequest::Txn(txn) => validate::check_txn(txn, max_txn_ops),
        WriteRequest::Compaction(_)
        | WriteRequest::LeaseGrant(_)
        | WriteRequest::LeaseRevoke(_)
        | WriteRequest::Alarm(_)
        | WriteRequest::Accounting(_) => Ok(()),
    }
}

/// Returns the protobuf length of a write request's own message as API-2 computes it, without
/// the raft entry around it that [`WriteRequest::encoded_len`] adds; for the server's fuzzing.
pub fn message_len(request: &WriteRequest) -> usize {
    request.message_len()
}

/// Returns the protobuf length of a Range request as API-2 computes it (a Range inside a Txn
/// counts towards the Txn's size); for the server's fuzzing.
pub fn range_message_len(request: &RangeRequest) -> usize {
    request.encoded_len()
}
