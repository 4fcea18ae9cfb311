//! Replays the committed corpora of the server's fuzz targets (`fuzz/corpus/grpc/` and
//! `fuzz/corpus/operator_json/`) through the same `kvd_server::fuzzing` functions the targets
//! call, so a plain `cargo test` on stable runs every input the fuzzer kept. Each function
//! panics on a bug (a decoder or conversion that panics, a request whose length differs from
//! the engine's (API-2), a Txn refusal the engine's checks disagree with (CONV-3), an operator
//! call that does not read back (OPS-1, OPS-4)); an empty corpus fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../tests/fuzz_inputs/mod.rs"]
mod fuzz_inputs;

use std::path::Path;

/// Runs `check` on every input of `fuzz/corpus/<target>/` (beside this package, at the
/// repository root).
fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    fuzz_inputs::replay(&root.join(target), check);
}

#[test]
fn grpc_corpus_replays() {
    replay("grpc", kvd_server::fuzzing::grpc_request);
}

#[test]
fn operator_json_corpus_replays() {
    replay("operator_json", kvd_server::fuzzing::operator_call);
}
