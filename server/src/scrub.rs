//! The periodic scrub (`--scrub-interval`): every interval, every stored history record, row
//! and meta value is checked against its checksum while the server serves
//! (`Engine::scrub`, SCRUB-1..3). Damage raises the CORRUPT alarm (the engine does that),
//! is logged at error level and counted in `kvd_scrub_runs_total{result="damaged"}`; a
//! sound pass is counted under `sound`, a pass that could not run under `failed`.
//!
//! Invariant SCRUB-4: at most one pass runs at a time (the loop awaits each), on the blocking
//! pool (NODE-1), the first one interval after the start (the open itself read every
//! record and row), and the loop ends when the server shuts down (NODE-3).
//!
//! Contact points: `server::run` spawns [`scrub_periodically`]; `server::http` reads
//! `Node::scrub_runs` at scrape time.

use std::time::Duration;

use tonic::Code;

use crate::node::Node;
use kvd::sync::{Arc, AtomicU64, Ordering};

/// Passes of the scrub by result, since the server started.
#[derive(Debug, Default)]
pub struct ScrubRuns {
    sound: AtomicU64,
    damaged: AtomicU64,
    failed: AtomicU64,
}

impl ScrubRuns {
    /// Returns the counts as (result label, passes), in a fixed order.
    pub fn counts(&self) -> [(&'static str, u64); 3] {
        [
            ("sound", self.sound.load(Ordering::Relaxed)),
            ("damaged", self.damaged.load(Ordering::Relaxed)),
            ("failed", self.failed.load(Ordering::Relaxed)),
        ]
    }
}

/// Scrubs the store every `interval` until the server stops (SCRUB-4).
pub async fn scrub_periodically(node: Arc<Node>, interval: Duration) {
    node.every(interval, || scrub(&node)).await;
}

async fn scrub(node: &Node) {
    let runs = &node.scrub_runs;
    match node.call(|engine| engine.scrub()).await {
        Ok(report) => {
            runs.sound.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                records = report.records,
                rows = report.rows,
                "scrub: every checksum matched"
            );
        }
        Err(status) if status.code() == Code::DataLoss => {
            runs.damaged.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                error = %status.message(),
                "scrub: stored data is damaged; the CORRUPT alarm is raised and writes \
                 stop (restore the data directory from a backup, or disarm the alarm \
                 to write on beside the damage)"
            );
        }
        Err(status) => {
            runs.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %status.message(), "scrub could not run");
        }
    }
}
