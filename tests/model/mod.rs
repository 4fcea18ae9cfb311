//! The reference model of kvd and the machinery that checks the engine against it.
//!
//! The model shares no code with what it judges: it names kvd's request and response types
//! and calls the engine's public API, and computes everything it compares on its own, from
//! etcd's and Mesos's documented behaviour and kvd's design documents (`docs/design/model.md`
//! says which rules, and what the model cannot know).
//!
//! - [`state`]: a plain in-memory model of etcd's KV and lease semantics (a per-key history
//!   of every revision, a lease table on a model clock, nothing clever) with the engine's
//!   request, response and error types, the order of a write's checks, the alarms and the
//!   space gate.
//! - [`wire`]: the request size etcd limits, from the model's own protobuf encoding of the
//!   raft entry; and the bytes of a Range's key-values, which the harness compares with the
//!   engine's wire form of every Range.
//! - [`space`]: etcd's cost of a write, the quota, the filesystem reserve, the alarm set,
//!   and what can be said about a space check without seeing redb's pages.
//! - [`accounts`]: the quota registry, agents, reservations and allocations, the owner of a
//!   key, limit checks, UPDATE_QUOTA's phases, and the recount of consumption.
//! - [`drift`]: the engine's consumption report against the model's recount.
//! - [`queue`]: the write prepare queue's rule: which writes it admits and which it refuses.
//! - [`ops`]: the operation enum a test sequence is made of.
//! - [`generate`]: builds operation sequences from an entropy source: a seeded PRNG for
//!   property tests, or arbitrary bytes for fuzzing (every byte string decodes to a valid
//!   sequence).
//! - [`harness`]: runs a sequence against a fresh engine and the model and compares every
//!   reply, error, revision, hash, lease, alarm and consumption counter, waiting (bounded)
//!   for clock-driven expiry.
//! - [`watch`]: the watches a sequence creates, and the check of every response and of each
//!   watch's whole event list against the model's history.
//!
//! This directory is shared by `tests/model_test.rs`, `tests/fuzz_corpus.rs` and the fuzz
//! target in `fuzz/`, through `mod model;` / `#[path] mod model;`. It names only kvd's public
//! API, `bytes` and `std`, so it builds in each of them.

// Each crate that includes the model uses a different part of it.
#![allow(dead_code, unused_imports)]

pub mod accounts;
pub mod drift;
pub mod generate;
pub mod harness;
pub mod ops;
pub mod queue;
pub mod rng;
pub mod space;
pub mod state;
pub mod watch;
pub mod wire;

pub use generate::{decode, generate};
pub use harness::{Coverage, Trace, run};
pub use ops::{Op, QuotaOp, Seq};
pub use state::{Limits, Model};
