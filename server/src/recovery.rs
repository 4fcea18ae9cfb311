//! Recovery from a poisoned store without a restart, the filesystem reserve, and the log
//! line that explains a NOSPACE.
//!
//! Why: after an I/O error (a full disk, typically) the engine refuses every write until its
//! data directory is reopened (STORE-2), since redb's state after a failed write is unknown;
//! redb repairs on open and the write-ahead log brings back every acknowledged write. The
//! server does that reopen itself: it holds the engine in a slot it can empty and refill.
//!
//! Owns: the engine slot, the storage state the surfaces report, the recovery task.
//!
//! Invariants:
//! - RECOVERY-1: once an engine call reports a poisoned store, every write is refused with
//!   `Unavailable` and a message naming the cause and what kvd waits for; `/health` answers
//!   503 with `"reason":"STORAGE POISONED: ..."` and `/metrics` has `kvd_storage_poisoned 1`.
//! - RECOVERY-2: the recovery task reopens the engine when the filesystem has its reserve free
//!   again, or at once when an operator disarms an alarm (`alarm disarm`). A reopen takes
//!   the engine out of the slot (calls meanwhile get `Unavailable ... reopening`), waits for
//!   the calls still holding it (at most [`REOPEN_DRAIN_MAX`]), closes it and opens the data
//!   directory again with the same configuration. A failed open is retried on the next
//!   look; the old engine is never put back.
//! - RECOVERY-3: a reopen ends the Watch streams of the old engine (`Unavailable`, clients watch
//!   again from their last revision); a Snapshot stream holds the old database open, so the
//!   open is retried until it ends (at most the snapshot stall timeout for a stalled one).
//! - RECOVERY-4: the filesystem reserve is the smaller of the engine's default (an eighth of the
//!   quota, at least 64 MiB) and [`FS_RESERVE_PERCENT`] of the filesystem, so a small
//!   filesystem is usable; the figure is logged at start.
//! - RECOVERY-5: the first NOSPACE of an episode (until the alarm is gone) is logged once, with
//!   the figures that explain it: the quota, the bytes in use, the free space and the
//!   reserve. An alarm kvd finds at its start is logged as kept from before, with the same
//!   figures and no guessed cause.
//!
//! Contact points: `server::node` routes every engine call through [`EngineSlot`] and
//! reports poisoned errors; `server::http` (`/health`, `/metrics`), `server::maintenance`
//! (disarm), `server::watch` (generations) read the state.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvd::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, RwLock, lock, read, write};
use kvd::{AlarmType, Config, Engine};

/// How often the recovery task looks at the storage state and the free space.
pub const RECOVERY_POLL: Duration = Duration::from_secs(1);
/// Longest wait for engine calls still holding a poisoned engine before it is dropped.
pub const REOPEN_DRAIN_MAX: Duration = Duration::from_secs(10);
/// The filesystem share the reserve is capped at (RECOVERY-4).
pub const FS_RESERVE_PERCENT: u64 = 5;
/// How long a disarm waits for the reopen it asked for.
pub const DISARM_REOPEN_WAIT: Duration = Duration::from_secs(30);

/// The engine in service, which the recovery task may replace (RECOVERY-2).
#[derive(Debug)]
pub struct EngineSlot {
    engine: RwLock<Option<Arc<Engine>>>,
    /// Counts reopens; a Watch stream belongs to the generation it started in (RECOVERY-3).
    generation: AtomicU64,
    state: Mutex<StorageState>,
    /// Wakes the recovery task (a poisoned error seen, a disarm asked for).
    wake: tokio::sync::Notify,
    /// Signalled after every reopen attempt.
    reopened: tokio::sync::Notify,
    disarm_requested: AtomicBool,
}

/// What the surfaces say about the storage (RECOVERY-1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageState {
    /// The cause the engine gave, while the store is poisoned.
    pub poisoned: Option<String>,
    /// The last failed reopen, if any.
    pub reopen_failed: Option<String>,
    /// What kvd waits for, in words.
    pub waiting_for: String,
}

impl EngineSlot {
    /// Returns a slot serving `engine`.
    pub fn new(engine: Arc<Engine>) -> EngineSlot {
        EngineSlot {
            engine: RwLock::new(Some(engine)),
            generation: AtomicU64::new(0),
            state: Mutex::new(StorageState::default()),
            wake: tokio::sync::Notify::new(),
            reopened: tokio::sync::Notify::new(),
            disarm_requested: AtomicBool::new(false),
        }
    }

    /// Returns the engine in service, or `None` while a reopen is under way.
    pub fn engine(&self) -> Option<Arc<Engine>> {
        read(&self.engine).clone()
    }

    /// Returns the generation of the engine in service (RECOVERY-3).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Returns what the surfaces report.
    pub fn state(&self) -> StorageState {
        lock(&self.state).clone()
    }

