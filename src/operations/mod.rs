//! Operation records: the outcome of every write that carried an operation id, kept so a
//! retry of it is answered with the recorded response instead of being applied again
//! (exactly-once writes), and so reconciliation can tell which operations finished.
//!
//! Owns the `operations` table (id → sequence, time, revision, request digest, response;
//! `codec`) and its in-memory index. The apply thread is its only user: it looks an id up
//! before applying a write that carries one, records the outcome in the batch that applies
//! the write, and evicts by count and age in the batches it runs.
//!
//! Invariants:
//! - OPER-1: an outcome is recorded in the same storage transaction as the write it
//!   describes, so after any crash either both are there or neither.
//! - OPER-2: a write with an id whose outcome is retained and whose digest matches is not
//!   applied again: it is answered with the recorded response, revision included. With
//!   another digest it is refused ([`crate::Error::OperationIdReused`]) and changes nothing.
//! - OPER-3: only applied writes are recorded; a refused write (admission, gate, quota,
//!   validation at apply) records nothing, so its retry is evaluated afresh.
//! - OPER-4: at most `retention.count` outcomes are retained, and none older than
//!   `retention.age` by the engine's wall clock is ever used; eviction goes oldest first by
//!   sequence number (apply order), inside the apply path, so it is deterministic given the
//!   clock.
//!
//! Contact points: `engine::apply` (lookup, record, evict), `engine::recover` via
//! [`Operations::load`]; defrag copies the table with every other one.

pub mod codec;
pub mod digest;
pub mod reconcile;

use std::collections::BTreeMap;
use std::time::Duration;

pub use codec::{AccountingOutcome, Recordable};
pub use digest::Digest;

use crate::error::{Error, StorageError};
use crate::storage::{RowTable, Snapshot, WriteBatch};

/// Outcomes by operation id.
pub const OPERATIONS_TABLE: RowTable = RowTable::new("operations");

/// The longest operation id, in bytes.
pub const OPERATION_ID_BYTES_MAX: usize = 256;

/// How many outcomes are retained unless configured (`--operation-retention-count`).
pub const OPERATION_RETENTION_COUNT_DEFAULT: u64 = 100_000;

/// How long an outcome is retained unless configured (`--operation-retention`).
pub const OPERATION_RETENTION_DEFAULT: Duration = Duration::from_secs(3_600);

/// Outcomes evicted for age per batch at most, so one batch after a long pause stays short.
const AGE_EVICTIONS_PER_BATCH_MAX: usize = 1_000;

/// How long outcomes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// At most this many outcomes (at least 1).
    pub count: u64,
    /// None older than this.
    pub age: Duration,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            count: OPERATION_RETENTION_COUNT_DEFAULT,
            age: OPERATION_RETENTION_DEFAULT,
        }
    }
}

/// Checks an operation id: a non-empty string of at most [`OPERATION_ID_BYTES_MAX`] bytes.
///
/// ```
/// assert!(kvd::validate_operation_id("client-7/42").is_ok());
/// assert!(kvd::validate_operation_id("").is_err());
/// assert!(kvd::validate_operation_id(&"x".repeat(257)).is_err());
/// ```
pub fn validate_operation_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::InvalidArgument(
            "operation id must not be empty".into(),
        ));
    }
    if id.len() > OPERATION_ID_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "operation id is {} bytes, more than {OPERATION_ID_BYTES_MAX}",
            id.len()
        )));
    }
    Ok(())
}

/// What is known of one retained outcome without reading its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Apply order among recorded outcomes.
    pub seq: u64,
    /// Wall-clock time of the apply, nanoseconds since the Unix epoch.
    pub at_nanos: u64,
    /// The revision the response names.
    pub revision: i64,
    /// The request's digest.
    pub digest: Digest,
}

/// What an id's lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No retained outcome: apply the write.
    Fresh,
    /// The same request was applied: answer with its recorded response.
    Retry,
    /// Another request was applied under this id: refuse.
    Reused,
}

/// The retained outcomes, indexed by id and by age.
#[derive(Debug, Default)]
pub struct Operations {
    by_id: BTreeMap<String, Entry>,
    by_seq: BTreeMap<u64, String>,
    next_seq: u64,
}

