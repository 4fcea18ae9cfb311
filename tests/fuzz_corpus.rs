//! Replays the fuzz corpus of the `ops` target (`fuzz/corpus/ops/`) and any crash artifacts
//! (`fuzz/artifacts/ops/`) through the same decoder and model harness as the fuzzer, so a
//! plain `cargo test` runs them on stable Rust.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod fuzz_inputs;
mod model;

use std::fs;
use std::path::Path;

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
    let corpus = fuzz_inputs::corpus(&root.join("corpus/ops"));
    for path in corpus
        .iter()
        .chain(&fuzz_inputs::inputs(&root.join("artifacts/ops")))
    {
        replay(path);
    }
}
