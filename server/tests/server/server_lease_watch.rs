//! The Lease and Watch services over the wire, with the generated gRPC client against a kvd
//! process: etcd's codes and messages for lease errors, keep-alive answers in order (TTL 0
//! for an unknown lease), many watches on one stream with ids, filters, prev_kv, catch-up,
//! cancel, progress and refusals, the compacted-watch notice, and the gauges in /metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::assert_status;
use crate::common::connect;

use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
use kvd_server::pb::etcdserverpb::watch_client::WatchClient;
use kvd_server::pb::etcdserverpb::watch_create_request::FilterType;
use kvd_server::pb::etcdserverpb::watch_request::RequestUnion;
use kvd_server::pb::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseLeasesRequest, LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest,
    ResponseHeader, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse,
};
use kvd_server::pb::mvccpb::event::EventType;
use tokio::sync::mpsc;
use tonic::Code;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The longest a test waits for one answer.
const PATIENCE: Duration = Duration::from_secs(10);

fn put(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: Bytes::from(key.to_owned()),
        value: Bytes::from(value.to_owned()),
        lease,
        ..PutRequest::default()
    }
}

/// Asserts `header` is a full etcd header (ids and raft term) at `revision`.
fn assert_full_header(header: Option<ResponseHeader>, revision: i64) {
    let header = header.expect("a header");
    assert_ne!(header.cluster_id, 0, "{header:?}");
    assert_ne!(header.member_id, 0, "{header:?}");
    assert_eq!((header.revision, header.raft_term), (revision, 1));
}

