//! Hostile clients (issue 16): protocol errors end streams and calls with an error status,
//! many streams share one connection, unfinished header blocks and slow connections cannot
//! exhaust the server's memory or connections. The raw HTTP/2 requests use the `h2` client,
//! which sends whatever DATA bytes it is given; frames h2 refuses to send (an oversized
//! HEADERS frame) are written to a plain TCP socket.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

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
        RawCall::start_with(send, path, &[]).await
    }

    /// Starts a call to `path` with `headers` besides gRPC's own.
    async fn start_with(
        send: &mut h2::client::SendRequest<Bytes>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> RawCall {
        let mut request = http::Request::builder()
            .method("POST")
            .uri(format!("http://127.0.0.1{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(()).unwrap();
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

/// Streams opened at once on one connection: more than hyper's default limit of 200.
const STREAMS_ON_ONE_CONNECTION: usize = 300;

#[tokio::test]
async fn three_hundred_streams_on_one_connection_are_all_served() {
    use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
    let server = common::start_kvd(&[]);
    // One tonic channel is one HTTP/2 connection; its client obeys the server's
    // SETTINGS_MAX_CONCURRENT_STREAMS and queues streams beyond it.
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (answered, mut answers) = tokio::sync::mpsc::channel(STREAMS_ON_ONE_CONNECTION);
    let (release, released) = tokio::sync::watch::channel(false);
    for id in 0..STREAMS_ON_ONE_CONNECTION {
        let mut lease = LeaseClient::new(channel.clone());
        let answered = answered.clone();
        let mut released = released.clone();
        tokio::spawn(async move {
            let (requests, receiver) = tokio::sync::mpsc::channel(1);
            requests
                .send(pb::LeaseKeepAliveRequest { id: id as i64 + 1 })
                .await
                .unwrap();
            let stream = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receiver);
            let mut responses = lease.lease_keep_alive(stream).await.unwrap().into_inner();
            let first = responses.message().await.unwrap().unwrap();
            answered.send(first.id).await.unwrap();
            // Every stream stays open until all have been answered.
            let _ = released.wait_for(|r| *r).await;
            drop(requests);
        });
    }
    drop(answered);
    let mut ids = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while ids.len() < STREAMS_ON_ONE_CONNECTION {
            ids.push(answers.recv().await.unwrap());
        }
    })
    .await;
    let _ = release.send(true);
    assert!(
        all.is_ok(),
        "{} of {STREAMS_ON_ONE_CONNECTION} streams answered on one connection",
        ids.len()
    );
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1..=STREAMS_ON_ONE_CONNECTION as i64).collect::<Vec<_>>()
    );
}

/// Watch streams opened at once: more than the former fixed cap of 1,024.
const WATCH_STREAMS: usize = 1_100;

#[tokio::test]
async fn more_than_a_thousand_watch_streams_are_served() {
    use kvd_server::pb::etcdserverpb::watch_client::WatchClient;
    let server = common::start_kvd(&[]);
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (created, mut creations) = tokio::sync::mpsc::channel(WATCH_STREAMS);
    let (release, released) = tokio::sync::watch::channel(false);
    for n in 0..WATCH_STREAMS {
        let mut watch = WatchClient::new(channel.clone());
        let created = created.clone();
        let mut released = released.clone();
        tokio::spawn(async move {
            let (requests, receiver) = tokio::sync::mpsc::channel(1);
            let create = pb::WatchRequest {
                request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                    pb::WatchCreateRequest {
                        key: Bytes::from(format!("w{n}")),
                        ..pb::WatchCreateRequest::default()
                    },
                )),
            };
            requests.send(create).await.unwrap();
            let stream = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receiver);
            let answer = match watch.watch(stream).await {
                Ok(responses) => responses.into_inner().message().await.map(|r| r.unwrap()),
                Err(status) => Err(status),
            };
            let _ = created.send(answer.map(|r| r.created)).await;
            let _ = released.wait_for(|r| *r).await;
            drop(requests);
        });
    }
    drop(created);
    let mut answers = Vec::new();
    let collected = tokio::time::timeout(Duration::from_secs(120), async {
        while answers.len() < WATCH_STREAMS {
            answers.push(creations.recv().await.unwrap());
        }
    })
    .await;
    let _ = release.send(true);
    assert!(collected.is_ok(), "{} answers in time", answers.len());
    let refused: Vec<_> = answers.iter().filter(|a| !matches!(a, Ok(true))).collect();
    assert!(
        refused.is_empty(),
        "{} refused, e.g. {:?}",
        refused.len(),
        refused.first()
    );
}

