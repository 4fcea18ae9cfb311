//! The state every service of one kvd server shares: the engine, the member's identity and
//! the settings that show in answers.
//!
//! Owns: the bridge from async handlers to the synchronous engine.
//!
//! Invariants:
//! - NODE-1: an engine call that may block for long (large reads, defrag, snapshot, hash)
//!   runs on tokio's blocking pool ([`Node::call`]), never on a reactor thread; a Range of
//!   at most [`RANGE_INLINE_RECORDS_MAX`] records is read on the reactor thread
//!   ([`Node::range`]), and so is a read-only Txn whose compares and ranges are bounded to
//!   as many ([`Node::read_only_txn`]), and so are Status and a LeaseTimeToLive that does
//!   not list the lease's keys ([`Node::quick`]: short locks, no disk). A write is
//!   submitted from the reactor thread ([`Node::submit`]: admission takes only short
//!   locks and never waits) and its answer awaited there, so no thread is parked per
//!   write in flight; the exception is a lone write (nothing else queued or in flight),
//!   which the engine applies and syncs in the submitting thread (APPLY-5).
//! - NODE-2: the node holds no state of its own beyond configuration, the shutdown signal,
//!   the auth tokens and failed-login counters (memory only, as etcd's simple tokens),
//!   the gauges of open streams, the last consumption drift check's figure, the scrub's
//!   pass counts and the test
//!   failpoint's counter (`server::operation`); everything a client sees comes from the engine at the
//!   time of the call (surfaces hold no state).
//! - NODE-3: once the shutdown signal is raised, every long-lived stream (Watch,
//!   LeaseKeepAlive) ends with `Unavailable "etcdserver: server stopped"` within
//!   [`STREAM_POLL`], so the graceful shutdown does not wait for clients to hang up.
//!
//! Contact points: the gRPC services and the HTTP routes hold an `Arc<Node>`.

use std::time::Duration;

use tonic::Status;

use crate::auth::Sessions;
use crate::convert::HeaderIds;
use crate::operation::DropAfterCommit;
use crate::recovery::EngineSlot;
use crate::status;
use kvd as api;
use kvd::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use kvd::{Completion, Engine};
use kvd::{Error, Result};

/// A Range reading at most this many records reads them on the reactor thread that took
/// the request (NODE-1): a hop to the blocking pool and back costs two thread wake-ups,
/// more than reading a few records from redb's cache.
pub const RANGE_INLINE_RECORDS_MAX: usize = 1_000;

/// An upper bound of the records a read-only Txn reads: its compares', then the larger
/// branch's (one runs); `usize::MAX` when a compare over a range or a Range without a
/// limit has none.
fn read_only_txn_records(req: &api::TxnRequest) -> usize {
    let compares = req.compare.iter().map(|c| {
        if c.range_end.is_empty() {
            1
        } else {
            usize::MAX
        }
    });
    let branch = |ops: &[api::RequestOp]| {
        ops.iter()
            .map(|op| match op {
                api::RequestOp::Range(r) if r.range_end.is_empty() => 1,
                api::RequestOp::Range(r) if r.limit > 0 => {
                    usize::try_from(r.limit).unwrap_or(usize::MAX)
                }
                _ => usize::MAX,
            })
            .fold(0, usize::saturating_add)
    };
    compares
        .fold(0, usize::saturating_add)
        .saturating_add(branch(&req.success).max(branch(&req.failure)))
}

/// The version kvd reports as its etcd server version (Status `version`, `/version`).
///
/// kvd follows etcd 3.6 semantics where 3.4 and 3.6 differ (`docs/operations.md`), so it
/// reports the etcd API level it implements, not its own crate version.
pub const ETCD_SERVER_VERSION: &str = "3.6.0";
/// The cluster version kvd reports (`/version` `etcdcluster`, Status `storageVersion`).
pub const ETCD_CLUSTER_VERSION: &str = "3.6.0";
/// etcd's default `--quota-backend-bytes` (2 GiB), used when the flag is 0.
pub const QUOTA_BACKEND_BYTES_DEFAULT: i64 = 2 << 30;
/// How often a thread that waits on the engine for a stream looks at the shutdown signal
/// and at whether its client is still there (NODE-3).
pub const STREAM_POLL: Duration = Duration::from_millis(100);
/// The message a stream ends with when the server shuts down (etcd's ErrStopped).
pub const SERVER_STOPPED: &str = "etcdserver: server stopped";