#[tokio::test]
async fn lease_rpcs_answer_as_etcd() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut lease = LeaseClient::new(channel.clone());
    let mut kv = KvClient::new(channel);

    let short = lease
        .lease_grant(LeaseGrantRequest { ttl: 1, id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(short.ttl, 2, "raised to the minimum TTL");
    assert!(short.id > 0 && short.error.is_empty());
    assert_full_header(short.header, 1);

    let granted = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 42 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((granted.id, granted.ttl), (42, 60));
    let again = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 42 })
        .await;
    assert_status(
        again,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    let huge = lease
        .lease_grant(LeaseGrantRequest {
            ttl: 9_000_000_001,
            id: 0,
        })
        .await;
    assert_status(huge, Code::OutOfRange, "etcdserver: too large lease TTL");

    kv.put(put("k1", "v", 42)).await.unwrap();
    let unknown = kv.put(put("k2", "v", 1234)).await;
    assert_status(
        unknown,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );

    let ttl = lease
        .lease_time_to_live(LeaseTimeToLiveRequest { id: 42, keys: true })
        .await
        .unwrap()
        .into_inner();
    assert!((58..=60).contains(&ttl.ttl), "{ttl:?}");
    assert_eq!((ttl.id, ttl.granted_ttl), (42, 60));
    assert_eq!(ttl.keys, vec![Bytes::from_static(b"k1")]);
    assert_full_header(ttl.header, 2);
    let missing = lease
        .lease_time_to_live(LeaseTimeToLiveRequest {
            id: 7777,
            keys: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((missing.ttl, missing.granted_ttl), (-1, 0));

    let list = lease
        .lease_leases(LeaseLeasesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut ids: Vec<i64> = list.leases.iter().map(|l| l.id).collect();
    ids.sort_unstable();
    let mut expected = vec![42, short.id];
    expected.sort_unstable();
    assert_eq!(ids, expected);
    assert_full_header(list.header, 2);

    let revoked = lease
        .lease_revoke(LeaseRevokeRequest { id: 42 })
        .await
        .unwrap()
        .into_inner();
    assert_full_header(revoked.header, 3);
    let gone = kv
        .range(RangeRequest {
            key: Bytes::from_static(b"k1"),
            ..RangeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.count, 0, "the lease's key went with it");
    let twice = lease.lease_revoke(LeaseRevokeRequest { id: 42 }).await;
    assert_status(
        twice,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
}

#[tokio::test]
async fn keep_alive_answers_each_request_in_order() {
    let server = common::start_kvd(&[]);
    let mut lease = LeaseClient::new(connect(&server.endpoint).await);
    lease
        .lease_grant(LeaseGrantRequest { ttl: 30, id: 5 })
        .await
        .unwrap();
    let (requests, receiver) = mpsc::channel(8);
    let mut answers = lease
        .lease_keep_alive(ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    for id in [5, 6, 5] {
        requests.send(LeaseKeepAliveRequest { id }).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let answer = tokio::time::timeout(PATIENCE, answers.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_full_header(answer.header, 1);
        got.push((answer.id, answer.ttl));
    }
    assert_eq!(
        got,
        vec![(5, 30), (6, 0), (5, 30)],
        "TTL 0 for an unknown lease"
    );
    // Closing our side ends the stream with OK, as etcd does.
    drop(requests);
    let end = tokio::time::timeout(PATIENCE, answers.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
}

/// One client-side watch stream: requests go in through a channel.
struct WatchSession {
    requests: mpsc::Sender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
}

impl WatchSession {
    async fn open(channel: Channel) -> WatchSession {
        let (requests, receiver) = mpsc::channel(8);
        let responses = WatchClient::new(channel)
            .watch(ReceiverStream::new(receiver))
            .await
            .unwrap()
            .into_inner();
        WatchSession {
            requests,
            responses,
        }
    }

    async fn send(&self, request: RequestUnion) {
        let request = WatchRequest {
            request_union: Some(request),
        };
        self.requests.send(request).await.unwrap();
    }

    async fn create(&self, create: WatchCreateRequest) {
        self.send(RequestUnion::CreateRequest(create)).await;
    }

    async fn next(&mut self) -> WatchResponse {
        tokio::time::timeout(PATIENCE, self.responses.message())
            .await
            .expect("a watch response within the patience")
            .unwrap()
            .expect("the stream is open")
    }

    /// Asserts nothing arrives for a short while.
    async fn quiet(&mut self) {
        let nothing = tokio::time::timeout(Duration::from_millis(300), self.responses.message());
        assert!(nothing.await.is_err(), "unexpected watch response");
    }
}

fn watch_key(key: &str) -> WatchCreateRequest {
    WatchCreateRequest {
        key: Bytes::from(key.to_owned()),
        ..WatchCreateRequest::default()
    }
}

#[tokio::test]
async fn one_stream_carries_many_watches() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    kv.put(put("a", "1", 0)).await.unwrap(); // revision 2
    kv.put(put("b", "1", 0)).await.unwrap(); // revision 3
    let mut session = WatchSession::open(channel).await;

    // From a past revision, with previous values: created, then the history.
    session
        .create(WatchCreateRequest {
            start_revision: 2,
            prev_kv: true,
            ..watch_key("a")
        })
        .await;
    let created = session.next().await;
    assert!(created.created && !created.canceled);
    assert_eq!(created.watch_id, 0);
    assert_full_header(created.header, 3);
    let history = session.next().await;
    assert_eq!(history.watch_id, 0);
    assert_eq!(history.events.len(), 1);
    let kv_a = history.events[0].kv.clone().unwrap();
    assert_eq!((kv_a.key.as_ref(), kv_a.mod_revision), (&b"a"[..], 2));
    assert!(
        history.events[0].prev_kv.is_none(),
        "the put created the key"
    );

    // Every key, deletes only.
    session
        .create(WatchCreateRequest {
            range_end: Bytes::from_static(b"\0"),
            filters: vec![FilterType::Noput as i32],
            ..watch_key("")
        })
        .await;
    let created = session.next().await;
    assert_eq!((created.watch_id, created.created), (1, true));

    kv.put(put("a", "2", 0)).await.unwrap(); // revision 4
    let live = session.next().await;
    assert_eq!(live.watch_id, 0);
    assert_full_header(live.header, 4);
    let event = &live.events[0];
    assert_eq!(event.r#type, EventType::Put as i32);
    assert_eq!(event.kv.as_ref().unwrap().value, Bytes::from_static(b"2"));
    let prev = event.prev_kv.as_ref().expect("prev_kv asked for");
    assert_eq!((prev.value.as_ref(), prev.mod_revision), (&b"1"[..], 2));

    kv.delete_range(DeleteRangeRequest {
        key: Bytes::from_static(b"b"),
        ..DeleteRangeRequest::default()
    })
    .await
    .unwrap(); // revision 5
    let deleted = session.next().await;
    assert_eq!(deleted.watch_id, 1, "the NOPUT watch saw only the delete");
    let event = &deleted.events[0];
    assert_eq!(event.r#type, EventType::Delete as i32);
    let kv_b = event.kv.as_ref().unwrap();
    assert_eq!(
        (kv_b.key.as_ref(), kv_b.mod_revision, kv_b.create_revision),
        (&b"b"[..], 5, 0)
    );

    // Refusals: a duplicate id and an empty range.
    session
        .create(WatchCreateRequest {
            watch_id: 1,
            ..watch_key("c")
        })
        .await;
    let duplicate = session.next().await;
    assert!(duplicate.created && duplicate.canceled);
    assert_eq!(
        (duplicate.watch_id, duplicate.cancel_reason.as_str()),
        (-1, "mvcc: duplicate watch ID provided on the WatchStream")
    );
    session
        .create(WatchCreateRequest {
            range_end: Bytes::from_static(b"a"),
            ..watch_key("z")
        })
        .await;
    let empty = session.next().await;
    assert!(empty.created && empty.canceled);
    assert_eq!(
        (empty.watch_id, empty.cancel_reason.as_str()),
        (-1, "mvcc: watcher range is empty")
    );

    session
        .send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
        .await;
    let progress = session.next().await;
    assert_eq!(progress.watch_id, -1);
    assert!(progress.events.is_empty() && !progress.created && !progress.canceled);
    assert_full_header(progress.header, 5);

    session
        .send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: 0,
        }))
        .await;
    let canceled = session.next().await;
    assert_eq!((canceled.watch_id, canceled.canceled), (0, true));
    assert_full_header(canceled.header, 5);
    // Canceling an unknown watch gets no answer; an empty request is ignored.
    session
        .send(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: 9,
        }))
        .await;
    session
        .requests
        .send(WatchRequest::default())
        .await
        .unwrap();
    session.quiet().await;

    let (_, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
    for line in [
        "kvd_watchers 1",
        "kvd_grpc_streams_open{stream=\"watch\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    kv.put(put("a", "3", 0)).await.unwrap();
    session.quiet().await;
}

#[tokio::test]
async fn watch_from_a_compacted_revision_is_canceled() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    for value in ["1", "2", "3"] {
        kv.put(put("c", value, 0)).await.unwrap();
    }
    kv.compact(CompactionRequest {
        revision: 3,
        physical: true,
    })
    .await
    .unwrap();
    let mut session = WatchSession::open(channel).await;
    session
        .create(WatchCreateRequest {
            start_revision: 2,
            ..watch_key("c")
        })
        .await;
    let created = session.next().await;
    assert!(created.created && !created.canceled);
    let canceled = session.next().await;
    assert_eq!(
        (
            canceled.watch_id,
            canceled.canceled,
            canceled.compact_revision
        ),
        (created.watch_id, true, 3)
    );
    // etcd's compacted notice has revision 0 in an otherwise full header.
    assert_full_header(canceled.header, 0);

    // At the compact revision itself the history is still there.
    session
        .create(WatchCreateRequest {
            start_revision: 3,
            ..watch_key("c")
        })
        .await;
    assert!(session.next().await.created);
    let history = session.next().await;
    let revisions: Vec<i64> = history
        .events
        .iter()
        .map(|e| e.kv.as_ref().unwrap().mod_revision)
        .collect();
    assert_eq!(revisions, vec![3, 4]);
}

#[tokio::test]
async fn a_stream_whose_client_went_away_releases_its_watches() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut session = WatchSession::open(channel.clone()).await;
    session.create(watch_key("gone")).await;
    assert!(session.next().await.created);
    // The metrics count the watch and its stream while the client is there.
    let (_, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
    assert!(
        metrics.lines().any(|l| l == "kvd_watchers 1")
            && metrics
                .lines()
                .any(|l| l == "kvd_grpc_streams_open{stream=\"watch\"} 1"),
        "watch not counted:\n{metrics}"
    );
    drop(session);
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let (_, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
        if metrics.lines().any(|l| l == "kvd_watchers 0")
            && metrics
                .lines()
                .any(|l| l == "kvd_grpc_streams_open{stream=\"watch\"} 0")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "watch not released:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_client_that_stops_reading_still_gets_every_event_in_order() {
    // More than the HTTP/2 window, the server's buffer and the engine's per-watch buffer
    // together hold, so the watch must fall back to catching up from history.
    const PUTS: i64 = 1_000;
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut session = WatchSession::open(channel.clone()).await;
    session
        .create(WatchCreateRequest {
            range_end: Bytes::from_static(b"slow0"),
            ..watch_key("slow/")
        })
        .await;
    assert!(session.next().await.created);

    // Write while nobody reads the stream.
    let value = "x".repeat(1_024);
    let mut writers = Vec::new();
    for writer in 0..4 {
        let mut kv = KvClient::new(channel.clone());
        let value = value.clone();
        writers.push(tokio::spawn(async move {
            for i in 0..PUTS / 4 {
                let key = format!("slow/{writer}/{i:04}");
                kv.put(put(&key, &value, 0)).await.unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }

    // Now read: every revision once, in order.
    let mut revisions = Vec::new();
    while revisions.len() < PUTS as usize {
        let response = session.next().await;
        assert!(!response.canceled, "{response:?}");
        revisions.extend(
            response
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision),
        );
    }
    let expected: Vec<i64> = (2..2 + PUTS).collect();
    assert_eq!(revisions, expected);
    session.quiet().await;
}

/// Returns the number of threads of process `pid` (Linux: `/proc/PID/status`).
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads line")
}

/// WATCH-SRV-1, WATCH-SRV-3: a watch stream holds no server thread, so two thousand streams
/// (each with a watch on one key) leave the server's thread count where it was, and every
/// one of them gets the put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_watch_streams_hold_no_thread_each() {
    const STREAMS: usize = 2_000;
    const CONNECTIONS: usize = 4;
    let server = common::start_kvd(&[]);
    let mut channels = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(connect(&server.endpoint).await);
    }
    let before = threads_of(server.pid());
    let mut sessions = Vec::with_capacity(STREAMS);
    for i in 0..STREAMS {
        let mut session = WatchSession::open(channels[i % CONNECTIONS].clone()).await;
        session.create(watch_key("crowd")).await;
        assert!(session.next().await.created);
        sessions.push(session);
    }
    let during = threads_of(server.pid());
    // The blocking pool may start a few threads for the creates; a thread per stream would
    // add two thousand.
    assert!(
        during < before + 64,
        "{STREAMS} watch streams took the server from {before} to {during} threads"
    );
    let mut kv = KvClient::new(channels[0].clone());
    let revision = kv
        .put(put("crowd", "v", 0))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    for session in &mut sessions {
        let response = session.next().await;
        assert_eq!(response.events.len(), 1, "{response:?}");
        assert_eq!(
            response.events[0].kv.as_ref().unwrap().mod_revision,
            revision
        );
    }
}

/// `--experimental-watch-progress-notify-interval` sets how often an idle watch created
/// with `progress_notify` hears the current revision (etcd's flag; the default is 10
/// minutes, too long for a test to see).
#[tokio::test]
async fn the_progress_notify_interval_is_a_flag() {
    let server = common::start_kvd(&["--experimental-watch-progress-notify-interval", "1s"]);
    let channel = connect(&server.endpoint).await;
    KvClient::new(channel.clone())
        .put(put("a", "1", 0))
        .await
        .unwrap(); // revision 2
    let mut session = WatchSession::open(channel).await;
    session
        .create(WatchCreateRequest {
            progress_notify: true,
            ..watch_key("idle")
        })
        .await;
    let created = session.next().await;
    assert!(created.created, "{created:?}");
    // No event comes for the idle key, so the next response is a progress notification.
    for _ in 0..2 {
        let progress = session.next().await;
        assert!(progress.events.is_empty(), "{progress:?}");
        assert!(!progress.created && !progress.canceled, "{progress:?}");
        assert_full_header(progress.header, 2);
    }
}
