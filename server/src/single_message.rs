//! A request body wrapper that lets at most one gRPC message through: every etcd method
//! except `Watch` and `LeaseKeepAlive` takes exactly one request message, and a request
//! carrying more is a cardinality violation.
//!
//! Why: tonic decodes a unary request's first message and silently drops any that follow
//! (it drains the body to reach the trailers), so a client that sent two Puts in one call
//! would see the first applied and the second lost without an error. gRPC-go, which etcd
//! runs, answers such a call with `INTERNAL`; so does kvd.
//!
//! Owns: the count of gRPC message boundaries in one request body.
//!
//! Invariants:
//! - ONE-1: the wrapper passes every byte of the first message through unchanged; the first
//!   byte of a second message turns into a body error carrying [`cardinality_violation`],
//!   which tonic reports as the call's status. Because tonic reads the whole request body
//!   before it calls a unary handler, the handler never runs for such a call: nothing of it
//!   is applied.
//! - ONE-2: the framing parser is total: it only counts bytes (a 1-byte flag and a 4-byte
//!   big-endian length per message), so no input makes it panic.
//!
//! Contact points: `server::http::track` wraps the body of every gRPC request: one whose
//! method is client-streaming ([`is_client_streaming`]) with [`SingleMessage::passing`],
//! which lets every message through, so that every gRPC call's body has one type.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::Frame;
use tonic::Status;

/// Bytes of a gRPC message prefix: the compressed flag and the big-endian length.
const PREFIX_BYTES: usize = 5;

/// The methods whose requests are streams of messages.
const CLIENT_STREAMING_PATHS: [&str; 2] = [
    "/etcdserverpb.Watch/Watch",
    "/etcdserverpb.Lease/LeaseKeepAlive",
];

/// Returns true if the gRPC method at `path` takes a stream of request messages.
pub fn is_client_streaming(path: &str) -> bool {
    CLIENT_STREAMING_PATHS.contains(&path)
}

/// Returns the status of a call that carried more than one request message (gRPC-go's code).
pub fn cardinality_violation() -> Status {
    Status::internal(
        "grpc: cardinality violation: received more than one request message \
         for a method that takes one",
    )
}

/// Where the parser is in the request's gRPC framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Reading the prefix of the first message: bytes of it seen so far, and its length.
    Prefix { seen: usize, len: u32 },
    /// Inside the first message's payload: bytes still to come.
    Payload(u64),
    /// The first message is complete; any further byte starts a second one.
    Done,
    /// The method takes a stream of messages: every byte passes.
    Any,
}

impl Framing {
    /// Advances over `bytes`; returns false if they go past the end of the first message.
    fn advance(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            match *self {
                Framing::Prefix { seen, len } => {
                    let byte = bytes[0];
                    bytes = &bytes[1..];
                    // Byte 0 is the compressed flag; bytes 1..5 the length.
                    let len = if seen == 0 {
                        len
                    } else {
                        len << 8 | u32::from(byte)
                    };
                    *self = if seen + 1 == PREFIX_BYTES {
                        Framing::Payload(u64::from(len))
                    } else {
                        Framing::Prefix {
                            seen: seen + 1,
                            len,
                        }
                    };
                }
                Framing::Payload(0) => *self = Framing::Done,
                Framing::Payload(left) => {
                    let take = usize::try_from(left).map_or(bytes.len(), |l| l.min(bytes.len()));
                    bytes = &bytes[take..];
                    *self = Framing::Payload(left - take as u64);
                }
                Framing::Done => return false,
                Framing::Any => return true,
            }
        }
        if *self == Framing::Payload(0) {
            *self = Framing::Done;
        }
        true
    }
}

/// A request body that fails at the first byte of a second gRPC message (ONE-1).
pub struct SingleMessage<B> {
    inner: B,
    framing: Framing,
    failed: bool,
}

impl<B> SingleMessage<B> {
    /// Wraps the request body `inner` of a method that takes one message.
    pub fn wrap(inner: B) -> SingleMessage<B> {
        SingleMessage {
            inner,
            framing: Framing::Prefix { seen: 0, len: 0 },
            failed: false,
        }
    }

    /// Wraps the request body `inner` of a method that takes a stream: nothing is refused.
    pub fn passing(inner: B) -> SingleMessage<B> {
        SingleMessage {
            inner,
            framing: Framing::Any,
            failed: false,
        }
    }
}

impl<B> http_body::Body for SingleMessage<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let past_first = frame
                    .data_ref()
                    .is_some_and(|data| !this.framing.advance(data.chunk()));
                if past_first {
                    this.failed = true;
                    return Poll::Ready(Some(Err(Box::new(cardinality_violation()))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn one_message_in_any_split_passes() {
        let bytes = message(b"hello");
        for split in 0..=bytes.len() {
            let mut framing = Framing::Prefix { seen: 0, len: 0 };
            assert!(framing.advance(&bytes[..split]));
            assert!(framing.advance(&bytes[split..]));
            assert_eq!(framing, Framing::Done, "split at {split}");
        }
    }

    #[test]
    fn a_stream_lets_every_message_through() {
        let mut two = message(b"first");
        two.extend(message(b"second"));
        let mut framing = Framing::Any;
        assert!(framing.advance(&two));
        assert!(framing.advance(&two));
        assert_eq!(framing, Framing::Any);
    }

    #[test]
    fn an_empty_message_is_one_message() {
        let mut framing = Framing::Prefix { seen: 0, len: 0 };
        assert!(framing.advance(&message(b"")));
        assert_eq!(framing, Framing::Done);
    }

    #[test]
    fn a_second_message_is_refused_wherever_it_starts() {
        let mut two = message(b"first");
        two.extend(message(b"second"));
        for split in 0..=two.len() {
            let mut framing = Framing::Prefix { seen: 0, len: 0 };
            let ok = framing.advance(&two[..split]) && framing.advance(&two[split..]);
            assert!(!ok, "split at {split}");
        }
    }
}
