//! The write-ahead log: what makes a write batch durable without a redb `Immediate` commit,
//! so that the apply thread can apply the next batch while this one's fdatasync runs.
//!
//! A logged batch is committed to redb with `Durability::None` (visible in this process, no
//! I/O) and its changes, as physical operations, are framed into one [`LogRecord`]. The
//! commit thread writes records in order into `kvd.wal`, a file whose first `wal_file_bytes`
//! are filled with zeros when it is created (so an overwrite plus `fdatasync` touches no
//! file-system metadata), and answers a batch only after the `fdatasync` that covers its
//! record. When the next record would pass `wal_file_bytes` a batch is committed `Immediate`
//! instead (a **checkpoint**): redb then holds every batch so far durably, and the log starts
//! again at the start of the other of its two regions (offset 0 or `wal_file_bytes`), so the
//! checkpoint's own sync can run off the apply thread (WAL-8). While a defrag copies, the log
//! may run on into the rest of the file (allocated, [`log_file_bytes`] in all: 16 MiB by
//! default) before a checkpoint, so no checkpoint's `fsync` competes with the copy's.
//!
//! Record layout (all integers big-endian): magic `KVDM` (u32), payload length (u32),
//! CRC-32 of the epoch, the sequence number and the payload (u32), sequence number (u64), the
//! durable mark (u64: the last sequence number a sync had made durable when the record was
//! written, stamped by the writer) and its CRC-32 with the record's CRC and sequence number
//! (u32), payload. Records of the layout before the mark (magic `KVDL`, no mark and its CRC)
//! are still replayed. The payload is a run of operations, each a tag byte then its fields:
//! - `1` put history: 16-byte revision key, value length (u32), value;
//! - `2` delete history: 16-byte revision key;
//! - `3` put meta: meta code (u8), value (u64);
//! - `4` put row: table name length (u8), name, key length (u32), key, value length (u32),
//!   value;
//! - `5` delete row: table name length (u8), name, key length (u32), key;
//! - `6` continue at: file offset (u64), only as a record's first operation: the next record
//!   of the chain starts there, not after this one (a deferred checkpoint's record, WAL-8).
//!
//! Every batch commit (logged or checkpoint) also writes, in the same redb transaction,
//! `wal_seq` (its sequence number) and `wal_offset` (where the next record goes). Recovery
//! on open reads both, and `wal_epoch`, from redb's last durable commit and replays the
//! records found from `wal_offset` that were written in that epoch and whose sequence numbers
//! follow on from `wal_seq` one by one, going on at the offset a record's "continue at" names;
//! the first record that is torn, fails its CRC (which folds in the epoch) or carries another
//! sequence number ends the log. Open then commits
//! the replayed operations with the next epoch and the log restarting at offset 0, so records
//! of a crashed run that were never acknowledged can never join a later run's chain.
//!
//! Invariants:
//! - WAL-1: a record is written only after the redb commit of its batch returned, and the
//!   commit thread writes records in sequence order, each after every earlier one.
//! - WAL-2: within an epoch sequence numbers grow by one per batch commit and are never
//!   reused, and every open starts a new epoch, so a stale record (an earlier lap of the
//!   file, or an unacknowledged tail of a crashed run) can never follow on from `wal_seq`.
//! - WAL-3: redb's durable state plus the records that follow on from its `wal_seq` is every
//!   batch whose answer was sent: a batch is answered after its record's `fdatasync`
//!   (logged) or after its own `Immediate` commit (checkpoint), which also makes every
//!   earlier batch durable in redb.
//! - WAL-4: the log restarts only in a checkpoint, and records after it overwrite only records
//!   of batches that a durable redb commit holds: a checkpoint whose commit was synchronous
//!   (no record; the log restarts at offset 0), or the deferred checkpoint before it (WAL-8).
//! - WAL-8: a checkpoint's commit does not wait for its sync when its own record fits in the
//!   log and one of the two regions (`[0, wal_file_bytes)`, `[wal_file_bytes, 2 *
//!   wal_file_bytes)`) is clear of the chain redb's last durable commit replays (from its
//!   `wal_offset` to the checkpoint's record): the checkpoint is then logged like any batch,
//!   its record's first operation names that region's start, and its commit writes that start
//!   as `wal_offset`. Until its sync is done the database file may hold the last durable
//!   commit or the checkpoint (redb falls back by checksum), and both replay every batch: the
//!   first through the checkpoint's record and on in the new region, the second from the new
//!   region. The next checkpoint's commit writes the file only after that sync (FILE-4), so
//!   its records, which may overwrite the old region, follow a durable checkpoint. Otherwise
//!   (a record too large, or a defrag that filled both regions) the checkpoint is synchronous
//!   and the log restarts at offset 0.
//! - WAL-5: decoding is total: bad bytes end the log (tail) or give `Corrupted` (inside a
//!   record whose CRC matched), never a panic.
//! - WAL-7: a break in the chain is the log's end only if no later record of the epoch
//!   carries a durable mark at or past the missing sequence number. Such a record was written
//!   after the missing one had been synced, so that one was durable (and its batch possibly
//!   answered) and is damaged since: replay refuses to open the log instead of dropping every
//!   acknowledged batch from there on. A torn last write cannot look like that: the records
//!   of one write carry the mark of the sync before it. The search past the break reads the
//!   rest of the file, and the file before the chain's segment (a chain that began in the
//!   second region goes on in the first, WAL-8), when the break is not at zeros (zeros end
//!   every write); at zeros it covers the bytes replay read already.
//! - WAL-6: the log is written in whole [`LOG_BLOCK_BYTES`] blocks at block offsets: a
//!   write rewrites the last, partly filled block with the bytes it already held (kept in
//!   memory, or read from the file when a write does not follow on from the previous one),
//!   then the new records, then zeros to the block's end. Zeros after the log's end are
//!   never part of a record (a zero magic ends the log at replay), so what replay finds is
//!   the same as with writes of the records alone. The blocks let the file be written with
//!   `O_DIRECT` where the filesystem allows it (not tmpfs; open rewrites the first block
//!   unchanged as a probe, and keeps the page cache if that fails): past the page cache, a sync
//!   measured 12-18 µs shorter and 8-12 µs cheaper in system CPU on this project's virtio
//!   disk (docs/design/write-path.md).
//!
//! Contact points: `Store::write_logged` frames records and decides checkpoints;
//! `engine::commit` writes them with [`LogWriter::write`]; `Store::open` replays.

use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::faults::Faults;
use super::{MetaKey, REVISION_KEY_BYTES, RevisionKey, io_error, open_read_write};
use crate::error::StorageError;
use crate::sync::{Arc, Mutex, lock};

/// The name of the log file inside the data directory.
pub const WAL_FILE_NAME: &str = "kvd.wal";
/// Default length of the log between checkpoints (`wal_file_bytes`): a record that would
/// pass it makes its batch a checkpoint (outside a defrag), so this also bounds the replay at open and redb's buffer of non-durable pages, and with it how
/// long a checkpoint holds the apply thread: under a flood of small puts a 16 MiB log made
/// checkpoints of 64-128 ms every 3 s, a 2 MiB one 8-16 ms, several a second; 512 KiB gave
/// the same throughput with 64 clients and a lower p99 (`docs/design/write-path.md`).
pub const WAL_FILE_BYTES_DEFAULT: u64 = 512 << 10;
/// The log file is this many times `wal_file_bytes` long, and at least
/// `Config::wal_defrag_room_bytes` ([`log_file_bytes`]). Past `wal_file_bytes` it is allocated
/// but not zero-filled, and records go there only while a defrag copies: a checkpoint then
/// would queue its `fsync` behind the copy's (measured: with checkpoints every 2 MiB of
/// records, the median longest put during a 500 MiB defrag was 59-88 ms; with none during the
/// copy, 27.6-34.5 ms).
pub const WAL_DEFRAG_ROOM_FACTOR: u64 = 8;
/// The shortest log file by default (`Config::wal_defrag_room_bytes`). The room past
/// `wal_file_bytes` must outlast a defrag's copy, whose length follows the store's size, not
/// the checkpoint interval: with a 4 MiB file (eight times the 512 KiB default) four writers
/// filled it about 4 s into a 500 MiB defrag, and the checkpoint that followed held every put
/// for about a second (`benchmarks-features.md`).
pub const WAL_DEFRAG_ROOM_BYTES_DEFAULT: u64 = 16 << 20;
/// Log writes cover whole blocks of this many bytes at offsets that are multiples of it, from
/// a buffer aligned to it, as `O_DIRECT` asks (WAL-6); 4 KiB is the largest logical block of
/// common disks and a page.
pub const LOG_BLOCK_BYTES: usize = 4096;
/// An aligned write buffer grown past this by a large record is given back after its write.
const BLOCKS_KEPT_BYTES: usize = 1 << 20;
/// The smallest log file accepted.
pub const WAL_FILE_BYTES_MIN: u64 = 64 << 10;
/// The largest log between checkpoints accepted: the file is eight times as long (512 MiB),
/// made at the first open, and a checkpoint writes the pages of that much log at once.
/// Larger values are refused rather than filling the disk with the file.
pub const WAL_FILE_BYTES_MAX: u64 = 64 << 20;
/// Bytes of a record before its payload.
pub const RECORD_HEADER_BYTES: usize = 32;
/// Bytes of a record header as kvd wrote it before the durable mark (WAL-7): replayed, never
/// written.
const LEGACY_HEADER_BYTES: usize = 20;
/// A batch makes a checkpoint once its record would pass its region's end less this fraction
/// of the region, kept for the checkpoint's own record, which then fits unless it is that
/// large itself (WAL-8).
pub const CHECKPOINT_ROOM_DIVISOR: u64 = 8;
/// Zeros written per call while the file is created.
const FILL_CHUNK_BYTES: usize = 1 << 20;
/// `KVDM`: a record with the durable mark (WAL-7).
const RECORD_MAGIC: u32 = 0x4b56_444d;
/// `KVDL`: a record of the layout before the durable mark.
const LEGACY_RECORD_MAGIC: u32 = 0x4b56_444c;

