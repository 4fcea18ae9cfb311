//! The commit thread: makes applied batches durable in order, then publishes and answers
//! them, while the apply thread goes on with the next batch.
//!
//! Each loop takes the batches the apply thread handed over since the last loop, at most
//! [`COMMIT_BATCHES_PER_SYNC_MAX`] (sleeping while there is none), writes their log records
//! in order and makes them durable with one `fdatasync` (`storage::wal`), then, batch by
//! batch, publishes the batch's revision with its events (the watch switch) and delivers
//! its answers.
//!
//! Invariants:
//! - COMMIT-1: a batch is published and answered only after the `fdatasync` that covers
//!   its record returned, or, for a checkpoint batch, after its own durable commit (which
//!   the apply thread made before handing it over); batches are published in the order
//!   they were applied (ENG-1, APPLY-1).
//! - COMMIT-2: after a failed log write the store is poisoned and no batch is published
//!   again: every batch handed over from then on is answered with the storage error.
//! - COMMIT-3: a barrier is answered only after every batch handed over before it was
//!   published or failed; the apply thread waits on one before a compaction or a defrag
//!   step, so those see a published revision equal to the applied one (APPLY-2).
//!
//! Contact points: `engine::apply` hands over [`Handover`]s through a [`Mailbox`];
//! `LogWriter::write` (`Store::log`) writes the records and `LogWriter::sync` makes them
//! durable.

use crossbeam_channel::Sender;

use super::ReadState;
use super::mailbox::Mailbox;
use super::proposal::Answer;
use crate::error::{Error, StorageError};
use crate::mvcc::write::Change;
use crate::storage::wal::LogRecord;
use crate::sync::{Arc, Ordering};

/// Batches taken per loop, at most: bounds the work between two looks at the mailbox.
pub const COMMIT_BATCHES_PER_SYNC_MAX: usize = 4_096;

/// A step of the commit protocol where a crash test makes the process abort, as a power
/// cut there would stop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitStep {
    /// A logged batch is committed to redb (no I/O), not yet handed over.
    AfterApply,
    /// A checkpoint batch's durable commit returned (its sync possibly still running,
    /// WAL-8), not yet handed over.
    AfterCheckpoint,
    /// Records are written to the log, before their `fdatasync`.
    AfterLogWrite,
    /// The `fdatasync` returned, before publishing and answering.
    AfterLogSync,
    /// The apply thread panics after applying a logged batch, instead of the process
    /// aborting (tests of what a bug in apply leaves: ENG-6).
    ApplyPanic,
}

/// Makes the process abort the `nth` time (from 1) it reaches `step` (crash tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitFailpoint {
    /// Where.
    pub step: CommitStep,
    /// On which passage.
    pub nth: u64,
}

/// Counts passages of the failpoint's step in one thread and aborts at the chosen one.
#[derive(Debug, Default)]
pub struct FailpointCounter {
    passed: u64,
}

impl FailpointCounter {
    /// Aborts the process if `failpoint` is at `step` and this is its passage.
    pub fn reach(&mut self, failpoint: Option<CommitFailpoint>, step: CommitStep) {
        let Some(failpoint) = failpoint.filter(|f| f.step == step) else {
            return;
        };
        self.passed += 1;
        if self.passed == failpoint.nth {
            if step == CommitStep::ApplyPanic {
                // What a bug in apply does: the thread unwinds.
                std::panic::resume_unwind(Box::new("kvd test failpoint: apply panicked"));
            }
            // No destructor, no flush: what a crash at this step leaves on disk.
            std::process::abort();
        }
    }
}

/// What the apply thread hands to the commit thread.
#[derive(Debug)]
pub enum Handover {
    /// An applied batch.
    Batch(AppliedBatch),
    /// Answered once everything before it is published or failed (COMMIT-3).
    Barrier(Sender<()>),
}