/// The settings that show in answers.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// The member name (`--name`).
    pub name: String,
    /// The client URLs advertised in MemberList.
    pub advertise_client_urls: Vec<String>,
    /// The peer URL shown in MemberList; kvd has no peers, so it is only a placeholder.
    pub peer_url: String,
    /// The space quota reported in Status (`dbSizeQuota`); 0 when the quota is disabled.
    pub quota_bytes: i64,
    /// `--max-txn-ops`, needed to order the errors of a Txn with an empty op.
    pub max_txn_ops: usize,
    /// Responses of committed writes with an operation id to drop (tests only; OPID-2).
    pub drop_responses_after_commit: u64,
    /// Most Watch streams open at once (`--max-watch-streams`, WATCH-SRV-3).
    pub max_watch_streams: usize,
    /// How long an idle auth token stays valid (`--auth-token-ttl`, AUTHN-1).
    pub auth_token_ttl: Duration,
}

/// Gauges of the long-lived streams open right now, for `/metrics`.
#[derive(Debug, Default)]
pub struct OpenStreams {
    /// Watch RPC streams.
    pub watch: AtomicUsize,
    /// LeaseKeepAlive RPC streams.
    pub keep_alive: AtomicUsize,
}

/// Counts one open stream in a gauge of [`OpenStreams`] until dropped.
#[derive(Debug)]
pub struct StreamGuard {
    node: Arc<Node>,
    gauge: fn(&OpenStreams) -> &AtomicUsize,
}

impl StreamGuard {
    /// Counts a stream in `gauge` of `node`'s open streams.
    pub fn new(node: Arc<Node>, gauge: fn(&OpenStreams) -> &AtomicUsize) -> StreamGuard {
        gauge(&node.streams).fetch_add(1, Ordering::Relaxed);
        StreamGuard { node, gauge }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        (self.gauge)(&self.node.streams).fetch_sub(1, Ordering::Relaxed);
    }
}

/// One running server's shared state.
#[derive(Debug)]
pub struct Node {
    /// The engine in service, which recovery may replace (RECOVERY-2).
    pub engines: Arc<EngineSlot>,
    /// The identity that goes into every response header.
    pub ids: HeaderIds,
    /// The settings that show in answers.
    pub settings: NodeSettings,
    /// True once the server is shutting down (NODE-3).
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// The long-lived streams open now.
    pub streams: OpenStreams,
    /// The test failpoint that drops responses of committed writes (OPID-2).
    pub drop_after_commit: DropAfterCommit,
    /// Rows the last consumption drift check found, or `None` before the first check.
    pub consumption_drift_rows: ConsumptionDrift,
    /// Passes of the periodic scrub by result (`server::scrub`).
    pub scrub_runs: crate::scrub::ScrubRuns,
    /// The auth tokens and failed-login counters (`server::auth`, AUTHN-1..3).
    pub sessions: Sessions,
}

/// The figure of the last periodic consumption drift check (`--consumption-check-interval`).
#[derive(Debug)]
pub struct ConsumptionDrift {
    /// The rows found, or `u64::MAX` before the first check.
    rows: AtomicU64,
}

impl Default for ConsumptionDrift {
    fn default() -> ConsumptionDrift {
        ConsumptionDrift {
            rows: AtomicU64::new(u64::MAX),
        }
    }
}

impl ConsumptionDrift {
    /// Records the rows a check found.
    pub fn set(&self, rows: usize) {
        let rows = u64::try_from(rows)
            .unwrap_or(u64::MAX - 1)
            .min(u64::MAX - 1);
        self.rows.store(rows, Ordering::Relaxed);
    }

    /// Returns the rows the last check found, `None` before the first one.
    pub fn get(&self) -> Option<u64> {
        let rows = self.rows.load(Ordering::Relaxed);
        (rows != u64::MAX).then_some(rows)
    }
}