#[tokio::test]
async fn watch_streams_beyond_the_flag_are_unavailable() {
    use kvd_server::pb::etcdserverpb::watch_client::WatchClient;
    let server = common::start_kvd(&["--max-watch-streams", "2"]);
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut open = Vec::new();
    for _ in 0..2 {
        let (requests, receiver) = tokio::sync::mpsc::channel::<pb::WatchRequest>(1);
        let stream = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receiver);
        let responses = WatchClient::new(channel.clone())
            .watch(stream)
            .await
            .unwrap();
        open.push((requests, responses));
    }
    let (_requests, receiver) = tokio::sync::mpsc::channel::<pb::WatchRequest>(1);
    let stream = tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(receiver);
    let third = WatchClient::new(channel.clone()).watch(stream).await;
    let status = third.expect_err("the third stream is refused");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().contains("--max-watch-streams"),
        "{status:?}"
    );
}

/// The server's open-file limit in the slow-connection test: kvd keeps 128 descriptors for
/// itself, so at most 128 connections are served.
const SLOW_TEST_OPEN_FILES: u32 = 256;
/// Connections the slow-connection test opens: more than the server has descriptors for.
const SLOW_CONNECTIONS: usize = 300;
/// How long the test's attackers keep trickling bytes, at most.
const TRICKLE_FOR: Duration = Duration::from_secs(40);
/// The HTTP/2 client preface; the attackers send all of it but its last byte.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Puts `key` through the established gRPC client `kv` on `runtime`; returns the revision.
fn established_put(
    runtime: &tokio::runtime::Runtime,
    kv: &mut kvd_server::pb::etcdserverpb::kv_client::KvClient<tonic::transport::Channel>,
    key: &str,
) -> i64 {
    let request = pb::PutRequest {
        key: Bytes::from(key.to_owned()),
        value: Bytes::from_static(b"v"),
        ..pb::PutRequest::default()
    };
    let put = runtime.block_on(async { tokio::time::timeout(CALL_TIMEOUT, kv.put(request)).await });
    put.expect("the established client answered in time")
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision
}

