//! A connection wrapper that lets the acknowledgement of an HTTP/2 PING leave with the next
//! thing the server writes, instead of in a write of its own.
//!
//! Why: gRPC-go's client transport (etcd's clients, etcdctl, etcd's benchmark) sends a
//! bandwidth-estimation PING with the first DATA frame it receives after its last PING was
//! acknowledged, so a client making one call at a time sends a PING with every call: its
//! WINDOW_UPDATE, PING and next request arrive in one read. h2 answers the PING at once, in a
//! write of its own, before the request is even handled: one `writev` and one wake-up of the
//! client more per call, on the call's path (measured under one client: 10,002 `writev`s for
//! 5,000 puts, the PING ACK's before each put's log sync). Held here, the acknowledgement
//! goes out in the same write as the answer.
//!
//! Owns: at most one PING ACK frame (17 bytes) written by h2 and not yet passed on.
//!
//! Invariants:
//! - PONG-1: only a write that is exactly one PING frame with the ACK flag is held, and only
//!   while an answer is due: the latest read brought a request (a HEADERS frame) and nothing
//!   else was written since. Every other byte passes through at once, and in order: a held
//!   frame goes out before any byte written after it. (A PING that comes without a request,
//!   as during a large answer, whose flow-control round trips the client times with it, is
//!   answered at once.)
//! - PONG-2: a held frame goes out with the next write, or when a flush finds it held for
//!   [`PONG_HOLD_MAX`], or at shutdown, whichever comes first; a flush waits for that
//!   (h2 flushes after every round of writes, so the wait only delays the acknowledgement,
//!   not anything written after it).
//! - PONG-3: a held frame counts as written (h2 is told so), so h2's own buffers and flow
//!   control never see the hold.
//!
//! The price: a PING is answered up to [`PONG_HOLD_MAX`] later than it could be. RFC 9113
//! asks that PING responses be given higher priority than any other frame (a SHOULD); a
//! client measuring round trips with PINGs (gRPC's bandwidth estimator, keep-alive) sees at
//! most that much more, far below any keep-alive timeout.
//!
//! Contact points: `server::connections` wraps every connection's stream (under TLS, the
//! decrypted one) before [`crate::authority::AuthorityFix`], whose frame-header parser it
//! uses to find a request's HEADERS frame.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use crate::authority::{FRAME_HEADER_BYTES, FRAME_HEADERS, FrameHeader};

/// The longest a PING acknowledgement waits for something to leave with (PONG-2).
pub const PONG_HOLD_MAX: Duration = Duration::from_millis(2);

/// Bytes of a PING frame: a 9-byte header and 8 bytes of opaque data.
const PING_FRAME_BYTES: usize = 17;
/// The header of a PING ACK frame: length 8, type 6 (PING), flags 1 (ACK), stream 0.
const PING_ACK_HEADER: [u8; 9] = [0, 0, 8, 6, 1, 0, 0, 0, 0];

/// A stream whose PING acknowledgements wait for the next write (PONG-1..3).
#[derive(Debug)]
pub struct PongHold<S> {
    inner: S,
    /// The held frame; `held[sent..]` is still to go out.
    held: Vec<u8>,
    sent: usize,
    /// When the held frame must go out at the latest; meaningful only while a frame is held.
    /// Made at the first hold and reset at every later one: a reset to a later deadline is an
    /// atomic store, where a new timer each hold would wake the runtime's driver through its
    /// eventfd once per call (one `write` and one more `epoll_wait` per put, measured).
    deadline: Option<Pin<Box<Sleep>>>,
    hold: Duration,
    /// The latest read brought a request (a HEADERS frame), and nothing but PING ACKs was
    /// written since: an answer is coming (PONG-1).
    answer_due: bool,
}

impl<S> PongHold<S> {
    /// Wraps `inner`, holding a PING acknowledgement for at most [`PONG_HOLD_MAX`].
    pub fn new(inner: S) -> PongHold<S> {
        PongHold::holding_for(inner, PONG_HOLD_MAX)
    }

    /// Wraps `inner`, holding a PING acknowledgement for at most `hold`.
    pub fn holding_for(inner: S, hold: Duration) -> PongHold<S> {
        PongHold {
            inner,
            held: Vec::with_capacity(PING_FRAME_BYTES),
            sent: 0,
            deadline: None,
            hold,
            answer_due: false,
        }
    }
}