const OP_PUT_HISTORY: u8 = 1;
const OP_DELETE_HISTORY: u8 = 2;
const OP_PUT_META: u8 = 3;
const OP_PUT_ROW: u8 = 4;
const OP_DELETE_ROW: u8 = 5;
const OP_CONTINUE_AT: u8 = 6;
/// Bytes of a "continue at" operation: the tag and the offset.
pub const CONTINUE_AT_BYTES: u64 = 9;

const _: () = assert!(WAL_FILE_BYTES_DEFAULT >= WAL_FILE_BYTES_MIN);
const _: () = assert!(RECORD_HEADER_BYTES == 4 + 4 + 4 + 8 + 8 + 4);
const _: () = assert!(LEGACY_HEADER_BYTES == 4 + 4 + 4 + 8);

/// One batch's record, placed in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    /// The batch's sequence number.
    pub seq: u64,
    /// Where the record starts in the file.
    pub offset: u64,
    /// The framed record.
    pub bytes: Vec<u8>,
}

impl LogRecord {
    /// Returns true if the record is a checkpoint's, naming where the log goes on (WAL-8).
    pub fn is_checkpoint(&self) -> bool {
        self.bytes
            .get(RECORD_HEADER_BYTES..)
            .and_then(continues_at)
            .is_some()
    }
}

/// Bytes an operation log reserves up front: a few dozen small Puts without a reallocation.
const OP_LOG_INITIAL_BYTES: usize = 16 << 10;

/// The operations of one batch, encoded as they are made.
#[derive(Debug, Default)]
pub struct OpLog {
    payload: Vec<u8>,
}

impl OpLog {
    /// Returns an empty log with room for a typical batch.
    pub fn new() -> OpLog {
        OpLog {
            payload: Vec::with_capacity(OP_LOG_INITIAL_BYTES),
        }
    }

    pub(crate) fn put_history(&mut self, key: &RevisionKey, value: &[u8]) {
        self.payload.push(OP_PUT_HISTORY);
        self.payload.extend_from_slice(key);
        put_bytes(&mut self.payload, value);
    }

    pub(crate) fn delete_history(&mut self, key: &RevisionKey) {
        self.payload.push(OP_DELETE_HISTORY);
        self.payload.extend_from_slice(key);
    }

    pub(crate) fn put_meta(&mut self, key: MetaKey, value: u64) {
        self.payload.push(OP_PUT_META);
        self.payload.push(key.code());
        self.payload.extend_from_slice(&value.to_be_bytes());
    }

    pub(crate) fn put_row(&mut self, table: &str, key: &[u8], value: &[u8]) {
        self.payload.push(OP_PUT_ROW);
        put_name(&mut self.payload, table);
        put_bytes(&mut self.payload, key);
        put_bytes(&mut self.payload, value);
    }

    pub(crate) fn delete_row(&mut self, table: &str, key: &[u8]) {
        self.payload.push(OP_DELETE_ROW);
        put_name(&mut self.payload, table);
        put_bytes(&mut self.payload, key);
    }

    /// Makes the record say that the chain goes on at `offset` (WAL-8): its first operation.
    pub(crate) fn continue_at(&mut self, offset: u64) {
        let mut op = [0u8; CONTINUE_AT_BYTES as usize];
        op[0] = OP_CONTINUE_AT;
        op[1..].copy_from_slice(&offset.to_be_bytes());
        self.payload.splice(0..0, op);
    }

    /// Returns the length the framed record will have.
    pub fn framed_len(&self) -> usize {
        RECORD_HEADER_BYTES + self.payload.len()
    }

    /// Frames the operations as the record of batch `seq` written in `epoch`.
    pub fn frame(self, epoch: u64, seq: u64, offset: u64) -> LogRecord {
        let mut bytes = Vec::with_capacity(self.framed_len());
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        bytes.extend_from_slice(&RECORD_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&len.to_be_bytes());
        let crc = checksum(epoch, seq, &self.payload);
        bytes.extend_from_slice(&crc.to_be_bytes());
        bytes.extend_from_slice(&seq.to_be_bytes());
        // The durable mark, 0 until the writer stamps it (WAL-7).
        bytes.extend_from_slice(&0u64.to_be_bytes());
        bytes.extend_from_slice(&mark_checksum(crc, seq, 0).to_be_bytes());
        bytes.extend_from_slice(&self.payload);
        LogRecord { seq, offset, bytes }
    }
}

/// One decoded operation of a record, borrowing the record's bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// Put a history record.
    PutHistory(RevisionKey, &'a [u8]),
    /// Delete a history record.
    DeleteHistory(RevisionKey),
    /// Set a meta integer.
    PutMeta(MetaKey, u64),
    /// Put a row of a named table.
    PutRow(&'a str, &'a [u8], &'a [u8]),
    /// Delete a row of a named table.
    DeleteRow(&'a str, &'a [u8]),
    /// The next record of the chain starts at this offset (WAL-8); changes nothing stored.
    ContinueAt(u64),
}

/// Decodes the operations of a payload whose CRC matched (WAL-5).
pub fn decode_ops(mut payload: &[u8]) -> Result<Vec<Op<'_>>, StorageError> {
    let mut ops = Vec::new();
    while let Some((&tag, rest)) = payload.split_first() {
        payload = rest;
        let op = match tag {
            OP_PUT_HISTORY => {
                let key = take_key(&mut payload)?;
                Op::PutHistory(key, take_bytes(&mut payload)?)
            }
            OP_DELETE_HISTORY => Op::DeleteHistory(take_key(&mut payload)?),
            OP_PUT_META => {
                let code = take(&mut payload, 1)?[0];
                let key = MetaKey::from_code(code)
                    .ok_or_else(|| corrupted(&format!("unknown meta code {code}")))?;
                Op::PutMeta(key, take_u64(&mut payload)?)
            }
            OP_PUT_ROW => {
                let table = take_name(&mut payload)?;
                let key = take_bytes(&mut payload)?;
                Op::PutRow(table, key, take_bytes(&mut payload)?)
            }
            OP_DELETE_ROW => {
                let table = take_name(&mut payload)?;
                Op::DeleteRow(table, take_bytes(&mut payload)?)
            }
            OP_CONTINUE_AT if ops.is_empty() => Op::ContinueAt(take_u64(&mut payload)?),
            other => return Err(corrupted(&format!("unknown operation {other}"))),
        };
        ops.push(op);
    }
    Ok(ops)
}

/// Where the next record goes, as the apply thread tracks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPosition {
    /// The sequence number of the next batch commit.
    pub next_seq: u64,
    /// Where its record would start.
    pub next_offset: u64,
    /// Where the log restarted at the last checkpoint (0 or `checkpoint_bytes`): the chain
    /// redb's last durable commit replays starts there or later (a compaction's or defrag's
    /// durable commit keeps the position after the batch before it) (WAL-8).
    pub chain_start: u64,
    /// The log's length between checkpoints (`wal_file_bytes`, the zero-filled part).
    pub checkpoint_bytes: u64,
    /// The file's usable length, never below `checkpoint_bytes`: the room past it is used
    /// only while a defrag copies ([`log_file_bytes`]).
    pub file_bytes: u64,
}

impl LogPosition {
    /// Returns true if the batch whose record is `len` bytes makes a checkpoint: its record
    /// would pass the log's end less the room kept for a checkpoint's record
    /// ([`CHECKPOINT_ROOM_DIVISOR`]). The log's end is its region's, or while a defrag copies
    /// (`defragging`) the file's, so no checkpoint's `fsync` competes with the copy's for the
    /// disk unless the whole file fills.
    pub fn needs_checkpoint(&self, len: u64, defragging: bool) -> bool {
        let room = self.checkpoint_bytes / CHECKPOINT_ROOM_DIVISOR;
        self.next_offset.saturating_add(len) > self.end(defragging).saturating_sub(room)
    }

