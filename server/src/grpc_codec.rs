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
//! - GRPC-CODEC-1: the bytes on the wire are prost's, unchanged: only where the codec's buffers
//!   start differs. A message of a unary call starts in [`UNARY_START_BYTES`]; the
//!   messages of the streams (`Watch`, `LeaseKeepAlive`, `Snapshot`) keep tonic's default,
//!   because a stream's buffer is reused for message after message and grows in steps of
//!   its starting size.
//! - GRPC-CODEC-2: the encoder reserves a message's encoded length before it writes it, so a
//!   large answer (a Range of many keys) is written into one allocation, not a buffer that
//!   doubles.
//! - GRPC-CODEC-3: a Watch stream's encoder encodes an event once for all the responses that
//!   carry it in a row: it keeps the last event it wrote with its bytes, and writes those
//!   bytes again for an event with the same numbers and the very same key and value buffers
//!   (held by the kept event, so their memory cannot be reused for other bytes meanwhile).
//!   With 1,000 watches of one key, the engine hands every watch's response the same shared
//!   event (WATCH-6), and prost's encoding of it 1,000 times was a fifth of the server's work
//!   under etcd's watch benchmark. The bytes are the ones prost writes (GRPC-CODEC-1): events are
//!   the response's last field, written in prost's order.
//!
//! Contact points: `build.rs` (`codec_path`), `server::pb`.

use std::any::{Any, TypeId};
use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder};

use crate::pb::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, SnapshotResponse, WatchRequest, WatchResponse,
};
use crate::pb::mvccpb::{Event, KeyValue};

/// The field number of `WatchResponse.events` (etcd's `rpc.proto`).
const WATCH_RESPONSE_EVENTS: u32 = 11;

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

/// Returns true if `M` is a message of one of etcd's streams (GRPC-CODEC-1).
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

/// Returns the bytes a buffer for message type `M` starts with (GRPC-CODEC-1).
fn start_bytes<M: 'static>() -> usize {
    if streamed::<M>() {
        STREAM_START_BYTES
    } else {
        UNARY_START_BYTES
    }
}

/// Returns the buffer settings for message type `M` (GRPC-CODEC-1).
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
            last_event: None,
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings::<U>())
    }
}

/// prost's encoding of `T`, reserving the message's length first (GRPC-CODEC-2), and for a
/// Watch response, each event's bytes reused from the previous response (GRPC-CODEC-3).
#[derive(Debug, Clone)]
pub struct EtcdEncoder<T> {
    settings: BufferSettings,
    /// The last event a Watch stream wrote, and its encoding (GRPC-CODEC-3).
    last_event: Option<(Event, Vec<u8>)>,
    _message: PhantomData<T>,
}

impl<T: Message + 'static> Encoder for EtcdEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, mut item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        if let Some(response) = (&mut item as &mut dyn Any).downcast_mut::<WatchResponse>() {
            // Everything but the events as prost writes it, then the events, its last field.
            let events = std::mem::take(&mut response.events);
            buf.reserve(response.encoded_len() + self.events_len(&events));
            return self.write_watch(response, events, buf);
        }
        buf.reserve(item.encoded_len());
        item.encode(buf).map_err(encoding_failed)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.settings
    }
}

impl<T> EtcdEncoder<T> {
    /// Returns the length of `events` as fields of a Watch response, measuring only those
    /// [`EtcdEncoder::write_event`] will not write from the last event's bytes.
    fn events_len(&self, events: &[Event]) -> usize {
        let mut last = self.last_event.as_ref().map(|(e, bytes)| (e, bytes.len()));
        let mut total = 0;
        for event in events {
            let len = match last {
                Some((previous, len)) if same_event(previous, event) => len,
                _ => event.encoded_len(),
            };
            total += key_len(WATCH_RESPONSE_EVENTS) + encoded_len_varint(len as u64) + len;
            last = Some((event, len));
        }
        total
    }

    /// Writes `response` (its events taken out) and then `events`, its last field.
    fn write_watch(
        &mut self,
        response: &WatchResponse,
        events: Vec<Event>,
        buf: &mut impl BufMut,
    ) -> Result<(), Status> {
        response.encode(buf).map_err(encoding_failed)?;
        for event in events {
            self.write_event(event, buf);
        }
        Ok(())
    }

