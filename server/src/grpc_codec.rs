//! The gRPC codec of every generated service and client (`build.rs` names it, BUILD-5):
//! prost's encoding, with buffers sized for etcd's calls instead of tonic's 8 KiB per call.
//!
//! Why: tonic allocates its codec buffer size once for the request it decodes and once for
//! the answer it encodes, per call. An 8 KiB block is past glibc's per-thread cache, so two
//! of them per Put went through the allocator's shared bins and merged its small free
//! chunks each time (`malloc_consolidate` and `_int_malloc` in the connection threads'
//! profile under etcd's 64-client benchmark). A Put's request is a few hundred bytes and
//! its answer a few dozen.
//!
//! Owns: nothing; the encoder and decoder are prost's.
//!
//! Invariants:
//! - CODEC-1: the bytes on the wire are prost's, unchanged: only where the codec's buffers
//!   start differs. A message of a unary call starts in [`UNARY_START_BYTES`]; the
//!   messages of the streams (`Watch`, `LeaseKeepAlive`, `Snapshot`) keep tonic's default,
//!   because a stream's buffer is reused for message after message and grows in steps of
//!   its starting size.
//! - CODEC-2: the encoder reserves a message's encoded length before it writes it, so a
//!   large answer (a Range of many keys) is written into one allocation, not a buffer that
//!   doubles.
//!
//! Contact points: `build.rs` (`codec_path`), `server::pb`.

use std::any::TypeId;
use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder};

use crate::pb::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, SnapshotResponse, WatchRequest, WatchResponse,
};

/// Where a unary call's request and answer buffers start: the largest block glibc's
/// per-thread cache serves (1,032 bytes asked for, on 64-bit). tonic's decoder reserves a
/// message's length again after it has read the message, so a request of up to about 500
/// bytes (a Put of etcd's benchmark values, 256 bytes) decodes without a second block.
const UNARY_START_BYTES: usize = 1024;

/// How many encoded bytes a stream gathers before it hands them to HTTP/2: tonic's default.
const STREAM_YIELD_BYTES: usize = 32 * 1024;

/// Where a stream's buffers start: tonic's default.
const STREAM_START_BYTES: usize = 8 * 1024;

/// The codec: `T` is the message it encodes, `U` the one it decodes.
#[derive(Debug, Clone)]
pub struct EtcdCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for EtcdCodec<T, U> {
    fn default() -> Self {
        EtcdCodec {
            _messages: PhantomData,
        }
    }
}

/// Returns true if `M` is a message of one of etcd's streams (CODEC-1).
fn streamed<M: 'static>() -> bool {
    let id = TypeId::of::<M>();
    [
        TypeId::of::<WatchRequest>(),
        TypeId::of::<WatchResponse>(),
        TypeId::of::<LeaseKeepAliveRequest>(),
        TypeId::of::<LeaseKeepAliveResponse>(),
        TypeId::of::<SnapshotResponse>(),
    ]
    .contains(&id)
}

/// Returns the bytes a buffer for message type `M` starts with (CODEC-1).
fn start_bytes<M: 'static>() -> usize {
    if streamed::<M>() {
        STREAM_START_BYTES
    } else {
        UNARY_START_BYTES
    }
}

/// Returns the buffer settings for message type `M` (CODEC-1).
fn settings<M: 'static>() -> BufferSettings {
    BufferSettings::new(start_bytes::<M>(), STREAM_YIELD_BYTES)
}

impl<T, U> Codec for EtcdCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = EtcdEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        EtcdEncoder {
            settings: settings::<T>(),
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings::<U>())
    }
}

/// prost's encoding of `T`, reserving the message's length first (CODEC-2).
#[derive(Debug, Clone)]
pub struct EtcdEncoder<T> {
    settings: BufferSettings,
    _message: PhantomData<T>,
}

impl<T: Message> Encoder for EtcdEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("kvd: encoding an answer: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::etcdserverpb::{PutRequest, PutResponse, RangeResponse, TxnRequest};

    #[test]
    fn unary_messages_start_small_and_stream_messages_keep_tonics_default() {
        assert_eq!(start_bytes::<PutRequest>(), UNARY_START_BYTES);
        assert_eq!(start_bytes::<PutResponse>(), UNARY_START_BYTES);
        assert_eq!(start_bytes::<TxnRequest>(), UNARY_START_BYTES);
        assert_eq!(start_bytes::<RangeResponse>(), UNARY_START_BYTES);
        assert_eq!(start_bytes::<WatchRequest>(), STREAM_START_BYTES);
        assert_eq!(start_bytes::<WatchResponse>(), STREAM_START_BYTES);
        assert_eq!(start_bytes::<LeaseKeepAliveRequest>(), STREAM_START_BYTES);
        assert_eq!(start_bytes::<LeaseKeepAliveResponse>(), STREAM_START_BYTES);
        assert_eq!(start_bytes::<SnapshotResponse>(), STREAM_START_BYTES);
    }
}
