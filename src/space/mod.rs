//! The space quota: etcd's cost model, the quota in bytes, the in-use estimate admission
//! reads, and the filesystem reserve guard.
//!
//! Why in-use size and not the file length: redb grows its file by doubling and never
//! shrinks it below the highest page in use, so the file length says little about what the
//! data needs; the pages redb has allocated (history, pinned pages and pending frees
//! included) do. Compaction frees pages and so relieves the quota; defrag gives the file
//! back to the filesystem.
//!
//! Invariants:
//! - SPACE-1: costs are etcd's: Put 256 + |key| + |value|; Txn the larger of its branches,
//!   nested txns included (etcd 3.6.14); LeaseGrant 64; everything else 0.
//! - SPACE-2: a write with cost `c` is applied only if `in_use + growth_bound(c) < quota`
//!   (etcd's strict `<`, with the page growth a write may really cause instead of its cost)
//!   and the filesystem keeps its reserve; `in_use` is the exact allocated size measured in
//!   the apply thread's own transaction whenever the running estimate says it might not fit.
//!   Near the quota this measurement (a walk of every page) runs once per batch.
//! - SPACE-3: the estimate does not undercount between measurements: every record written,
//!   tombstones included, adds twice its bytes plus an allowance, and every commit a page
//!   allowance; only a measurement lowers it.
//! - SPACE-4: the measured figure Status and `/metrics` report (`dbSizeInUse`) is refreshed
//!   by the apply thread busy or idle, at most every 10 s of engine time and at least 20
//!   times the walk's own duration apart. A walk stalls writes while it runs (about 0.4 s
//!   per GiB in use here), so a walk expected to take over 20 ms (the last one did, or,
//!   before the first, the file is past 32 MiB) runs only once the engine has been quiet
//!   (nothing queued or in flight, no batch for max(1 s, 5 walks) of engine time), or under
//!   continuous writes at most every 5 minutes, and never while a defrag copies: the figure
//!   lags the truth by at most max(10 s, 20 walks) for a small database and 5 minutes (plus
//!   a defrag's length) for a large one.
//!
//! Contact points: `Engine` (admission) and `engine::apply` (the exact check); `alarm` is
//! raised on the first refusal.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::api::{RequestOp, TxnRequest};
use crate::sync::{AtomicU64, Mutex, Ordering, lock};

/// etcd's DefaultQuotaBytes: 2 GiB.
pub const QUOTA_BYTES_DEFAULT: u64 = 2 << 30;
/// etcd's MaxQuotaBytes: above it etcd (and kvd) warns.
pub const QUOTA_BYTES_WARN: u64 = 8 << 30;
/// etcd's kvOverhead: the cost of a Put beyond its key and value.
pub const PUT_OVERHEAD_BYTES: u64 = 256;
/// etcd's leaseOverhead: the cost of a LeaseGrant.
pub const LEASE_GRANT_COST_BYTES: u64 = 64;
/// Bytes of page churn the estimate adds per commit (the copy-on-write pages a commit
/// touches beyond its records).
pub const COMMIT_PAGE_ALLOWANCE_BYTES: u64 = 4 * 4096;
/// The smallest filesystem reserve: writes stop while less than this is free.
pub const FS_RESERVE_BYTES_MIN: u64 = 64 << 20;

const _: () = assert!(QUOTA_BYTES_DEFAULT < QUOTA_BYTES_WARN);

/// Returns the quota in force for etcd's `--quota-backend-bytes` value: 0 means the 2 GiB
/// default, a negative value disables the quota (`None`).
///
/// ```
/// assert_eq!(kvd::space_quota_bytes(0), Some(2 << 30));
/// assert_eq!(kvd::space_quota_bytes(-1), None);
/// assert_eq!(kvd::space_quota_bytes(1_000_000), Some(1_000_000));
/// ```
pub fn quota_bytes(configured: i64) -> Option<u64> {
    match configured {
        0 => Some(QUOTA_BYTES_DEFAULT),
        n if n < 0 => None,
        n => Some(n.unsigned_abs()),
    }
}

