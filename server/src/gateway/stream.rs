//! The gateway's streaming methods: `/v3/watch` and `/v3/lease/keepalive` (bidirectional)
//! and `/v3/maintenance/snapshot` and `/v3/election/observe` (server streaming), as etcd's
//! gateway streams them.
//!
//! A request body is a sequence of JSON objects (whitespace between them optional); each is
//! one request message. The answer is chunked: one JSON object per response message, each
//! followed by a newline, wrapped as `{"result":{...}}` (GW-5).
//!
//! Invariants:
//! - GW-STREAM-1: the messages reach the same service object the gRPC server uses, as a
//!   gRPC request stream (each request is encoded as a gRPC frame and decoded by tonic), so
//!   a gateway stream behaves as a gRPC stream does (GW-1).
//! - GW-STREAM-2: a first message that is not JSON of the request type is answered as a
//!   unary error with code 2 (Unknown, HTTP 500), as etcd 3.4's gateway answers it; a later
//!   one ends the request side only (the client's half-close), as etcd's gateway does.
//! - GW-STREAM-3: at most [`STREAM_FRAMES_BUFFERED`] decoded requests wait for the service;
//!   one request's JSON may take at most the gateway's body limit, past which the request
//!   side ends.
//! - GW-STREAM-4: a stream error after the first answer is sent as etcd's gateway sends
//!   it, `{"error":{"grpc_code":N,"http_code":H,"message":M,"http_status":S}}`, and ends the
//!   answer.
//!
//! Contact points: `gateway` (routes, errors, metrics), `watch.rs`, `lease.rs`,
//! `maintenance.rs`, `election.rs`.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use prost::Message;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::codec::{Codec, Streaming};
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::tokio_stream::{Stream, StreamExt};
use tonic::{Code, Status};

use super::{Gateway, GatewayRequest, decode_value, error_response, http_status};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::lease_server::Lease;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::pb::etcdserverpb::watch_server::Watch;
use crate::pb::v3electionpb;
use crate::pb::v3electionpb::election_server::Election;

/// Decoded requests buffered ahead of the service (GW-STREAM-3).
pub const STREAM_FRAMES_BUFFERED: usize = 16;

/// Returns the route of `/v3/watch`.
pub fn watch_route(gateway: &Gateway) -> MethodRouter {
    let gateway = gateway.clone();
    post(move |headers: axum::http::HeaderMap, body: Body| {
        let gateway = gateway.clone();
        async move {
            let service = gateway.watch.clone();
            bidi::<pb::WatchRequest, _, _, _>(
                &gateway,
                "/etcdserverpb.Watch/Watch",
                body,
                move |requests| async move {
                    service.watch(super::with_token(&headers, requests)).await
                },
            )
            .await
        }
    })
}

/// Returns the route of `/v3/lease/keepalive`.
pub fn keep_alive_route(gateway: &Gateway) -> MethodRouter {
    let gateway = gateway.clone();
    post(move |headers: axum::http::HeaderMap, body: Body| {
        let gateway = gateway.clone();
        async move {
            let service = gateway.lease.clone();
            bidi::<pb::LeaseKeepAliveRequest, _, _, _>(
                &gateway,
                "/etcdserverpb.Lease/LeaseKeepAlive",
                body,
                move |requests| async move {
                    service
                        .lease_keep_alive(super::with_token(&headers, requests))
                        .await
                },
            )
            .await
        }
    })
}

/// Returns the route of `/v3/maintenance/snapshot`.
pub fn snapshot_route(gateway: &Gateway) -> MethodRouter {
    let gateway = gateway.clone();
    post(move |headers: axum::http::HeaderMap, body: Bytes| {
        let gateway = gateway.clone();
        async move {
            let service = gateway.maintenance.clone();
            server_streaming::<pb::SnapshotRequest, _, _, _>(
                &gateway,
                "/etcdserverpb.Maintenance/Snapshot",
                &body,
                move |request| async move {
                    service.snapshot(super::with_token(&headers, request)).await
                },
            )
            .await
        }
    })
}