fn nanos(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

impl Operations {
    /// Loads the retained outcomes from `snapshot`; every row is decoded whole (STORE-4).
    pub fn load(snapshot: &Snapshot) -> Result<Operations, StorageError> {
        let mut operations = Operations::default();
        for (key, value) in snapshot.rows(OPERATIONS_TABLE)? {
            let id = String::from_utf8(key)
                .map_err(|_| StorageError::Corrupted("operations row: id is not UTF-8".into()))?;
            let head = codec::check_row(&value)?;
            operations.insert(id, head.seq, head.at_nanos, head.revision, head.digest);
        }
        Ok(operations)
    }

    fn insert(&mut self, id: String, seq: u64, at_nanos: u64, revision: i64, digest: Digest) {
        self.next_seq = self.next_seq.max(seq + 1);
        self.by_seq.insert(seq, id.clone());
        let entry = Entry {
            seq,
            at_nanos,
            revision,
            digest,
        };
        if let Some(old) = self.by_id.insert(id, entry) {
            self.by_seq.remove(&old.seq);
        }
    }

    /// Returns the retained outcome of `id`, unless it is older than `age` at `now` (wall).
    pub fn get(&self, id: &str, now: Duration, age: Duration) -> Option<&Entry> {
        self.by_id
            .get(id)
            .filter(|e| !expired(e.at_nanos, now, age))
    }

    /// Returns what a write with `id` and `digest` must do (OPER-2).
    pub fn lookup(&self, id: &str, digest: &Digest, now: Duration, age: Duration) -> Lookup {
        match self.get(id, now, age) {
            None => Lookup::Fresh,
            Some(e) if e.digest == *digest => Lookup::Retry,
            Some(_) => Lookup::Reused,
        }
    }

    /// Returns the retained ids starting with `prefix`, in id order, with their outcomes.
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
        now: Duration,
        age: Duration,
    ) -> impl Iterator<Item = (&'a String, &'a Entry)> + 'a {
        self.by_id
            .range(prefix.to_owned()..)
            .take_while(move |(id, _)| id.starts_with(prefix))
            .filter(move |(_, e)| !expired(e.at_nanos, now, age))
    }

    /// Records the outcome of `id` in `batch` (OPER-1), at wall time `now`, and evicts the
    /// oldest outcomes beyond `retention.count` in the same batch (OPER-4).
    pub fn record_in<R: Recordable>(
        &mut self,
        batch: &mut WriteBatch<'_>,
        id: &str,
        digest: Digest,
        now: Duration,
        response: &R,
        retention: Retention,
    ) -> Result<(), StorageError> {
        let head = codec::RowHead {
            seq: self.next_seq,
            at_nanos: nanos(now),
            revision: response.revision(),
            digest,
            kind: R::KIND,
        };
        batch.put_row(
            OPERATIONS_TABLE,
            id.as_bytes(),
            &codec::encode_row(&head, response),
        )?;
        self.insert(
            id.to_owned(),
            head.seq,
            head.at_nanos,
            head.revision,
            digest,
        );
        let keep = usize::try_from(retention.count.max(1)).unwrap_or(usize::MAX);
        while self.by_id.len() > keep {
            self.evict_oldest(batch)?;
        }
        Ok(())
    }

    /// Evicts, in `batch`, outcomes older than `age` at wall time `now`, oldest first, at
    /// most [`AGE_EVICTIONS_PER_BATCH_MAX`] (the rest go in later batches; `get` ignores
    /// them meanwhile). Returns how many went.
    pub fn evict_aged_in(
        &mut self,
        batch: &mut WriteBatch<'_>,
        now: Duration,
        age: Duration,
    ) -> Result<usize, StorageError> {
        let mut evicted = 0;
        while evicted < AGE_EVICTIONS_PER_BATCH_MAX {
            let Some(oldest) = self.by_seq.values().next() else {
                break;
            };
            let Some(entry) = self.by_id.get(oldest) else {
                break;
            };
            if !expired(entry.at_nanos, now, age) {
                break;
            }
            self.evict_oldest(batch)?;
            evicted += 1;
        }
        Ok(evicted)
    }

    /// Returns true if the oldest outcome is older than `age` at `now`: a batch has work.
    pub fn has_aged(&self, now: Duration, age: Duration) -> bool {
        self.by_seq
            .values()
            .next()
            .and_then(|id| self.by_id.get(id))
            .is_some_and(|e| expired(e.at_nanos, now, age))
    }

    fn evict_oldest(&mut self, batch: &mut WriteBatch<'_>) -> Result<(), StorageError> {
        if let Some((_, id)) = self.by_seq.pop_first() {
            batch.delete_row(OPERATIONS_TABLE, id.as_bytes())?;
            self.by_id.remove(&id);
        }
        Ok(())
    }

    /// Reads the recorded response of `id` as this batch sees it.
    pub fn response_in<R: Recordable>(batch: &WriteBatch<'_>, id: &str) -> Result<R, StorageError> {
        let row = batch
            .get_row(OPERATIONS_TABLE, id.as_bytes())?
            .ok_or_else(|| {
                StorageError::Corrupted(format!("operations row of '{id}' is missing"))
            })?;
        codec::decode_response(&row)
    }
}

/// True if an outcome applied at `at_nanos` is older than `age` at wall time `now`.
fn expired(at_nanos: u64, now: Duration, age: Duration) -> bool {
    nanos(now).saturating_sub(at_nanos) > nanos(age)
}
