//! Replays the committed corpora of the decoder fuzz targets (`fuzz/corpus/{record,rows,
//! wal_ops,wal_log,bbolt_read}/`) through the same `kvd::fuzzing` functions the targets call, so a
//! plain `cargo test` on stable runs every input the fuzzer kept. Each function panics on a
//! bug (a decoder that panics, a round trip that changes a value, a replay that differs from
//! its oracle; REC-1, REC-2, WAL-2, WAL-5); an empty corpus fails the test, so a missing
//! directory cannot pass for a clean run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

/// Returns the files of `fuzz/corpus/<target>/` in name order, skipping hidden ones
/// (libFuzzer's temporaries); panics if there are none.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .filter(|path| !path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    files
}

/// Runs `check` on every input of `target`'s corpus, naming the input if it panics.
fn replay(target: &str, check: fn(&[u8])) {
    for path in corpus(target) {
        let bytes = fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "fuzz input {} failed", path.display());
    }
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
