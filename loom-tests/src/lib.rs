//! loom models of kvd's synchronisation. The modules below are kvd's own source files,
//! compiled here with `--cfg loom` so that `sync` hands them loom's atomics and locks: loom
//! checks the real code, not a copy.

#![allow(dead_code)]

#[path = "../../src/sync.rs"]
pub mod sync;

#[path = "../../src/engine/publish.rs"]
pub mod publish;

#[path = "../../src/engine/mailbox.rs"]
pub mod mailbox;

#[path = "../../src/engine/reply.rs"]
pub mod reply;

#[path = "../../src/clock.rs"]
pub mod clock;

#[path = "../../src/engine/prepare.rs"]
pub mod prepare;

#[path = "../../src/watch/queue.rs"]
pub mod watch_queue;