/// Returns the filesystem reserve for a quota: an eighth of the quota, at least
/// `FS_RESERVE_BYTES_MIN`. Headroom for redb to grow its file and write a commit when the
/// quota is disabled or larger than the disk.
pub fn default_fs_reserve_bytes(quota: Option<u64>) -> u64 {
    quota.map_or(FS_RESERVE_BYTES_MIN, |q| (q / 8).max(FS_RESERVE_BYTES_MIN))
}

/// Returns the cost of a Put of this key and value (SPACE-1).
pub fn put_cost(key: usize, value: usize) -> u64 {
    PUT_OVERHEAD_BYTES + key as u64 + value as u64
}

/// Returns the cost of a Txn: its larger branch, nested txns included (SPACE-1).
pub fn txn_cost(txn: &TxnRequest) -> u64 {
    let branch = |ops: &[RequestOp]| -> u64 {
        ops.iter()
            .map(|op| match op {
                RequestOp::Put(p) => put_cost(p.key.len(), p.value.len()),
                RequestOp::Txn(t) => txn_cost(t),
                RequestOp::Range(_) | RequestOp::DeleteRange(_) => 0,
            })
            .sum()
    };
    branch(&txn.success).max(branch(&txn.failure))
}

/// Bytes of history record header (`mvcc::record`).
const RECORD_HEADER_BYTES: u64 = 29;

/// Returns how much a record of this key and value may grow the pages in use: twice its
/// bytes (copy-on-write B-tree pages are rarely full) plus a small per-record allowance
/// (SPACE-3).
pub fn record_growth(key_len: usize, value_len: usize) -> u64 {
    2 * (RECORD_HEADER_BYTES + key_len as u64 + value_len as u64) + 64
}

/// Returns the space a write of etcd cost `cost` is checked for (SPACE-2): twice the cost
/// plus one commit's page allowance, so an admitted write cannot take the pages in use past
/// the quota. Stricter than etcd's `size + cost < quota` by that factor.
pub fn growth_bound(cost: u64) -> u64 {
    cost.saturating_mul(2)
        .saturating_add(COMMIT_PAGE_ALLOWANCE_BYTES)
}

/// The in-use figure admission reads: the last exact measurement plus what commits added
/// since (SPACE-3).
#[derive(Debug)]
pub struct SpaceTracker {
    measured: AtomicU64,
    added_since: AtomicU64,
}

impl SpaceTracker {
    /// Returns a tracker starting from a measurement.
    pub fn new(measured: u64) -> SpaceTracker {
        SpaceTracker {
            measured: AtomicU64::new(measured),
            added_since: AtomicU64::new(0),
        }
    }

    /// Records an exact measurement.
    pub fn measured(&self, bytes: u64) {
        self.added_since.store(0, Ordering::Release);
        self.measured.store(bytes, Ordering::Release);
    }

    /// Records a commit that wrote `record_bytes`.
    pub fn committed(&self, record_bytes: u64) {
        self.added_since
            .fetch_add(record_bytes + COMMIT_PAGE_ALLOWANCE_BYTES, Ordering::AcqRel);
    }

    /// Returns the last exact measurement.
    pub fn last_measured(&self) -> u64 {
        self.measured.load(Ordering::Acquire)
    }

    /// Returns the estimate: never below the truth since the last measurement.
    pub fn estimate(&self) -> u64 {
        self.measured
            .load(Ordering::Acquire)
            .saturating_add(self.added_since.load(Ordering::Acquire))
    }
}

/// Returns true if `in_use + cost` fits strictly under `quota` (SPACE-2).
pub fn fits(in_use: u64, cost: u64, quota: Option<u64>) -> bool {
    quota.is_none_or(|q| in_use.saturating_add(cost) < q)
}

/// Where the filesystem guard reads the free space of the data directory's filesystem: an
/// input of apply like the clock, so tests and simulations can drive it.
pub trait FreeSpace: Send + Sync + std::fmt::Debug {
    /// Returns the bytes free on the filesystem holding `dir`, or `None` if that cannot be
    /// read (then the guard does not refuse: an unreadable figure is not evidence of a full
    /// disk).
    fn available(&self, dir: &Path) -> Option<u64>;
}