    /// Returns where the log restarts after a checkpoint whose record of `len` bytes (its
    /// "continue at" included) would go at `next_offset`, if the checkpoint's sync can be
    /// deferred: the start of a region clear of the chain from `chain_start` to that record's
    /// end, when the record fits before the log's end (WAL-8). `None`: the checkpoint must be
    /// synchronous.
    pub fn deferred_restart(&self, len: u64, defragging: bool) -> Option<u64> {
        let end = self.next_offset.checked_add(len)?;
        if end > self.end(defragging) {
            return None;
        }
        let region = self.checkpoint_bytes;
        [0, region].into_iter().find(|&start| {
            let clear = start + region <= self.chain_start || start >= end;
            start != self.chain_start && clear && start + region <= self.file_bytes
        })
    }

    fn end(&self, defragging: bool) -> u64 {
        if defragging {
            self.file_bytes
        } else {
            self.chain_start.saturating_add(self.checkpoint_bytes)
        }
    }
}

/// Writes records into the log file and makes them durable.
#[derive(Debug)]
pub struct LogWriter {
    file: File,
    /// True if `file` was opened with `O_DIRECT` (WAL-6).
    direct: bool,
    sync: bool,
    faults: Option<Arc<Faults>>,
    /// The block-aligned copy of the log's last written block (WAL-6).
    blocks: Mutex<Blocks>,
    /// The store's disk histograms (TIME-1); the fsync is timed here.
    pub timings: super::timings::DiskTimings,
}

impl LogWriter {
    /// Writes `records` in order (WAL-1), each run of adjoining records in one write of whole
    /// blocks (WAL-6); [`LogWriter::sync`] then makes them durable.
    pub fn write(&self, records: &[&LogRecord]) -> Result<(), StorageError> {
        let mut blocks = lock(&self.blocks);
        for record in records {
            if let Err(e) = self.allow() {
                // The records before this one still go out, as they would one by one.
                blocks.flush(&self.file)?;
                return Err(e);
            }
            if blocks.end() != Some(record.offset) {
                blocks.flush(&self.file)?;
                blocks.load(&self.file, record.offset)?;
            }
            blocks.push(&record.bytes)?;
            blocks.stamp_last(record.bytes.len());
        }
        blocks.flush(&self.file)
    }

    /// Makes the records just written durable with one `fdatasync` (skipped when there are
    /// none, and under `unsafe_no_fsync`).
    pub fn sync(&self, records: &[&LogRecord]) -> Result<(), StorageError> {
        if let Some(faults) = &self.faults {
            faults.before_log_sync();
        }
        if self.sync && !records.is_empty() {
            self.allow()?;
            let started = std::time::Instant::now();
            self.file
                .sync_data()
                .map_err(|e| StorageError::Io(format!("fdatasync {WAL_FILE_NAME}: {e}")))?;
            self.timings.wal_fsync.observe(started.elapsed());
            if let Some(last) = records.last() {
                let mut blocks = lock(&self.blocks);
                blocks.durable = blocks.durable.max(last.seq);
            }
        }
        Ok(())
    }

    /// Notes that every record up to `seq` is durable (in redb's durable state after replay),
    /// for the durable mark of the records written next (WAL-7).
    pub fn set_durable(&self, seq: u64) {
        let mut blocks = lock(&self.blocks);
        blocks.durable = blocks.durable.max(seq);
    }

    /// Returns true if the log is written with `O_DIRECT`, past the page cache (WAL-6).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn allow(&self) -> Result<(), StorageError> {
        match &self.faults {
            Some(faults) => faults.allow().map_err(|e| StorageError::Io(e.to_string())),
            None => Ok(()),
        }
    }
}

/// The log's bytes from a block boundary to the end of what was last written, in a buffer
/// aligned for `O_DIRECT` (WAL-6): every write rewrites the last, partly filled block whole,
/// with zeros after the log's end.
#[derive(Debug)]
struct Blocks {
    /// Backing memory; the usable buffer is `raw[start..]`, whose first byte sits at a
    /// [`LOG_BLOCK_BYTES`] boundary in memory.
    raw: Vec<u8>,
    start: usize,
    /// The file offset of the buffer's first byte (a multiple of [`LOG_BLOCK_BYTES`]), or
    /// `None` before the first write.
    base: Option<u64>,
    /// Bytes of log from `base`: less than a block after every write (only the last, partly
    /// filled block is kept), more while records wait for the next.
    len: usize,
    /// True if bytes were pushed since the last write to the file.
    unwritten: bool,
    /// The last sequence number whose record a sync made durable, stamped into the records
    /// written after it (WAL-7); 0 without syncs (`unsafe_no_fsync`).
    durable: u64,
}

impl Blocks {
    fn new() -> Blocks {
        Blocks {
            raw: Vec::new(),
            start: 0,
            base: None,
            len: 0,
            unwritten: false,
            durable: 0,
        }
    }

    /// Where the log's next byte goes, if a write has placed the buffer.
    fn end(&self) -> Option<u64> {
        self.base.map(|base| base + self.len as u64)
    }

    /// Places the buffer so that the next byte goes to `offset`, reading the bytes of its
    /// block before it from the file (a block past the file's end reads as zeros).
    fn load(&mut self, file: &File, offset: u64) -> Result<(), StorageError> {
        let block = LOG_BLOCK_BYTES as u64;
        let base = offset - offset % block;
        let prefix = usize::try_from(offset - base).unwrap_or(0);
        self.reserve(LOG_BLOCK_BYTES)?;
        let buffer = &mut self.raw[self.start..self.start + LOG_BLOCK_BYTES];
        let filled = if prefix == 0 {
            0
        } else {
            // One read of the whole block: under O_DIRECT a read must be whole blocks too,
            // and only the file's end makes it short.
            file.read_at(buffer, base)
                .map_err(|e| StorageError::Io(format!("read {WAL_FILE_NAME}: {e}")))?
        };
        buffer[filled.min(prefix)..].fill(0);
        self.base = Some(base);
        self.len = prefix;
        self.unwritten = false;
        Ok(())
    }

    fn push(&mut self, bytes: &[u8]) -> Result<(), StorageError> {
        self.reserve(round_up(self.len + bytes.len()))?;
        let at = self.start + self.len;
        self.raw[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self.unwritten = true;
        Ok(())
    }

    /// Stamps the durable mark into the record of `len` bytes just pushed (WAL-7).
    fn stamp_last(&mut self, len: usize) {
        let at = self.start + self.len - len;
        let Some(Header { crc, seq, .. }) =
            header_at(&self.raw, at).filter(|header| header.bytes == RECORD_HEADER_BYTES)
        else {
            return;
        };
        let mark = at + 20;
        self.raw[mark..mark + 8].copy_from_slice(&self.durable.to_be_bytes());
        self.raw[mark + 8..mark + 12]
            .copy_from_slice(&mark_checksum(crc, seq, self.durable).to_be_bytes());
    }

    /// Writes the buffer's blocks whole (the first of them held bytes already written, the
    /// buffer starting with the last partly filled block), then keeps only the last partly
    /// filled block.
    fn flush(&mut self, file: &File) -> Result<(), StorageError> {
        let Some(base) = self.base else {
            return Ok(());
        };
        if !self.unwritten {
            return Ok(());
        }
        let end = round_up(self.len);
        self.raw[self.start + self.len..self.start + end].fill(0);
        file.write_all_at(&self.raw[self.start..self.start + end], base)
            .map_err(|e| StorageError::Io(format!("write {WAL_FILE_NAME}: {e}")))?;
        let keep = self.len - self.len % LOG_BLOCK_BYTES;
        self.raw
            .copy_within(self.start + keep..self.start + self.len, self.start);
        self.base = Some(base + keep as u64);
        self.len -= keep;
        self.unwritten = false;
        if self.raw.len() > BLOCKS_KEPT_BYTES {
            self.reallocate(LOG_BLOCK_BYTES)?;
        }
        Ok(())
    }

    /// Makes the aligned buffer at least `bytes` long, keeping its contents.
    fn reserve(&mut self, bytes: usize) -> Result<(), StorageError> {
        if self.raw.len() - self.start >= bytes {
            return Ok(());
        }
        self.reallocate(round_up(bytes.max(2 * (self.raw.len() - self.start))))
    }

    /// Moves the contents into a new aligned buffer of `capacity` bytes (at least `len`).
    fn reallocate(&mut self, capacity: usize) -> Result<(), StorageError> {
        let mut raw = vec![0u8; capacity + LOG_BLOCK_BYTES];
        let start = raw.as_ptr().align_offset(LOG_BLOCK_BYTES);
        if start >= LOG_BLOCK_BYTES {
            return Err(StorageError::Io(format!(
                "cannot align a buffer for {WAL_FILE_NAME}"
            )));
        }
        raw[start..start + self.len].copy_from_slice(&self.raw[self.start..self.start + self.len]);
        self.raw = raw;
        self.start = start;
        Ok(())
    }
}

/// Rounds `bytes` up to whole blocks.
fn round_up(bytes: usize) -> usize {
    bytes.div_ceil(LOG_BLOCK_BYTES) * LOG_BLOCK_BYTES
}

/// Returns the log opened again with `O_DIRECT` where the filesystem takes it (WAL-6), else
/// `buffered`, the file as open already; and whether it is direct.
fn open_for_writes(path: &Path, sync: bool, buffered: File) -> (File, bool) {
    // tmpfs and some others refuse the flag at open; a filesystem that takes it but not
    // this alignment fails the probe. The page cache then.
    if sync
        && let Ok(file) = open_direct(path)
        && rewrite_first_block(&file).is_ok()
    {
        return (file, true);
    }
    (buffered, false)
}

/// Reads the file's first block and writes it back unchanged, as the writer's block writes
/// would: proof that the file takes them. The file is at least [`WAL_FILE_BYTES_MIN`] long,
/// and bytes written over themselves change nothing even if the write is torn.
fn rewrite_first_block(file: &File) -> Result<(), StorageError> {
    let mut probe = Blocks::new();
    probe.reserve(LOG_BLOCK_BYTES)?;
    let block = &mut probe.raw[probe.start..probe.start + LOG_BLOCK_BYTES];
    let read = file
        .read_at(block, 0)
        .map_err(|e| StorageError::Io(format!("read {WAL_FILE_NAME}: {e}")))?;
    if read < LOG_BLOCK_BYTES {
        return Err(StorageError::Io(format!(
            "{WAL_FILE_NAME} is shorter than a block"
        )));
    }
    probe.base = Some(0);
    probe.len = LOG_BLOCK_BYTES;
    probe.unwritten = true;
    probe.flush(file)
}

/// Opens an existing file for reads and writes with `O_DIRECT`.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    File::options()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
        .open(path)
}

