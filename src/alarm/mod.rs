//! Alarms: NOSPACE and CORRUPT, persisted, latched until an explicit deactivation (etcd's
//! alarm store).
//!
//! Invariants:
//! - ALARM-1: the alarm set in memory equals the `alarms` storage table, changed in the same
//!   transaction as the write that raised or cleared it; alarms survive restart.
//! - ALARM-2: nothing clears an alarm but a Deactivate request: not compaction, not defrag.
//! - ALARM-3: the `nospace` and `corrupt` flags are set (release) before the activation's
//!   batch is published, and every write with cost is checked against them in the apply
//!   thread, after every earlier activation in apply order: once an alarm is applied, no
//!   write it blocks is applied after it.
//!
//! Owns: the alarm set and its rows in the `alarms` table ([`Alarms::load`] reads them,
//! [`Alarms::set`] writes them in the batch it is handed).
//!
//! Contact points: `engine::apply` applies Alarm requests and raises NOSPACE on the first
//! refusal; `Engine` reads the flags at admission and answers Get from memory.

use std::collections::BTreeSet;

use crate::api::{AlarmMember, AlarmType};
use crate::error::StorageError;
use crate::storage::{RowTable, Snapshot, WriteBatch};
use crate::sync::{AtomicBool, Ordering};

/// The storage table of alarms: 8-byte big-endian member id + 1 byte type → empty.
pub const ALARMS_TABLE: RowTable = RowTable::new("alarms");

/// The active alarms.
#[derive(Debug, Default)]
pub struct Alarms {
    active: BTreeSet<AlarmMember>,
    nospace: AtomicBool,
    corrupt: AtomicBool,
}

impl Alarms {
    /// Returns an alarm set holding `active`.
    pub fn new(active: impl IntoIterator<Item = AlarmMember>) -> Alarms {
        let alarms = Alarms {
            active: active.into_iter().collect(),
            ..Alarms::default()
        };
        alarms.refresh_flags();
        alarms
    }

    fn refresh_flags(&self) {
        let has = |kind| self.active.iter().any(|a| a.alarm == kind);
        self.nospace
            .store(has(AlarmType::NoSpace), Ordering::Release);
        self.corrupt
            .store(has(AlarmType::Corrupt), Ordering::Release);
    }

    /// Adds `member` (no-op for `AlarmType::None`); returns true if it was new.
    pub fn activate(&mut self, member: AlarmMember) -> bool {
        if member.alarm == AlarmType::None {
            return false;
        }
        let added = self.active.insert(member);
        self.refresh_flags();
        added
    }

    /// Removes `member`; returns true if it was active.
    pub fn deactivate(&mut self, member: AlarmMember) -> bool {
        let removed = self.active.remove(&member);
        self.refresh_flags();
        removed
    }

    /// Returns the active alarms of kind `kind`, or all with `AlarmType::None`.
    pub fn list(&self, kind: AlarmType) -> Vec<AlarmMember> {
        self.active
            .iter()
            .filter(|a| kind == AlarmType::None || a.alarm == kind)
            .copied()
            .collect()
    }

    /// Loads the active alarms from their table (ALARM-1).
    pub fn load(snapshot: &Snapshot) -> Result<Alarms, StorageError> {
        let mut active = Vec::new();
        for (key, _) in snapshot.rows(ALARMS_TABLE)? {
            active.push(decode_key(&key)?);
        }
        Ok(Alarms::new(active))
    }

    /// Activates (`active`) or deactivates `member`, and writes or deletes its row in
    /// `batch` if that changed anything; returns true if it did (ALARM-1: memory and table
    /// change together).
    pub fn set(
        &mut self,
        member: AlarmMember,
        active: bool,
        batch: &mut WriteBatch<'_>,
    ) -> Result<bool, StorageError> {
        let key = encode_key(member);
        let changed = if active {
            self.activate(member)
        } else {
            self.deactivate(member)
        };
        match (changed, active) {
            (true, true) => batch.put_row(ALARMS_TABLE, &key, &[])?,
            (true, false) => {
                batch.delete_row(ALARMS_TABLE, &key)?;
            }
            (false, _) => {}
        }
        Ok(changed)
    }

    /// Returns true while a NOSPACE alarm is active.
    pub fn nospace(&self) -> bool {
        self.nospace.load(Ordering::Acquire)
    }

    /// Returns true while a CORRUPT alarm is active.
    pub fn corrupt(&self) -> bool {
        self.corrupt.load(Ordering::Acquire)
    }
}

/// Returns the storage key of an alarm.
pub fn encode_key(member: AlarmMember) -> [u8; 9] {
    let mut key = [0u8; 9];
    key[..8].copy_from_slice(&member.member_id.to_be_bytes());
    key[8] = match member.alarm {
        AlarmType::None => 0,
        AlarmType::NoSpace => 1,
        AlarmType::Corrupt => 2,
    };
    key
}

/// Decodes a storage key (total: bad bytes give `Corrupted`).
pub fn decode_key(key: &[u8]) -> Result<AlarmMember, StorageError> {
    let bad = || StorageError::Corrupted(format!("alarm row key of {} bytes", key.len()));
    let array: [u8; 9] = key.try_into().map_err(|_| bad())?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&array[..8]);
    let alarm = match array[8] {
        1 => AlarmType::NoSpace,
        2 => AlarmType::Corrupt,
        _ => return Err(bad()),
    };
    Ok(AlarmMember {
        member_id: u64::from_be_bytes(id),
        alarm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_latch_and_list_by_kind() {
        let mut alarms = Alarms::new([]);
        let nospace = AlarmMember {
            member_id: 1,
            alarm: AlarmType::NoSpace,
        };
        assert!(alarms.activate(nospace));
        assert!(!alarms.activate(nospace), "already active");
        assert!(alarms.nospace() && !alarms.corrupt());
        assert!(!alarms.activate(AlarmMember {
            member_id: 1,
            alarm: AlarmType::None
        }));
        assert_eq!(alarms.list(AlarmType::Corrupt), vec![]);
        assert_eq!(alarms.list(AlarmType::None), vec![nospace]);
        assert!(alarms.deactivate(nospace));
        assert!(!alarms.nospace());
        assert_eq!(decode_key(&encode_key(nospace)), Ok(nospace));
        assert!(decode_key(&[0; 9]).is_err());
    }
}