    /// Returns the message a refused call carries while the store is poisoned or
    /// reopening (RECOVERY-1), or `None` when the storage is fine.
    pub fn refusal(&self) -> Option<String> {
        let state = self.state();
        let cause = state.poisoned?;
        let mut message = format!(
            "kvd: storage poisoned after an I/O error ({cause}); writes are refused until kvd \
             reopens the database, which it does {}",
            state.waiting_for
        );
        if let Some(failed) = state.reopen_failed {
            message.push_str(&format!(" (the last reopen failed: {failed})"));
        }
        Some(message)
    }

    /// Records that the engine reported a poisoned store (RECOVERY-1) and wakes the recovery task.
    /// An I/O error of a write counts too: the write that failed poisoned the store
    /// (STORE-1), and the next call would say so.
    pub fn note_poisoned(&self, err: &kvd::Error, write: bool) {
        let cause = match err {
            kvd::Error::Storage(kvd::StorageError::Poisoned(cause)) => cause.clone(),
            kvd::Error::Storage(kvd::StorageError::Io(_)) if write => err.to_string(),
            _ => return,
        };
        let first = {
            let mut state = lock(&self.state);
            let first = state.poisoned.is_none();
            if first {
                state.poisoned = Some(cause.clone());
                state.waiting_for =
                    "once the filesystem has its reserve free again, or on `alarm disarm`"
                        .to_owned();
            }
            first
        };
        if first {
            tracing::error!(
                cause,
                "storage poisoned: writes refused until the database is reopened"
            );
        }
        self.wake.notify_one();
    }

    /// Asks the recovery task to reopen now (an operator's disarm, RECOVERY-2) and waits for the
    /// attempt, at most [`DISARM_REOPEN_WAIT`]. Returns true if the store is fine afterwards.
    pub async fn reopen_for_disarm(&self) -> bool {
        if self.state().poisoned.is_none() {
            return true;
        }
        let attempt = self.reopened.notified();
        self.disarm_requested.store(true, Ordering::Release);
        self.wake.notify_one();
        let _ = tokio::time::timeout(DISARM_REOPEN_WAIT, attempt).await;
        self.state().poisoned.is_none()
    }

    /// Takes the engine out of service, for a reopen (RECOVERY-2) or at shutdown.
    pub fn take(&self) -> Option<Arc<Engine>> {
        write(&self.engine).take()
    }

    /// Puts a freshly opened engine in service and clears the poisoned state.
    fn install(&self, engine: Arc<Engine>) {
        *write(&self.engine) = Some(engine);
        self.generation.fetch_add(1, Ordering::AcqRel);
        *lock(&self.state) = StorageState::default();
    }

    fn reopen_failed(&self, error: String) {
        lock(&self.state).reopen_failed = Some(error);
    }
}

/// What the recovery task needs to reopen the engine and to explain a NOSPACE.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The data directory.
    pub data_dir: PathBuf,
    /// The engine configuration to reopen with.
    pub engine_config: Config,
    /// The filesystem reserve in force (RECOVERY-4).
    pub reserve_bytes: u64,
}

/// Returns the reserve for a filesystem of `fs_total_bytes` and an engine default (RECOVERY-4).
pub fn scaled_reserve_bytes(engine_default: u64, fs_total_bytes: Option<u64>) -> u64 {
    match fs_total_bytes {
        Some(total) => engine_default.min(total / 100 * FS_RESERVE_PERCENT),
        None => engine_default,
    }
}

/// Returns the size of the filesystem holding `dir`.
pub fn fs_total_bytes(dir: &Path) -> Option<u64> {
    // The directory may not exist before the engine's first open; its parent's
    // filesystem is the one it will be created on.
    let existing = dir.ancestors().find(|d| d.exists())?;
    let stat = rustix::fs::statvfs(existing).ok()?;
    stat.f_blocks.checked_mul(stat.f_frsize)
}

/// Returns the free bytes of the filesystem holding `dir` (what the engine's guard reads).
fn fs_free_bytes(dir: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(dir).ok()?;
    stat.f_bavail.checked_mul(stat.f_frsize)
}

