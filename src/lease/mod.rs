//! Leases: TTLs that keys can be attached to; when a lease is revoked or expires, its keys
//! are deleted in one revision (etcd's lessor).
//!
//! Owns: the in-memory lease table (id → granted TTL, deadline, attached keys), the
//! key → lease attachment map, and the encoding of lease rows in the `leases` table.
//!
//! Invariants:
//! - LEASE-1: a key is attached to at most one lease, and `attached[key] == id` iff `key` is
//!   in `leases[id].keys`.
//! - LEASE-2: the lease table in memory holds exactly the rows of the `leases` storage
//!   table plus the grants and minus the revokes of the batch being applied; a lease row is
//!   written and deleted in the same storage transaction as the key deletions of its revoke.
//! - LEASE-3: deadlines are memory only: after a restart every lease gets its full TTL again
//!   from the engine's clock (etcd's behaviour on a new leader).
//! - LEASE-4: TTLs below the minimum are raised to it; TTLs above `LEASE_TTL_MAX_SECONDS`
//!   are refused.
//!
//! The lessor reads and writes its own rows ([`Lessor::load`], [`Lessor::grant_in`],
//! [`Lessor::revoke_in`]) in the batch it is handed.
//!
//! Contact points: the apply thread grants, revokes and attaches (`engine::apply`); the
//! engine answers keep-alive, time-to-live and list from here; expiry is found here and
//! carried out as revokes through the apply path.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;

use crate::error::StorageError;
use crate::storage::{RowTable, Snapshot, WriteBatch};

/// The storage table of leases: 8-byte big-endian id → 8-byte big-endian granted TTL.
pub const LEASES_TABLE: RowTable = RowTable::new("leases");
/// etcd's MaxLeaseTTL, in seconds.
pub const LEASE_TTL_MAX_SECONDS: i64 = 9_000_000_000;
/// etcd's default minimum TTL: ceil(1.5 × the 1 s election timeout).
pub const LEASE_TTL_MIN_SECONDS_DEFAULT: i64 = 2;
/// Expired leases revoked per pass of the apply thread (etcd's leaseRevokeRate / 2).
pub const LEASE_REVOKES_PER_PASS_MAX: usize = 500;

/// One lease.
#[derive(Debug, Clone)]
struct Lease {
    /// The granted TTL in seconds, after clamping.
    ttl: i64,
    /// When it expires, on the engine's clock.
    deadline: Duration,
    keys: BTreeSet<Bytes>,
}

/// What TimeToLive reports for a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseTtl {
    /// Seconds left, truncated toward zero, never negative.
    pub remaining: i64,
    /// The granted TTL.
    pub granted: i64,
    /// The attached keys, in key order (empty unless asked for).
    pub keys: Vec<Bytes>,
}

/// Every lease and attachment.
#[derive(Debug, Default)]
pub struct Lessor {
    leases: BTreeMap<i64, Lease>,
    attached: BTreeMap<Bytes, i64>,
}

impl Lessor {
    /// Returns an empty lessor.
    pub fn new() -> Lessor {
        Lessor::default()
    }

    /// Loads the leases from their table, each with its full TTL from `now` (LEASE-3) and
    /// raised to `ttl_min` (LEASE-4). Attachments come from the history (`Lessor::attach`).
    pub fn load(snapshot: &Snapshot, now: Duration, ttl_min: i64) -> Result<Lessor, StorageError> {
        let mut lessor = Lessor::new();
        for (key, value) in snapshot.rows(LEASES_TABLE)? {
            let (id, ttl) = decode_row(&key, &value)?;
            lessor.grant(id, effective_ttl(ttl, ttl_min), now);
        }
        Ok(lessor)
    }

    /// Grants lease `id` and writes its row in `batch` (LEASE-2).
    pub fn grant_in(
        &mut self,
        batch: &mut WriteBatch<'_>,
        id: i64,
        ttl: i64,
        now: Duration,
    ) -> Result<(), StorageError> {
        let (key, value) = encode_row(id, ttl);
        batch.put_row(LEASES_TABLE, &key, &value)?;
        self.grant(id, ttl, now);
        Ok(())
    }

