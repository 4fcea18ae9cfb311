//! How Maintenance.Snapshot streams: a [`ChunkSource`] yields the image's bytes, this module
//! cuts them into etcd's 32 KiB chunks, appends etcd's SHA-256 trailer and sends them at
//! the client's pace. What the bytes are is the source's business: etcd's bbolt file
//! ([`kvd::EtcdSnapshotStream`], the default) or kvd's own dump ([`kvd::SnapshotStream`],
//! asked for with the request metadata [`SNAPSHOT_FORMAT_HEADER`]` = kvd`).
//!
//! Owns: the snapshot slots, each stream's pump task.
//!
//! Invariants:
//! - SNAPSHOT-1: at most `--max-snapshots` streams run at once; a further Snapshot call is
//!   refused with `ResourceExhausted` before any work is done.
//! - SNAPSHOT-2: memory per stream is bounded whatever the client's read rate: the pump
//!   produces the next chunk only once the previous one is queued, and at most
//!   [`SNAPSHOT_CHUNKS_QUEUED`] chunks wait for the client (plus one source call's output,
//!   at most a chunk and one record, and the frames the streamed call's task reads ahead,
//!   CONN-7).
//! - SNAPSHOT-3: a stream whose client has left the queue full for `--snapshot-stall-timeout`
//!   is abandoned: its source (and the engine's read snapshot, SNAP-2) is dropped and its
//!   slot freed at once; the client, if it ever reads again, gets `Aborted` after what was
//!   queued, never an OK end of a truncated image.
//! - SNAPSHOT-4: nothing here writes to disk or calls the engine's write path, so a
//!   snapshot cannot raise an alarm or fill the filesystem.
//! - SNAPSHOT-5: no thread waits on a slow client: each source call runs on the blocking
//!   pool and returns; the waiting is an async send.
//!
//! Contact points: `server::maintenance` starts streams; `server::lib` sizes the slots.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sha2::Digest;
use tonic::Status;
use tonic::codegen::tokio_stream::Stream;

use crate::pb::etcdserverpb::SnapshotResponse;
use kvd::sync::Arc;

/// The request metadata that picks the snapshot format: `etcd` (the default) or `kvd`.
pub const SNAPSHOT_FORMAT_HEADER: &str = "kvd-snapshot-format";

/// etcd's snapshot chunk size.
pub const SNAPSHOT_CHUNK_BYTES: usize = 32 * 1024;
/// Chunks waiting for the client per stream (SNAPSHOT-2).
pub const SNAPSHOT_CHUNKS_QUEUED: usize = 4;
/// Default of `--max-snapshots` (SNAPSHOT-1).
pub const SNAPSHOTS_MAX_DEFAULT: usize = 4;
/// Default of `--snapshot-stall-timeout` (SNAPSHOT-3).
pub const SNAPSHOT_STALL_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// A source of an image's bytes, produced in order on demand.
pub trait ChunkSource: Send + 'static {
    /// Appends the next bytes to `out`, at least `chunk_bytes` unless the image ends;
    /// returns false once the last bytes have been appended.
    fn next_chunk(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> kvd::Result<bool>;

    /// Returns an estimate of the image's length, for `remaining_bytes`.
    fn size_estimate(&self) -> u64;
}

impl ChunkSource for kvd::SnapshotStream {
    fn next_chunk(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> kvd::Result<bool> {
        kvd::SnapshotStream::next_chunk(self, out, chunk_bytes)
    }

    fn size_estimate(&self) -> u64 {
        kvd::SnapshotStream::size_estimate(self)
    }
}

impl ChunkSource for kvd::EtcdSnapshotStream {
    fn next_chunk(&mut self, out: &mut Vec<u8>, chunk_bytes: usize) -> kvd::Result<bool> {
        kvd::EtcdSnapshotStream::next_chunk(self, out, chunk_bytes)
    }

    fn size_estimate(&self) -> u64 {
        kvd::EtcdSnapshotStream::size(self)
    }
}

type Sender = tokio::sync::mpsc::Sender<Result<SnapshotResponse, Status>>;

/// The snapshot slots and the stall timeout, shared by every Snapshot call.
#[derive(Debug)]
pub struct Snapshots {
    slots: Arc<tokio::sync::Semaphore>,
    most: usize,
    stall_timeout: Duration,
}

impl Snapshots {
    /// Returns `most` slots (at least one) with `stall_timeout`.
    pub fn new(most: usize, stall_timeout: Duration) -> Snapshots {
        let most = most.max(1);
        Snapshots {
            slots: Arc::new(tokio::sync::Semaphore::new(most)),
            most,
            stall_timeout,
        }
    }

