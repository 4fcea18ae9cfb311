//! Permission checks: does a user's set of permitted key intervals cover a request's key or
//! range (etcd's rule).
//!
//! A permission `(key, range_end)` is the interval `[key, key+"\0")` when `range_end` is
//! empty, `[key, +inf)` when it is the single byte 0, else `[key, range_end)`. A request on
//! one key is permitted when any interval holds the key; a request on a range (or an
//! open-ended one, range end "\0") only when the intervals cover it without a gap from its
//! start to its end (to +inf for an open-ended one).
//!
//! Invariants:
//! - PERM-1: a range request is permitted only when every key it could touch lies in some
//!   permitted interval; a from-key request (range end "\0") needs an interval reaching
//!   +inf (etcd 3.6's fix: 3.4 checked only its start key).
//! - PERM-2: a Txn is permitted only when every compare and every op of both branches is,
//!   nested Txns included, whatever the compares' outcome (etcd 3.6).
//!
//! Contact points: `auth::AuthStore::check_key` uses [`covers`]; `engine::auth` walks Txns.

use std::cmp::Ordering;

/// The end of an interval: a key (exclusive) or +inf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Exclusive end key.
    Key(Vec<u8>),
    /// No end.
    Infinite,
}

impl End {
    fn cmp_key(&self, key: &[u8]) -> Ordering {
        match self {
            End::Key(k) => k.as_slice().cmp(key),
            End::Infinite => Ordering::Greater,
        }
    }
}

impl PartialOrd for End {
    fn partial_cmp(&self, other: &End) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for End {
    fn cmp(&self, other: &End) -> Ordering {
        match (self, other) {
            (End::Infinite, End::Infinite) => Ordering::Equal,
            (End::Infinite, End::Key(_)) => Ordering::Greater,
            (End::Key(_), End::Infinite) => Ordering::Less,
            (End::Key(a), End::Key(b)) => a.cmp(b),
        }
    }
}

/// A half-open key interval `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// First key.
    pub start: Vec<u8>,
    /// Exclusive end.
    pub end: End,
}

/// Returns the interval of a permission or a request `(key, range_end)`, etcd's encoding.
pub fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    let end = match range_end {
        [] => {
            let mut next = key.to_vec();
            next.push(0);
            End::Key(next)
        }
        [0] => End::Infinite,
        end => End::Key(end.to_vec()),
    };
    Interval {
        start: key.to_vec(),
        end,
    }
}

/// Returns true if the permitted `intervals` cover the request `(key, range_end)` (PERM-1).
pub fn covers(intervals: &[Interval], key: &[u8], range_end: &[u8]) -> bool {
    let wanted = interval(key, range_end);
    // An inverted request range names no key; etcd answers it from the start key alone.
    let single = range_end.is_empty() || wanted.end.cmp_key(key) != Ordering::Greater;
    if single {
        return intervals
            .iter()
            .any(|i| i.start.as_slice() <= key && i.end.cmp_key(key) == Ordering::Greater);
    }
    let mut sorted: Vec<&Interval> = intervals.iter().collect();
    sorted.sort_by(|a, b| a.start.cmp(&b.start));
    // Sweep from the request's start: each interval must begin at or before the point
    // reached so far, or there is a gap.
    let mut reached = End::Key(key.to_vec());
    for i in sorted {
        if reached >= wanted.end {
            return true;
        }
        if End::Key(i.start.clone()) > reached {
            return false;
        }
        if i.end > reached {
            reached = i.end.clone();
        }
    }
    reached >= wanted.end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Vec<Interval> {
        vec![interval(b"/dev/", b"/dev0")]
    }

    #[test]
    fn etcds_examples_with_a_prefix_permission() {
        let allowed: [(&[u8], &[u8]); 6] = [
            (b"/dev/a", b""),
            (b"/dev/", b"/dev0"),
            (b"/dev/a", b"/dev/b"),
            (b"/dev/", b""),
            (b"/dev/zzz", b""),
            (b"/dev/a", b"/dev0"),
        ];
        for (key, end) in allowed {
            assert!(covers(&dev(), key, end), "{key:?} {end:?}");
        }
        let denied: [(&[u8], &[u8]); 7] = [
            (b"/dev/", b"/dev1"),
            (b"/", b"0"),
            (b"\0", b"\0"),
            (b"/dev", b""),
            (b"/dev/", b"\0"),
            (b"/other", b""),
            (b"/dea", b"/dev/b"),
        ];
        for (key, end) in denied {
            assert!(!covers(&dev(), key, end), "{key:?} {end:?}");
        }
    }

    #[test]
    fn adjacent_intervals_cover_contiguously_and_a_gap_denies() {
        let two = vec![interval(b"a", b"c"), interval(b"c", b"e")];
        assert!(covers(&two, b"a", b"e"));
        assert!(covers(&two, b"b", b"d"));
        assert!(!covers(&two, b"a", b"f"));
        let gap = vec![interval(b"a", b"c"), interval(b"d", b"e")];
        assert!(!covers(&gap, b"a", b"e"));
        assert!(covers(&gap, b"d", b""));
        let open = vec![interval(b"m", b"\0")];
        assert!(covers(&open, b"m", b"\0"));
        assert!(covers(&open, b"x", b"\0"));
        assert!(!covers(&open, b"a", b"\0"));
        let single = vec![interval(b"k", b"")];
        assert!(covers(&single, b"k", b""));
        assert!(covers(&single, b"k", b"k\0"));
        assert!(!covers(&single, b"k", b"l"));
        assert!(!covers(&[], b"k", b""));
    }
}