/// Watches the storage until `stopping` resolves: reopens a poisoned engine when its cause
/// is gone (RECOVERY-2) and logs the first NOSPACE of each episode (RECOVERY-5).
pub async fn run(slot: Arc<EngineSlot>, recovery: Recovery, stopping: impl std::future::Future) {
    tokio::pin!(stopping);
    // Before the first client request: an alarm found now was raised before the start.
    let mut nospace_logged = log_nospace(&slot, &recovery, false, true).await;
    let mut waiting_logged = false;
    loop {
        tokio::select! {
            _ = &mut stopping => return,
            () = slot.wake.notified() => {}
            () = tokio::time::sleep(RECOVERY_POLL) => {}
        }
        nospace_logged = log_nospace(&slot, &recovery, nospace_logged, false).await;
        if slot.state().poisoned.is_none() {
            waiting_logged = false;
            continue;
        }
        let free = fs_free_bytes(&recovery.data_dir);
        let disarm = slot.disarm_requested.swap(false, Ordering::AcqRel);
        let space_back = free.is_some_and(|f| f >= recovery.reserve_bytes);
        if !(space_back || disarm) {
            if !waiting_logged {
                tracing::warn!(
                    free_bytes = ?free,
                    reserve_bytes = recovery.reserve_bytes,
                    "storage poisoned: waiting for the reserve to be free (or `alarm disarm`) to reopen"
                );
                waiting_logged = true;
            }
            continue;
        }
        reopen(
            &slot,
            &recovery,
            if disarm {
                "alarm disarm"
            } else {
                "free space back"
            },
        )
        .await;
        slot.reopened.notify_waiters();
    }
}

/// Replaces the engine in the slot by a fresh open of the data directory (RECOVERY-2).
async fn reopen(slot: &EngineSlot, recovery: &Recovery, why: &'static str) {
    tracing::info!(
        why,
        "reopening the database to recover from the poisoned store"
    );
    if let Some(old) = slot.take() {
        let deadline = tokio::time::Instant::now() + REOPEN_DRAIN_MAX;
        while Arc::strong_count(&old) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let closed = tokio::task::spawn_blocking(move || match Arc::try_unwrap(old) {
            Ok(engine) => engine.close().map_err(|e| e.to_string()),
            // Dropped with the last call that holds it; its threads stop then.
            Err(_shared) => Err("an engine call still held the engine".to_owned()),
        })
        .await;
        match closed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "closing the poisoned engine failed"),
            Err(e) => tracing::warn!(error = %e, "closing the poisoned engine failed"),
        }
    }
    let dir = recovery.data_dir.clone();
    let config = recovery.engine_config.clone();
    let opened = tokio::task::spawn_blocking(move || Engine::open(&dir, config)).await;
    match opened {
        Ok(Ok(engine)) => {
            slot.install(Arc::new(engine));
            tracing::info!(why, "database reopened: writes are served again");
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reopening the database failed; retrying");
            slot.reopen_failed(e.to_string());
        }
        Err(e) => {
            tracing::warn!(error = %e, "reopening the database failed; retrying");
            slot.reopen_failed(e.to_string());
        }
    }
}

/// Logs the first NOSPACE of an episode with its figures (RECOVERY-5); returns whether one is
/// logged for the current episode. At the `first` check after the start an alarm found was
/// raised before it, by a cause kvd no longer knows, and is logged as kept.
async fn log_nospace(slot: &EngineSlot, recovery: &Recovery, logged: bool, first: bool) -> bool {
    let Some(engine) = slot.engine() else {
        return logged;
    };
    let status = tokio::task::spawn_blocking(move || engine.status()).await;
    let Ok(Ok(status)) = status else {
        return logged;
    };
    let nospace = status.alarms.iter().any(|a| a.alarm == AlarmType::NoSpace);
    if !nospace {
        return false;
    }
    if logged {
        return true;
    }
    let free = fs_free_bytes(&recovery.data_dir);
    if first {
        tracing::warn!(
            quota_bytes = status.db_size_quota,
            db_size_in_use_bytes = status.db_size_in_use,
            db_size_bytes = status.db_size,
            fs_free_bytes = ?free,
            fs_reserve_bytes = recovery.reserve_bytes,
            "NOSPACE alarm kept from before the start: writes that need space are refused \
             until `alarm disarm`"
        );
        return true;
    }
    let below_reserve = free.is_some_and(|f| f < recovery.reserve_bytes);
    let reason = if below_reserve {
        "the filesystem has less than the reserve free"
    } else {
        "the database reached its space quota"
    };
    tracing::warn!(
        reason,
        quota_bytes = status.db_size_quota,
        db_size_in_use_bytes = status.db_size_in_use,
        db_size_bytes = status.db_size,
        fs_free_bytes = ?free,
        fs_reserve_bytes = recovery.reserve_bytes,
        "NOSPACE alarm raised: writes that need space are refused until `alarm disarm`"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_scales_with_the_filesystem() {
        let default = 64 << 20;
        assert_eq!(scaled_reserve_bytes(default, None), default);
        // 64 MiB filesystem: 5%.
        assert_eq!(
            scaled_reserve_bytes(default, Some(64 << 20)),
            (64 << 20) / 100 * 5
        );
        // A large filesystem keeps the engine's figure.
        assert_eq!(scaled_reserve_bytes(default, Some(1 << 40)), default);
    }
}