    /// Writes `event` as a field of a Watch response: the last event's bytes again if it is
    /// the same event, else its encoding, which it then keeps (GRPC-CODEC-3).
    fn write_event(&mut self, event: Event, buf: &mut impl BufMut) {
        let hit = self
            .last_event
            .as_ref()
            .is_some_and(|(last, _)| same_event(last, &event));
        if !hit {
            let bytes = event.encode_to_vec();
            self.last_event = Some((event, bytes));
        }
        if let Some((_, bytes)) = &self.last_event {
            encode_key(WATCH_RESPONSE_EVENTS, WireType::LengthDelimited, buf);
            encode_varint(bytes.len() as u64, buf);
            buf.put_slice(bytes);
        }
    }
}

fn encoding_failed(e: prost::EncodeError) -> Status {
    Status::internal(format!("kvd: encoding an answer: {e}"))
}

/// True if `a` and `b` encode to the same bytes because they are the same event: equal
/// numbers, and keys and values in the very same buffers (GRPC-CODEC-3). An event with a
/// previous value never matches: those are resolved per watch.
fn same_event(a: &Event, b: &Event) -> bool {
    a.r#type == b.r#type
        && a.prev_kv.is_none()
        && b.prev_kv.is_none()
        && match (&a.kv, &b.kv) {
            (Some(a), Some(b)) => same_kv(a, b),
            (None, None) => true,
            _ => false,
        }
}

fn same_kv(a: &KeyValue, b: &KeyValue) -> bool {
    let same_buffer = |a: &Bytes, b: &Bytes| a.len() == b.len() && a.as_ptr() == b.as_ptr();
    a.create_revision == b.create_revision
        && a.mod_revision == b.mod_revision
        && a.version == b.version
        && a.lease == b.lease
        && same_buffer(&a.key, &b.key)
        && same_buffer(&a.value, &b.value)
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

    fn put_event(key: &Bytes, value: &Bytes, mod_revision: i64) -> Event {
        Event {
            r#type: 0,
            kv: Some(KeyValue {
                key: key.clone(),
                create_revision: 2,
                mod_revision,
                version: mod_revision - 1,
                value: value.clone(),
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    fn response(watch_id: i64, events: Vec<Event>) -> WatchResponse {
        WatchResponse {
            watch_id,
            events,
            ..WatchResponse::default()
        }
    }

    #[test]
    fn watch_responses_encode_to_prosts_bytes_whether_an_event_is_reused_or_not() {
        let key = Bytes::from_static(b"watched");
        let value = Bytes::from(vec![7u8; 300]);
        let other_value = Bytes::from(vec![7u8; 300]);
        let base = || put_event(&key, &value, 3);
        let with_kv = |change: fn(&mut KeyValue)| {
            let mut event = base();
            if let Some(kv) = event.kv.as_mut() {
                change(kv);
            }
            event
        };
        // Each event that differs from `base` in one thing only, right after `base`: a
        // reuse that overlooked that thing would write `base`'s bytes for it.
        let traps = vec![
            with_kv(|kv| kv.mod_revision = 9),
            with_kv(|kv| kv.create_revision = 9),
            with_kv(|kv| kv.version = 9),
            with_kv(|kv| kv.lease = 9),
            with_kv(|kv| kv.value = kv.value.slice(..299)),
            with_kv(|kv| kv.key = kv.key.slice(..6)),
            Event {
                r#type: 1,
                ..base()
            },
            Event {
                prev_kv: put_event(&key, &other_value, 2).kv,
                ..base()
            },
            Event { kv: None, ..base() },
            put_event(&key, &other_value, 3),
        ];
        let mut responses = vec![
            response(0, Vec::new()),
            // The same shared event for three watches: written once, reused twice.
            response(0, vec![base()]),
            response(1, vec![base()]),
            response(2, vec![base()]),
            // Several events in one response, repeated and not.
            response(3, vec![base(), base(), put_event(&key, &value, 5)]),
            response(4, vec![put_event(&key, &value, 5)]),
        ];
        for trap in traps {
            responses.push(response(0, vec![base()]));
            responses.push(response(1, vec![trap]));
        }
        let mut encoder = EtcdEncoder::<WatchResponse> {
            settings: settings::<WatchResponse>(),
            last_event: None,
            _message: PhantomData,
        };
        for original in responses {
            let want = original.encode_to_vec();
            let mut head = original.clone();
            let events = std::mem::take(&mut head.events);
            assert_eq!(
                head.encoded_len() + encoder.events_len(&events),
                want.len(),
                "the length reserved for {original:?}"
            );
            let mut got = Vec::new();
            encoder.write_watch(&head, events, &mut got).unwrap();
            assert_eq!(got, want, "the bytes of {original:?}");
        }
    }
}