    /// Takes a slot, or refuses the call (SNAPSHOT-1).
    pub fn reserve(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        self.slots.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "kvd: too many snapshots in progress (at most {}, --max-snapshots); retry later",
                self.most
            ))
        })
    }

    /// Streams `source` in the slot `permit`, returning the response stream.
    pub fn stream(
        &self,
        source: Box<dyn ChunkSource>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> SnapshotBody {
        let (sender, chunks) = tokio::sync::mpsc::channel(SNAPSHOT_CHUNKS_QUEUED);
        let (abort, aborted) = tokio::sync::oneshot::channel();
        let stall_timeout = self.stall_timeout;
        tokio::spawn(async move {
            if let Err(status) = pump(source, &sender, stall_timeout).await {
                // The client gets it after what is queued, or never if it is gone.
                let _ = abort.send(status);
            }
            drop(permit);
        });
        SnapshotBody {
            chunks,
            aborted: Some(aborted),
        }
    }
}

/// Sends the image of `source` with etcd's trailer; `Err` carries the status the stream must
/// end with (SNAPSHOT-3, or the source's error). A client that went away ends it quietly.
async fn pump(
    mut source: Box<dyn ChunkSource>,
    sender: &Sender,
    stall_timeout: Duration,
) -> Result<(), Status> {
    let estimate = source.size_estimate();
    let mut hasher = sha2::Sha256::new();
    let mut pending = BytesMut::new();
    let mut sent: u64 = 0;
    let mut more = true;
    while more || !pending.is_empty() {
        if more && pending.len() < SNAPSHOT_CHUNK_BYTES {
            let (back, produced) = produce(source).await?;
            source = back;
            let (bytes, again) = produced.map_err(|e| crate::status::from_error(&e))?;
            more = again;
            pending.extend_from_slice(&bytes);
            continue;
        }
        let take = pending.len().min(SNAPSHOT_CHUNK_BYTES);
        let blob = pending.split_to(take).freeze();
        hasher.update(&blob);
        sent += blob.len() as u64;
        let remaining = if more || !pending.is_empty() {
            // Never 0 before the end: the estimate may be short.
            estimate.saturating_sub(sent).max(1)
        } else {
            0
        };
        if !send(sender, chunk(remaining, blob), stall_timeout).await? {
            return Ok(());
        }
    }
    drop(source);
    let trailer = Bytes::copy_from_slice(&hasher.finalize());
    send(sender, chunk(0, trailer), stall_timeout).await?;
    Ok(())
}

/// Runs one source call on the blocking pool (SNAPSHOT-5) and hands the source back.
async fn produce(
    mut source: Box<dyn ChunkSource>,
) -> Result<(Box<dyn ChunkSource>, kvd::Result<(Vec<u8>, bool)>), Status> {
    let called = tokio::task::spawn_blocking(move || {
        let mut out = Vec::with_capacity(SNAPSHOT_CHUNK_BYTES);
        let more = source.next_chunk(&mut out, SNAPSHOT_CHUNK_BYTES);
        (source, more.map(|more| (out, more)))
    })
    .await;
    called.map_err(|join| {
        tracing::error!(error = %join, "snapshot source call did not finish");
        crate::status::from_join_error(&join)
    })
}

fn chunk(remaining_bytes: u64, blob: Bytes) -> SnapshotResponse {
    SnapshotResponse {
        header: None,
        remaining_bytes,
        blob,
        version: String::new(),
    }
}

/// Queues `response`, waiting at most `stall_timeout` for room (SNAPSHOT-3). Returns false
/// if the client went away.
async fn send(
    sender: &Sender,
    response: SnapshotResponse,
    stall_timeout: Duration,
) -> Result<bool, Status> {
    match tokio::time::timeout(stall_timeout, sender.send(Ok(response))).await {
        Ok(Ok(())) => Ok(true),
        Ok(Err(_gone)) => Ok(false),
        Err(_elapsed) => {
            tracing::warn!(
                stall_timeout_s = stall_timeout.as_secs_f64(),
                "snapshot stream abandoned: the client read nothing for the stall timeout"
            );
            Err(Status::aborted(format!(
                "kvd: snapshot abandoned: the client read nothing for {:?} (--snapshot-stall-timeout)",
                stall_timeout
            )))
        }
    }
}

/// The response stream of one Snapshot call: the queued chunks, then the abandoning status
/// if the pump gave up (SNAPSHOT-3).
pub struct SnapshotBody {
    chunks: tokio::sync::mpsc::Receiver<Result<SnapshotResponse, Status>>,
    aborted: Option<tokio::sync::oneshot::Receiver<Status>>,
}

impl Stream for SnapshotBody {
    type Item = Result<SnapshotResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match this.chunks.poll_recv(cx) {
            Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => {}
        }
        // The pump is done: it either finished (the sender of `aborted` dropped unused) or
        // left a status.
        let Some(aborted) = this.aborted.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(aborted).poll(cx) {
            Poll::Ready(Ok(status)) => {
                this.aborted = None;
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(Err(_finished)) => {
                this.aborted = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