#[test]
fn slow_and_silent_connections_leave_new_clients_and_health_answered() {
    use std::io::Write;
    let server = common::start_kvd_with_open_files(
        SLOW_TEST_OPEN_FILES,
        &["--connection-header-timeout", "2s"],
    );
    let host = server.endpoint.trim_start_matches("http://").to_owned();
    // An established gRPC client, connected before the attack.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone()).unwrap();
    let channel = runtime.block_on(channel.connect()).unwrap();
    let mut established = kvd_server::pb::etcdserverpb::kv_client::KvClient::new(channel);
    assert_eq!(established_put(&runtime, &mut established, "before"), 2);

    // Half the attackers send nothing; half trickle the HTTP/2 preface a byte at a time and
    // never send its last byte, so no connection ever completes anything.
    let mut silent = Vec::new();
    let mut trickling = Vec::new();
    for n in 0..SLOW_CONNECTIONS {
        let stream = std::net::TcpStream::connect(&host).unwrap();
        if n % 2 == 0 {
            silent.push(stream);
        } else {
            trickling.push(stream);
        }
    }
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let trickler = std::thread::spawn(move || {
        for sent in 0..PREFACE.len() - 1 {
            for stream in &mut trickling {
                let _ = stream.write_all(&PREFACE[sent..=sent]);
            }
            if stopped.recv_timeout(Duration::from_millis(500)).is_ok() {
                return trickling;
            }
        }
        // Hold the connections (without sending) until the test is done.
        let _ = stopped.recv_timeout(TRICKLE_FOR);
        trickling
    });

    // A new client and /health are answered while the attackers are still connected.
    let healthy = common::wait_until(Duration::from_secs(30), || {
        matches!(common::http_get(&server.endpoint, "/health"), Ok((200, _)))
    });
    let put = common::wait_until(Duration::from_secs(30), || {
        common::etcdctl(&server.endpoint, &["put", "after", "attack"], None).code == 0
    });
    let refused = common::http_get(&server.endpoint, "/metrics")
        .ok()
        .and_then(|(_, metrics)| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix("kvd_connections_refused_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
    let _ = stop.send(());
    let trickling = trickler.join().unwrap();
    assert!(healthy, "/health unanswered; log:\n{}", server.log());
    assert!(put, "a new client was not served; log:\n{}", server.log());
    // The established connection was never dropped: its put follows the new client's.
    assert_eq!(established_put(&runtime, &mut established, "during"), 4);
    assert!(
        refused.is_some_and(|n| n > 0),
        "refusals counted: {refused:?}"
    );
    assert!(
        server
            .log()
            .contains("--max-connections lowered to fit the open-file limit")
    );
    drop((silent, trickling));
}

/// Connections that each announce an oversized HEADERS frame.
const OVERSIZED_HEADER_CONNECTIONS: usize = 300;
/// Payload bytes each of them sends before stalling: just under the former 1 MiB the
/// `:authority` repair held per connection.
const OVERSIZED_HEADER_SENT_BYTES: usize = 1_000_000;
/// Most the server's peak resident memory may exceed its resident memory before the attack:
/// a bound on memory, far below the 300 MB the former buffering took.
const OVERSIZED_HEADER_RSS_GROWTH_MAX_KIB: u64 = 64 * 1024;
/// How long the server may take to close all the attack connections.
const OVERSIZED_HEADER_CLOSE_WAIT: Duration = Duration::from_secs(60);

/// Reads `stream` until the server closes it (end of file or a reset) or `deadline`
/// passes; returns whether it was closed.
fn closed_by_server(stream: &mut std::net::TcpStream, deadline: Instant) -> bool {
    use std::io::{ErrorKind, Read};
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // A reset: the server closed the socket with our bytes still unread.
            Err(_) => return true,
        }
    }
}

#[test]
fn announced_oversized_header_frames_leave_memory_bounded() {
    use std::io::Write;
    let server = common::start_kvd(&[]);
    let host = server.endpoint.trim_start_matches("http://").to_owned();
    assert!(matches!(
        common::http_get(&server.endpoint, "/health"),
        Ok((200, _))
    ));
    let before = server.rss_kib();
    // From here the peak counts only what the attack makes the server hold.
    server.reset_peak_rss();
    // The preface, an empty SETTINGS frame, and a HEADERS frame announcing 16 MiB - 1 bytes
    // (the largest length a frame header holds) of which ~1 MB follows.
    let mut attack = PREFACE.to_vec();
    attack.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    attack.extend_from_slice(&[0xff, 0xff, 0xff, 0x1, 0, 0, 0, 0, 1]);
    attack.extend(std::iter::repeat_n(0u8, OVERSIZED_HEADER_SENT_BYTES));
    let mut open = Vec::new();
    for _ in 0..OVERSIZED_HEADER_CONNECTIONS {
        let mut stream = std::net::TcpStream::connect(&host).unwrap();
        stream
            .set_write_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        // The server may close the connection before all of it is written.
        let _ = stream.write_all(&attack);
        open.push(stream);
    }
    // Measure only once the server has dealt with every attack connection: each is closed
    // (or refused) by the server, so whatever it read of them it read before this point.
    let deadline = Instant::now() + OVERSIZED_HEADER_CLOSE_WAIT;
    for (n, stream) in open.iter_mut().enumerate() {
        assert!(
            closed_by_server(stream, deadline),
            "attack connection {n} still open; log:\n{}",
            server.log()
        );
    }
    let peak = server.peak_rss_kib();
    drop(open);
    let growth = peak.saturating_sub(before);
    assert!(
        growth < OVERSIZED_HEADER_RSS_GROWTH_MAX_KIB,
        "peak RSS {growth} KiB above the RSS before the attack ({before} -> {peak})"
    );
}

