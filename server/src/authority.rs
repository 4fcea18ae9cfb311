//! A connection wrapper that repairs the HTTP/2 `:authority` etcd's Go clients send, so that
//! the HTTP/2 server accepts their requests.
//!
//! Why: etcdctl 3.4 dials each endpoint of `endpoint status`, `endpoint hashkv` and `defrag`
//! as `passthrough:///http://127.0.0.1:2379`, and gRPC-go then sends the `:authority`
//! `http://127.0.0.1:2379` (etcd 3.5.0's client sent `#initially=[...]`). gRPC-go's server
//! ignores the authority; hyper's HTTP/2 layer (h2) rejects such a request with
//! `RST_STREAM(PROTOCOL_ERROR)` before any handler runs, and offers no switch to relax that.
//! This wrapper sits between the socket and hyper and rewrites such an authority value to a
//! valid one of the same length (`-…-@127.0.0.1:2379`, or `x…x`), which nothing in kvd reads.
//!
//! Owns: the bytes of client-to-server HTTP/2 header blocks, nothing else.
//!
//! Invariants:
//! - AUTH-1: only an `:authority` value that the HTTP `Authority` parser rejects is changed;
//!   every other byte the client sends reaches hyper unchanged, in order.
//! - AUTH-2: a rewritten value has the same decoded length as the original, so the HPACK
//!   dynamic tables of the client's encoder and hyper's decoder keep identical sizes and
//!   indices; later requests that refer to the entry get the repaired value, and the wrapper
//!   needs no HPACK table of its own.
//! - AUTH-3: anything the wrapper does not understand (not HTTP/2, a malformed frame or header
//!   block, a block over [`HEADER_BLOCK_BYTES_MAX`]) is passed through unchanged, so hyper
//!   reports the error it would have reported without the wrapper. By AUTH-2, falling back
//!   to pass-through at any point is safe.
//! - AUTH-4: every decoder here is total: bad bytes lead to pass-through, never a panic.
//! - AUTH-5: whenever the wrapper waits for the socket, it tells the connection's watchdog
//!   whether it holds an unfinished piece of HTTP/2 input (the preface, a frame header, a
//!   header block or the rest of a forwarded frame), so a stalled client is closed after
//!   the header timeout (CONN-2).
//! - AUTH-6: the wrapper holds at most [`HEADER_BLOCK_BYTES_MAX`] (one frame's worth) of
//!   unexamined input per connection: a HEADERS frame announcing more than the maximum frame
//!   size, or a header block that does not fit, passes through at once (AUTH-3), and reads
//!   from the socket never go past the bound.
//!
//! Contact points: `server::connections` wraps every accepted TCP connection
//! ([`AuthorityFix::watched`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::connections::Activity;
use axum::http::uri::Authority;
use bytes::{Buf, BufMut, BytesMut};
use fluke_hpack::huffman::HuffmanDecoder;
use kvd::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Bytes of an HTTP/2 frame header.
pub(crate) const FRAME_HEADER_BYTES: usize = 9;
/// Largest frame payload the wrapper writes or examines: HTTP/2's default
/// SETTINGS_MAX_FRAME_SIZE, which hyper's server keeps (and enforces) unless configured
/// otherwise.
const FRAME_PAYLOAD_BYTES_MAX: usize = 16_384;
/// Largest header block (HEADERS plus CONTINUATIONs, frame headers included) the wrapper
/// holds to examine: one frame's worth (AUTH-6). Larger ones pass through unchanged
/// (AUTH-3); hyper's own limit on a header list is 16 KiB by default, so a request whose
/// block is larger would be refused anyway.
pub const HEADER_BLOCK_BYTES_MAX: usize = FRAME_HEADER_BYTES + FRAME_PAYLOAD_BYTES_MAX;
/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 16_384;
/// Largest HPACK integer continuation shift accepted (values up to 2^35).
const HPACK_INT_SHIFT_MAX: u32 = 28;

/// HTTP/2's frame type HEADERS.
pub(crate) const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Bytes of the priority fields of a HEADERS frame with the PRIORITY flag.
const PRIORITY_BYTES: usize = 5;
/// HPACK static table index of `:authority`.
const STATIC_AUTHORITY_INDEX: u64 = 1;