/// Without `O_DIRECT` (not Linux), the log goes through the page cache.
#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> std::io::Result<File> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// Returns the length of the log file for a log of `checkpoint_bytes` between checkpoints:
/// [`WAL_DEFRAG_ROOM_FACTOR`] times as long, and at least `least_bytes`.
pub fn log_file_bytes(checkpoint_bytes: u64, least_bytes: u64) -> u64 {
    checkpoint_bytes
        .saturating_mul(WAL_DEFRAG_ROOM_FACTOR)
        .max(least_bytes)
}

/// Opens `dir`'s log file, creating it filled with zeros over both regions (twice
/// `checkpoint_bytes`, WAL-8; no further than `file_bytes`) and allocated up to `file_bytes`
/// (and made durable) if it is missing or shorter. Returns the
/// writer and the file's length: when the filesystem cannot allocate the defrag room (full,
/// or no `fallocate`), the log goes without it. Nothing of the log is read here: replay reads
/// only its records ([`read_records_after`]).
pub fn open(
    dir: &Path,
    checkpoint_bytes: u64,
    file_bytes: u64,
    sync: bool,
    faults: Option<Arc<Faults>>,
) -> Result<(LogWriter, u64), StorageError> {
    let path = dir.join(WAL_FILE_NAME);
    let file = open_read_write(&path)?;
    let length = file
        .metadata()
        .map_err(|e| io_error("read the length of", &path, &e))?
        .len();
    // Both regions (WAL-8). A file made before the second region was used has only the
    // first zero-filled: the first lap through the second pays its extents' conversion.
    let zeroed = checkpoint_bytes
        .saturating_mul(2)
        .min(file_bytes.max(checkpoint_bytes));
    if length < zeroed {
        fill_with_zeros(&file, length, zeroed).map_err(|e| io_error("fill", &path, &e))?;
    }
    let mut usable = length.max(zeroed);
    if usable < file_bytes {
        // The defrag room: allocated, not written (no zeros to write at open), so a record
        // there can never meet a full filesystem; its first overwrite of a block changes the
        // extent's metadata, which only a defrag's batches pay.
        if fs4::FileExt::allocate(&file, file_bytes).is_ok() {
            usable = file_bytes;
        }
        file.sync_all().map_err(|e| io_error("sync", &path, &e))?;
    }
    if length < usable {
        super::defrag::sync_dir(dir)?;
    }
    let (file, direct) = open_for_writes(&path, sync, file);
    let writer = LogWriter {
        file,
        direct,
        sync,
        faults,
        blocks: Mutex::new(Blocks::new()),
        timings: super::timings::DiskTimings::default(),
    };
    Ok((writer, usable))
}

/// Bytes read from the log file at a time during replay: the records of a typical log in a
/// few reads, and no more than that past their end.
const REPLAY_READ_BYTES: usize = 256 << 10;

/// The records replay found in the log file, with the bytes that hold them.
#[derive(Debug)]
pub struct Replayed {
    /// The file's bytes from the replay's offset, at least to the end of the last record.
    bytes: Vec<u8>,
    /// Each record's sequence number and where its payload lies in `bytes`.
    records: Vec<(u64, Range<usize>)>,
}

impl Replayed {
    /// The records in log order: sequence number and payload.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.records
            .iter()
            .map(|(seq, range)| (*seq, &self.bytes[range.clone()]))
    }

    /// The last record's sequence number, if there is one.
    pub fn last_seq(&self) -> Option<u64> {
        self.records.last().map(|(seq, _)| *seq)
    }
}

/// Reads from `dir`'s log file the records that [`records_after`] would find in the whole
/// file, reading only as far as they go (plus at most [`REPLAY_READ_BYTES`]), not the whole
/// file with its defrag room. A missing file holds no records.
pub fn read_records_after(
    dir: &Path,
    offset: u64,
    last_seq: u64,
    epoch: u64,
) -> Result<Replayed, StorageError> {
    let path = dir.join(WAL_FILE_NAME);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Replayed {
                bytes: Vec::new(),
                records: Vec::new(),
            });
        }
        Err(e) => return Err(io_error("open", &path, &e)),
    };
    let length = file
        .metadata()
        .map_err(|e| io_error("read the length of", &path, &e))?
        .len();
    let mut replayed = Replayed {
        bytes: Vec::new(),
        records: Vec::new(),
    };
    let (mut start, mut last_seq) = (offset, last_seq);
    loop {
        let mut source = FileSource {
            file: &file,
            path: &path,
            start,
            available: usize::try_from(length.saturating_sub(start)).unwrap_or(usize::MAX),
            bytes: Vec::new(),
        };
        let scanned = scan(&mut source, last_seq, epoch)?;
        if let Some(d) = scanned.damage {
            let (at, witness_at) = (start + d.at as u64, start + d.witness_at as u64);
            return Err(damaged(&path, d.missing, at, witness_at, d.witness));
        }
        if let Some((at, false)) = scanned.broke_at
            && start > 0
        {
            // WAL-7 before the scan's start too: a chain that restarted in the second region
            // goes on in the first (WAL-8).
            let mut before = vec![0u8; usize::try_from(start).unwrap_or(usize::MAX)];
            file.read_exact_at(&mut before, 0)
                .map_err(|e| io_error("read", &path, &e))?;
            if let Some((witness_at, witness)) = witness_from(&before, 0, scanned.expected, epoch) {
                let at = start + at as u64;
                return Err(damaged(
                    &path,
                    scanned.expected,
                    at,
                    witness_at as u64,
                    witness,
                ));
            }
        }
        let shift = replayed.bytes.len();
        replayed.records.extend(
            (scanned.records.into_iter())
                .map(|(seq, range)| (seq, range.start + shift..range.end + shift)),
        );
        if replayed.bytes.is_empty() {
            replayed.bytes = source.bytes;
        } else {
            replayed.bytes.extend_from_slice(&source.bytes);
        }
        match scanned.continues_at {
            Some(next) => (start, last_seq) = (next, scanned.expected.wrapping_sub(1)),
            None => return Ok(replayed),
        }
    }
}

/// The error of a replay that met damage (WAL-7): the record of batch `missing` at file offset
/// `at` is unreadable, and the record at `witness_at` (its sequence number and durable mark)
/// proves it was durable.
fn damaged(
    path: &Path,
    missing: u64,
    at: u64,
    witness_at: u64,
    witness: (u64, u64),
) -> StorageError {
    let (seq, durable) = witness;
    StorageError::Corrupted(format!(
        "{} is damaged: the record of batch {missing} at offset {at} cannot be read, but the \
         record of batch {seq} at offset {witness_at}, written once every batch up to \
         {durable} was durable, comes after it; replaying only what comes before would lose \
         acknowledged writes. Restore the data directory from a snapshot or a backup",
        path.display(),
    ))
}

