//! A connection wrapper that gathers the DATA frames of a large answer into few writes.
//!
//! Why: HTTP/2 frames carry at most 16 KiB each toward gRPC-go's clients (the size a peer
//! takes unless it says otherwise, and they do not), and h2 writes every DATA frame of more
//! than 256 bytes with a `writev` of its own, flushing after each. A Range of 1,000 keys of
//! 256 bytes (280 KB) left in 18 `writev`s, each of which, over loopback, ran the client's
//! receive path and woke its reader: about 20 `writev`s per Range measured with `strace`
//! under etcd's benchmark. Gathered, the answer leaves in one or two.
//!
//! Owns: the bytes written and not yet passed on, at most [`GATHER_MAX`] plus one write.
//!
//! Invariants:
//! - GATHER-1: bytes pass on in the order they were written, unchanged.
//! - GATHER-2: only large writes are held: a write of at least [`LARGE_WRITE`] bytes, or
//!   any write while something is held (to keep GATHER-1). A small write with nothing held
//!   passes at once, so answers of a few frames (Put, Txn, most watch responses) go out as
//!   before.
//! - GATHER-3: a flush that follows a large write while bytes are held is put off by one
//!   turn of the connection's task: it reports done and wakes the task, and the next flush
//!   with no write since (h2 flushes at the end of every poll of the connection) passes
//!   everything on. So nothing is held past the poll after the one that wrote it, and a
//!   flow-control pause (h2 stops writing until the client's WINDOW_UPDATE) costs one more
//!   poll, never a wait. With nothing held, a flush neither waits nor wakes anyone.
//! - GATHER-4: more than [`GATHER_MAX`] held bytes go out before another write is taken.
//!
//! Contact points: `server::connections` wraps every connection's stream (under TLS, the
//! decrypted one) in this, beneath [`crate::pong::PongHold`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A write this large is held (GATHER-2): a whole DATA frame of the default size.
pub const LARGE_WRITE: usize = 16 * 1024;

/// Held bytes beyond this go out before the next write is taken (GATHER-4).
pub const GATHER_MAX: usize = 512 * 1024;

/// A held buffer whose capacity grew beyond this is given back once it has gone out.
const KEEP_CAPACITY: usize = 64 * 1024;

/// A stream whose large writes are gathered into few (GATHER-1..4).
#[derive(Debug)]
pub struct WriteGather<S> {
    inner: S,
    /// Held bytes; `held[sent..]` is still to go out.
    held: Vec<u8>,
    sent: usize,
    /// A large write came since the last flush (GATHER-3).
    large_since_flush: bool,
}

impl<S> WriteGather<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> WriteGather<S> {
        WriteGather {
            inner,
            held: Vec::new(),
            sent: 0,
            large_since_flush: false,
        }
    }
}

impl<S> WriteGather<S> {
    /// The held bytes not yet passed on.
    fn pending(&self) -> usize {
        self.held.len() - self.sent
    }
}

