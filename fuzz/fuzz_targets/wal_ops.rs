//! Fuzzes the operations of a write-ahead log record's payload (`storage::wal::decode_ops`), re-logged and re-framed: a thin wrapper over `kvd::fuzzing::wal_ops`, which
//! panics on a bug (WAL-5, WAL-2; see that function's doc).
//!
//! Run with `scripts/fuzz.sh wal_ops` (or `cargo +nightly fuzz run wal_ops -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/wal_ops/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd::fuzzing::wal_ops(data));