/// Returns the route of `/v3/election/observe`.
pub fn observe_route(gateway: &Gateway) -> MethodRouter {
    let gateway = gateway.clone();
    post(move |headers: axum::http::HeaderMap, body: Bytes| {
        let gateway = gateway.clone();
        async move {
            let service = gateway.election.clone();
            server_streaming::<v3electionpb::LeaderRequest, _, _, _>(
                &gateway,
                "/v3electionpb.Election/Observe",
                &body,
                move |request| async move {
                    service.observe(super::with_token(&headers, request)).await
                },
            )
            .await
        }
    })
}

/// Runs a server-streaming method: decodes its one request from `body` (GW-2) and streams
/// its answers (GW-5).
async fn server_streaming<Req, Resp, F, Fut>(
    gateway: &Gateway,
    grpc_method: &'static str,
    body: &[u8],
    call: F,
) -> Response
where
    Req: DeserializeOwned + Default + GatewayRequest,
    Resp: Serialize + Send + 'static,
    F: FnOnce(Req) -> Fut,
    Fut: std::future::Future<
            Output = Result<tonic::Response<tonic::codegen::BoxStream<Resp>>, Status>,
        >,
{
    gateway.metrics.start(grpc_method);
    let started = Instant::now();
    let request = match super::decode::<Req>(body) {
        Ok(request) => request,
        Err(status) => {
            gateway
                .metrics
                .record(grpc_method, status.code(), started.elapsed());
            return error_response(&status);
        }
    };
    let answer = call(request).await;
    answer_stream(gateway, grpc_method, started, answer)
}

/// Runs a bidirectional method: reads the first request, hands the service a gRPC request
/// stream fed from the body (GW-STREAM-1, GW-STREAM-2), and streams its answers.
async fn bidi<Req, Resp, F, Fut>(
    gateway: &Gateway,
    grpc_method: &'static str,
    body: Body,
    call: F,
) -> Response
where
    Req: DeserializeOwned + Message + Default + GatewayRequest + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: FnOnce(Streaming<Req>) -> Fut,
    Fut: std::future::Future<
            Output = Result<tonic::Response<tonic::codegen::BoxStream<Resp>>, Status>,
        >,
{
    gateway.metrics.start(grpc_method);
    let started = Instant::now();
    let limit = gateway
        .max_receive_bytes
        .saturating_mul(super::JSON_BODY_FACTOR);
    let mut objects = JsonObjects::new(body, limit);
    let first = match objects.next::<Req>().await {
        Some(Err(message)) => {
            // GW-STREAM-2: etcd's gateway passes the decoder's error on as a plain error.
            let status = Status::unknown(message);
            gateway
                .metrics
                .record(grpc_method, status.code(), started.elapsed());
            return error_response(&status);
        }
        Some(Ok(first)) => Some(first),
        None => None,
    };
    let (frames, receiver) =
        tokio::sync::mpsc::channel::<Result<Bytes, Status>>(STREAM_FRAMES_BUFFERED);
    tokio::spawn(async move {
        if let Some(first) = first
            && frames.send(Ok(grpc_frame(&first))).await.is_err()
        {
            return;
        }
        loop {
            match objects.next::<Req>().await {
                Some(Ok(request)) => {
                    if frames.send(Ok(grpc_frame(&request))).await.is_err() {
                        return;
                    }
                }
                Some(Err(message)) => {
                    // GW-STREAM-2: a later bad message only ends the request side.
                    tracing::debug!(method = grpc_method, error = %message, "gateway stream request not decoded");
                    return;
                }
                None => return,
            }
        }
    });
    let body = Body::from_stream(ReceiverStream::new(receiver));
    let decoder = tonic_prost::ProstCodec::<Req, Req>::default().decoder();
    let requests = Streaming::new_request(decoder, body, None, Some(limit));
    let answer = call(requests).await;
    answer_stream(gateway, grpc_method, started, answer)
}