/// Values written before the snapshot test: 160 × 256 KiB, a 40 MiB database.
const SNAPSHOT_TEST_VALUES: usize = 160;
const SNAPSHOT_TEST_VALUE_BYTES: usize = 256 * 1024;
/// Stalled snapshot streams opened: more than `--max-snapshots 4` lets run.
const STALLED_SNAPSHOTS: usize = 8;
/// Most the data directory may grow while snapshots stall (no copy is written).
const SNAPSHOT_DIR_GROWTH_MAX_BYTES: u64 = 8 << 20;
/// Most the server's RSS may grow while snapshots stall: a bound on memory.
const SNAPSHOT_RSS_GROWTH_MAX_KIB: u64 = 64 * 1024;

/// Returns the bytes of the files in `dir` and its subdirectories.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                dir_bytes(&entry.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_snapshots_hold_no_disk_bounded_memory_and_raise_no_alarm() {
    use kvd_server::pb::etcdserverpb::kv_client::KvClient;
    use kvd_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
    let server = common::start_kvd(&["--max-snapshots", "4", "--snapshot-stall-timeout", "3s"]);
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel.clone());
    for n in 0..SNAPSHOT_TEST_VALUES {
        let request = pb::PutRequest {
            key: Bytes::from(format!("big/{n:04}")),
            value: Bytes::from(vec![b'a' + (n % 26) as u8; SNAPSHOT_TEST_VALUE_BYTES]),
            ..pb::PutRequest::default()
        };
        kv.put(request).await.unwrap();
    }
    let dir_before = dir_bytes(&server.data_dir);
    let rss_before = server.rss_kib();

    // Each stall on its own connection: the client reads one message and then nothing, so
    // the server sees its flow-control window close.
    let mut stalled = Vec::new();
    let mut refused = 0;
    for _ in 0..STALLED_SNAPSHOTS {
        let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
            .unwrap()
            .initial_stream_window_size(64 * 1024)
            .initial_connection_window_size(64 * 1024)
            .connect()
            .await
            .unwrap();
        match MaintenanceClient::new(channel)
            .snapshot(pb::SnapshotRequest {})
            .await
        {
            Ok(response) => {
                let mut stream = response.into_inner();
                let first = stream.message().await.unwrap().unwrap();
                assert!(first.remaining_bytes > 0);
                stalled.push(stream);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("--max-snapshots"), "{status:?}");
                refused += 1;
            }
        }
    }
    let dir_during = dir_bytes(&server.data_dir);
    let rss_during = server.rss_kib();
    let dir_growth = dir_during.saturating_sub(dir_before);
    assert!(
        dir_growth < SNAPSHOT_DIR_GROWTH_MAX_BYTES,
        "the data directory grew by {dir_growth} bytes ({dir_before} -> {dir_during})"
    );
    let rss_growth = rss_during.saturating_sub(rss_before);
    assert!(
        rss_growth < SNAPSHOT_RSS_GROWTH_MAX_KIB,
        "RSS grew by {rss_growth} KiB ({rss_before} -> {rss_during})"
    );
    assert_eq!(
        (stalled.len(), refused),
        (4, STALLED_SNAPSHOTS - 4),
        "four slots"
    );
    // Writes go on meanwhile.
    kv.put(pb::PutRequest {
        key: Bytes::from_static(b"during"),
        value: Bytes::from_static(b"v"),
        ..pb::PutRequest::default()
    })
    .await
    .unwrap();

    // After the stall timeout the slots are free again: a new snapshot is served whole.
    let full = common::wait_until_async(Duration::from_secs(30), || async {
        let mut maintenance = MaintenanceClient::new(channel.clone());
        let Ok(response) = maintenance.snapshot(pb::SnapshotRequest {}).await else {
            return false;
        };
        let mut stream = response.into_inner();
        let mut image = Vec::new();
        while let Some(chunk) = stream.message().await.unwrap() {
            image.extend_from_slice(&chunk.blob);
        }
        image.len() > SNAPSHOT_TEST_VALUES * SNAPSHOT_TEST_VALUE_BYTES
    })
    .await;
    assert!(full, "no full snapshot after the stall timeout");
    // A stalled client that reads again gets Aborted, never an OK end of a short image.
    for mut stream in stalled {
        let ended = loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => break None,
                Err(status) => break Some(status),
            }
        };
        let status = ended.expect("a stalled stream must not end OK");
        assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    }
    let alarms = MaintenanceClient::new(channel.clone())
        .alarm(pb::AlarmRequest::default())
        .await
        .unwrap()
        .into_inner()
        .alarms;
    assert!(alarms.is_empty(), "{alarms:?}");
}

