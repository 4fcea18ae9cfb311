//! Time as an input: the engine never reads the wall clock itself.
//!
//! Owns: the [`Clock`] trait, the system clock and a manual clock for tests.
//!
//! Invariants:
//! - CLOCK-1: `now()` never goes backwards for a given clock.
//! - CLOCK-2: apply and compaction take time only from the engine's `Clock` (house rule 5),
//!   so a test that drives a [`ManualClock`] replays exactly.
//!
//! Contact points: `engine::Config::clock`; lease expiry and auto-compaction read it, and the
//! engine registers with `Clock::on_jump` so a manual clock's `advance` wakes its apply thread.

use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Mutex, Ordering, WeakWake, lock};

/// A monotonic source of time, measured from an arbitrary origin.
///
/// ```
/// use kvd::Clock;
/// let clock = std::sync::Arc::new(kvd::ManualClock::new());
/// let config = kvd::Config { clock: clock.clone(), ..kvd::Config::default() };
/// clock.advance(std::time::Duration::from_secs(1));
/// assert_eq!(config.clock.now().as_secs(), 1);
/// ```
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Returns the time elapsed since the clock's origin.
    fn now(&self) -> Duration;

    /// Returns the time since the Unix epoch, for times that are stored and must mean the
    /// same after a restart (an operation's record, when an agent became unreachable). It
    /// may jump with the system's clock; nothing that needs monotonic time reads it.
    fn wall(&self) -> Duration;

    /// Registers `wake`, to be called after every jump of this clock while it is alive, so a
    /// thread that sleeps until a deadline on this clock can look again. A clock that only
    /// flows with real time (the system's) has no jumps and ignores it.
    fn on_jump(&self, wake: WeakWake) {
        drop(wake);
    }
}

/// The operating system's monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// Returns a clock whose origin is now.
    ///
    /// ```
    /// use kvd::Clock;
    /// let clock = kvd::SystemClock::new();
    /// assert!(clock.now() < std::time::Duration::from_secs(60));
    /// ```
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall(&self) -> Duration {
        // A clock set before 1970 reads as the epoch.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
    }
}

/// A clock that moves only when told to; for tests. Its wall time is
/// [`MANUAL_CLOCK_EPOCH`] plus its monotonic time.
#[derive(Debug)]
pub struct ManualClock {
    nanos: AtomicU64,
    /// Called after each `advance`; dead ones are dropped then.
    on_jump: Mutex<Vec<WeakWake>>,
}

/// The wall time of a [`ManualClock`] at its origin: 2026-01-01T00:00:00Z.
pub const MANUAL_CLOCK_EPOCH: Duration = Duration::from_secs(1_767_225_600);

impl ManualClock {
    /// Returns a clock at time zero.
    ///
    /// ```
    /// use kvd::Clock;
    /// let clock = kvd::ManualClock::new();
    /// clock.advance(std::time::Duration::from_secs(3));
    /// assert_eq!(clock.now().as_secs(), 3);
    /// ```
    pub fn new() -> ManualClock {
        ManualClock {
            nanos: AtomicU64::new(0),
            on_jump: Mutex::new(Vec::new()),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
        let wakes: Vec<_> = {
            let mut registered = lock(&self.on_jump);
            registered.retain(|wake| wake.strong_count() > 0);
            registered
                .iter()
                .filter_map(|wake| wake.upgrade())
                .collect()
        };
        for wake in wakes {
            wake();
        }
    }
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn wall(&self) -> Duration {
        MANUAL_CLOCK_EPOCH + self.now()
    }

    fn on_jump(&self, wake: WeakWake) {
        lock(&self.on_jump).push(wake);
    }
}