    /// Revokes lease `id` and deletes its row in `batch`, the batch that deletes its keys
    /// (LEASE-2).
    pub fn revoke_in(&mut self, batch: &mut WriteBatch<'_>, id: i64) -> Result<(), StorageError> {
        self.revoke(id);
        batch.delete_row(LEASES_TABLE, &id.to_be_bytes())?;
        Ok(())
    }

    /// Returns true if lease `id` exists.
    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    /// Adds lease `id` with TTL `ttl` seconds expiring `ttl` after `now`.
    pub fn grant(&mut self, id: i64, ttl: i64, now: Duration) {
        let deadline = now.saturating_add(Duration::from_secs(u64::try_from(ttl).unwrap_or(0)));
        self.leases.insert(
            id,
            Lease {
                ttl,
                deadline,
                keys: BTreeSet::new(),
            },
        );
    }

    /// Removes lease `id` and returns its keys in key order, or `None` if it did not exist.
    pub fn revoke(&mut self, id: i64) -> Option<Vec<Bytes>> {
        let lease = self.leases.remove(&id)?;
        for key in &lease.keys {
            self.attached.remove(key);
        }
        Some(lease.keys.into_iter().collect())
    }

    /// Attaches `key` to `lease`, detaching it from any other; `lease == 0` only detaches
    /// (LEASE-1). A lease that does not exist is ignored: callers check existence first.
    pub fn attach(&mut self, key: &Bytes, lease: i64) {
        if let Some(old) = self.attached.remove(key)
            && let Some(l) = self.leases.get_mut(&old)
        {
            l.keys.remove(key);
        }
        if lease != 0
            && let Some(l) = self.leases.get_mut(&lease)
        {
            l.keys.insert(key.clone());
            self.attached.insert(key.clone(), lease);
        }
    }