impl<S: AsyncWrite + Unpin> WriteGather<S> {
    /// Passes every held byte on.
    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.pending() > 0 {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.held.clear();
        self.sent = 0;
        if self.held.capacity() > KEEP_CAPACITY {
            self.held = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteGather<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending() > GATHER_MAX {
            // GATHER-4.
            ready!(this.poll_release(cx))?;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if this.pending() == 0 && total < LARGE_WRITE {
            // GATHER-2: a small write with nothing held passes at once.
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        for buf in bufs {
            this.held.extend_from_slice(buf);
        }
        if total >= LARGE_WRITE {
            this.large_since_flush = true;
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let held = this.pending();
        if this.large_since_flush && held > 0 && held <= GATHER_MAX {
            // GATHER-3: put off by one turn of the task.
            this.large_since_flush = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.large_since_flush = false;
        ready!(this.poll_release(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteGather<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};

    use super::*;

    /// A stream that records each write it is given, taking at most `per_write` bytes.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        per_write: Option<usize>,
        flushes: usize,
        shut: bool,
    }

    impl Recorder {
        fn bytes(&self) -> Vec<u8> {
            self.writes.concat()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            let n = this.per_write.map_or(buf.len(), |max| buf.len().min(max));
            this.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    /// Counts the wakes of the task that polls.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Poller {
        wakes: Arc<Wakes>,
        waker: Waker,
    }

    impl Poller {
        fn new() -> Poller {
            let wakes = Arc::new(Wakes::default());
            let waker = Waker::from(wakes.clone());
            Poller { wakes, waker }
        }

        fn woken(&self) -> usize {
            self.wakes.0.load(Ordering::SeqCst)
        }

        fn write(&self, gather: &mut WriteGather<Recorder>, bytes: &[u8]) {
            let mut cx = Context::from_waker(&self.waker);
            match Pin::new(gather).poll_write(&mut cx, bytes) {
                Poll::Ready(Ok(n)) => assert_eq!(n, bytes.len(), "a write is taken whole"),
                other => panic!("write: {other:?}"),
            }
        }

        fn flush(&self, gather: &mut WriteGather<Recorder>) {
            let mut cx = Context::from_waker(&self.waker);
            match Pin::new(gather).poll_flush(&mut cx) {
                Poll::Ready(Ok(())) => {}
                other => panic!("flush: {other:?}"),
            }
        }
    }

    /// A DATA frame's worth of bytes, numbered so that order shows.
    fn frame(n: u8) -> Vec<u8> {
        vec![n; LARGE_WRITE]
    }

    #[test]
    fn small_writes_pass_at_once() {
        let poller = Poller::new();
        let mut gather = WriteGather::new(Recorder::default());
        poller.write(&mut gather, b"headers");
        poller.write(&mut gather, b"trailers");
        assert_eq!(
            gather.inner.writes,
            [b"headers".to_vec(), b"trailers".to_vec()]
        );
        poller.flush(&mut gather);
        assert_eq!(
            gather.inner.flushes, 1,
            "a flush after small writes is not put off"
        );
        assert_eq!(poller.woken(), 0);
    }

    #[test]
    fn a_large_answer_leaves_in_one_write_after_a_quiet_flush() {
        let poller = Poller::new();
        let mut gather = WriteGather::new(Recorder::default());
        poller.write(&mut gather, b"headers");
        let mut expected = b"headers".to_vec();
        // h2 flushes after every DATA frame it writes; each flush is put off (GATHER-3).
        for n in 1..=3 {
            poller.write(&mut gather, &frame(n));
            expected.extend_from_slice(&frame(n));
            poller.flush(&mut gather);
            assert_eq!(
                poller.woken(),
                n as usize,
                "the task is woken to flush again"
            );
        }
        // The last, short frame and the trailers are held behind the frames (GATHER-1).
        poller.write(&mut gather, b"end");
        poller.write(&mut gather, b"trailers");
        expected.extend_from_slice(b"endtrailers");
        assert_eq!(gather.inner.writes.len(), 1, "only the headers went out");
        assert_eq!(gather.inner.flushes, 0);
        // The flush at the end of the poll comes after small writes: it passes everything.
        poller.flush(&mut gather);
        assert_eq!(gather.inner.writes.len(), 2, "the rest in one write");
        assert_eq!(gather.inner.bytes(), expected);
        assert_eq!(gather.inner.flushes, 1);
    }

    #[test]
    fn a_flush_is_put_off_by_one_turn_only() {
        let poller = Poller::new();
        let mut gather = WriteGather::new(Recorder::default());
        // A flow-control pause: h2 writes a frame, flushes, and has nothing more to write.
        poller.write(&mut gather, &frame(1));
        poller.flush(&mut gather);
        assert!(gather.inner.writes.is_empty(), "put off");
        assert_eq!(poller.woken(), 1);
        poller.flush(&mut gather);
        assert_eq!(
            gather.inner.bytes(),
            frame(1),
            "the next flush passes it on"
        );
        poller.flush(&mut gather);
        assert_eq!(poller.woken(), 1, "nothing held: no more wakes");
    }

    #[test]
    fn a_full_gather_goes_out_before_the_next_write() {
        let poller = Poller::new();
        let mut gather = WriteGather::new(Recorder::default());
        let frames = GATHER_MAX / LARGE_WRITE + 1;
        for n in 0..frames {
            poller.write(&mut gather, &frame(n as u8));
        }
        assert!(gather.inner.writes.is_empty(), "up to the bound, held");
        poller.write(&mut gather, b"next");
        // Past it, out before the next write, which then, small with nothing held, passes.
        assert_eq!(gather.inner.writes.len(), 2);
        assert_eq!(gather.inner.writes[0].len(), frames * LARGE_WRITE);
        assert_eq!(gather.inner.writes[1], b"next");
        // Nothing is held now: the flush is not put off, and nobody is woken.
        poller.flush(&mut gather);
        assert_eq!(poller.woken(), 0);
        // A flush with more than the bound held is not put off (GATHER-4).
        for n in 0..frames {
            poller.write(&mut gather, &frame(n as u8));
        }
        poller.flush(&mut gather);
        assert_eq!(
            gather.inner.bytes().len(),
            2 * frames * LARGE_WRITE + b"next".len()
        );
    }

    #[test]
    fn partial_writes_and_shutdown_pass_everything_in_order() {
        let poller = Poller::new();
        let mut gather = WriteGather::new(Recorder {
            per_write: Some(5_000),
            ..Recorder::default()
        });
        let mut expected = Vec::new();
        for n in 1..=2 {
            poller.write(&mut gather, &frame(n));
            expected.extend_from_slice(&frame(n));
        }
        let mut cx = Context::from_waker(&poller.waker);
        match Pin::new(&mut gather).poll_shutdown(&mut cx) {
            Poll::Ready(Ok(())) => {}
            other => panic!("shutdown: {other:?}"),
        }
        assert!(gather.inner.shut);
        assert_eq!(gather.inner.bytes(), expected, "held bytes go out first");
        assert!(gather.inner.writes.iter().all(|w| w.len() <= 5_000));
    }
}