const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX > PRIORITY_BYTES);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Matching the HTTP/2 preface.
    Preface,
    /// Reading HTTP/2 frames.
    Frames,
    /// Not HTTP/2, or given up (AUTH-3): bytes go through unchanged.
    Passthrough,
}

/// A client connection whose HTTP/2 header blocks get their `:authority` repaired.
pub struct AuthorityFix<S> {
    inner: S,
    mode: Mode,
    /// Bytes read from the socket and not yet handed to hyper: the first `examined` of
    /// them are examined and ready for hyper, the rest not yet examined. One buffer that is
    /// only ever advanced, never split, so its storage is reused read after read.
    input: BytesMut,
    /// How many bytes at the front of `input` are examined.
    examined: usize,
    /// Payload bytes of the current non-header frame still to forward unchanged.
    forward_remaining: usize,
    /// The socket reported end of stream.
    eof: bool,
    /// Built on first use: constructing it builds its code tables.
    huffman: Option<HuffmanDecoder>,
    /// Where the connection's watchdog learns of unfinished input (AUTH-5).
    activity: Option<Arc<Activity>>,
}

impl<S> std::fmt::Debug for AuthorityFix<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorityFix")
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl<S> AuthorityFix<S> {
    /// Wraps the connection `inner`.
    pub fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            mode: Mode::Preface,
            input: BytesMut::new(),
            examined: 0,
            forward_remaining: 0,
            eof: false,
            huffman: None,
            activity: None,
        }
    }

    /// Wraps the connection `inner` and reports to `activity` whenever it waits for input
    /// with an unfinished piece in hand (AUTH-5).
    pub fn watched(inner: S, activity: Arc<Activity>) -> AuthorityFix<S> {
        AuthorityFix {
            activity: Some(activity),
            ..AuthorityFix::new(inner)
        }
    }

    /// Tells the watchdog, before waiting for the socket, whether an unfinished preface,
    /// frame or header block is held (AUTH-5).
    fn note_wait(&self) {
        let Some(activity) = &self.activity else {
            return;
        };
        let holding = match self.mode {
            Mode::Preface => true,
            Mode::Frames => !self.unexamined().is_empty() || self.forward_remaining > 0,
            // HTTP/1: hyper's header read timeout watches the request head.
            Mode::Passthrough => false,
        };
        if holding {
            activity.unfinished();
        } else {
            activity.finished();
        }
    }

    /// The bytes read and not yet examined.
    fn unexamined(&self) -> &[u8] {
        &self.input[self.examined..]
    }

    /// Examines bytes of `input` and marks them ready for hyper; returns false when more
    /// input is needed to make progress.
    fn process(&mut self) -> bool {
        match self.mode {
            Mode::Passthrough => {
                if self.unexamined().is_empty() {
                    return false;
                }
                self.examined = self.input.len();
                true
            }
            Mode::Preface => {
                let input = self.unexamined();
                let seen = input.len().min(PREFACE.len());
                if input[..seen] != PREFACE[..seen] {
                    self.mode = Mode::Passthrough;
                    return true;
                }
                if seen < PREFACE.len() {
                    return false;
                }
                self.examined += PREFACE.len();
                self.mode = Mode::Frames;
                true
            }
            Mode::Frames => self.process_frame(),
        }
    }

    fn process_frame(&mut self) -> bool {
        if self.forward_remaining > 0 {
            let n = self.forward_remaining.min(self.unexamined().len());
            if n == 0 {
                return false;
            }
            self.examined += n;
            self.forward_remaining -= n;
            return true;
        }
        let Some(header) = FrameHeader::parse(self.unexamined()) else {
            return false;
        };
        if header.kind != FRAME_HEADERS {
            self.examined += FRAME_HEADER_BYTES;
            self.forward_remaining = header.len;
            return true;
        }
        if header.len > FRAME_PAYLOAD_BYTES_MAX {
            // AUTH-6: hyper refuses a frame over its maximum size as soon as it reads the
            // frame header; holding its payload would only cost memory.
            self.mode = Mode::Passthrough;
            return true;
        }
        match header_block_extent(self.unexamined()) {
            Extent::Incomplete if self.unexamined().len() < HEADER_BLOCK_BYTES_MAX => false,
            Extent::Incomplete | Extent::Malformed => {
                self.mode = Mode::Passthrough;
                true
            }
            Extent::Complete(end) => {
                let start = self.examined;
                let huffman = self.huffman.get_or_insert_with(HuffmanDecoder::new);
                match rewrite_frames(&self.input[start..start + end], huffman) {
                    Some(rewritten) => {
                        tracing::debug!("repaired an HTTP/2 :authority the server would refuse");
                        let rest = self.input.split_off(start + end);
                        self.input.truncate(start);
                        self.input.extend_from_slice(&rewritten);
                        self.input.extend_from_slice(&rest);
                        self.examined = start + rewritten.len();
                    }
                    None => self.examined = start + end,
                }
                true
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            // Each step examines more or gives up (AUTH-3), so this ends.
            while this.process() {}
            if this.examined > 0 {
                let n = buf.remaining().min(this.examined);
                buf.put_slice(&this.input[..n]);
                this.input.advance(n);
                this.examined -= n;
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                if this.input.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                // A truncated frame at the end: hand it over as it is (AUTH-3).
                this.mode = Mode::Passthrough;
                continue;
            }
            // AUTH-6: never read past what the wrapper may hold. `process` only asks for
            // more while the input is under the bound, so there is room for a byte at least.
            let room = HEADER_BLOCK_BYTES_MAX
                .saturating_sub(this.input.len())
                .clamp(1, READ_CHUNK_BYTES);
            this.input.reserve(room);
            let mut spare = (&mut this.input).limit(room);
            match tokio_util::io::poll_read_buf(Pin::new(&mut this.inner), cx, &mut spare) {
                Poll::Pending => {
                    this.note_wait();
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(0)) => this.eof = true,
                Poll::Ready(Ok(_)) => {}
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// An HTTP/2 frame header (also read by `pong`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    pub(crate) len: usize,
    pub(crate) kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    /// Returns the frame header at the start of `bytes`, if all nine bytes are there.
    pub(crate) fn parse(bytes: &[u8]) -> Option<FrameHeader> {
        let head: &[u8; FRAME_HEADER_BYTES] = bytes.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        Some(FrameHeader {
            len,
            kind: head[3],
            flags: head[4],
            stream,
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        let len = self.len.to_be_bytes();
        out.extend_from_slice(&len[len.len() - 3..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// How much of the input a header block (HEADERS and its CONTINUATIONs) occupies.
#[derive(Debug, PartialEq, Eq)]
enum Extent {
    /// The block ends at this offset.
    Complete(usize),
    /// More bytes are needed.
    Incomplete,
    /// Not a well-formed sequence; hyper will say why.
    Malformed,
}

/// Returns the extent of the header block that starts with the HEADERS frame at `bytes[0]`.
fn header_block_extent(bytes: &[u8]) -> Extent {
    let mut offset = 0;
    let mut first = true;
    loop {
        let Some(header) = bytes.get(offset..).and_then(FrameHeader::parse) else {
            return Extent::Incomplete;
        };
        let expected = if first {
            FRAME_HEADERS
        } else {
            FRAME_CONTINUATION
        };
        if header.kind != expected {
            return Extent::Malformed;
        }
        first = false;
        offset += FRAME_HEADER_BYTES + header.len;
        if offset > bytes.len() {
            return Extent::Incomplete;
        }
        if header.flags & FLAG_END_HEADERS != 0 {
            return Extent::Complete(offset);
        }
    }
}

/// Returns the frames of a complete header block with a repaired `:authority`, or `None` if
/// nothing needs repair or the block is not understood (AUTH-1, AUTH-3).
fn rewrite_frames(frames: &[u8], huffman: &mut HuffmanDecoder) -> Option<Vec<u8>> {
    let first = FrameHeader::parse(frames)?;
    let payload = frames.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + first.len)?;
    let (priority, fragment) = split_headers_payload(first.flags, payload)?;
    let mut block = fragment.to_vec();
    let mut offset = FRAME_HEADER_BYTES + first.len;
    while offset < frames.len() {
        let next = FrameHeader::parse(frames.get(offset..)?)?;
        let start = offset + FRAME_HEADER_BYTES;
        block.extend_from_slice(frames.get(start..start + next.len)?);
        offset = start + next.len;
    }
    let fixed = fix_header_block(&block, huffman)?;
    Some(frame_header_block(first, priority, &fixed))
}

/// Splits a HEADERS payload into its priority fields (if flagged) and the block fragment,
/// dropping padding.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<&[u8]>, &[u8])> {
    let mut rest = payload;
    if flags & FLAG_PADDED != 0 {
        let (&pad, after) = rest.split_first()?;
        rest = after.get(..after.len().checked_sub(usize::from(pad))?)?;
    }
    let priority = if flags & FLAG_PRIORITY != 0 {
        let (fields, after) = rest.split_at_checked(PRIORITY_BYTES)?;
        rest = after;
        Some(fields)
    } else {
        None
    };
    Some((priority, rest))
}

/// Returns HEADERS (+ CONTINUATION) frames carrying `block`, keeping END_STREAM and the
/// priority fields of the original first frame, without padding.
fn frame_header_block(first: FrameHeader, priority: Option<&[u8]>, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 2 * FRAME_HEADER_BYTES + PRIORITY_BYTES);
    let priority = priority.unwrap_or_default();
    let first_room = FRAME_PAYLOAD_BYTES_MAX - priority.len();
    let (head, mut rest) = block.split_at(block.len().min(first_room));
    let mut flags = first.flags & (FLAG_END_STREAM | FLAG_PRIORITY);
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    let len = priority.len() + head.len();
    FrameHeader {
        len,
        kind: FRAME_HEADERS,
        flags,
        stream: first.stream,
    }
    .write(&mut out);
    out.extend_from_slice(priority);
    out.extend_from_slice(head);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(FRAME_PAYLOAD_BYTES_MAX));
        rest = after;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        let header = FrameHeader {
            len: chunk.len(),
            kind: FRAME_CONTINUATION,
            flags,
            stream: first.stream,
        };
        header.write(&mut out);
        out.extend_from_slice(chunk);
    }
    out
}

/// Returns the header block with every unparseable `:authority` value replaced (AUTH-1,
/// AUTH-2), or `None` if there is nothing to replace or the block does not parse.
fn fix_header_block(block: &[u8], huffman: &mut HuffmanDecoder) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut copied = 0;
    let mut pos = 0;
    while pos < block.len() {
        let first = block[pos];
        let name_prefix_bits = if first & 0x80 != 0 {
            // Indexed field: an index only.
            read_int(block, &mut pos, 7)?;
            continue;
        } else if first & 0x40 != 0 {
            6 // literal with incremental indexing
        } else if first & 0x20 != 0 {
            // Dynamic table size update: an integer only.
            read_int(block, &mut pos, 5)?;
            continue;
        } else {
            4 // literal without indexing, or never indexed
        };
        let name_index = read_int(block, &mut pos, name_prefix_bits)?;
        let is_authority = if name_index == 0 {
            let name = read_string(block, &mut pos)?;
            decode_string(block, &name, huffman)?.as_slice() == b":authority"
        } else {
            name_index == STATIC_AUTHORITY_INDEX
        };
        let value = read_string(block, &mut pos)?;
        if !is_authority {
            continue;
        }
        let decoded = decode_string(block, &value, huffman)?;
        if Authority::try_from(decoded.as_slice()).is_ok() {
            continue;
        }
        let replacement = same_length_authority(&decoded)?;
        out.extend_from_slice(&block[copied..value.start]);
        write_raw_string(&mut out, &replacement);
        copied = value.end;
    }
    if copied == 0 {
        return None;
    }
    out.extend_from_slice(&block[copied..]);
    Some(out)
}

/// An HPACK string literal inside a block: `start` is its first byte (flag and length).
#[derive(Debug, Clone, Copy)]
struct StringAt {
    start: usize,
    data_start: usize,
    end: usize,
    huffman: bool,
}

/// Reads an HPACK integer with a `prefix_bits`-bit prefix at `*pos` (RFC 7541 §5.1).
fn read_int(block: &[u8], pos: &mut usize, prefix_bits: u8) -> Option<u64> {
    let mask = u8::MAX >> (8 - prefix_bits);
    let first = *block.get(*pos)?;
    *pos += 1;
    let mut value = u64::from(first & mask);
    if value < u64::from(mask) {
        return Some(value);
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(*pos)?;
        *pos += 1;
        value = value.checked_add(u64::from(byte & 0x7f) << shift)?;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
        if shift > HPACK_INT_SHIFT_MAX {
            return None;
        }
    }
}

/// Reads an HPACK string literal at `*pos` (RFC 7541 §5.2) without decoding it.
fn read_string(block: &[u8], pos: &mut usize) -> Option<StringAt> {
    let start = *pos;
    let huffman = *block.get(start)? & 0x80 != 0;
    let len = usize::try_from(read_int(block, pos, 7)?).ok()?;
    let data_start = *pos;
    let end = data_start
        .checked_add(len)
        .filter(|end| *end <= block.len())?;
    *pos = end;
    Some(StringAt {
        start,
        data_start,
        end,
        huffman,
    })
}

fn decode_string(block: &[u8], at: &StringAt, huffman: &mut HuffmanDecoder) -> Option<Vec<u8>> {
    let data = block.get(at.data_start..at.end)?;
    if at.huffman {
        huffman.decode(data).ok()
    } else {
        Some(data.to_vec())
    }
}

/// Writes `value` as a string literal without Huffman coding.
fn write_raw_string(out: &mut Vec<u8>, value: &[u8]) {
    let mut len = value.len();
    if len < 0x7f {
        out.put_u8(len as u8);
    } else {
        out.put_u8(0x7f);
        len -= 0x7f;
        while len >= 0x80 {
            out.put_u8((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        out.put_u8(len as u8);
    }
    out.extend_from_slice(value);
}

/// Returns a valid authority exactly as long as `value` (AUTH-2): the host and port found in
/// a URL-like value behind a filler user-info (`--@127.0.0.1:2379`), else `x` repeated.
fn same_length_authority(value: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(value);
    let host_port = text
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', ']', ';', ',']).next().unwrap_or_default());
    if let Some(host_port) = host_port.filter(|h| !h.is_empty() && h.len() < value.len()) {
        let mut candidate = vec![b'-'; value.len() - host_port.len() - 1];
        candidate.push(b'@');
        candidate.extend_from_slice(host_port.as_bytes());
        if candidate.len() == value.len() && Authority::try_from(candidate.as_slice()).is_ok() {
            return Some(candidate);
        }
    }
    let filler = vec![b'x'; value.len()];
    Authority::try_from(filler.as_slice())
        .is_ok()
        .then_some(filler)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// Encodes a literal with incremental indexing of `:authority` (static name index 1).
    fn authority_literal(value: &[u8]) -> Vec<u8> {
        let mut out = vec![0x40 | 0x01];
        write_raw_string(&mut out, value);
        out
    }

    fn headers_frame(flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        FrameHeader {
            len: payload.len(),
            kind: FRAME_HEADERS,
            flags,
            stream,
        }
        .write(&mut out);
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn url_authority_becomes_host_and_port_of_the_same_length() {
        let fixed = same_length_authority(b"http://127.0.0.1:2379").unwrap();
        assert_eq!(fixed, b"------@127.0.0.1:2379");
        let odd = same_length_authority(b"#initially=[http://127.0.0.1:2379]").unwrap();
        assert_eq!(odd.len(), "#initially=[http://127.0.0.1:2379]".len());
        assert!(Authority::try_from(odd.as_slice()).is_ok());
    }

    #[test]
    fn only_bad_authorities_are_rewritten() {
        let mut huffman = HuffmanDecoder::new();
        // :method GET (indexed 2), then a good authority: nothing to do.
        let mut good = vec![0x82];
        good.extend(authority_literal(b"127.0.0.1:2379"));
        assert_eq!(fix_header_block(&good, &mut huffman), None);
        // A bad one: same block with the value replaced.
        let mut bad = vec![0x82];
        bad.extend(authority_literal(b"http://127.0.0.1:2379"));
        bad.push(0x84); // :path / (indexed 4)
        let fixed = fix_header_block(&bad, &mut huffman).unwrap();
        let mut expected = vec![0x82];
        expected.extend(authority_literal(b"------@127.0.0.1:2379"));
        expected.push(0x84);
        assert_eq!(fixed, expected);
    }

    #[test]
    fn huffman_coded_authority_is_decoded() {
        // "www.example.com" Huffman-coded, from RFC 7541 C.4.1 (a valid authority).
        let coded = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut block = vec![0x41, 0x80 | coded.len() as u8];
        block.extend_from_slice(&coded);
        let mut huffman = HuffmanDecoder::new();
        assert_eq!(
            huffman.decode(&coded).ok(),
            Some(b"www.example.com".to_vec())
        );
        assert_eq!(fix_header_block(&block, &mut huffman), None);
    }

    #[test]
    fn malformed_blocks_are_left_alone() {
        let mut huffman = HuffmanDecoder::new();
        for block in [
            &[0x41, 0x85, 0x01][..],
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
            &[0x3f],
        ] {
            assert_eq!(fix_header_block(block, &mut huffman), None);
        }
    }

    #[test]
    fn long_strings_use_continued_lengths() {
        let value = vec![b'a'; 300];
        let mut out = Vec::new();
        write_raw_string(&mut out, &value);
        let mut pos = 0;
        let at = read_string(&out, &mut pos).unwrap();
        assert_eq!((at.end - at.data_start, pos), (300, out.len()));
    }

    #[tokio::test]
    async fn connection_rewrites_headers_and_forwards_everything_else() {
        let mut block = vec![0x82];
        block.extend(authority_literal(b"http://127.0.0.1:2379"));
        let mut padded = vec![3u8];
        padded.extend_from_slice(&block);
        padded.extend_from_slice(&[0, 0, 0]);
        let data = [0u8, 0, 2, 0, 0, 0, 0, 0, 1, b'h', b'i'];
        let mut input = PREFACE.to_vec();
        input.extend(headers_frame(FLAG_END_HEADERS | FLAG_PADDED, 1, &padded));
        input.extend_from_slice(&data);
        let mut got = Vec::new();
        AuthorityFix::new(input.as_slice())
            .read_to_end(&mut got)
            .await
            .unwrap();
        let mut fixed_block = vec![0x82];
        fixed_block.extend(authority_literal(b"------@127.0.0.1:2379"));
        let mut expected = PREFACE.to_vec();
        expected.extend(headers_frame(FLAG_END_HEADERS, 1, &fixed_block));
        expected.extend_from_slice(&data);
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn http1_passes_through() {
        let input = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        let mut got = Vec::new();
        AuthorityFix::new(input.as_slice())
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, input);
    }

    #[tokio::test]
    async fn an_oversized_headers_frame_passes_through_at_once() {
        // A HEADERS frame announcing 16 MiB - 1 bytes, of which 64 KiB arrive: the wrapper
        // must not wait for (or hold) the payload.
        let mut input = PREFACE.to_vec();
        input.extend_from_slice(&[0xff, 0xff, 0xff, FRAME_HEADERS, 0, 0, 0, 0, 1]);
        input.extend(std::iter::repeat_n(0u8, 64 * 1024));
        let mut fix = AuthorityFix::new(input.as_slice());
        let mut first = vec![0u8; 64];
        let n = fix.read(&mut first).await.unwrap();
        // The preface, the frame header and some of the payload, unchanged.
        assert!(n > PREFACE.len() + FRAME_HEADER_BYTES);
        assert_eq!(&first[..n], &input[..n]);
        assert_eq!(fix.mode, Mode::Passthrough);
        assert!(fix.input.len() <= HEADER_BLOCK_BYTES_MAX);
    }

    #[tokio::test]
    async fn a_header_block_over_one_frame_passes_through() {
        // HEADERS without END_HEADERS, then CONTINUATIONs past the bound: passed on unchanged.
        let mut input = PREFACE.to_vec();
        let mut block = vec![0x82];
        block.extend(authority_literal(b"http://127.0.0.1:2379"));
        input.extend(headers_frame(0, 1, &block));
        for _ in 0..3 {
            FrameHeader {
                len: 8_000,
                kind: FRAME_CONTINUATION,
                flags: 0,
                stream: 1,
            }
            .write(&mut input);
            input.extend(std::iter::repeat_n(0x82u8, 8_000));
        }
        let mut got = Vec::new();
        AuthorityFix::new(input.as_slice())
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, input);
    }

    #[test]
    fn header_blocks_over_several_frames_are_found() {
        let mut bytes = headers_frame(0, 1, &[0x82]);
        assert_eq!(header_block_extent(&bytes), Extent::Incomplete);
        FrameHeader {
            len: 1,
            kind: FRAME_CONTINUATION,
            flags: FLAG_END_HEADERS,
            stream: 1,
        }
        .write(&mut bytes);
        bytes.push(0x84);
        assert_eq!(header_block_extent(&bytes), Extent::Complete(bytes.len()));
        let mut wrong = headers_frame(0, 1, &[0x82]);
        wrong.extend(headers_frame(FLAG_END_HEADERS, 1, &[0x84]));
        assert_eq!(header_block_extent(&wrong), Extent::Malformed);
    }
}
