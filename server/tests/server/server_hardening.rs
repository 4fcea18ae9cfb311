//! Hostile clients (issue 16): protocol errors end streams and calls with an error status,
//! many streams share one connection, unfinished header blocks and slow connections cannot
//! exhaust the server's memory or connections. The raw HTTP/2 requests use the `h2` client,
//! which sends whatever DATA bytes it is given; frames h2 refuses to send (an oversized
//! HEADERS frame) are written to a plain TCP socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kvd_server::pb::etcdserverpb as pb;
use prost::Message;
use tonic::codegen::http;

use crate::common;

/// How long a raw call may take before the test gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Protobuf bytes no message decodes: a field tag with the invalid wire type 7.
const GARBAGE: &[u8] = &[0x0f, 0xff, 0xff, 0xff];
/// gRPC's INTERNAL code.
const GRPC_INTERNAL: &str = "13";

/// Returns `payload` as one length-prefixed gRPC message.
fn grpc_message(payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(payload.len() + 5);
    out.put_u8(0);
    out.put_u32(u32::try_from(payload.len()).unwrap());
    out.put_slice(payload);
    out.freeze()
}

/// Opens an HTTP/2 connection to `endpoint` with the h2 client.
async fn h2_connect(endpoint: &str) -> h2::client::SendRequest<Bytes> {
    let host = endpoint.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send.ready().await.unwrap()
}

/// A raw gRPC call in progress.
struct RawCall {
    body: h2::SendStream<Bytes>,
    response: Option<h2::client::ResponseFuture>,
    received: Option<h2::RecvStream>,
    headers: http::HeaderMap,
    buffered: BytesMut,
}

impl RawCall {
    /// Starts a call to `path`; the response head is awaited on the first read.
    async fn start(send: &mut h2::client::SendRequest<Bytes>, path: &str) -> RawCall {
        let request = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let mut send = send.clone().ready().await.unwrap();
        let (response, body) = send.send_request(request, false).unwrap();
        RawCall {
            body,
            response: Some(response),
            received: None,
            headers: http::HeaderMap::new(),
            buffered: BytesMut::new(),
        }
    }

    fn send(&mut self, bytes: Bytes, end: bool) {
        self.body.send_data(bytes, end).unwrap();
    }

    async fn head(&mut self) {
        if let Some(response) = self.response.take() {
            let response = tokio::time::timeout(CALL_TIMEOUT, response)
                .await
                .expect("response headers in time")
                .unwrap();
            let (parts, body) = response.into_parts();
            self.headers = parts.headers;
            self.received = Some(body);
        }
    }

    /// Returns the next response message, or `None` when the body ended first. Panics if
    /// nothing arrives within [`CALL_TIMEOUT`].
    async fn message<M: Message + Default>(&mut self) -> Option<M> {
        self.head().await;
        loop {
            if self.buffered.len() >= 5 {
                let len = u32::from_be_bytes(self.buffered[1..5].try_into().unwrap()) as usize;
                if self.buffered.len() >= 5 + len {
                    let frame = self.buffered.split_to(5 + len);
                    return Some(M::decode(&frame[5..]).unwrap());
                }
            }
            let received = self.received.as_mut().unwrap();
            let data = tokio::time::timeout(CALL_TIMEOUT, received.data())
                .await
                .expect("a response message or the end of the stream in time")?;
            let data = data.unwrap();
            let _ = received.flow_control().release_capacity(data.len());
            self.buffered.put_slice(&data);
        }
    }

    /// Reads to the end of the response and returns its `grpc-status` and `grpc-message`
    /// (from the trailers, or from the head of a trailers-only answer), and how many
    /// messages came before it.
    async fn status<M: Message + Default>(&mut self) -> (String, String, usize) {
        let mut messages = 0;
        while self.message::<M>().await.is_some() {
            messages += 1;
        }
        let received = self.received.as_mut().unwrap();
        let trailers = tokio::time::timeout(CALL_TIMEOUT, received.trailers())
            .await
            .expect("trailers in time")
            .unwrap();
        let map = trailers.unwrap_or_else(|| self.headers.clone());
        let field = |name: &str| {
            map.get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        let message = percent_decode(&field("grpc-message"));
        (field("grpc-status"), message, messages)
    }
}

/// Decodes the percent-encoding of a `grpc-message`.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if bytes[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn watch_create(key: &str) -> Bytes {
    let request = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: Bytes::from(key.to_owned()),
                ..pb::WatchCreateRequest::default()
            },
        )),
    };
    grpc_message(&request.encode_to_vec())
}

