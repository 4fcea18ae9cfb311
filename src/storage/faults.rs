//! Fault injection: a switch that makes the database file's writes and syncs fail after a
//! chosen number of them, to test what the engine does after an I/O error (poisoning, then
//! recovery on reopen).
//!
//! It can also hold the write-ahead log's `fdatasync` until released, and fail the next
//! batch's apply, so a test can see what is answered while a commit is in flight.
//!
//! Invariants:
//! - FAULT-1: once a fault fired, every later write and sync fails too until `heal`, as a
//!   dead disk would; reads keep working.
//!
//! Contact points: `Config::faults` (tests only; production never sets it); the database
//! file's backend (`db_file`) asks [`Faults`] before every write and sync when it is set.

use std::io;

use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering, lock};

/// A switch that makes storage writes fail, shared between a test and the engine.
#[derive(Debug)]
pub struct Faults {
    /// Writes and syncs still allowed before failing; `u64::MAX` means never fail.
    remaining: AtomicU64,
    /// True while log syncs wait for `release_log_syncs`.
    held: Mutex<bool>,
    released: Condvar,
    /// Log syncs waiting now.
    waiting: AtomicUsize,
    /// Makes the next batch fail before its commit.
    fail_batch: AtomicBool,
}

impl Faults {
    /// Returns a switch that never fails.
    ///
    /// ```
    /// let faults = kvd::Faults::new();
    /// faults.fail_after(3);
    /// faults.heal();
    /// ```
    pub fn new() -> Faults {
        Faults {
            remaining: AtomicU64::new(u64::MAX),
            held: Mutex::new(false),
            released: Condvar::new(),
            waiting: AtomicUsize::new(0),
            fail_batch: AtomicBool::new(false),
        }
    }

    /// Makes every write-ahead log `fdatasync` wait until [`Faults::release_log_syncs`].
    pub fn hold_log_syncs(&self) {
        *lock(&self.held) = true;
    }

    /// Lets held and later log syncs go on.
    pub fn release_log_syncs(&self) {
        *lock(&self.held) = false;
        self.released.notify_all();
    }

    /// Returns true while log syncs are held.
    pub(crate) fn log_syncs_held(&self) -> bool {
        *lock(&self.held)
    }

    /// Returns how many log syncs are waiting to be released.
    pub fn log_syncs_waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Makes the next write batch fail with an I/O error before its commit.
    pub fn fail_next_batch(&self) {
        self.fail_batch.store(true, Ordering::SeqCst);
    }

    /// Waits while log syncs are held.
    pub(crate) fn before_log_sync(&self) {
        let mut held = lock(&self.held);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        while *held {
            held = self
                .released
                .wait(held)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Returns true once after `fail_next_batch`.
    pub(crate) fn take_batch_failure(&self) -> bool {
        self.fail_batch.swap(false, Ordering::SeqCst)
    }

    /// Lets `operations` more writes or syncs succeed, then fails all (FAULT-1).
    pub fn fail_after(&self, operations: u64) {
        self.remaining.store(operations, Ordering::SeqCst);
    }

    /// Stops failing.
    pub fn heal(&self) {
        self.remaining.store(u64::MAX, Ordering::SeqCst);
    }

    pub(crate) fn allow(&self) -> io::Result<()> {
        let mut current = self.remaining.load(Ordering::SeqCst);
        loop {
            match current {
                u64::MAX => return Ok(()),
                0 => return Err(io::Error::other("kvd: injected storage fault")),
                n => match self.remaining.compare_exchange(
                    n,
                    n - 1,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => return Ok(()),
                    Err(seen) => current = seen,
                },
            }
        }
    }
}

impl Default for Faults {
    fn default() -> Faults {
        Faults::new()
    }
}
