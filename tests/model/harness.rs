//! Runs a sequence against a fresh engine and the model, comparing everything observable.
//!
//! After every op: the full reply (response structs or errors) and the engine's Status
//! (current and compaction revisions). HashKV: every field but `hash` against the model, and
//! the hash itself must be a function of (compaction revision, hash revision), so it may not
//! change across reopens, background compaction or later writes. On Reopen: hash_kv(0)
//! before and after. At the end: a Range of every key at every readable revision (and just
//! outside the readable window). Any mismatch panics with the sequence label and op index.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::Path;

use bytes::Bytes;
use kvd::{Config, Engine, Error, HashKvResponse, RangeRequest};

use super::ops::{Op, Reply, Seq};
use super::state::{Limits, Model};

/// What a run observed that depends on the engine alone, for comparing two engines fed the
/// same sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Every HashKV the harness asked for: (op index, engine reply).
    pub hashes: Vec<(usize, Result<HashKvResponse, Error>)>,
}

/// History records per compaction step: small, so that compactions take many steps and
/// overlap with the ops that follow them.
const COMPACTION_BATCH_RECORDS: usize = 16;

/// Returns the engine configuration for `limits`: no fsync and a small cache, to stay fast.
pub fn config(limits: Limits) -> Config {
    Config {
        unsafe_no_fsync: true,
        cache_size_bytes: 4 << 20,
        max_txn_ops: limits.max_txn_ops,
        max_request_bytes: limits.max_request_bytes,
        compaction_batch_records: COMPACTION_BATCH_RECORDS,
        ..Config::default()
    }
}

/// Runs `seq` against a fresh engine in `dir` (which must be empty) and the model; panics
/// on the first difference, naming the sequence and the op index.
pub fn run(seq: &Seq, dir: &Path) -> Trace {
    let mut h = Harness::new(seq, dir);
    for (i, op) in seq.ops.iter().enumerate() {
        h.step(i, op);
    }
    h.sweep(seq.ops.len(), "final sweep", true);
    h.close(seq.ops.len());
    h.trace
}

struct Harness<'a> {
    seq: &'a Seq,
    dir: &'a Path,
    engine: Option<Engine>,
    model: Model,
    /// (compaction revision, hash revision) → the hash first seen for it.
    hashes: BTreeMap<(i64, i64), u32>,
    trace: Trace,
}

/// The longest Debug text a failure message prints per value (values can be 1.5 MiB).
const DEBUG_CHARS_MAX: usize = 6000;

fn shown(value: &dyn Debug) -> String {
    let text = format!("{value:?}");
    match text.char_indices().nth(DEBUG_CHARS_MAX) {
        Some((cut, _)) => format!("{}… ({} more bytes)", &text[..cut], text.len() - cut),
        None => text,
    }
}