/// HTTP-7: a `grpc-timeout` that has run out before the call runs refuses it with
/// `DeadlineExceeded` and writes nothing; a call still waiting (here for its request body)
/// when its deadline passes is answered the same way; a malformed `grpc-timeout` gets
/// `Internal` and writes nothing; a deadline with room to spare changes nothing. (Raw
/// calls: tonic's client enforces a deadline itself, and could not show the server's.)
#[tokio::test]
async fn grpc_timeout_is_the_calls_deadline() {
    const GRPC_DEADLINE_EXCEEDED: &str = "4";
    let server = common::start_kvd(&[]);
    let mut send = h2_connect(&server.endpoint).await;
    let put = |key: &str| {
        grpc_message(
            &pb::PutRequest {
                key: Bytes::from(key.to_owned()),
                value: Bytes::from_static(b"v"),
                ..pb::PutRequest::default()
            }
            .encode_to_vec(),
        )
    };
    let path = "/etcdserverpb.KV/Put";
    let mut late = RawCall::start_with(&mut send, path, &[("grpc-timeout", "1n")]).await;
    late.send(put("late"), true);
    let (code, message, _) = late.status::<pb::PutResponse>().await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        (GRPC_DEADLINE_EXCEEDED, "context deadline exceeded")
    );
    let started = Instant::now();
    let mut waiting = RawCall::start_with(&mut send, path, &[("grpc-timeout", "300m")]).await;
    let (code, message, _) = waiting.status::<pb::PutResponse>().await;
    assert_eq!(
        (code.as_str(), message.as_str()),
        (GRPC_DEADLINE_EXCEEDED, "context deadline exceeded")
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    for bad in ["xyz", "10", "123456789S", "5x"] {
        let mut call = RawCall::start_with(&mut send, path, &[("grpc-timeout", bad)]).await;
        call.send(put("malformed"), true);
        let (code, message, _) = call.status::<pb::PutResponse>().await;
        assert_eq!(code, GRPC_INTERNAL, "{bad}: {message}");
        assert!(
            message.contains("malformed grpc-timeout"),
            "{bad}: {message}"
        );
    }
    // The largest timeout the format holds (about 11,000 years) is a deadline like any other.
    for (key, timeout) in [("in-time", "30S"), ("far", "99999999H")] {
        let mut call = RawCall::start_with(&mut send, path, &[("grpc-timeout", timeout)]).await;
        call.send(put(key), true);
        assert!(
            call.message::<pb::PutResponse>().await.is_some(),
            "{timeout}"
        );
    }
    for (key, found) in [("late", 0), ("malformed", 0), ("in-time", 1), ("far", 1)] {
        let mut call = RawCall::start(&mut send, "/etcdserverpb.KV/Range").await;
        let range = pb::RangeRequest {
            key: Bytes::from(key.to_owned()),
            ..pb::RangeRequest::default()
        };
        call.send(grpc_message(&range.encode_to_vec()), true);
        let got = call.message::<pb::RangeResponse>().await.unwrap();
        assert_eq!(got.kvs.len(), found, "{key}");
    }
}
