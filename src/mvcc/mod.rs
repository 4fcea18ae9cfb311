//! Multi-version concurrency control with etcd's semantics: revisions, the key index,
//! reads, writes, compaction and HashKV.
//!
//! Owns: the meaning of the history. Knows nothing of threads: the engine decides which
//! lock protects the [`Index`] and which storage batch or snapshot records come from.
//!
//! Invariants: see each submodule (`REV-*`, `REC-*`, `KI-*`, `IDX-*`, `READ-*`, `WRITE-*`,
//! `VAL-*`, `HASH-*`, `COMPACT-*`).
//!
//! Contact points: `engine` composes it with `storage`.

pub mod compaction;
pub mod hash;
pub mod index;
pub mod key_index;
pub mod read;
pub mod record;
pub mod revision;
pub mod validate;
pub mod wire;
pub mod write;

pub use index::Index;
pub use key_index::KeyIndex;
pub use revision::Revision;
