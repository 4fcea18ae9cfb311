//! Maintenance.Hash: a hash of the whole logical store at the current revision, computed from
//! the engine's public reads.
//!
//! etcd's Hash is a CRC-32 of its bbolt file, page layout and free pages included, so it
//! changes with a defrag and differs between members holding the same data. kvd has no
//! bbolt file; its Hash covers what a client can observe instead: HashKV at the current
//! revision (every kept revision of every key, the compaction revision), each lease with its
//! granted TTL, and the active alarms.
//!
//! Invariants:
//! - HASH-SRV-1: the hash is a function of the logical store only: equal for two engines
//!   with the same history, unchanged by a restart or a defrag. Remaining lease TTLs are left
//!   out (they follow the clock); leases and alarms are hashed in a fixed order.
//! - HASH-SRV-2: the parts are read at one applied index: a write applied between the first
//!   and the last read (seen as a changed applied index or revision, or a lease gone
//!   meanwhile) restarts the reads, at most [`STORE_HASH_ATTEMPTS_MAX`] times.
//!
//! Contact points: `server::maintenance` answers Hash with [`store_hash`]; the engine's
//! `hash_kv`, `lease_leases`, `lease_time_to_live` and `status`.

use sha2::Digest;

use kvd::{Engine, Error, Result};

/// Reads of the whole store tried before giving up under a steady stream of writes
/// (HASH-SRV-2).
pub const STORE_HASH_ATTEMPTS_MAX: usize = 16;

/// Names the hash's layout; a change of what is hashed changes this tag.
const STORE_HASH_TAG: &[u8] = b"kvd store hash v1";

/// A hash of the store and the revision it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreHash {
    /// The revision the hash covers (the current one when it was read).
    pub revision: i64,
    /// The hash (HASH-SRV-1).
    pub hash: u32,
}

/// Returns the hash of the store at the current revision (HASH-SRV-1, HASH-SRV-2).
pub fn store_hash(engine: &Engine) -> Result<StoreHash> {
    for _ in 0..STORE_HASH_ATTEMPTS_MAX {
        if let Some(hash) = try_store_hash(engine)? {
            return Ok(hash);
        }
    }
    Err(Error::InvalidArgument(
        "kvd: writes kept landing while hashing the store; retry".into(),
    ))
}

/// Reads and hashes the store once; `None` if a write landed meanwhile.
fn try_store_hash(engine: &Engine) -> Result<Option<StoreHash>> {
    let before = engine.status()?;
    let kv = engine.hash_kv(0)?;
    let mut leases = engine.lease_leases()?.leases;
    leases.sort_unstable();
    let mut granted = Vec::with_capacity(leases.len());
    for id in leases {
        let lease = engine.lease_time_to_live(id, false)?;
        if lease.ttl == -1 {
            return Ok(None); // Revoked or expired since the listing.
        }
        granted.push((id, lease.granted_ttl));
    }
    let after = engine.status()?;
    let moved = after.applied_index != before.applied_index
        || after.header.revision != kv.hash_revision
        || before.header.revision != kv.hash_revision;
    if moved {
        return Ok(None);
    }
    let mut alarms: Vec<(u64, &'static str)> = after
        .alarms
        .iter()
        .map(|a| (a.member_id, a.alarm.name()))
        .collect();
    alarms.sort_unstable();

    let mut hasher = sha2::Sha256::new();
    hasher.update(STORE_HASH_TAG);
    hasher.update(kv.hash_revision.to_be_bytes());
    hasher.update(kv.compact_revision.to_be_bytes());
    hasher.update(kv.hash.to_be_bytes());
    hasher.update((granted.len() as u64).to_be_bytes());
    for (id, ttl) in &granted {
        hasher.update(id.to_be_bytes());
        hasher.update(ttl.to_be_bytes());
    }
    hasher.update((alarms.len() as u64).to_be_bytes());
    for (member, alarm) in &alarms {
        hasher.update(member.to_be_bytes());
        hasher.update((alarm.len() as u64).to_be_bytes());
        hasher.update(alarm.as_bytes());
    }
    let digest = hasher.finalize();
    let hash = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    Ok(Some(StoreHash {
        revision: kv.hash_revision,
        hash,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(dir: &std::path::Path) -> Engine {
        Engine::open(dir, kvd::Config::default()).unwrap()
    }

    fn history(engine: &Engine) {
        for i in 0..20 {
            engine
                .put(kvd::PutRequest::new(format!("k{}", i % 7), format!("v{i}")))
                .unwrap();
        }
        engine
            .lease_grant(kvd::LeaseGrantRequest { ttl: 600, id: 42 })
            .unwrap();
        engine
            .delete_range(kvd::DeleteRangeRequest::key("k3"))
            .unwrap();
        engine
            .compact(kvd::CompactionRequest {
                revision: 10,
                physical: true,
            })
            .unwrap();
    }

    #[test]
    fn store_hash_is_equal_for_the_same_history_and_survives_defrag_and_restart() {
        let a_dir = tempfile::tempdir().unwrap();
        let b_dir = tempfile::tempdir().unwrap();
        let a = engine(a_dir.path());
        let b = engine(b_dir.path());
        history(&a);
        history(&b);
        let hash = store_hash(&a).unwrap();
        assert_eq!(store_hash(&b).unwrap(), hash, "HASH-SRV-1: same history");
        a.defrag().unwrap();
        assert_eq!(store_hash(&a).unwrap(), hash, "HASH-SRV-1: defrag");
        a.close().unwrap();
        let a = engine(a_dir.path());
        assert_eq!(store_hash(&a).unwrap(), hash, "HASH-SRV-1: restart");
    }

    #[test]
    fn store_hash_follows_keys_leases_and_alarms() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        let mut seen = vec![store_hash(&e).unwrap().hash];
        e.put(kvd::PutRequest::new("k", "v")).unwrap();
        seen.push(store_hash(&e).unwrap().hash);
        e.lease_grant(kvd::LeaseGrantRequest { ttl: 600, id: 7 })
            .unwrap();
        seen.push(store_hash(&e).unwrap().hash);
        e.alarm(kvd::AlarmRequest {
            action: kvd::AlarmAction::Activate,
            member_id: 3,
            alarm: kvd::AlarmType::NoSpace,
        })
        .unwrap();
        seen.push(store_hash(&e).unwrap().hash);
        let mut distinct = seen.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            seen.len(),
            "every change moves the hash: {seen:?}"
        );
    }
}