impl Node {
    /// Returns a node serving `engine`; `shutdown` turns true when the server stops.
    pub fn new(
        engines: Arc<EngineSlot>,
        ids: HeaderIds,
        settings: NodeSettings,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Node {
        let drop_after_commit = DropAfterCommit::new(settings.drop_responses_after_commit);
        let sessions = Sessions::new(settings.auth_token_ttl);
        Node {
            engines,
            ids,
            settings,
            shutdown,
            streams: OpenStreams::default(),
            drop_after_commit,
            consumption_drift_rows: ConsumptionDrift::default(),
            scrub_runs: crate::scrub::ScrubRuns::default(),
            sessions,
        }
    }

    /// Runs `f` against the engine in the caller's thread: only for calls that take short
    /// locks and never wait for the disk (the auth store's reads and permission checks,
    /// lease renewals and time-to-live reads, Status; an exception to NODE-1, like
    /// admission).
    pub fn quick<T>(&self, f: impl FnOnce(&Engine) -> Result<T>) -> std::result::Result<T, Status> {
        let engine = self.engine()?;
        f(&engine).map_err(|err| self.engine_error(&err, false))
    }

    /// Returns true while auth is enabled (`server::auth`).
    pub fn auth_enabled(&self) -> std::result::Result<bool, Status> {
        Ok(self.quick(Engine::auth_status)?.0)
    }

    /// Returns true once the server has started shutting down (NODE-3): the signal is
    /// raised, or its sender is gone.
    pub fn is_stopping(&self) -> bool {
        self.shutdown.has_changed().is_err() || *self.shutdown.borrow()
    }

    /// Returns when the server starts shutting down (NODE-3).
    pub async fn stopping(&self) {
        let mut shutdown = self.shutdown.clone();
        // An error means the sender is gone, which also means the server is stopping.
        let _ = shutdown.wait_for(|stop| *stop).await;
    }

    /// Runs `pass` every `interval`, the first one interval from now, one at a time, until
    /// the server stops (NODE-3); a pass that took longer than the interval is followed by
    /// the next one, not by a burst.
    pub async fn every<F, Fut>(&self, interval: Duration, mut pass: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = self.stopping() => return,
            }
            pass().await;
        }
    }

    /// Runs a Range (NODE-1): its keys are chosen here (short locks), and their records are
    /// read here too when there are at most [`RANGE_INLINE_RECORDS_MAX`], else on the
    /// blocking pool; the answer's key-values come in etcd's wire form (WIRE-1).
    pub async fn range(
        &self,
        req: api::RangeRequest,
    ) -> std::result::Result<kvd::EncodedRange, Status> {
        let prepared = self.quick(|e| e.prepare_range(&req))?;
        if prepared.records() <= RANGE_INLINE_RECORDS_MAX {
            return prepared
                .finish_wire()
                .map_err(|err| self.engine_error(&err, false));
        }
        self.call(move |_| prepared.finish_wire()).await
    }

    /// Serves a read-only Txn (NODE-1) with `options` (its caller): on the reactor thread
    /// when it reads at most [`RANGE_INLINE_RECORDS_MAX`] records (every compare and every
    /// Range names one key or has a limit), else on the blocking pool. etcd's STM reads
    /// its keys with such Txns, one key each.
    pub async fn read_only_txn(
        &self,
        req: api::TxnRequest,
        options: kvd::WriteOptions,
    ) -> std::result::Result<api::TxnResponse, Status> {
        if read_only_txn_records(&req) <= RANGE_INLINE_RECORDS_MAX {
            return self.quick(|e| e.txn_with(req, &options));
        }
        self.call(move |e| e.txn_with(req, &options)).await
    }

    /// Runs `f` against the engine on the blocking pool (NODE-1) and maps its error to
    /// etcd's gRPC status.
    pub async fn call<T, F>(&self, f: F) -> std::result::Result<T, Status>
    where
        F: FnOnce(&Engine) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let engine = self.engine()?;
        match tokio::task::spawn_blocking(move || f(&engine)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.engine_error(&err, false)),
            Err(join) => {
                tracing::error!(error = %join, "engine call did not finish");
                Err(status::from_join_error(&join))
            }
        }
    }

    /// Returns the engine in service, or `Unavailable` while it is being reopened (RECOVERY-2).
    fn engine(&self) -> std::result::Result<Arc<Engine>, Status> {
        self.engines.engine().ok_or_else(|| {
            let why = self.engines.refusal().unwrap_or_else(|| {
                "kvd: the database is being reopened after a storage error".to_owned()
            });
            Status::unavailable(format!("{why}; retry shortly"))
        })
    }

    /// Maps an engine error (of a `write` or not) to its gRPC status; a poisoned store is
    /// reported to recovery and answered with what kvd waits for (RECOVERY-1).
    fn engine_error(&self, err: &Error, write: bool) -> Status {
        self.engines.note_poisoned(err, write);
        match self.engines.refusal() {
            Some(message) if err.is_poisoned() => Status::unavailable(message),
            _ => status::from_error(err),
        }
    }

    /// Submits a write with `submit` (one of the engine's `submit_*` calls) and awaits its
    /// answer on the runtime (NODE-1), mapping its error to etcd's gRPC status.
    pub async fn submit<T, F>(&self, submit: F) -> std::result::Result<T, Status>
    where
        F: FnOnce(&Engine, Completion<T>),
        T: Send + 'static,
    {
        let engine = self.engine()?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        submit(
            &engine,
            Box::new(move |result| {
                // A client that went away is not an error of ours.
                let _ = reply.send(result);
            }),
        );
        match answer.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.engine_error(&err, true)),
            Err(_) => Err(status::from_error(&Error::Closed)),
        }
    }

    /// Returns the engine's status (revisions, sizes, applied index), read in the caller's
    /// thread: short locks and one `stat` of the database file (NODE-1).
    pub fn status(&self) -> std::result::Result<api::Status, Status> {
        self.quick(Engine::status)
    }

    /// Returns a full response header at the current revision.
    pub fn current_header(
        &self,
    ) -> std::result::Result<crate::pb::etcdserverpb::ResponseHeader, Status> {
        let status = self.status()?;
        Ok(self.ids.header(status.header.revision))
    }
}

