//! Fuzzes the operator API's `POST /api/v1` request bodies, decoded and checked as the server
//! and the engine check them: a thin wrapper over `kvd_server::fuzzing::operator_call`, which
//! panics on a bug (OPS-1, OPS-4; see that function's doc).
//!
//! Run with `scripts/fuzz.sh operator_json` (or `cargo +nightly fuzz run operator_json -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/operator_json/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd_server::fuzzing::operator_call(data));
