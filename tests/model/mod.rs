//! The reference model of kvd and the machinery that checks the engine against it.
//!
//! - [`state`]: a plain in-memory model of etcd's KV and lease semantics (a per-key history
//!   of every revision, a lease table on a model clock, nothing clever) with the engine's
//!   request, response and error types.
//! - [`ops`]: the operation enum a test sequence is made of.
//! - [`generate`]: builds operation sequences from an entropy source: a seeded PRNG for
//!   property tests, or arbitrary bytes for fuzzing (every byte string decodes to a valid
//!   sequence).
//! - [`harness`]: runs a sequence against a fresh engine and the model and compares every
//!   reply, error, revision, hash and lease, waiting (bounded) for clock-driven expiry.
//! - [`watch`]: the watches a sequence creates, and the check of every response and of each
//!   watch's whole event list against the model's history.
//!
//! This directory is shared by `tests/model_test.rs`, `tests/fuzz_corpus.rs` and the fuzz
//! target in `fuzz/`, through `mod model;` / `#[path] mod model;`. It names only kvd's public
//! API, `bytes` and `std`, so it builds in each of them.

// Each crate that includes the model uses a different part of it.
#![allow(dead_code, unused_imports)]

pub mod generate;
pub mod harness;
pub mod ops;
pub mod rng;
pub mod state;
pub mod watch;

pub use generate::{decode, generate};
pub use harness::{Coverage, Trace, run};
pub use ops::{Op, Seq};
pub use state::{Limits, Model};