/// Where a scan of the log takes its bytes from: all of them at once, or read on demand.
trait LogSource {
    /// Why a read failed.
    type Error;
    /// Returns the log's bytes from the scan's start: at least `end` of them when the log
    /// holds that many, else all it holds.
    fn up_to(&mut self, end: usize) -> Result<&[u8], Self::Error>;
}

impl LogSource for &[u8] {
    type Error = std::convert::Infallible;

    fn up_to(&mut self, _end: usize) -> Result<&[u8], Self::Error> {
        Ok(self)
    }
}

/// The log file read forward in [`REPLAY_READ_BYTES`] steps, every byte read kept.
struct FileSource<'a> {
    file: &'a File,
    path: &'a Path,
    /// The file offset of `bytes[0]`.
    start: u64,
    /// Bytes of the file from `start` to its end.
    available: usize,
    bytes: Vec<u8>,
}

impl LogSource for FileSource<'_> {
    type Error = StorageError;

    fn up_to(&mut self, end: usize) -> Result<&[u8], StorageError> {
        let had = self.bytes.len();
        if end > had && had < self.available {
            let want = end
                .max(had.saturating_add(REPLAY_READ_BYTES))
                .min(self.available);
            self.bytes.resize(want, 0);
            self.file
                .read_exact_at(&mut self.bytes[had..], self.start + had as u64)
                .map_err(|e| io_error("read", self.path, &e))?;
        }
        Ok(&self.bytes)
    }
}

/// What a scan of the log found.
struct Scanned {
    /// The records that follow on: sequence number and where the payload lies.
    records: Vec<(u64, Range<usize>)>,
    /// Set when the chain broke at a record a later one proves was durable (WAL-7).
    damage: Option<Damage>,
    /// Where the chain goes on, named by its last record (WAL-8); the scan stopped there.
    continues_at: Option<u64>,
    /// The sequence number of the record the chain needs next.
    expected: u64,
    /// Where the chain broke, if it did, and whether zeros are there (the end of a write).
    broke_at: Option<(usize, bool)>,
}

/// A break in the chain that is damage, not the log's end (WAL-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    /// Where, from the scan's start, the unreadable record begins.
    pub at: usize,
    /// The sequence number that record should carry.
    pub missing: u64,
    /// Where the later record that proves it durable begins.
    pub witness_at: usize,
    /// That record's sequence number, and its durable mark.
    pub witness: (u64, u64),
}

/// The records from the start of `source` whose sequence numbers follow on from `last_seq`,
/// each whole, of `epoch` and with a matching CRC; the first that is not ends the log, unless
/// a later record of `epoch` was written after that one was durable (WAL-7). The search for
/// such a record reads the rest of the source when the break is not at zeros (the end of a
/// write); at zeros it covers only what was read already.
fn scan<S: LogSource>(source: &mut S, last_seq: u64, epoch: u64) -> Result<Scanned, S::Error> {
    let mut records = Vec::new();
    let mut at = 0usize;
    let mut expected = last_seq.wrapping_add(1);
    while let Some(header_end) = at.checked_add(RECORD_HEADER_BYTES) {
        let Some(header) = header_at(source.up_to(header_end)?, at) else {
            break;
        };
        let Some(end) = (at + header.bytes).checked_add(header.len) else {
            break;
        };
        match record_at(source.up_to(end)?, at, epoch) {
            Some((seq, payload, next)) if seq == expected => {
                records.push((seq, payload..next));
                expected = expected.wrapping_add(1);
                at = next;
                if let Some(offset) = continues_at(&source.up_to(next)?[payload..next]) {
                    return Ok(Scanned {
                        records,
                        damage: None,
                        continues_at: Some(offset),
                        expected,
                        broke_at: None,
                    });
                }
            }
            _ => break,
        }
    }
    let at_zeros = {
        let held = source.up_to(at.saturating_add(4))?;
        held.get(at..at + 4).is_none_or(|word| word == [0; 4])
    };
    let rest = source.up_to(if at_zeros { 0 } else { usize::MAX })?;
    let damage = witness_after(rest, at, expected, epoch).map(|(witness_at, witness)| Damage {
        at,
        missing: expected,
        witness_at,
        witness,
    });
    Ok(Scanned {
        records,
        damage,
        continues_at: None,
        expected,
        broke_at: Some((at, at_zeros)),
    })
}

/// Returns the offset a record's payload says the chain goes on at, if it does (WAL-8).
fn continues_at(payload: &[u8]) -> Option<u64> {
    let (&code, mut offset) = payload.split_first()?;
    (code == OP_CONTINUE_AT)
        .then(|| take_u64(&mut offset).ok())
        .flatten()
}

/// Looks in `log` past `at` for a record of `epoch` whose durable mark is at least `missing`:
/// one written after the record of batch `missing` had been made durable (WAL-7). Returns its
/// offset, sequence number and mark.
fn witness_after(log: &[u8], at: usize, missing: u64, epoch: u64) -> Option<(usize, (u64, u64))> {
    witness_from(log, at.checked_add(1)?, missing, epoch)
}

/// [`witness_after`] from `from` on, `from` included.
fn witness_from(
    log: &[u8],
    mut from: usize,
    missing: u64,
    epoch: u64,
) -> Option<(usize, (u64, u64))> {
    let magic = RECORD_MAGIC.to_be_bytes();
    while let Some(found) = log.get(from..)?.windows(4).position(|w| w == magic) {
        let candidate = from + found;
        if let Some(header) = header_at(log, candidate)
            && let Some(durable) = header.durable
            && durable >= missing
            && header.seq > missing
            && record_at(log, candidate, epoch).is_some()
        {
            return Some((candidate, (header.seq, durable)));
        }
        from = candidate + 1;
    }
    None
}

/// Returns the records of `log` from `offset`, written in `epoch`, whose sequence numbers
/// follow on from `last_seq` (WAL-2, WAL-5): the part of the log redb's durable state does
/// not hold. Damage the scan found (WAL-7) is left to [`damage_after`].
pub fn records_after(log: &[u8], offset: u64, last_seq: u64, epoch: u64) -> Vec<(u64, &[u8])> {
    let mut records = Vec::new();
    let (mut offset, mut last_seq) = (offset, last_seq);
    while let Some(mut from) = usize::try_from(offset).ok().and_then(|at| log.get(at..)) {
        let Ok(found) = scan(&mut from, last_seq, epoch);
        records.extend((found.records.into_iter()).map(|(seq, range)| (seq, &from[range])));
        match found.continues_at {
            Some(next) => (offset, last_seq) = (next, found.expected.wrapping_sub(1)),
            None => break,
        }
    }
    records
}

/// The damage a replay of `log` from `offset` would stop at (WAL-7), offsets from `offset`.
#[cfg(test)]
fn damage_after(log: &[u8], offset: u64, last_seq: u64, epoch: u64) -> Option<Damage> {
    let mut from = usize::try_from(offset).ok().and_then(|at| log.get(at..))?;
    let Ok(found) = scan(&mut from, last_seq, epoch);
    found.damage
}

/// A record's header: payload length, CRC, sequence number, the durable mark where the
/// record has a valid one, and the header's length.
struct Header {
    len: usize,
    crc: u32,
    seq: u64,
    durable: Option<u64>,
    bytes: usize,
}

/// Decodes the header starting at `at`, if a whole one with a record magic is there.
fn header_at(log: &[u8], at: usize) -> Option<Header> {
    let word = |h: &[u8], i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let long = |h: &[u8], i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&h[i..i + 8]);
        u64::from_be_bytes(bytes)
    };
    let magic = word(log.get(at..at.checked_add(4)?)?, 0);
    let bytes = match magic {
        RECORD_MAGIC => RECORD_HEADER_BYTES,
        LEGACY_RECORD_MAGIC => LEGACY_HEADER_BYTES,
        _ => return None,
    };
    let header = log.get(at..at.checked_add(bytes)?)?;
    let (crc, seq) = (word(header, 8), long(header, 12));
    let durable = (magic == RECORD_MAGIC)
        .then(|| long(header, 20))
        .filter(|&mark| mark_checksum(crc, seq, mark) == word(header, 28));
    Some(Header {
        len: usize::try_from(word(header, 4)).ok()?,
        crc,
        seq,
        durable,
        bytes,
    })
}

/// Decodes the record starting at `at`, if a whole one of `epoch` with a matching CRC is there
/// (a record of another epoch fails the CRC, which folds the epoch in);
/// returns its sequence number, where its payload starts and the offset after it.
fn record_at(log: &[u8], at: usize, epoch: u64) -> Option<(u64, usize, usize)> {
    let header = header_at(log, at)?;
    // Every byte of a record is checked: a mark that fails its CRC makes the record damaged.
    if header.bytes == RECORD_HEADER_BYTES && header.durable.is_none() {
        return None;
    }
    let start = at + header.bytes;
    let end = start.checked_add(header.len)?;
    let payload = log.get(start..end)?;
    (checksum(epoch, header.seq, payload) == header.crc).then_some((header.seq, start, end))
}