/// Runs `f`, which may block on the engine (a watch stream's locks, for example), on the
/// blocking pool (NODE-1) and maps its error to etcd's gRPC status.
pub async fn blocking<T, F>(f: F) -> std::result::Result<T, Status>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(status::from_error(&err)),
        Err(join) => {
            tracing::error!(error = %join, "engine call did not finish");
            Err(status::from_join_error(&join))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(key: &str, range_end: &str, limit: i64) -> api::RequestOp {
        api::RequestOp::Range(api::RangeRequest {
            range_end: range_end.to_owned().into(),
            limit,
            ..api::RangeRequest::key(key.to_owned())
        })
    }

    fn txn(compare_end: Option<&str>, success: Vec<api::RequestOp>) -> api::TxnRequest {
        let compare = compare_end.map(|end| api::Compare {
            range_end: end.to_owned().into(),
            ..api::Compare::new(
                "a",
                api::CompareResult::Equal,
                api::CompareTarget::Version(1),
            )
        });
        api::TxnRequest {
            compare: compare.into_iter().collect(),
            success,
            failure: vec![get("f", "", 0)],
        }
    }

    #[test]
    fn a_read_only_txn_is_bounded_by_its_keys_and_limits() {
        // An STM read: one key.
        assert_eq!(read_only_txn_records(&txn(None, vec![get("k", "", 0)])), 1);
        let four = vec![
            get("a", "", 0),
            get("b", "", 0),
            get("c", "z", 2),
            get("d", "", 0),
        ];
        assert_eq!(read_only_txn_records(&txn(Some(""), four)), 1 + 5);
        let unbounded = vec![get("a", "z", 0)];
        assert_eq!(read_only_txn_records(&txn(None, unbounded)), usize::MAX);
        let over_a_range = txn(Some("z"), vec![get("a", "", 0)]);
        assert_eq!(read_only_txn_records(&over_a_range), usize::MAX);
        let past = vec![get("a", "z", 1_000), get("b", "", 0)];
        assert!(read_only_txn_records(&txn(None, past)) > RANGE_INLINE_RECORDS_MAX);
    }
}