#[tokio::test]
async fn garbage_on_a_watch_stream_ends_it_with_internal() {
    let server = common::start_kvd(&[]);
    let mut send = h2_connect(&server.endpoint).await;
    let mut call = RawCall::start(&mut send, "/etcdserverpb.Watch/Watch").await;
    call.send(watch_create("a"), false);
    let created: pb::WatchResponse = call.message().await.expect("created");
    assert!(created.created, "{created:?}");
    // Garbage, then a valid create that must not be served.
    call.send(grpc_message(GARBAGE), false);
    call.send(watch_create("b"), false);
    let (code, message, after) = call.status::<pb::WatchResponse>().await;
    assert_eq!(code, GRPC_INTERNAL, "{message}");
    assert_eq!(after, 0, "no response after the garbage");
    // The connection still serves other calls.
    let mut again = RawCall::start(&mut send, "/etcdserverpb.Watch/Watch").await;
    again.send(watch_create("c"), false);
    let created: pb::WatchResponse = again.message().await.expect("created");
    assert!(created.created);
}

#[tokio::test]
async fn garbage_on_a_keep_alive_stream_ends_it_with_internal() {
    let server = common::start_kvd(&[]);
    let mut send = h2_connect(&server.endpoint).await;
    let mut call = RawCall::start(&mut send, "/etcdserverpb.Lease/LeaseKeepAlive").await;
    let keep_alive = pb::LeaseKeepAliveRequest { id: 7 };
    call.send(grpc_message(&keep_alive.encode_to_vec()), false);
    let answer: pb::LeaseKeepAliveResponse = call.message().await.expect("an answer");
    assert_eq!((answer.id, answer.ttl), (7, 0), "unknown lease: TTL 0");
    call.send(grpc_message(GARBAGE), false);
    let (code, message, after) = call.status::<pb::LeaseKeepAliveResponse>().await;
    assert_eq!(code, GRPC_INTERNAL, "{message}");
    assert_eq!(after, 0);
}

#[tokio::test]
async fn a_unary_call_with_two_messages_is_refused_and_applies_nothing() {
    let server = common::start_kvd(&[]);
    let mut send = h2_connect(&server.endpoint).await;
    let put = |key: &str| {
        let request = pb::PutRequest {
            key: Bytes::from(key.to_owned()),
            value: Bytes::from_static(b"v"),
            ..pb::PutRequest::default()
        };
        grpc_message(&request.encode_to_vec())
    };
    // Both messages in one DATA frame, and in two frames.
    for (n, split) in [false, true].into_iter().enumerate() {
        let (first, second) = (format!("first{n}"), format!("second{n}"));
        let mut call = RawCall::start(&mut send, "/etcdserverpb.KV/Put").await;
        if split {
            call.send(put(&first), false);
            call.send(put(&second), true);
        } else {
            let mut both = BytesMut::from(&put(&first)[..]);
            both.put_slice(&put(&second));
            call.send(both.freeze(), true);
        }
        let (code, message, messages) = call.status::<pb::PutResponse>().await;
        assert_eq!(code, GRPC_INTERNAL, "{message}");
        assert!(message.contains("cardinality violation"), "{message}");
        assert_eq!(messages, 0);
    }
    // Nothing was applied: the revision is still 1. One message is served as before.
    let mut call = RawCall::start(&mut send, "/etcdserverpb.KV/Put").await;
    call.send(put("one"), true);
    let answer: pb::PutResponse = call.message().await.expect("a put response");
    assert_eq!(answer.header.unwrap().revision, 2);
    let (code, _, _) = call.status::<pb::PutResponse>().await;
    assert_eq!(code, "0");
}
