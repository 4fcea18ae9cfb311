//! Fuzzes the row tables' rows: leases, alarms, the quota registry, agents, reservations,
//! allocations, and meta values: a thin wrapper over `kvd::fuzzing::rows`, which panics on a
//! bug (STORE-4 and the row codecs' round trips; see that function's doc).
//!
//! Run with `scripts/fuzz.sh rows` (or `cargo +nightly fuzz run rows -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/rows/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd::fuzzing::rows(data));