/// A batch the apply thread committed to redb, waiting to be durable.
#[derive(Debug)]
pub struct AppliedBatch {
    /// Its log record; `None` if the batch was a checkpoint, durable already.
    pub record: Option<LogRecord>,
    /// The revision to publish: the last one the batch wrote, or the current one.
    pub revision: i64,
    /// The requests applied up to and including this batch.
    pub applied_index: u64,
    /// The batch's changes by revision, for watchers.
    pub events: Vec<(i64, Vec<Change>)>,
    /// The answers, in request order.
    pub answers: Vec<Answer>,
}

/// What the commit thread uses: the state it publishes into, and the crash-test failpoint.
/// The apply thread holds one too, for [`finish_inline`].
#[derive(Debug, Clone)]
pub struct Committer {
    /// The store whose log it syncs, and the revision, index and hub it publishes into.
    pub reads: Arc<ReadState>,
    /// Where the process aborts in a crash test (`Config::commit_failpoint`).
    pub failpoint: Option<CommitFailpoint>,
}

/// Runs the commit thread until the mailbox closes and is drained.
pub fn run(shared: &Committer, mailbox: &Mailbox<Handover>) {
    let mut failed: Option<StorageError> = None;
    let mut counter = FailpointCounter::default();
    loop {
        let taken = mailbox.take(COMMIT_BATCHES_PER_SYNC_MAX, None);
        if failed.is_none() {
            let records: Vec<&LogRecord> = taken
                .items
                .iter()
                .filter_map(|h| match h {
                    Handover::Batch(b) => b.record.as_ref(),
                    Handover::Barrier(_) => None,
                })
                .collect();
            if let Err(e) = make_durable(shared, &records, &mut counter) {
                // COMMIT-2: refuse every later write until reopen.
                shared.reads.store.poison(&e.to_string());
                failed = Some(e);
            }
        }
        for handover in taken.items {
            match handover {
                Handover::Batch(batch) => finish(shared, batch, failed.as_ref()),
                Handover::Barrier(reply) => {
                    let _ = reply.send(());
                }
            }
        }
        if taken.closed {
            return;
        }
    }
}

/// Makes one batch durable, publishes and answers it in the calling thread: what the apply
/// thread does instead of a hand-over when the commit thread is idle (nothing in flight), so
/// a lone writer pays no extra thread wake-up. Same steps and order as [`run`] (COMMIT-1).
pub fn finish_inline(shared: &Committer, batch: AppliedBatch, counter: &mut FailpointCounter) {
    let records: Vec<&LogRecord> = batch.record.iter().collect();
    match make_durable(shared, &records, counter) {
        Ok(()) => finish(shared, batch, None),
        Err(e) => {
            // COMMIT-2: nothing is in flight beside this batch; the poisoned store refuses
            // every later batch.
            shared.reads.store.poison(&e.to_string());
            finish(shared, batch, Some(&e));
        }
    }
}

/// Writes `records` in order and syncs them (WAL-1), passing the failpoints between.
fn make_durable(
    shared: &Committer,
    records: &[&LogRecord],
    counter: &mut FailpointCounter,
) -> Result<(), StorageError> {
    let failpoint = shared.failpoint;
    let log = shared.reads.store.log();
    let durable = log.write(records).and_then(|()| {
        if !records.is_empty() {
            counter.reach(failpoint, CommitStep::AfterLogWrite);
        }
        log.sync(records)
    });
    if !records.is_empty() {
        counter.reach(failpoint, CommitStep::AfterLogSync);
    }
    durable
}

/// Publishes and answers one batch, or fails its answers (COMMIT-1, COMMIT-2).
fn finish(shared: &Committer, batch: AppliedBatch, failed: Option<&StorageError>) {
    if let Some(e) = failed {
        for answer in batch.answers {
            answer.fail(Error::Storage(e.clone()));
        }
        return;
    }
    shared
        .reads
        .applied_index
        .store(batch.applied_index, Ordering::Release);
    let wakes = shared.reads.publish(batch.revision, batch.events);
    for answer in batch.answers {
        answer.deliver();
    }
    // The writers first: a write's answer is not scheduled behind the fan-out it caused.
    for waker in wakes {
        waker.wake();
    }
}