/// The CRC-32 of a record's durable mark, bound to the record by its CRC and sequence number.
fn mark_checksum(crc: u32, seq: u64, durable: u64) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&crc.to_be_bytes());
    hasher.update(&seq.to_be_bytes());
    hasher.update(&durable.to_be_bytes());
    hasher.finalize()
}

fn checksum(epoch: u64, seq: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&epoch.to_be_bytes());
    hasher.update(&seq.to_be_bytes());
    hasher.update(payload);
    hasher.finalize()
}

fn fill_with_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; FILL_CHUNK_BYTES];
    let mut writer = std::io::BufWriter::new(file);
    std::io::Seek::seek(&mut writer, std::io::SeekFrom::Start(from))?;
    let mut left = to - from;
    while left > 0 {
        let n = left.min(FILL_CHUNK_BYTES as u64) as usize;
        writer.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    writer.flush()?;
    drop(writer);
    file.sync_all()
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    // Table names are short constants of this crate.
    debug_assert!(name.len() <= usize::from(u8::MAX));
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(name.as_bytes());
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], StorageError> {
    if input.len() < n {
        return Err(corrupted("operation cut short"));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

fn take_key(input: &mut &[u8]) -> Result<RevisionKey, StorageError> {
    let bytes = take(input, REVISION_KEY_BYTES)?;
    bytes.try_into().map_err(|_| corrupted("revision key"))
}

fn take_u64(input: &mut &[u8]) -> Result<u64, StorageError> {
    let bytes = take(input, 8)?;
    Ok(u64::from_be_bytes(
        bytes.try_into().map_err(|_| corrupted("u64"))?,
    ))
}

fn take_bytes<'a>(input: &mut &'a [u8]) -> Result<&'a [u8], StorageError> {
    let len = take(input, 4)?;
    let len = u32::from_be_bytes(len.try_into().map_err(|_| corrupted("length"))?);
    take(
        input,
        usize::try_from(len).map_err(|_| corrupted("length"))?,
    )
}

fn take_name<'a>(input: &mut &'a [u8]) -> Result<&'a str, StorageError> {
    let len = take(input, 1)?[0];
    let name = take(input, usize::from(len))?;
    std::str::from_utf8(name).map_err(|_| corrupted("table name"))
}

