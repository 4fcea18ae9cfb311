//! A latency histogram with bounded relative error: log-linear buckets over microseconds,
//! mergeable across clients.
//!
//! Owns: bucketing, percentiles, and the coarse power-of-two view the report prints.
//!
//! Invariants:
//! - HIST-1: a recorded value lands in a bucket whose bounds are within 1/[`SUB_BUCKETS`]
//!   of it (values below [`SUB_BUCKETS`] µs exactly), so a percentile read from the buckets
//!   is at most that much above the true one, and never above the recorded maximum.
//! - HIST-2: `count` equals the sum of the buckets; `min ≤ every percentile ≤ max`.
//!
//! Contact points: `bench::run` records into one histogram per client and merges them.

/// Sub-buckets per power of two (a power of two itself).
pub const SUB_BUCKETS: u64 = 64;
const SUB_BITS: u32 = SUB_BUCKETS.trailing_zeros();
/// Buckets needed to cover every `u64` value.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB_BUCKETS as usize;

const _: () = assert!(SUB_BUCKETS.is_power_of_two());

/// Latencies in microseconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum_micros: u128,
    min_micros: u64,
    max_micros: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: vec![0; BUCKETS],
            count: 0,
            sum_micros: 0,
            min_micros: u64::MAX,
            max_micros: 0,
        }
    }
}

/// Returns the bucket of `micros` (HIST-1).
fn bucket_of(micros: u64) -> usize {
    if micros < SUB_BUCKETS {
        return micros as usize;
    }
    let exponent = 63 - micros.leading_zeros(); // ≥ SUB_BITS
    let shift = exponent - SUB_BITS;
    let mantissa = (micros >> shift) - SUB_BUCKETS; // 0..SUB_BUCKETS
    ((shift as u64 + 1) * SUB_BUCKETS + mantissa) as usize
}

/// Returns the largest value of bucket `index`.
fn bucket_high(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB_BUCKETS {
        return index;
    }
    let shift = index / SUB_BUCKETS - 1;
    let mantissa = index % SUB_BUCKETS + SUB_BUCKETS;
    let low = mantissa << shift;
    low.saturating_add((1u64 << shift) - 1)
}

impl Histogram {
    /// Records one latency.
    pub fn record(&mut self, micros: u64) {
        self.buckets[bucket_of(micros)] += 1;
        self.count += 1;
        self.sum_micros += u128::from(micros);
        self.min_micros = self.min_micros.min(micros);
        self.max_micros = self.max_micros.max(micros);
    }

    /// Adds `other`'s values to this one.
    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_micros += other.sum_micros;
        self.min_micros = self.min_micros.min(other.min_micros);
        self.max_micros = self.max_micros.max(other.max_micros);
    }

    /// Returns the number of values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Returns the smallest value, 0 if none.
    pub fn min(&self) -> u64 {
        if self.count == 0 { 0 } else { self.min_micros }
    }

    /// Returns the largest value, 0 if none.
    pub fn max(&self) -> u64 {
        self.max_micros
    }

    /// Returns the mean, 0 if none.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_micros as f64 / self.count as f64
        }
    }

    /// Returns the value at `percent` (0–100]: the high end of the bucket holding the
    /// value of that rank, capped at the maximum (HIST-1); 0 if none.
    pub fn percentile(&self, percent: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((percent / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return bucket_high(index).clamp(self.min(), self.max_micros);
            }
        }
        self.max_micros
    }

    /// Returns counts per power-of-two bucket of microseconds, `(upper bound µs, count)`,
    /// from the first bucket with a value to the last; the counts add up to `count`.
    pub fn coarse(&self) -> Vec<(u64, u64)> {
        let mut by_power: Vec<(u64, u64)> = Vec::new();
        for (index, n) in self.buckets.iter().enumerate() {
            if *n == 0 {
                continue;
            }
            let high = bucket_high(index);
            let bound = high.checked_next_power_of_two().unwrap_or(u64::MAX).max(1);
            match by_power.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, count)) => *count += n,
                None => by_power.push((bound, *n)),
            }
        }
        by_power.sort_unstable();
        by_power
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_their_values_within_the_relative_error() {
        for micros in (0..5_000).chain([65_535, 65_536, 1 << 40, u64::MAX]) {
            let index = bucket_of(micros);
            let high = bucket_high(index);
            assert!(high >= micros, "{micros} above its bucket's high {high}");
            let low = if index == 0 {
                0
            } else {
                bucket_high(index - 1) + 1
            };
            assert!(low <= micros, "{micros} below its bucket's low {low}");
            assert!(
                (high - low) <= micros / SUB_BUCKETS,
                "bucket of {micros} too wide: {low}..={high}"
            );
        }
    }

    #[test]
    fn percentiles_of_a_uniform_run() {
        let mut h = Histogram::default();
        for micros in 1..=1_000 {
            h.record(micros);
        }
        assert_eq!(h.count(), 1_000);
        assert_eq!((h.min(), h.max()), (1, 1_000));
        let p50 = h.percentile(50.0);
        assert!((500..=508).contains(&p50), "{p50}");
        let p99 = h.percentile(99.0);
        assert!((990..=1_000).contains(&p99), "{p99}");
        assert_eq!(h.percentile(100.0), 1_000);
        assert!((h.mean() - 500.5).abs() < 1e-9);
        let coarse: u64 = h.coarse().iter().map(|(_, n)| n).sum();
        assert_eq!(coarse, 1_000);
    }

    #[test]
    fn merged_histograms_add_up() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        a.record(10);
        b.record(20_000);
        b.record(7);
        a.merge(&b);
        assert_eq!((a.count(), a.min(), a.max()), (3, 7, 20_000));
        assert_eq!(a.percentile(100.0), 20_000);
        assert_eq!(Histogram::default().percentile(50.0), 0);
    }
}
