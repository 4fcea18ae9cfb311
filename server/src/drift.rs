//! The periodic consumption drift check (`--consumption-check-interval`): every interval,
//! the consumption counters are compared with a recount from the index and the records
//! (`Engine::consumption_drift`), the number of rows that differ is published for
//! `/metrics` (`kvd_consumption_drift_rows`), and drift is logged as a warning. It never
//! repairs: that is the operator's call (`RECONCILE_CONSUMPTION` with `repair`, or
//! `kvd reconcile --repair`).
//!
//! Invariant DRIFT-1: at most one check runs at a time (the loop awaits each), it runs on
//! the blocking pool (NODE-1), and the loop ends when the server shuts down (NODE-3).
//!
//! Contact points: `server::run` spawns [`check_periodically`]; `server::http` reads
//! `Node::consumption_drift_rows` at scrape time.

use std::time::Duration;

use crate::node::Node;
use kvd::sync::Arc;

/// Checks the consumption counters every `interval` until the server stops (DRIFT-1).
pub async fn check_periodically(node: Arc<Node>, interval: Duration) {
    node.every(interval, || check(&node)).await;
}

async fn check(node: &Node) {
    match node.call(|engine| engine.consumption_drift()).await {
        Ok(drift) => {
            node.consumption_drift_rows.set(drift.len());
            if drift.is_empty() {
                tracing::debug!("consumption check: counters agree with the recount");
            } else {
                let (role, resource, _, _) = &drift[0];
                tracing::warn!(
                    rows = drift.len(),
                    first_role = %role,
                    first_resource = %resource,
                    "consumption check: counters differ from the recount; \
                     run `kvd reconcile` to see them, `kvd reconcile --repair` to fix them"
                );
            }
        }
        Err(status) => {
            tracing::warn!(error = %status.message(), "consumption check failed");
        }
    }
}