/// Returns true if `bufs` together are exactly one PING frame with the ACK flag.
fn is_ping_ack(bufs: &[IoSlice<'_>]) -> bool {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if total != PING_FRAME_BYTES {
        return false;
    }
    let mut header = [0u8; PING_ACK_HEADER.len()];
    let mut filled = 0;
    for buf in bufs {
        let take = buf.len().min(header.len() - filled);
        header[filled..filled + take].copy_from_slice(&buf[..take]);
        filled += take;
        if filled == header.len() {
            break;
        }
    }
    header == PING_ACK_HEADER
}

/// Returns true if `bytes`, read as whole frames from their start, hold a HEADERS frame.
/// A read need not start at a frame boundary; a wrong guess only decides whether one
/// acknowledgement waits (PONG-2 bounds the wait), never what is sent.
fn holds_headers(bytes: &[u8]) -> bool {
    let mut at = 0;
    while let Some(header) = bytes.get(at..).and_then(FrameHeader::parse) {
        if header.kind == FRAME_HEADERS {
            return true;
        }
        at += FRAME_HEADER_BYTES + header.len;
    }
    false
}

impl<S: AsyncWrite + Unpin> PongHold<S> {
    /// Passes the held frame on, followed in the same writes by as much of `bufs` as the
    /// socket takes once the frame is out (PONG-1). Returns how many bytes of `bufs` went
    /// out: 0 when `bufs` is empty, or when the frame's last byte ended a write.
    fn poll_release(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        while self.sent < self.held.len() {
            let mut slices = Vec::with_capacity(bufs.len() + 1);
            slices.push(IoSlice::new(&self.held[self.sent..]));
            slices.extend(bufs.iter().map(|b| IoSlice::new(b)));
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let rest = self.held.len() - self.sent;
            if n < rest {
                self.sent += n;
                continue;
            }
            self.clear();
            return Poll::Ready(Ok(n - rest));
        }
        Poll::Ready(Ok(0))
    }

