//! Replays the committed corpora of the server's fuzz targets (`fuzz/corpus/grpc/` and
//! `fuzz/corpus/operator_json/`) through the same `kvd_server::fuzzing` functions the targets
//! call, so a plain `cargo test` on stable runs every input the fuzzer kept. Each function
//! panics on a bug (a decoder or conversion that panics, a request whose length differs from
//! the engine's (API-2), a Txn refusal the engine's checks disagree with (CONV-3), an operator
//! call that does not read back (OPS-1, OPS-4)); an empty corpus fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

/// Returns the files of `fuzz/corpus/<target>/` (beside this package, at the repository
/// root) in name order, skipping hidden ones (libFuzzer's temporaries); panics if there are
/// none.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
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
fn grpc_corpus_replays() {
    replay("grpc", kvd_server::fuzzing::grpc_request);
}

#[test]
fn operator_json_corpus_replays() {
    replay("operator_json", kvd_server::fuzzing::operator_call);
}
