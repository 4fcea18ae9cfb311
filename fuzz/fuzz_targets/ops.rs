//! Fuzzes operation sequences: the input bytes decode (totally) into a sequence of Put,
//! DeleteRange, Txn, Range, Compact, Reopen, HashKV, lease (grant, revoke, keep-alive,
//! time-to-live, list), clock-step and watch operations, which run against a fresh engine
//! on a manual clock and the reference model of `tests/model`; any difference panics (for
//! watches: any event list that differs from the model's history).
//!
//! Run with `cargo +nightly fuzz run ops` from the repository root. A crash file replays
//! through `cargo test --test fuzz_corpus` once copied to `fuzz/corpus/ops/` (or left in
//! `fuzz/artifacts/ops/`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/model/mod.rs"]
mod model;

fuzz_target!(|data: &[u8]| {
    let seq = model::decode(data);
    if seq.ops.is_empty() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory for the engine");
    model::run(&seq, dir.path());
});
