//! The one import point for locks, atomics and threads, so that loom can model the real
//! code (`--cfg loom` swaps in loom's types).
//!
//! Owns: nothing but re-exports, and the helpers that take a lock or wait on a condition
//! variable recovering from poisoning (`lock`, `read`, `write`, `wait`, `wait_timeout`).
//!
//! Invariants:
//! - SYNC-1: no other module names `std::sync` or `loom` (the tidy test checks it);
//!   `std::sync::Arc` and channels are re-exported here too, so the rule has no exceptions.
//!
//! Contact points: every module that shares state between the apply thread and readers.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
#[cfg(loom)]
pub use loom::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
// loom has no weak pointer; nothing loom models holds one.
#[cfg(loom)]
pub use std::sync::Weak;

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub use std::sync::{
    Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};

/// An immutable shared name (a role): its reference count synchronises nothing a loom model
/// checks, so it is the standard library's `Arc` under loom too (loom's has no `Ord`).
pub type Name = std::sync::Arc<str>;

/// A callback held by reference count, such as a clock's wake-up of a sleeping thread. It is
/// the standard library's `Arc` under loom too, so a weak reference to it can be kept (loom's
/// `Arc` has none); nothing loom models calls one.
pub type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// A weak reference to a [`Wake`]: its holder calls it while somebody else keeps it alive.
pub type WeakWake = std::sync::Weak<dyn Fn() + Send + Sync>;

/// Returns `f` as a [`Wake`].
pub fn wake(f: impl Fn() + Send + Sync + 'static) -> Wake {
    std::sync::Arc::new(f)
}

/// Locks `mutex`, recovering the guard if a panicking thread poisoned it: the data behind
/// our mutexes is kept consistent by the code that holds them, so poisoning carries no
/// information we act on.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits on `condvar` with `guard`, recovering the guard from poisoning as [`lock`] does.
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar
        .wait(guard)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits on `condvar` with `guard` for at most `timeout`, recovering from poisoning as
/// [`lock`] does; returns the guard whether the wait was woken or timed out.
pub fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    condvar
        .wait_timeout(guard, timeout)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .0
}

/// Takes a read lock on `lock`, recovering from poisoning as [`lock`] does.
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes a write lock on `lock`, recovering from poisoning as [`lock`] does.
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