/// How long [`StatvfsFreeSpace`] answers with a figure it read before it reads again.
pub const FREE_SPACE_REREAD_AFTER: Duration = Duration::from_millis(10);

/// The free space `statvfs` reports, read again once the last figure is
/// `FREE_SPACE_REREAD_AFTER` (10 ms) old or was read for another directory.
///
/// Why not read every time: apply asks once per batch, and a single client's writes make a
/// batch each, thousands a second, each paying a `statfs` system call with its path walk.
/// What a figure 10 ms old misses is what the disk took in those 10 ms, far below any
/// reserve (at least `FS_RESERVE_BYTES_MIN`, 64 MiB).
#[derive(Debug, Default)]
pub struct StatvfsFreeSpace {
    last: Mutex<Option<FreeSpaceReading>>,
}

/// One `statvfs` figure and when and where it was read.
#[derive(Debug)]
struct FreeSpaceReading {
    at: Instant,
    dir: PathBuf,
    bytes: Option<u64>,
}

impl FreeSpace for StatvfsFreeSpace {
    fn available(&self, dir: &Path) -> Option<u64> {
        let mut last = lock(&self.last);
        let now = Instant::now();
        if let Some(reading) = last.as_ref()
            && reading.dir == dir
            && now.saturating_duration_since(reading.at) < FREE_SPACE_REREAD_AFTER
        {
            return reading.bytes;
        }
        let bytes = fs4::available_space(dir).ok();
        *last = Some(FreeSpaceReading {
            at: now,
            dir: dir.to_path_buf(),
            bytes,
        });
        bytes
    }
}

/// A free-space figure a test sets by hand.
///
/// ```
/// use kvd::{FreeSpace, ManualFreeSpace};
/// let space = ManualFreeSpace::new(Some(1 << 30));
/// space.set(Some(10));
/// assert_eq!(space.available(std::path::Path::new(".")), Some(10));
/// ```
#[derive(Debug)]
pub struct ManualFreeSpace {
    /// `u64::MAX` stands for "cannot be read".
    bytes: AtomicU64,
}

impl ManualFreeSpace {
    /// Returns a figure starting at `bytes` (`None`: unreadable).
    pub fn new(bytes: Option<u64>) -> ManualFreeSpace {
        ManualFreeSpace {
            bytes: AtomicU64::new(bytes.unwrap_or(u64::MAX)),
        }
    }

    /// Sets the figure (`None`: unreadable).
    pub fn set(&self, bytes: Option<u64>) {
        self.bytes
            .store(bytes.unwrap_or(u64::MAX), Ordering::Release);
    }
}

impl FreeSpace for ManualFreeSpace {
    fn available(&self, _dir: &Path) -> Option<u64> {
        match self.bytes.load(Ordering::Acquire) {
            u64::MAX => None,
            n => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_fits_strictly_below_and_none_disables() {
        assert!(fits(99, 0, Some(100)));
        assert!(!fits(90, 10, Some(100)), "strict <, as etcd");
        assert!(fits(u64::MAX, 1, None));
        assert_eq!(quota_bytes(0), Some(QUOTA_BYTES_DEFAULT));
        assert_eq!(default_fs_reserve_bytes(Some(8 << 30)), 1 << 30);
        assert_eq!(
            default_fs_reserve_bytes(Some(1 << 20)),
            FS_RESERVE_BYTES_MIN
        );
    }

    #[test]
    fn a_free_space_figure_is_read_for_the_directory_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let statvfs = StatvfsFreeSpace::default();
        assert!(statvfs.available(dir.path()).is_some_and(|b| b > 0));
        // Asked at once for another directory, the figure read for the first is not served.
        let missing = dir.path().join("missing");
        assert_eq!(statvfs.available(&missing), None);
        assert!(statvfs.available(dir.path()).is_some());
    }

    #[test]
    fn estimate_never_drops_below_measurement_until_remeasured() {
        let tracker = SpaceTracker::new(1000);
        tracker.committed(500);
        assert_eq!(tracker.estimate(), 1000 + 500 + COMMIT_PAGE_ALLOWANCE_BYTES);
        tracker.measured(1200);
        assert_eq!(tracker.estimate(), 1200);
    }
}
