//! Fuzzes history records (`mvcc::record`) and history keys (`mvcc::revision`): a thin wrapper
//! over `kvd::fuzzing::history_record`, which panics on a bug (REC-1, REC-2, REV-1, REV-2; see
//! that function's doc).
//!
//! Run with `scripts/fuzz.sh record` (or `cargo +nightly fuzz run record -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/record/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd::fuzzing::history_record(data));
