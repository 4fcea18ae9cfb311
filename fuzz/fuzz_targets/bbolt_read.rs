//! Fuzzes the reader of etcd's snapshot files (`bbolt::read`, `bbolt::status` and the
//! import of `engine::etcd_snapshot`): a thin wrapper over `kvd::fuzzing::bbolt_file`, which
//! panics on a bug (BBOLT-2, BREAD-1, BREAD-2; see that function's doc).
//!
//! Run with `scripts/fuzz.sh bbolt_read` (or `cargo +nightly fuzz run bbolt_read -s none`
//! from the repository root); `cargo test` replays `fuzz/corpus/bbolt_read/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd::fuzzing::bbolt_file(data));
