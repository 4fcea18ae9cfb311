//! Replays the committed corpora of the decoder fuzz targets (`fuzz/corpus/{record,rows,
//! wal_ops,wal_log,bbolt_read}/`) through the same `kvd::fuzzing` functions the targets call, so a
//! plain `cargo test` on stable runs every input the fuzzer kept. Each function panics on a
//! bug (a decoder that panics, a round trip that changes a value, a replay that differs from
//! its oracle; REC-1, REC-2, WAL-2, WAL-5); an empty corpus fails the test, so a missing
//! directory cannot pass for a clean run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fuzz_inputs;

use std::path::Path;

/// Runs `check` on every input of `fuzz/corpus/<target>/`.
fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    fuzz_inputs::replay(&root.join(target), check);
}

#[test]
fn record_corpus_replays() {
    replay("record", kvd::fuzzing::history_record);
}

#[test]
fn rows_corpus_replays() {
    replay("rows", kvd::fuzzing::rows);
}

#[test]
fn wal_ops_corpus_replays() {
    replay("wal_ops", kvd::fuzzing::wal_ops);
}

#[test]
fn bbolt_read_corpus_replays() {
    replay("bbolt_read", kvd::fuzzing::bbolt_file);
}

#[test]
fn wal_log_corpus_replays() {
    replay("wal_log", kvd::fuzzing::wal_log);
}