    fn clear(&mut self) {
        self.held.clear();
        self.sent = 0;
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PongHold<S> {
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
        let ack = is_ping_ack(bufs);
        if !ack {
            // These bytes are the answer, or something else: either way no answer is due.
            this.answer_due = false;
        }
        // PONG-1: a held frame goes out first, in the same write when the socket takes it.
        let written = ready!(this.poll_release(cx, bufs))?;
        if written > 0 {
            return Poll::Ready(Ok(written));
        }
        if ack && this.answer_due {
            this.held.clear();
            for buf in bufs {
                this.held.extend_from_slice(buf);
            }
            this.sent = 0;
            let until = tokio::time::Instant::now() + this.hold;
            match this.deadline.as_mut() {
                Some(deadline) => deadline.as_mut().reset(until),
                None => this.deadline = Some(Box::pin(tokio::time::sleep_until(until))),
            }
            // PONG-3: counted as written.
            return Poll::Ready(Ok(PING_FRAME_BYTES));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.sent < this.held.len() {
            // PONG-2: wait for the next write, or for the deadline.
            if let Some(deadline) = this.deadline.as_mut() {
                ready!(deadline.as_mut().poll(cx));
            }
            ready!(this.poll_release(cx, &[]))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx, &[]))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PongHold<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if holds_headers(&buf.filled()[before..]) {
            this.answer_due = true;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ping(ack: bool) -> Vec<u8> {
        let mut frame = vec![0, 0, 8, 6, u8::from(ack), 0, 0, 0, 0];
        frame.extend_from_slice(b"12345678");
        frame
    }

    /// A HEADERS frame's worth of bytes (the content does not matter to the wrapper): a
    /// request when read, an answer when written.
    const ANSWER: &[u8] = b"\x00\x00\x03\x01\x04\x00\x00\x00\x01abc";
    /// A WINDOW_UPDATE frame.
    const WINDOW_UPDATE: &[u8] = b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x10\x00";

    /// Has the wrapper read `frames` from the client.
    async fn client_sends(
        held: &mut PongHold<tokio::io::DuplexStream>,
        far: &mut tokio::io::DuplexStream,
        frames: &[u8],
    ) {
        far.write_all(frames).await.expect("write");
        let mut got = vec![0u8; frames.len()];
        held.read_exact(&mut got).await.expect("read");
        assert_eq!(got, frames, "reads pass through unchanged");
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// Reads what is available now (a duplex pipe holds what was written).
    async fn available(reader: &mut tokio::io::DuplexStream) -> Vec<u8> {
        let mut out = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_millis(50), reader.read(&mut out))
            .await
            .map_or(0, |read| read.expect("read"));
        out.truncate(n);
        out
    }

    #[test]
    fn a_ping_ack_leaves_with_the_next_write_in_order() {
        runtime().block_on(async {
            let (near, mut far) = tokio::io::duplex(4096);
            let mut held = PongHold::holding_for(near, Duration::from_secs(3600));
            client_sends(
                &mut held,
                &mut far,
                &[WINDOW_UPDATE, &ping(false), ANSWER].concat(),
            )
            .await;
            let n = held.write(&ping(true)).await.expect("write");
            assert_eq!(n, PING_FRAME_BYTES, "counted as written (PONG-3)");
            assert!(available(&mut far).await.is_empty(), "held, not sent");
            held.write_all(ANSWER).await.expect("write");
            let mut expected = ping(true);
            expected.extend_from_slice(ANSWER);
            assert_eq!(
                available(&mut far).await,
                expected,
                "the ACK first, then the answer"
            );
        });
    }

    #[test]
    fn a_held_ping_ack_goes_out_at_the_deadline_or_at_shutdown() {
        runtime().block_on(async {
            let (near, mut far) = tokio::io::duplex(4096);
            let mut held = PongHold::holding_for(near, Duration::from_millis(5));
            client_sends(&mut held, &mut far, ANSWER).await;
            held.write_all(&ping(true)).await.expect("write");
            // The flush waits for the deadline, then passes the frame on (PONG-2).
            held.flush().await.expect("flush");
            assert_eq!(available(&mut far).await, ping(true));

            let (near, mut far) = tokio::io::duplex(4096);
            let mut held = PongHold::holding_for(near, Duration::from_secs(3600));
            client_sends(&mut held, &mut far, ANSWER).await;
            held.write_all(&ping(true)).await.expect("write");
            assert!(available(&mut far).await.is_empty(), "held");
            held.shutdown().await.expect("shutdown");
            assert_eq!(available(&mut far).await, ping(true));
        });
    }

    #[test]
    fn everything_else_passes_at_once() {
        runtime().block_on(async {
            let (near, mut far) = tokio::io::duplex(4096);
            let mut held = PongHold::holding_for(near, Duration::from_secs(3600));
            // With no request read, a PING ACK is not held.
            held.write_all(&ping(true)).await.expect("write");
            assert_eq!(available(&mut far).await, ping(true), "no answer due");
            // Nor after a read without a request (a PING amid a large answer).
            client_sends(&mut held, &mut far, &[WINDOW_UPDATE, &ping(false)].concat()).await;
            held.write_all(&ping(true)).await.expect("write");
            assert_eq!(
                available(&mut far).await,
                ping(true),
                "no request in the read"
            );
            // With a request read: a PING that asks for an acknowledgement, a frame written
            // with a PING ACK, and any other frame pass at once (PONG-1) ...
            client_sends(&mut held, &mut far, ANSWER).await;
            for bytes in [
                ping(false),
                [ping(true), ANSWER.to_vec()].concat(),
                ANSWER.to_vec(),
            ] {
                held.write_all(&bytes).await.expect("write");
                assert_eq!(available(&mut far).await, bytes);
            }
            // ... and once something was written, the answer is no longer due.
            held.write_all(&ping(true)).await.expect("write");
            assert_eq!(available(&mut far).await, ping(true), "answered already");
            held.flush()
                .await
                .expect("nothing held: the flush does not wait");
        });
    }

    #[test]
    fn only_a_whole_ping_ack_is_recognised() {
        let ack = ping(true);
        let split = [IoSlice::new(&ack[..4]), IoSlice::new(&ack[4..])];
        assert!(is_ping_ack(&split), "split across slices");
        assert!(!is_ping_ack(&[IoSlice::new(&ping(false))]));
        assert!(!is_ping_ack(&[IoSlice::new(&ack[..16])]));
        let mut other_stream = ping(true);
        other_stream[8] = 1;
        assert!(!is_ping_ack(&[IoSlice::new(&other_stream)]));
        assert!(holds_headers(
            &[WINDOW_UPDATE, &ping(false), ANSWER].concat()
        ));
        assert!(!holds_headers(&[WINDOW_UPDATE, &ping(false)].concat()));
        assert!(
            !holds_headers(&ANSWER[..8]),
            "a partial header is not a frame"
        );
    }
}
