//! Fuzzes every gRPC service's request messages, decoded with prost and run through the
//! handlers' conversions: a thin wrapper over `kvd_server::fuzzing::grpc_request`, which panics
//! on a bug (API-2, CONV-3 with VAL-1, STATUS-1; see that function's doc).
//!
//! Run with `scripts/fuzz.sh grpc` (or `cargo +nightly fuzz run grpc -s none` from the
//! repository root); `cargo test` replays `fuzz/corpus/grpc/` on stable.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kvd_server::fuzzing::grpc_request(data));
