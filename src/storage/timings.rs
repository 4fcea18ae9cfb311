//! Wall-clock durations of the two disk steps etcd publishes as histograms: the log's
//! `fdatasync` (etcd's `etcd_disk_wal_fsync_duration_seconds`) and the commit of a write
//! transaction to the database (`etcd_disk_backend_commit_duration_seconds`).
//!
//! Owns: the bucket counters, in etcd's buckets (1 ms doubling to 8.192 s).
//!
//! Invariants:
//! - TIME-1: the durations are for monitoring only: nothing reads them back into apply,
//!   commit or compaction, so they do not break determinism (style rule 5).
//! - TIME-2: recording takes no lock (relaxed atomics); a snapshot may mix a recording in
//!   progress, but every bucket count and the total only grow.
//!
//! Contact points: `storage::wal` (fsync) and `Store::write_logged` (commit) record here;
//! `Engine::disk_timings` reads a snapshot for the server's `/metrics`.

use std::time::Duration;

use crate::sync::{AtomicU64, Ordering};

/// The number of finite buckets, etcd's `prometheus.ExponentialBuckets(0.001, 2, 14)`.
pub const DISK_BUCKETS: usize = 14;
/// The upper bound of the first bucket, in microseconds (1 ms).
pub const DISK_BUCKET_FIRST_MICROS: u64 = 1_000;

/// Returns the finite upper bounds of the buckets, in seconds: 0.001, 0.002, … 8.192.
pub fn disk_bucket_bounds_seconds() -> [f64; DISK_BUCKETS] {
    let mut bounds = [0.0; DISK_BUCKETS];
    for (i, bound) in bounds.iter_mut().enumerate() {
        *bound = (DISK_BUCKET_FIRST_MICROS << i) as f64 / 1e6;
    }
    bounds
}

/// One histogram of durations.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Counts per bucket, not cumulative; the last slot is `+Inf`.
    buckets: [AtomicU64; DISK_BUCKETS + 1],
    sum_micros: AtomicU64,
}

impl LatencyHistogram {
    /// Records one duration (TIME-2).
    pub fn observe(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = (0..DISK_BUCKETS)
            .find(|i| micros <= DISK_BUCKET_FIRST_MICROS << i)
            .unwrap_or(DISK_BUCKETS);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// Returns the counts so far.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets = [0; DISK_BUCKETS + 1];
        for (count, bucket) in buckets.iter_mut().zip(&self.buckets) {
            *count = bucket.load(Ordering::Relaxed);
        }
        HistogramSnapshot {
            buckets,
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// The counts of one histogram at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Counts per bucket of [`disk_bucket_bounds_seconds`], not cumulative; the last slot
    /// is `+Inf`.
    pub buckets: [u64; DISK_BUCKETS + 1],
    /// The sum of the durations, in microseconds.
    pub sum_micros: u64,
}

impl HistogramSnapshot {
    /// Returns the number of durations recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The disk histograms of one store.
#[derive(Debug, Default)]
pub struct DiskTimings {
    /// The log's `fdatasync`, one per synced batch.
    pub wal_fsync: LatencyHistogram,
    /// The database commit of a write transaction.
    pub backend_commit: LatencyHistogram,
}

/// A snapshot of the disk timings (`DiskTimings`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTimingsSnapshot {
    /// The log's `fdatasync`.
    pub wal_fsync: HistogramSnapshot,
    /// The database commit.
    pub backend_commit: HistogramSnapshot,
}

impl DiskTimings {
    /// Returns the counts so far.
    pub fn snapshot(&self) -> DiskTimingsSnapshot {
        DiskTimingsSnapshot {
            wal_fsync: self.wal_fsync.snapshot(),
            backend_commit: self.backend_commit.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_land_in_etcds_buckets() {
        let bounds = disk_bucket_bounds_seconds();
        assert_eq!((bounds[0], bounds[13]), (0.001, 8.192));
        let histogram = LatencyHistogram::default();
        histogram.observe(Duration::from_micros(1_000));
        histogram.observe(Duration::from_micros(1_001));
        histogram.observe(Duration::from_secs(60));
        let got = histogram.snapshot();
        assert_eq!(got.buckets[0], 1, "at most 1 ms");
        assert_eq!(got.buckets[1], 1, "at most 2 ms");
        assert_eq!(got.buckets[DISK_BUCKETS], 1, "+Inf");
        assert_eq!(got.count(), 3);
        assert_eq!(got.sum_micros, 60_002_001);
    }
}