    /// Renews lease `id` to a full TTL from `now`; returns the TTL, or `None` if unknown or
    /// already past its deadline.
    pub fn keep_alive(&mut self, id: i64, now: Duration) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        if lease.deadline <= now {
            // Expired, its revoke pending: etcd answers TTL 0 and does not revive it.
            return None;
        }
        lease.deadline =
            now.saturating_add(Duration::from_secs(u64::try_from(lease.ttl).unwrap_or(0)));
        Some(lease.ttl)
    }

    /// Returns what TimeToLive reports for lease `id`, its attached keys only if `keys`.
    pub fn time_to_live(&self, id: i64, now: Duration, keys: bool) -> Option<LeaseTtl> {
        let lease = self.leases.get(&id)?;
        let remaining = lease.deadline.saturating_sub(now).as_secs();
        Some(LeaseTtl {
            remaining: i64::try_from(remaining).unwrap_or(i64::MAX),
            granted: lease.ttl,
            keys: if keys {
                lease.keys.iter().cloned().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// Returns every lease id, soonest deadline first (ties by id).
    pub fn list(&self) -> Vec<i64> {
        let mut ids: Vec<(Duration, i64)> = self
            .leases
            .iter()
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Returns up to `limit` leases whose deadline is at or before `now`, soonest first.
    pub fn expired(&self, now: Duration, limit: usize) -> Vec<i64> {
        let mut expired: Vec<(Duration, i64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, l)| (l.deadline, *id))
            .collect();
        expired.sort_unstable();
        expired.into_iter().take(limit).map(|(_, id)| id).collect()
    }
}

/// Returns the storage row of a lease.
pub fn encode_row(id: i64, ttl: i64) -> ([u8; 8], [u8; 8]) {
    (id.to_be_bytes(), ttl.to_be_bytes())
}

/// Decodes a lease row (total: bad bytes give `Corrupted`).
pub fn decode_row(key: &[u8], value: &[u8]) -> Result<(i64, i64), StorageError> {
    let int = |bytes: &[u8]| -> Result<i64, StorageError> {
        let array: [u8; 8] = bytes.try_into().map_err(|_| {
            StorageError::Corrupted(format!("lease row field of {} bytes", bytes.len()))
        })?;
        Ok(i64::from_be_bytes(array))
    };
    Ok((int(key)?, int(value)?))
}

/// Returns the TTL a grant of `ttl` seconds gets: raised to `min_ttl` (LEASE-4).
pub fn effective_ttl(ttl: i64, min_ttl: i64) -> i64 {
    ttl.max(min_ttl)
}

/// Returns a lease id for a grant that asked for none: derived from the request's position
/// in the apply order, so apply stays deterministic (APPLY-3); positive and unused.
pub fn generate_id(seed: u64, taken: impl Fn(i64) -> bool) -> i64 {
    let mut state = seed;
    loop {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let id = i64::try_from(z >> 1).unwrap_or(i64::MAX);
        if id != 0 && !taken(id) {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Bytes {
        Bytes::copy_from_slice(k.as_bytes())
    }

    #[test]
    fn attach_moves_a_key_between_leases() {
        let mut lessor = Lessor::new();
        lessor.grant(1, 10, Duration::ZERO);
        lessor.grant(2, 10, Duration::ZERO);
        lessor.attach(&key("a"), 1);
        lessor.attach(&key("b"), 1);
        lessor.attach(&key("a"), 2);
        let ttl = |lessor: &Lessor, id| {
            lessor
                .time_to_live(id, Duration::ZERO, true)
                .map(|t| t.keys)
        };
        assert_eq!(ttl(&lessor, 1), Some(vec![key("b")]));
        assert_eq!(ttl(&lessor, 2), Some(vec![key("a")]));
        assert_eq!(
            lessor
                .time_to_live(2, Duration::ZERO, false)
                .map(|t| t.keys),
            Some(vec![]),
            "keys only when asked"
        );
        lessor.attach(&key("b"), 0);
        assert_eq!(ttl(&lessor, 1), Some(vec![]));
        assert_eq!(lessor.revoke(2), Some(vec![key("a")]));
        assert_eq!(lessor.revoke(2), None);
    }

    #[test]
    fn deadlines_expire_keep_alive_renews_and_list_is_soonest_first() {
        let mut lessor = Lessor::new();
        lessor.grant(7, 5, Duration::ZERO);
        lessor.grant(8, 3, Duration::ZERO);
        assert_eq!(lessor.list(), vec![8, 7]);
        let at = |s| Duration::from_secs(s);
        assert_eq!(
            lessor
                .time_to_live(7, at(1), true)
                .map(|t| (t.remaining, t.granted)),
            Some((4, 5))
        );
        assert_eq!(lessor.expired(at(3), 10), vec![8]);
        assert_eq!(
            lessor.keep_alive(8, at(3)),
            None,
            "past its deadline: not revived"
        );
        assert_eq!(lessor.keep_alive(7, at(2)), Some(5), "renewed until t=7");
        assert_eq!(lessor.expired(at(6), 10), vec![8]);
        assert_eq!(lessor.expired(at(7), 10), vec![8, 7]);
        assert_eq!(lessor.keep_alive(99, at(3)), None);
        assert_eq!(
            lessor.time_to_live(8, at(100), false).map(|t| t.remaining),
            Some(0)
        );
    }

    #[test]
    fn lease_rows_round_trip_and_reject_bad_bytes() {
        let (k, v) = encode_row(42, 60);
        assert_eq!(decode_row(&k, &v), Ok((42, 60)));
        assert!(decode_row(&k[..7], &v).is_err());
    }

    #[test]
    fn generated_ids_are_positive_unused_and_deterministic() {
        let a = generate_id(5, |_| false);
        assert_eq!(a, generate_id(5, |_| false));
        assert!(a > 0);
        let b = generate_id(5, |id| id == a);
        assert!(b > 0 && b != a);
    }
}