impl<'a> Harness<'a> {
    fn new(seq: &'a Seq, dir: &'a Path) -> Harness<'a> {
        let engine = match Engine::open(dir, config(seq.limits)) {
            Ok(engine) => engine,
            Err(e) => panic!("{}: Engine::open failed: {e:?}", seq.label),
        };
        Harness {
            seq,
            dir,
            engine: Some(engine),
            model: Model::new(seq.limits),
            hashes: BTreeMap::new(),
            trace: Trace { hashes: Vec::new() },
        }
    }

    fn fail(&self, i: usize, what: &str, engine: &dyn Debug, model: &dyn Debug) -> ! {
        let op = self
            .seq
            .ops
            .get(i)
            .map_or_else(|| "(after the last op)".to_owned(), |op| shown(op));
        panic!(
            "kvd model mismatch: {label}, op #{i} of {n}: {what}\n  op:     {op}\n  engine: {e}\n  \
             model:  {m}\n  (model state: revision {rev}, compact revision {compact})",
            label = self.seq.label,
            n = self.seq.ops.len(),
            e = shown(engine),
            m = shown(model),
            rev = self.model.current_revision(),
            compact = self.model.compact_revision(),
        )
    }

    /// Calls the engine; if it panics, says where before passing the panic on.
    fn call<T>(&self, i: usize, f: impl FnOnce(&Engine) -> T) -> T {
        let Some(engine) = &self.engine else {
            panic!("{}: op #{i}: the engine is not open", self.seq.label)
        };
        match catch_unwind(AssertUnwindSafe(|| f(engine))) {
            Ok(value) => value,
            Err(payload) => {
                eprintln!(
                    "kvd engine panicked: {}, op #{i} of {}",
                    self.seq.label,
                    self.seq.ops.len()
                );
                resume_unwind(payload)
            }
        }
    }

    fn step(&mut self, i: usize, op: &Op) {
        // Sequences never hold undefined txns; hand-written ones are skipped, not sent.
        if !self.model.op_defined(op) {
            return;
        }
        match op {
            Op::Reopen => self.reopen(i),
            Op::HashKv(rev) => {
                self.hash_kv(i, *rev);
            }
            _ => {
                let engine = self.call(i, |e| apply(e, op));
                let model = self.model.apply(op);
                if engine != model {
                    self.fail(i, "replies differ", &engine, &model);
                }
            }
        }
        self.check_status(i);
    }

    fn check_status(&self, i: usize) {
        let status = self.call(i, Engine::status);
        let want = (self.model.current_revision(), self.model.compact_revision());
        match status {
            Ok(s) if (s.header.revision, s.compact_revision) == want => {}
            other => self.fail(
                i,
                "status (revision, compact_revision) after the op",
                &other,
                &want,
            ),
        }
    }

    fn hash_kv(&mut self, i: usize, rev: i64) -> Option<u32> {
        let engine = self.call(i, |e| e.hash_kv(rev));
        self.trace.hashes.push((i, engine.clone()));
        let model = self.model.hash_kv(rev);
        let masked = engine.clone().map(|r| HashKvResponse { hash: 0, ..r });
        if masked != model {
            self.fail(i, &format!("hash_kv({rev}) (hash masked)"), &engine, &model);
        }
        let resp = engine.ok()?;
        let key = (resp.compact_revision, resp.hash_revision);
        match self.hashes.get(&key) {
            Some(&seen) if seen != resp.hash => self.fail(
                i,
                &format!(
                    "hash_kv at hash revision {} (compact revision {}) changed since it was \
                     first taken",
                    key.1, key.0
                ),
                &resp,
                &format!("hash {seen}"),
            ),
            Some(_) => {}
            None => {
                self.hashes.insert(key, resp.hash);
            }
        }
        Some(resp.hash)
    }

    fn reopen(&mut self, i: usize) {
        let before = self.hash_kv(i, 0);
        if let Some(engine) = self.engine.take()
            && let Err(e) = engine.close()
        {
            self.fail(i, "Engine::close", &Err::<(), _>(e), &Ok::<(), Error>(()));
        }
        match Engine::open(self.dir, config(self.seq.limits)) {
            Ok(engine) => self.engine = Some(engine),
            Err(e) => self.fail(
                i,
                "Engine::open on reopen",
                &Err::<(), _>(e),
                &Ok::<(), Error>(()),
            ),
        }
        let after = self.hash_kv(i, 0);
        if before != after {
            self.fail(i, "hash_kv(0) differs across close/reopen", &after, &before);
        }
        self.sweep(i, "sweep after reopen", false);
    }

    /// Reads every key at every revision from just below the compaction revision to just
    /// above the current one (`full`), or at about 20 revisions spread over that window.
    fn sweep(&self, i: usize, what: &str, full: bool) {
        let first = (self.model.compact_revision() - 1).max(1);
        let last = self.model.current_revision() + 1;
        let stride = if full {
            1
        } else {
            ((last - first) / 20).max(1)
        };
        let revs = (first..=last)
            .step_by(stride as usize)
            .chain([last - 1, last]);
        for rev in revs {
            let req = RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                revision: rev,
                ..RangeRequest::default()
            };
            let engine = self.call(i, |e| e.range(&req));
            let model = self.model.range(&req);
            if engine != model {
                self.fail(
                    i,
                    &format!("{what}: every key at revision {rev}"),
                    &engine,
                    &model,
                );
            }
        }
    }

    fn close(&mut self, i: usize) {
        if let Some(engine) = self.engine.take()
            && let Err(e) = engine.close()
        {
            self.fail(
                i,
                "Engine::close at the end",
                &Err::<(), _>(e),
                &Ok::<(), Error>(()),
            );
        }
    }
}

/// Sends `op` to the engine.
fn apply(engine: &Engine, op: &Op) -> Reply {
    match op {
        Op::Put(r) => Reply::Put(engine.put(r.clone())),
        Op::DeleteRange(r) => Reply::DeleteRange(engine.delete_range(r.clone())),
        Op::Txn(r) => Reply::Txn(engine.txn(r.clone())),
        Op::Range(r) => Reply::Range(engine.range(r)),
        Op::Compact(r) => Reply::Compact(engine.compact(*r)),
        Op::Reopen => Reply::Reopen,
        Op::HashKv(rev) => Reply::HashKv(engine.hash_kv(*rev)),
    }
}
