//! Online defrag, engine side: pauses physical compaction, copies from snapshots while
//! writes go on, then has the apply thread swap the files between two batches.
//!
//! Invariants:
//! - EDEFRAG-1: at most one defrag runs; while it runs the apply thread runs no compaction
//!   step (DEFRAG-1), and the step in progress when it began has committed before the first
//!   snapshot (the snapshot is taken by the apply thread).
//! - EDEFRAG-2: writes pause only for the swap: the remainder copied there is bounded by the
//!   catch-up rounds before it, not by the database size.
//! - EDEFRAG-3: a failed defrag leaves the old file in service and deletes the copy; a
//!   failpoint (tests) stops as a crash would, leaving the files as they are and refusing
//!   writes until reopen.
//!
//! Contact points: `Engine::defrag`, `engine::apply` (the begin snapshot and the swap).

use crossbeam_channel::Sender;

use super::Shared;
use crate::api::{DefragProgress, DefragResponse, ResponseHeader};
use crate::error::{Error, Result, StorageError};
use crate::storage::Snapshot;
use crate::storage::defrag::{Progress, Target};
use crate::sync::Ordering;

/// Catch-up rounds before the swap, at most.
pub const DEFRAG_CATCH_UP_ROUNDS_MAX: usize = 8;
/// A catch-up round that copied fewer history records than this ends the catch-up.
pub const DEFRAG_CATCH_UP_SMALL_RECORDS: usize = 1_000;

/// Where a test makes a defrag stop as if the process died there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefragFailpoint {
    /// After the bulk copy.
    AfterCopy,
    /// After the catch-up rounds, before the swap.
    AfterCatchUp,
    /// After the rename, before the new file is in service.
    AfterRename,
}

/// Messages from a defrag to the apply thread.
pub enum DefragStep {
    /// Take the first snapshot (compaction is paused from now on).
    Begin(Sender<Result<Snapshot>>),
    /// Finish the copy and swap the files.
    Swap(Box<Target>, Sender<Result<u64>>),
}

impl std::fmt::Debug for DefragStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DefragStep::Begin(_) => "DefragStep::Begin",
            DefragStep::Swap(..) => "DefragStep::Swap",
        })
    }
}

/// The state of defrag shared between the caller and the apply thread.
#[derive(Debug, Default)]
pub struct DefragState {
    /// True while a defrag runs (EDEFRAG-1).
    pub running: crate::sync::AtomicBool,
    /// Bytes copied and to copy.
    pub progress: Progress,
}

impl DefragState {
    /// Returns the progress figures.
    pub fn progress(&self) -> DefragProgress {
        DefragProgress {
            running: self.running.load(Ordering::Acquire),
            copied_bytes: self.progress.copied.load(Ordering::Relaxed),
            total_bytes: self.progress.total.load(Ordering::Relaxed),
        }
    }
}

/// Runs a defrag (EDEFRAG-1..3); `step` hands a message to the apply thread and waits.
pub fn run(shared: &Shared, step: impl Fn(DefragStep) -> Result<()>) -> Result<DefragResponse> {
    if shared.defrag.running.swap(true, Ordering::AcqRel) {
        return Err(Error::InvalidArgument("a defrag is already running".into()));
    }
    shared.reads.store.set_defragging(true);
    let result = copy_and_swap(shared, &step);
    // The first batch after the swap is a checkpoint if the log ran past its usual length;
    // the swap's durable commit left little for it to write.
    shared.reads.store.set_defragging(false);
    shared.defrag.running.store(false, Ordering::Release);
    result
}

fn copy_and_swap(
    shared: &Shared,
    step: &impl Fn(DefragStep) -> Result<()>,
) -> Result<DefragResponse> {
    let store = &shared.reads.store;
    let progress = &shared.defrag.progress;
    let db_size_before = store.file_size()?;
    progress.copied.store(0, Ordering::Relaxed);
    progress
        .total
        .store(shared.space.last_measured(), Ordering::Relaxed);
    let (reply, answer) = crossbeam_channel::bounded(1);
    step(DefragStep::Begin(reply))?;
    let first = answer.recv().map_err(|_| Error::Closed)??;
    let mut target = match store.begin_defrag(first, progress) {
        Ok(target) => target,
        Err(e) => return Err(abandon(shared, None, e)),
    };
    failpoint(shared, DefragFailpoint::AfterCopy)?;
    for _ in 0..DEFRAG_CATCH_UP_ROUNDS_MAX {
        let copied = store
            .snapshot()
            .and_then(|s| store.catch_up_defrag(&mut target, &s, progress));
        match copied {
            Ok(n) if n < DEFRAG_CATCH_UP_SMALL_RECORDS => break,
            Ok(_) => {}
            Err(e) => return Err(abandon(shared, Some(target), e)),
        }
    }
    // Close and reopen the copy: redb trims the file it grew by doubling only at close, and
    // doing it here keeps it out of the write pause.
    if let Err(e) = target.reopen() {
        return Err(abandon(shared, None, e));
    }
    failpoint(shared, DefragFailpoint::AfterCatchUp)?;
    let (reply, answer) = crossbeam_channel::bounded(1);
    step(DefragStep::Swap(Box::new(target), reply))?;
    let pause_micros = answer.recv().map_err(|_| Error::Closed)??;
    Ok(DefragResponse {
        header: ResponseHeader {
            revision: shared.reads.published.load(),
        },
        db_size_before,
        db_size_after: store.file_size()?,
        pause_micros,
    })
}

/// The apply thread's part of the swap: no write is in flight while it runs (EDEFRAG-2).
/// Returns how long writes were paused, in microseconds.
pub fn swap(shared: &Shared, target: Target) -> Result<u64> {
    // Wall-clock time for the report only; nothing applied depends on it.
    let started = std::time::Instant::now();
    let store = &shared.reads.store;
    let snapshot = store.snapshot()?;
    if shared.config.defrag_failpoint == Some(DefragFailpoint::AfterRename) {
        drop(snapshot);
        store.poison("defrag failpoint after rename");
        store.rename_only_for_failpoint(target)?;
        return Err(Error::Storage(StorageError::Io(
            "kvd: defrag failpoint after rename".into(),
        )));
    }
    match store.swap_defragged(target, &snapshot, &shared.defrag.progress) {
        Ok(()) => {}
        Err(e) => {
            drop(snapshot);
            return Err(abandon(shared, None, e));
        }
    }
    // EDEFRAG-2: the snapshot holds the last reference to the old database, whose drop
    // frees its cache and closes its retired file (FILE-2, FILE-3): that goes to a thread
    // of its own, out of the write pause.
    snapshot.drop_in_background();
    // EDEFRAG-2: no walk of the new file here (it reads every page); its length bounds
    // what it uses until the next idle measurement (SPACE-3).
    if let Ok(length) = store.file_size() {
        shared.space.measured(length);
    }
    Ok(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX))
}

fn failpoint(shared: &Shared, here: DefragFailpoint) -> Result<()> {
    if shared.config.defrag_failpoint == Some(here) {
        shared.reads.store.poison("defrag failpoint");
        return Err(Error::Storage(StorageError::Io(format!(
            "kvd: defrag failpoint {here:?}"
        ))));
    }
    Ok(())
}

/// Deletes the copy and returns the error that stopped the defrag (EDEFRAG-3).
fn abandon(shared: &Shared, target: Option<Target>, cause: StorageError) -> Error {
    // Failing to delete the copy is not worse than the failure itself: the next open
    // deletes it (DEFRAG-2).
    let _ = shared.reads.store.abandon_defrag(target);
    Error::Storage(cause)
}