fn corrupted(what: &str) -> StorageError {
    StorageError::Corrupted(format!("{WAL_FILE_NAME}: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const EPOCH: u64 = 3;

    fn sample(seq: u64, offset: u64) -> LogRecord {
        let mut ops = OpLog::default();
        ops.put_history(&[7; 16], b"value");
        ops.delete_history(&[8; 16]);
        ops.put_meta(MetaKey::CurrentRevision, 42);
        ops.put_row("leases", b"k", b"v");
        ops.delete_row("leases", b"gone");
        ops.frame(EPOCH, seq, offset)
    }

    fn lay_out(records: &[LogRecord], len: usize) -> Vec<u8> {
        let mut log = vec![0u8; len];
        for r in records {
            let at = r.offset as usize;
            log[at..at + r.bytes.len()].copy_from_slice(&r.bytes);
        }
        log
    }

    #[test]
    fn record_round_trips_every_operation() {
        let record = sample(5, 0);
        let log = lay_out(std::slice::from_ref(&record), 4096);
        let found = records_after(&log, 0, 4, EPOCH);
        assert_eq!(found.len(), 1);
        let ops = decode_ops(found[0].1).unwrap();
        assert_eq!(
            ops,
            vec![
                Op::PutHistory([7; 16], b"value"),
                Op::DeleteHistory([8; 16]),
                Op::PutMeta(MetaKey::CurrentRevision, 42),
                Op::PutRow("leases", b"k", b"v"),
                Op::DeleteRow("leases", b"gone"),
            ]
        );
    }

    #[test]
    fn replay_stops_at_a_stale_sequence_number() {
        // WAL-2: record 9 at the start is from an earlier lap; 3 and 4 follow on from 2.
        let first = sample(3, 0);
        let second = sample(4, first.bytes.len() as u64);
        let stale = sample(9, second.offset + second.bytes.len() as u64);
        let log = lay_out(&[first, second, stale], 4096);
        let seqs: Vec<u64> = records_after(&log, 0, 2, EPOCH)
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(seqs, vec![3, 4]);
        assert!(
            records_after(&log, 0, 3, EPOCH).is_empty(),
            "3 is not after 3"
        );
        assert!(
            records_after(&log, 0, 2, EPOCH + 1).is_empty(),
            "records of another epoch never replay"
        );
    }

    #[test]
    fn torn_or_damaged_tail_ends_the_log() {
        let first = sample(1, 0);
        let second = sample(2, first.bytes.len() as u64);
        let mut log = lay_out(&[first.clone(), second.clone()], 4096);
        // A torn second record: its last byte never reached the disk.
        let last = second.offset as usize + second.bytes.len() - 1;
        log[last] ^= 0xff;
        let seqs: Vec<u64> = records_after(&log, 0, 0, EPOCH)
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(seqs, vec![1]);
        // A record cut off by the end of the file.
        let cut = &log[..first.bytes.len() - 1];
        assert!(records_after(cut, 0, 0, EPOCH).is_empty());
        // Zeros (a fresh file) hold no record.
        assert!(records_after(&[0u8; 64], 0, 0, EPOCH).is_empty());
    }

    #[test]
    fn damaged_operation_inside_a_valid_record_is_corrupted_not_a_panic() {
        for payload in [&[OP_PUT_HISTORY, 1, 2][..], &[99], &[OP_PUT_META, 200, 0]] {
            assert!(matches!(
                decode_ops(payload),
                Err(StorageError::Corrupted(_))
            ));
        }
    }

    /// A position in a log of 4 KiB regions in a 16 KiB file, the chain starting at
    /// `chain_start`.
    fn position(chain_start: u64, next_offset: u64) -> LogPosition {
        LogPosition {
            next_seq: 1,
            next_offset,
            chain_start,
            checkpoint_bytes: 4096,
            file_bytes: 4 * 4096,
        }
    }

    #[test]
    fn checkpoint_when_the_record_would_pass_the_room_kept_for_a_checkpoint() {
        // An eighth of the region, 512 bytes, is kept for the checkpoint's own record.
        let at = |next_offset| position(0, next_offset);
        assert!(!at(0).needs_checkpoint(100, false));
        assert!(!at(3484).needs_checkpoint(100, false), "fits exactly");
        assert!(at(3500).needs_checkpoint(100, false), "into the room");
        assert!(at(0).needs_checkpoint(5000, false), "larger than the log");
        // In the second region, its end counts.
        assert!(!position(4096, 4096 + 3484).needs_checkpoint(100, false));
        assert!(position(4096, 4096 + 3500).needs_checkpoint(100, false));
        // While a defrag copies, the whole file is the log.
        assert!(!at(4000).needs_checkpoint(200, true), "in the defrag room");
        assert!(!at(0).needs_checkpoint(5000, true));
        let last = 4 * 4096 - 512;
        assert!(!at(last - 100).needs_checkpoint(100, true), "fits exactly");
        assert!(at(last - 100).needs_checkpoint(200, true), "past the file");
    }

    #[test]
    fn a_checkpoint_restarts_the_log_in_the_region_its_chain_leaves_clear() {
        // WAL-8: from the first region to the second, and back.
        assert_eq!(position(0, 3600).deferred_restart(400, false), Some(4096));
        assert_eq!(position(4096, 7700).deferred_restart(400, false), Some(0));
        // The record must fit before the region's end.
        assert_eq!(position(0, 3600).deferred_restart(497, false), None);
        assert_eq!(position(0, 0).deferred_restart(5000, false), None);
        // After a defrag ran the chain from the first region into the second, no region is
        // clear: the checkpoint is synchronous.
        assert_eq!(position(0, 9000).deferred_restart(100, true), None);
        // From the second region the chain may run to the file's end and leave the first
        // clear.
        assert_eq!(position(4096, 12000).deferred_restart(100, true), Some(0));
        assert_eq!(
            position(4096, 4 * 4096 - 50).deferred_restart(100, true),
            None
        );
        // A file without its defrag room still has both regions; one with a single region
        // has no second to go to.
        let single = LogPosition {
            file_bytes: 4096,
            ..position(0, 3600)
        };
        assert_eq!(single.deferred_restart(100, false), None);
    }

    #[test]
    fn the_log_file_is_eight_times_the_log_and_at_least_the_defrag_room() {
        let (default, least) = (WAL_FILE_BYTES_DEFAULT, WAL_DEFRAG_ROOM_BYTES_DEFAULT);
        assert_eq!(log_file_bytes(default, least), least);
        assert_eq!(log_file_bytes(WAL_FILE_BYTES_MIN, least), least);
        assert_eq!(
            log_file_bytes(4 << 20, least),
            32 << 20,
            "eight times a long log"
        );
        assert_eq!(
            log_file_bytes(WAL_FILE_BYTES_MIN, 0),
            512 << 10,
            "no floor asked"
        );
        assert_eq!(log_file_bytes(u64::MAX, least), u64::MAX);
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, usable) = open(
            dir.path(),
            default,
            log_file_bytes(default, least),
            true,
            None,
        )
        .expect("open");
        let length = fs::metadata(dir.path().join(WAL_FILE_NAME))
            .expect("stat")
            .len();
        assert_eq!(
            (usable, length),
            (least, least),
            "a default log's file is the default room, all of it usable"
        );
    }

    /// A record of `len` bytes (payload padding included) for batch `seq` at `offset`.
    fn sized(seq: u64, offset: u64, len: usize) -> LogRecord {
        let mut ops = OpLog::default();
        let value = vec![u8::try_from(seq % 251).unwrap_or(0); len - RECORD_HEADER_BYTES - 21];
        ops.put_history(&[1; 16], &value);
        let record = ops.frame(EPOCH, seq, offset);
        assert_eq!(record.bytes.len(), len);
        record
    }

    /// Records `first..` of the given lengths, each starting where the one before ended.
    fn run_of(first: u64, offset: u64, lens: &[usize]) -> Vec<LogRecord> {
        let mut at = offset;
        let mut out = Vec::new();
        for (i, len) in lens.iter().enumerate() {
            out.push(sized(first + i as u64, at, *len));
            at += *len as u64;
        }
        out
    }

    /// The sequence numbers a replay from offset 0 after `last_seq` finds in `dir`'s log,
    /// checked to be what a scan of the whole file finds, payloads and all.
    fn replayed(dir: &Path, last_seq: u64) -> Vec<u64> {
        replayed_from(dir, 0, last_seq)
    }

    fn replayed_from(dir: &Path, offset: u64, last_seq: u64) -> Vec<u64> {
        let whole = fs::read(dir.join(WAL_FILE_NAME)).expect("read");
        let scanned = records_after(&whole, offset, last_seq, EPOCH);
        let read = read_records_after(dir, offset, last_seq, EPOCH).expect("replay");
        assert!(
            read.records().eq(scanned.iter().copied()),
            "replay read other records"
        );
        scanned.iter().map(|r| r.0).collect()
    }

    fn write(log: &LogWriter, records: &[LogRecord]) {
        let refs: Vec<&LogRecord> = records.iter().collect();
        log.write(&refs).expect("write");
        log.sync(&refs).expect("sync");
    }

    const FILE: u64 = 64 << 10;

    #[test]
    fn block_writes_leave_the_records_where_they_say_and_zeros_after() {
        // WAL-6: runs that cross blocks, a record larger than the buffer kept, a write in
        // the middle of a block, and a new lap from offset 0 (a checkpoint's restart).
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
        // The large record runs past the zero-filled file, which the write extends.
        let large = BLOCKS_KEPT_BYTES + 20_000;
        let mut model = vec![0u8; round_up(5400 + 4096 + 60 + large).max(FILE as usize)];
        // Each write stamps the durable mark of the sync before it (WAL-7).
        let place = |model: &mut Vec<u8>, records: &[LogRecord], durable: u64| {
            for r in records {
                let at = r.offset as usize;
                model[at..at + r.bytes.len()].copy_from_slice(&stamped(r, durable));
                // The rest of the last record's block is zeros.
                let end = at + r.bytes.len();
                model[end..round_up(end)].fill(0);
            }
        };
        let first = run_of(1, 0, &[100, 300, 5000]);
        write(&log, &first);
        place(&mut model, &first, 0);
        let at = first.iter().map(|r| r.bytes.len() as u64).sum::<u64>();
        let second = run_of(4, at, &[4096, 60, large]);
        write(&log, &second);
        place(&mut model, &second, 3);
        let read = fs::read(dir.path().join(WAL_FILE_NAME)).expect("read");
        assert_eq!(&read[..model.len()], &model[..], "first lap");
        assert_eq!(replayed(dir.path(), 0), (1..=6).collect::<Vec<u64>>());

        // A new lap: record 7 overwrites the start; what follows it in its block is zeroed,
        // and the older records further on stay as they were.
        // The buffer grown for it was given back (only the last, partly filled block kept).
        assert!(lock(&log.blocks).raw.len() <= 2 * LOG_BLOCK_BYTES);
        let lap = run_of(7, 0, &[200]);
        write(&log, &lap);
        place(&mut model, &lap, 6);
        let read = fs::read(dir.path().join(WAL_FILE_NAME)).expect("read");
        assert_eq!(&read[..model.len()], &model[..], "second lap");
        assert_eq!(replayed(dir.path(), 6), vec![7]);
    }

    #[test]
    fn a_write_that_does_not_follow_on_keeps_the_bytes_before_it_in_its_block() {
        // A reopened log goes on mid-block: the block's first bytes come from the file.
        let dir = tempfile::tempdir().expect("tempdir");
        let records = run_of(1, 0, &[700, 900]);
        {
            let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
            write(&log, &records[..1]);
        }
        let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("reopen");
        assert_eq!(replayed(dir.path(), 0), vec![1]);
        write(&log, &records[1..]);
        assert_eq!(replayed(dir.path(), 0), vec![1, 2]);
    }

    #[test]
    fn a_failed_write_still_writes_the_records_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let faults = Arc::new(Faults::new());
        let (log, _) = open(dir.path(), FILE, FILE, true, Some(faults.clone())).expect("open");
        let records = run_of(1, 0, &[300, 300, 300]);
        let refs: Vec<&LogRecord> = records.iter().collect();
        faults.fail_after(2);
        assert!(log.write(&refs).is_err(), "the third record's write fails");
        assert_eq!(replayed(dir.path(), 0), vec![1, 2]);
    }

    #[test]
    fn the_log_is_direct_where_the_filesystem_takes_o_direct() {
        let dir = tempfile::tempdir().expect("tempdir");
        let probe = dir.path().join("probe");
        fs::write(&probe, [0u8; LOG_BLOCK_BYTES]).expect("probe");
        // The filesystem under test takes the flag and block writes through it (as ext4
        // does; tmpfs refuses the flag): the writer must use them exactly then.
        let takes_direct = open_direct(&probe)
            .ok()
            .is_some_and(|file| rewrite_first_block(&file).is_ok());
        let (synced, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
        assert_eq!(synced.is_direct(), takes_direct);
        drop(synced);
        // The probe at open changed nothing: a fresh log is still all zeros.
        let log = fs::read(dir.path().join(WAL_FILE_NAME)).expect("read");
        assert!(log[..FILE as usize].iter().all(|&b| b == 0));
        // Without syncs the page cache is faster, and nothing is direct.
        let (unsynced, _) = open(dir.path(), FILE, FILE, false, None).expect("open");
        assert!(!unsynced.is_direct());
    }

    #[test]
    fn replay_reads_the_records_and_not_the_rest_of_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A log file of 4 MiB with the records in its first part: one record larger than a
        // replay read, and records that straddle the reads' boundaries.
        let (file_bytes, chunk) = (4u64 << 20, REPLAY_READ_BYTES);
        let (log, usable) = open(dir.path(), file_bytes, file_bytes, true, None).expect("open");
        assert_eq!(usable, file_bytes);
        let lens = [chunk + 1000, 70_000, 90_000, 100_000, 300, chunk / 2];
        let records = run_of(1, 0, &lens);
        write(&log, &records);
        let end: usize = lens.iter().sum();
        assert_eq!(replayed(dir.path(), 0), vec![1, 2, 3, 4, 5, 6]);
        let read = read_records_after(dir.path(), 0, 0, EPOCH).expect("replay");
        assert!(read.bytes.len() >= end);
        assert!(
            read.bytes.len() <= end + RECORD_HEADER_BYTES + chunk,
            "read {} bytes for {end} bytes of records",
            read.bytes.len()
        );
        assert_eq!(read.last_seq(), Some(6));
        // From a later record's offset, after its predecessor's sequence number.
        let third = records[2].offset;
        assert_eq!(replayed_from(dir.path(), third, 2), vec![3, 4, 5, 6]);
        // An offset at or past the file's end, or a chain that does not follow on.
        assert!(replayed_from(dir.path(), file_bytes, 0).is_empty());
        assert!(replayed_from(dir.path(), file_bytes + 4096, 0).is_empty());
        assert!(replayed_from(dir.path(), 0, 7).is_empty());
    }

    #[test]
    fn replay_ends_at_a_record_cut_off_by_the_end_of_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
        // The second record's header claims more bytes than the file holds.
        let records = run_of(1, 0, &[500, FILE as usize]);
        write(&log, &records[..1]);
        let mut header = records[1].bytes[..RECORD_HEADER_BYTES].to_vec();
        header[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        let path = dir.path().join(WAL_FILE_NAME);
        let file = File::options().write(true).open(&path).expect("open");
        file.write_all_at(&header, 500).expect("write");
        assert_eq!(replayed(dir.path(), 0), vec![1]);
    }

    /// `record`'s bytes with the durable mark `durable` stamped in, as the writer writes them.
    fn stamped(record: &LogRecord, durable: u64) -> Vec<u8> {
        let mut bytes = record.bytes.clone();
        let crc = u32::from_be_bytes(bytes[8..12].try_into().expect("crc"));
        bytes[20..28].copy_from_slice(&durable.to_be_bytes());
        bytes[28..32].copy_from_slice(&mark_checksum(crc, record.seq, durable).to_be_bytes());
        bytes
    }

    /// Writes and syncs `records` one by one, each in a write of its own: every record then
    /// carries the mark of the one before it (WAL-7).
    fn write_each_synced(log: &LogWriter, records: &[LogRecord]) {
        for record in records {
            log.write(&[record]).expect("write");
            log.sync(&[record]).expect("sync");
        }
    }

    /// Flips a byte inside `record`'s payload in `dir`'s log.
    fn damage(dir: &Path, record: &LogRecord) {
        let path = dir.join(WAL_FILE_NAME);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let at = record.offset + RECORD_HEADER_BYTES as u64 + 3;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).expect("read");
        file.write_all_at(&[byte[0] ^ 0xff], at).expect("write");
    }

    #[test]
    fn a_damaged_record_that_a_later_record_proves_durable_refuses_replay() {
        for broken in [0, 1, 2] {
            let dir = tempfile::tempdir().expect("tempdir");
            let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
            let records = run_of(1, 0, &[500, 700, 600, 400]);
            write_each_synced(&log, &records);
            damage(dir.path(), &records[broken]);
            let whole = fs::read(dir.path().join(WAL_FILE_NAME)).expect("read");
            let missing = records[broken].seq;
            let found = damage_after(&whole, 0, 0, EPOCH).expect("damage found");
            assert_eq!((found.missing, found.witness.0), (missing, missing + 1));
            assert_eq!(found.at as u64, records[broken].offset);
            let error = read_records_after(dir.path(), 0, 0, EPOCH).expect_err("refused");
            let StorageError::Corrupted(message) = error else {
                panic!("{error:?}");
            };
            assert!(
                message.contains(&format!("record of batch {missing} at offset")),
                "{message}"
            );
        }
    }

    /// The log of [`a_log_across_both_regions`]: 8 KiB regions in a 64 KiB file.
    const REGION: u64 = 8 << 10;

    /// A checkpoint's record (WAL-8) of `len` bytes: batch `seq` at `offset`, the chain going
    /// on at `next`.
    fn checkpoint(seq: u64, offset: u64, len: usize, next: u64) -> LogRecord {
        let mut ops = OpLog::default();
        ops.put_history(&[2; 16], &vec![9; len - RECORD_HEADER_BYTES - 21 - 9]);
        ops.continue_at(next);
        let record = ops.frame(EPOCH, seq, offset);
        assert_eq!(record.bytes.len(), len);
        assert!(record.is_checkpoint());
        record
    }

    /// Batches 1 to 7, each written and synced alone: 1 and 2 in the first region, 3 a
    /// checkpoint going on in the second, 4 there, 5 a checkpoint going back to the first,
    /// 6 and 7 over 1 and 2.
    fn a_log_across_both_regions(dir: &Path) -> Vec<LogRecord> {
        let (log, usable) = open(dir, REGION, FILE, true, None).expect("open");
        assert_eq!(usable, FILE);
        let mut records = run_of(1, 0, &[500, 700]);
        records.push(checkpoint(3, 1200, 600, REGION));
        records.extend(run_of(4, REGION, &[800]));
        records.push(checkpoint(5, REGION + 800, 400, 0));
        records.extend(run_of(6, 0, &[300, 900]));
        write_each_synced(&log, &records);
        records
    }

    #[test]
    fn replay_follows_a_checkpoint_record_into_the_other_region_and_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = a_log_across_both_regions(dir.path());
        let payload = &records[2].bytes[RECORD_HEADER_BYTES..];
        assert_eq!(decode_ops(payload).expect("ops")[0], Op::ContinueAt(REGION));
        // From checkpoint 3, once durable, and from 5.
        assert_eq!(replayed_from(dir.path(), REGION, 3), vec![4, 5, 6, 7]);
        assert_eq!(replayed_from(dir.path(), 0, 5), vec![6, 7]);
        // From the durable commit before checkpoint 3, as after a power cut before 3's sync,
        // while 1 and 2 were still there: 3's record leads into the second region, and 5's
        // back into the first.
        let lap = tempfile::tempdir().expect("tempdir");
        let (log, _) = open(lap.path(), REGION, FILE, true, None).expect("open");
        write_each_synced(&log, &records[..5]);
        assert_eq!(replayed_from(lap.path(), 0, 0), vec![1, 2, 3, 4, 5]);
        // A "continue at" anywhere but first is refused as damage inside a valid record.
        let mut ops = OpLog::default();
        ops.put_meta(MetaKey::CurrentRevision, 1);
        ops.payload
            .extend_from_slice(&[OP_CONTINUE_AT, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            decode_ops(&ops.payload),
            Err(StorageError::Corrupted(_))
        ));
    }

    #[test]
    fn damage_before_the_log_goes_back_to_the_first_region_refuses_replay() {
        // WAL-7 across WAL-8's regions: checkpoint 5's record is damaged, and 6 and 7, in the
        // first region before the replay's start, were written once 5 was durable.
        let dir = tempfile::tempdir().expect("tempdir");
        let records = a_log_across_both_regions(dir.path());
        damage(dir.path(), &records[4]);
        let error = read_records_after(dir.path(), REGION, 3, EPOCH).expect_err("refused");
        let StorageError::Corrupted(message) = error else {
            panic!("{error:?}");
        };
        assert!(
            message.contains(&format!("record of batch 5 at offset {}", REGION + 800)),
            "{message}"
        );
        assert!(
            message.contains("record of batch 6 at offset 0"),
            "{message}"
        );
        // Damage with nothing after it in either region is the log's end.
        let dir = tempfile::tempdir().expect("tempdir");
        let records = a_log_across_both_regions(dir.path());
        damage(dir.path(), &records[6]);
        assert_eq!(replayed_from(dir.path(), 0, 5), vec![6]);
    }

    #[test]
    fn a_torn_last_write_still_ends_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (log, _) = open(dir.path(), FILE, FILE, true, None).expect("open");
        let records = run_of(1, 0, &[500, 700, 600, 400]);
        write_each_synced(&log, &records[..2]);
        // Records 3 and 4 go out in one write that never synced; a crash tore record 3.
        write(&log, &records[2..]);
        damage(dir.path(), &records[2]);
        let whole = fs::read(dir.path().join(WAL_FILE_NAME)).expect("read");
        assert_eq!(damage_after(&whole, 0, 0, EPOCH), None);
        assert_eq!(replayed(dir.path(), 0), vec![1, 2]);
        // A stale record of an earlier lap (lower sequence numbers, lower marks) after the
        // break is no witness either.
        assert_eq!(replayed(dir.path(), 2), Vec::<u64>::new());
    }

    #[test]
    fn records_of_the_layout_before_the_durable_mark_still_replay() {
        let payload = {
            let mut ops = OpLog::default();
            ops.put_meta(MetaKey::CurrentRevision, 7);
            ops.payload
        };
        let mut log = Vec::new();
        for seq in [5u64, 6] {
            log.extend_from_slice(&LEGACY_RECORD_MAGIC.to_be_bytes());
            log.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            log.extend_from_slice(&checksum(EPOCH, seq, &payload).to_be_bytes());
            log.extend_from_slice(&seq.to_be_bytes());
            log.extend_from_slice(&payload);
        }
        log.resize(4096, 0);
        let found = records_after(&log, 0, 4, EPOCH);
        assert_eq!(found.iter().map(|r| r.0).collect::<Vec<_>>(), vec![5, 6]);
        assert_eq!(
            decode_ops(found[1].1).expect("ops"),
            vec![Op::PutMeta(MetaKey::CurrentRevision, 7)]
        );
    }

    #[test]
    fn replay_of_a_missing_log_finds_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let read = read_records_after(dir.path(), 0, 0, EPOCH).expect("replay");
        assert_eq!(read.records().count(), 0);
        assert_eq!(read.last_seq(), None);
    }
}
