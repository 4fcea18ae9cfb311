//! The reference model of kvd and the machinery that checks the engine against it.
//!
//! - [`state`]: a plain in-memory model of etcd's KV semantics (a per-key history of every
//!   revision, nothing clever) with the engine's request, response and error types.
//! - [`ops`]: the operation enum a test sequence is made of.
//! - [`generate`]: builds operation sequences from an entropy source: a seeded PRNG for
//!   property tests, or arbitrary bytes for fuzzing (every byte string decodes to a valid
//!   sequence).
//! - [`harness`]: runs a sequence against a fresh engine and the model and compares every
//!   reply, error, revision and hash.
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

pub use generate::{decode, generate};
pub use harness::{Trace, run};
pub use ops::{Op, Seq};
pub use state::{Limits, Model};