/// Answers a service's response stream as newline-separated `{"result":...}` objects, or
/// its refusal as a unary error (GW-5, GW-STREAM-4).
fn answer_stream<Resp: Serialize + Send + 'static>(
    gateway: &Gateway,
    grpc_method: &str,
    started: Instant,
    answer: Result<tonic::Response<tonic::codegen::BoxStream<Resp>>, Status>,
) -> Response {
    let stream = match answer {
        Ok(stream) => stream.into_inner(),
        Err(status) => {
            gateway
                .metrics
                .record(grpc_method, status.code(), started.elapsed());
            return error_response(&status);
        }
    };
    gateway
        .metrics
        .record(grpc_method, Code::Ok, started.elapsed());
    let mut response = Body::from_stream(result_lines(stream)).into_response();
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Returns the stream of answer lines: each message as `{"result":...}\n`, then an error
/// line and the end if the stream fails (GW-STREAM-4).
fn result_lines<Resp: Serialize + Send + 'static>(
    stream: tonic::codegen::BoxStream<Resp>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    // An error line is the last one: `take_while` sees the item after it and stops there.
    let mut after_error = false;
    stream
        .map(|item| match item {
            Ok(message) => (
                serde_json::to_vec(&message).map(|json| {
                    let mut line = Vec::with_capacity(json.len() + 12);
                    line.extend_from_slice(b"{\"result\":");
                    line.extend_from_slice(&json);
                    line.extend_from_slice(b"}\n");
                    line
                }),
                false,
            ),
            Err(status) => (Ok(stream_error_line(&status)), true),
        })
        .take_while(move |(_, is_error)| !std::mem::replace(&mut after_error, *is_error))
        .map(|(line, _)| line.map(Bytes::from).map_err(std::io::Error::other))
}

/// The error object of a failed stream (GW-STREAM-4), grpc-gateway's `StreamError`.
#[derive(Serialize)]
struct StreamError<'a> {
    grpc_code: i32,
    http_code: u16,
    message: &'a str,
    http_status: &'a str,
}

#[derive(Serialize)]
struct StreamErrorLine<'a> {
    error: StreamError<'a>,
}

fn stream_error_line(status: &Status) -> Vec<u8> {
    let http = http_status(status.code());
    let line = StreamErrorLine {
        error: StreamError {
            grpc_code: status.code() as i32,
            http_code: http.as_u16(),
            message: status.message(),
            http_status: http.canonical_reason().unwrap_or(""),
        },
    };
    let mut out = serde_json::to_vec(&line).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

/// Returns `message` as one gRPC frame: no compression, its length, its bytes.
fn grpc_frame<M: Message>(message: &M) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut frame = Vec::with_capacity(encoded.len() + 5);
    frame.push(0);
    // A message over 4 GiB cannot reach here: the body limit is far below.
    let len = u32::try_from(encoded.len()).unwrap_or(u32::MAX);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&encoded);
    Bytes::from(frame)
}

/// Reads a request body as a sequence of JSON objects, as they arrive.
struct JsonObjects {
    body: axum::body::BodyDataStream,
    buffer: Vec<u8>,
    ended: bool,
    limit: usize,
}

impl JsonObjects {
    fn new(body: Body, limit: usize) -> JsonObjects {
        JsonObjects {
            body: body.into_data_stream(),
            buffer: Vec::new(),
            ended: false,
            limit,
        }
    }

    /// Returns the next object decoded as `T`, an error text for one that is not, or
    /// `None` at the end of the body.
    async fn next<T: DeserializeOwned + GatewayRequest>(&mut self) -> Option<Result<T, String>> {
        loop {
            let start = self
                .buffer
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(self.buffer.len());
            self.buffer.drain(..start);
            if !self.buffer.is_empty() {
                let mut objects = serde_json::Deserializer::from_slice(&self.buffer)
                    .into_iter::<serde_json::Value>();
                match objects.next() {
                    Some(Ok(object)) => {
                        let used = objects.byte_offset();
                        self.buffer.drain(..used);
                        return Some(decode_value(object));
                    }
                    Some(Err(e)) if !e.is_eof() || self.ended => {
                        return Some(Err(e.to_string()));
                    }
                    // Incomplete: read more below.
                    Some(Err(_)) | None => {}
                }
            } else if self.ended {
                return None;
            }
            if self.buffer.len() > self.limit {
                return Some(Err(format!(
                    "kvd: a stream message over {} bytes of JSON",
                    self.limit
                )));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buffer.extend_from_slice(&chunk),
                Some(Err(e)) => return Some(Err(e.to_string())),
                None => self.ended = true,
            }
        }
    }
}
