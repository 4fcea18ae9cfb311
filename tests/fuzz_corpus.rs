//! Replays the fuzz corpus of the `ops` target (`fuzz/corpus/ops/`) and any crash artifacts
//! (`fuzz/artifacts/ops/`) through the same decoder and model harness as the fuzzer, so a
//! plain `cargo test` runs them on stable Rust.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod model;

use std::fs;
use std::path::{Path, PathBuf};

/// Returns the files of `dir` in name order, skipping hidden ones (libFuzzer's temporaries).
fn inputs(dir: &Path) -> Vec<PathBuf> {
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

fn replay(path: &Path) {
    let bytes = fs::read(path).unwrap();
    let mut seq = model::decode(&bytes);
    seq.label = format!(
        "fuzz input {} ({}, {} ops)",
        path.display(),
        seq.label,
        seq.ops.len()
    );
    let dir = tempfile::tempdir().unwrap();
    model::run(&seq, dir.path());
}

#[test]
fn fuzz_corpus_replays() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = inputs(&root.join("corpus/ops"));
    assert!(
        !corpus.is_empty(),
        "no inputs in {}",
        root.join("corpus/ops").display()
    );
    for path in corpus.iter().chain(&inputs(&root.join("artifacts/ops"))) {
        replay(path);
    }
}
