//! Recovery at open: rebuilds the key index from the history, and finds the current
//! revision, the applied index, an interrupted compaction to resume, the leases and their
//! keys, and the active alarms. Each domain loads its own rows (`Lessor::load`,
//! `Alarms::load`; the accounts load after, from the rebuilt index).
//!
//! Invariants:
//! - RECOVER-1: the current revision is at least every revision the history, the meta table
//!   and a scheduled compaction name (ENG-2 across a restart).
//! - RECOVER-2: an index compacted at a scheduled but unfinished compaction has that
//!   compaction as a job to resume, so its records are deleted before the next compaction.
//!
//! Contact points: `Engine::open` calls [`recover`] once, before any thread starts.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::alarm::Alarms;
use crate::error::StorageError;
use crate::lease::Lessor;
use crate::mvcc::compaction::CompactionJob;
use crate::mvcc::record::Record;
use crate::mvcc::{Index, Revision};
use crate::storage::{MetaKey, Store};

/// What open found on disk.
pub struct Recovered {
    /// The rebuilt index, compacted at the compaction revision.
    pub index: Index,
    /// The current revision (ENG-2: never below what was committed).
    pub current: i64,
    /// Requests applied so far.
    pub applied_index: u64,
    /// An interrupted compaction to resume.
    pub jobs: Vec<CompactionJob>,
    /// The leases, with full TTLs from now (LEASE-3), and their keys.
    pub lessor: Lessor,
    /// The active alarms (ALARM-1).
    pub alarms: Alarms,
}

/// Rebuilds the index from the history and the meta table.
pub fn recover(
    store: &Store,
    now: Duration,
    lease_ttl_min: i64,
) -> Result<Recovered, StorageError> {
    let snapshot = store.snapshot()?;
    let meta = |key| -> Result<i64, StorageError> {
        Ok(snapshot
            .get_meta(key)?
            .map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX)))
    };
    let finished = meta(MetaKey::FinishedCompactRevision)?;
    let scheduled = meta(MetaKey::ScheduledCompactRevision)?;
    let recorded_current = meta(MetaKey::CurrentRevision)?;
    let applied_index = snapshot.get_meta(MetaKey::AppliedIndex)?.unwrap_or(0);
    let alarms = Alarms::load(&snapshot)?;
    // etcd raises stored TTLs below the minimum on load (LEASE-4).
    let mut lessor = Lessor::load(&snapshot, now, lease_ttl_min)?;
    // The lease of each key's newest record, for keys that have one.
    let mut attached: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    let mut index = Index::new();
    let mut last_main = 1;
    snapshot.scan_history(.., usize::MAX, |key, value| {
        let rev = Revision::from_key(key);
        let head = Record::decode_head(key, value)?;
        if head.tombstone || head.lease == 0 {
            attached.remove(head.key);
        } else {
            attached.insert(head.key.to_vec(), head.lease);
        }
        index.restore(
            head.key,
            rev,
            head.tombstone,
            head.create_revision,
            head.version,
            head.cost(),
        );
        last_main = rev.main;
        Ok(true)
    })?;
    let mut jobs = Vec::new();
    if scheduled > finished {
        index.compact(scheduled);
        jobs.push(CompactionJob::new(scheduled));
    } else if finished >= 0 {
        index.compact(finished);
    }
    for (key, lease) in attached {
        lessor.attach(&Bytes::from(key), lease);
    }
    let current = last_main.max(recorded_current).max(scheduled).max(1);
    Ok(Recovered {
        index,
        current,
        applied_index,
        jobs,
        lessor,
        alarms,
    })
}
