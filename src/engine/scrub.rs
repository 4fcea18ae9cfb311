//! The scrub: a pass over every stored byte that carries a checksum, while the engine
//! serves, so damage in data nobody reads (old revisions, cold keys, rows read only at open)
//! is found when it happens rather than at the next restart or at the read that needed it.
//!
//! It checks every history record (REC-4) and every row and meta value (ROW-1); what it
//! finds damaged raises the CORRUPT alarm, as etcd's corruption check does, so every write
//! stops (`etcdserver: corrupt cluster`) until an operator disarms it.
//!
//! Invariants:
//! - SCRUB-1: each chunk of at most [`SCRUB_CHUNK_RECORDS`] records is read from a snapshot
//!   of its own (STORE-5): a pass never pins the pages writers free for longer than one
//!   chunk, and a compaction or a defrag may run between chunks (a record compacted away
//!   meanwhile is simply not checked).
//! - SCRUB-2: after each chunk the pass sleeps as long as the chunk took, so it uses at most
//!   half of one CPU, on the caller's thread.
//! - SCRUB-3: damage (`StorageError::Corrupted`) raises CORRUPT under this engine's member id
//!   through the apply path before the error is returned; any other error ends the pass
//!   and raises nothing.
//!
//! Contact points: the server runs [`Engine::scrub`] every `--scrub-interval`.

use std::ops::Bound;
use std::time::Instant;

use super::Engine;
use crate::api::{AlarmAction, AlarmRequest, AlarmType};
use crate::error::{Error, Result, StorageError};
use crate::mvcc::record::Record;
use crate::storage::RevisionKey;

/// History records checked per snapshot (SCRUB-1).
pub const SCRUB_CHUNK_RECORDS: usize = 4096;

/// What a sound pass checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubReport {
    /// History records whose checksums (or, written before checksums, whose bytes) were
    /// checked.
    pub records: u64,
    /// Of `records`, those written before records carried checksums (REC-4): sound, but
    /// read unchecked until compaction removes them.
    pub unchecked: u64,
    /// Rows and meta values whose seals were checked.
    pub rows: u64,
}

impl Engine {
    /// Checks every stored history record, row and meta value against its checksum, while
    /// the engine serves (SCRUB-1, SCRUB-2); on damage raises the CORRUPT alarm and returns
    /// the `Corrupted` error (SCRUB-3). Runs on the caller's thread.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
    /// engine.put(kvd::PutRequest::new("k", "v")).unwrap();
    /// let report = engine.scrub().unwrap();
    /// assert_eq!(report.records, 1);
    /// ```
    pub fn scrub(&self) -> Result<ScrubReport> {
        self.scrub_in_chunks(SCRUB_CHUNK_RECORDS)
    }

    /// The reads of [`Engine::scrub`] without its pause between chunks and without raising
    /// CORRUPT: for `kvd check`, which reports damage and changes nothing for it.
    pub(crate) fn check_checksums(&self) -> Result<ScrubReport> {
        self.scrub_pass(SCRUB_CHUNK_RECORDS, false)
    }

    /// [`Engine::scrub`] with chunks of `chunk` records.
    fn scrub_in_chunks(&self, chunk: usize) -> Result<ScrubReport> {
        match self.scrub_pass(chunk, true) {
            Err(Error::Storage(damage @ StorageError::Corrupted(_))) => {
                let member_id = self.shared()?.config.member_id;
                // The damage is the news: a refused alarm (engine closing) does not hide it.
                let _ = self.alarm(AlarmRequest {
                    action: AlarmAction::Activate,
                    member_id,
                    alarm: AlarmType::Corrupt,
                });
                Err(Error::Storage(damage))
            }
            other => other,
        }
    }

    /// Reads every row, meta value and record, `chunk` records per snapshot, sleeping as
    /// long as each chunk took when `pause` (SCRUB-1, SCRUB-2).
    fn scrub_pass(&self, chunk: usize, pause: bool) -> Result<ScrubReport> {
        let store = &self.shared()?.reads.store;
        let mut report = ScrubReport {
            rows: store.check_seals()?,
            ..ScrubReport::default()
        };
        let mut from: Bound<RevisionKey> = Bound::Unbounded;
        loop {
            let started = Instant::now();
            let mut last = None;
            let visited =
                store
                    .snapshot()?
                    .scan_history((from, Bound::Unbounded), chunk, |key, bytes| {
                        if !Record::decode_head(key, bytes)?.checksummed() {
                            report.unchecked += 1;
                        }
                        last = Some(*key);
                        Ok(true)
                    })?;
            report.records += visited as u64;
            match last {
                Some(key) if visited == chunk => from = Bound::Excluded(key),
                _ => return Ok(report),
            }
            if pause {
                std::thread::sleep(started.elapsed());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AlarmMember, PutRequest};
    use crate::engine::Config;
    use crate::mvcc::revision::Revision;

    #[test]
    fn a_sound_store_passes_and_a_damaged_record_raises_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(
            dir.path(),
            Config {
                member_id: 42,
                ..Config::default()
            },
        )
        .unwrap();
        let records = 40;
        for i in 0..records {
            engine.put(PutRequest::new(format!("k{i}"), "v")).unwrap();
        }
        let sound = engine.scrub().unwrap();
        assert_eq!(sound.records, records as u64);
        assert!(sound.rows > 0, "at least the meta values");
        assert_eq!(
            sound.unchecked, 0,
            "every record written by this build has a checksum"
        );
        for chunk in [1, 16, 40] {
            assert_eq!(
                engine.scrub_in_chunks(chunk),
                Ok(sound),
                "chunks of {chunk}"
            );
        }

        // A record changed under the running engine, past the first chunk.
        let at = Revision {
            main: records as i64,
            sub: 0,
        }
        .to_key();
        let store = &engine.shared().unwrap().reads.store;
        let mut bytes = store.snapshot().unwrap().get_history(&at).unwrap().unwrap();
        let end = bytes.len() - 5;
        bytes[end] ^= 0x01;
        store.write(|batch| batch.put_history(&at, &bytes)).unwrap();
        // Found in the third chunk of 16.
        let damage = engine.scrub_in_chunks(16).unwrap_err();
        assert!(damage.is_corrupted(), "{damage}");
        assert!(
            damage
                .to_string()
                .contains(&format!("checksum mismatch at revision ({records}, 0)")),
            "{damage}"
        );
        let alarms = engine
            .alarm(AlarmRequest {
                action: AlarmAction::Get,
                member_id: 0,
                alarm: AlarmType::None,
            })
            .unwrap()
            .alarms;
        assert_eq!(
            alarms,
            vec![AlarmMember {
                member_id: 42,
                alarm: AlarmType::Corrupt
            }],
            "SCRUB-3"
        );
        assert!(matches!(
            engine.put(PutRequest::new("after", "v")),
            Err(Error::Corrupt)
        ));
        engine.close().unwrap();
    }
}
