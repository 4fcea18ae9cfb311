//! Fuzzes log replay (`storage::wal::records_after`) over a log built and damaged as the input
//! says, against an oracle: a thin wrapper over `kvd::fuzzing::wal_log`, which panics on a bug
//! (WAL-2, WAL-5; see that function's doc).
//!
//! Run with `scripts/fuzz.sh wal_log` (or `cargo +nightly fuzz run wal_log -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/wal_log/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd::fuzzing::wal_log(data));
