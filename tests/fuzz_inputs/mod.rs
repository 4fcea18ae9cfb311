//! The committed fuzz inputs, for the tests that replay them on stable Rust
//! (`tests/fuzz_decoders.rs`, `tests/fuzz_corpus.rs`, `server/tests/fuzz_corpus.rs`, which
//! includes this file by path): the input files of a corpus directory, and their replay
//! through a check that panics on a bug.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

/// Returns the files of `dir` in name order, skipping hidden ones (libFuzzer's
/// temporaries); none if `dir` does not exist (an artifacts directory often does not).
pub fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .filter(|path| !path.file_name().unwrap().to_string_lossy().starts_with('.'))
        .collect();
    files.sort();
    files
}

/// Returns the inputs of the corpus `dir`; panics if there are none, so a missing
/// directory cannot pass for a clean run.
pub fn corpus(dir: &Path) -> Vec<PathBuf> {
    let files = inputs(dir);
    assert!(!files.is_empty(), "no inputs in {}", dir.display());
    files
}

/// Runs `check` on every input of the corpus `dir`, naming the input if it panics.
pub fn replay(dir: &Path, check: fn(&[u8])) {
    for path in corpus(dir) {
        let bytes = fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&bytes));
        assert!(outcome.is_ok(), "fuzz input {} failed", path.display());
    }
}
