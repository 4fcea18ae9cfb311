//! Bad and unusual input over the wire, with the generated gRPC client: each request gets
//! etcd's gRPC code and message (etcd 3.4's error table), and the server keeps serving
//! on the same connection afterwards. Also the shape of the answers etcd's clients rely on
//! (Status, MemberList, headers) and the refusals of what kvd does not serve yet. Leases and
//! watches over the wire are in `server_lease_watch.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::assert_status;
use crate::common::connect;

use bytes::Bytes;
use kvd_server::pb::etcdserverpb::auth_client::AuthClient;
use kvd_server::pb::etcdserverpb::cluster_client::ClusterClient;
use kvd_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd_server::pb::etcdserverpb::request_op::Request;
use kvd_server::pb::etcdserverpb::{
    AlarmRequest, AuthStatusRequest, AuthenticateRequest, CompactionRequest, Compare,
    DeleteRangeRequest, HashKvRequest, MemberAddRequest, MemberListRequest, MemberPromoteRequest,
    MemberRemoveRequest, MemberUpdateRequest, MoveLeaderRequest, PutRequest, RangeRequest,
    RequestOp, StatusRequest, TxnRequest,
};
use tonic::Code;
use tonic::transport::Channel;

fn put(key: &str, value: impl Into<Bytes>) -> PutRequest {
    PutRequest {
        key: Bytes::from(key.to_owned()),
        value: value.into(),
        ..PutRequest::default()
    }
}

fn range(key: &str) -> RangeRequest {
    RangeRequest {
        key: Bytes::from(key.to_owned()),
        ..RangeRequest::default()
    }
}

fn put_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(Request::RequestPut(put(key, "v"))),
    }
}

/// Asserts the server still answers a write and a read on `kv`'s connection.
async fn assert_serving(kv: &mut KvClient<Channel>) {
    let written = kv.put(put("alive", "yes")).await.unwrap().into_inner();
    let read = kv.range(range("alive")).await.unwrap().into_inner();
    assert_eq!(read.kvs[0].value, Bytes::from_static(b"yes"));
    assert_eq!(
        read.header.unwrap().revision,
        written.header.unwrap().revision
    );
}

#[tokio::test]
async fn oversized_messages_get_etcds_errors_and_the_connection_survives() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);

    // Over --max-request-bytes (1.5 MiB) but under the gRPC limit: the engine refuses it.
    let too_large = kv.put(put("big", vec![b'a'; 1_572_864])).await;
    assert_status(
        too_large,
        Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    // etcd's limits are exact: this value fits (spec/etcd.md §12).
    kv.put(put("big", vec![b'a'; 1_572_836 - 2])).await.unwrap();

    // Over the gRPC receive limit (max-request-bytes + 512 KiB): refused before decoding,
    // as gRPC-go refuses it.
    // The same put etcd 3.4.23 answered with "(2150410 vs. 2097152)" (spec/etcd.md §12).
    let huge = put("big", vec![b'a'; 2_150_400]);
    assert_eq!(prost::Message::encoded_len(&huge), 2_150_410);
    let huge = kv.put(huge).await;
    let expected = "grpc: received message larger than max (2150410 vs. 2097152)";
    assert_status(huge, Code::ResourceExhausted, expected);
    assert_serving(&mut kv).await;
}

#[tokio::test]
async fn empty_keys_are_refused_everywhere() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    let message = "etcdserver: key is not provided";
    assert_status(kv.range(range("")).await, Code::InvalidArgument, message);
    assert_status(kv.put(put("", "v")).await, Code::InvalidArgument, message);
    let delete = DeleteRangeRequest::default();
    assert_status(
        kv.delete_range(delete).await,
        Code::InvalidArgument,
        message,
    );
    let compare = Compare {
        key: Bytes::new(),
        ..Compare::default()
    };
    let txn = TxnRequest {
        compare: vec![compare],
        ..TxnRequest::default()
    };
    assert_status(kv.txn(txn).await, Code::InvalidArgument, message);
    let txn = TxnRequest {
        success: vec![put_op("")],
        ..TxnRequest::default()
    };
    assert_status(kv.txn(txn).await, Code::InvalidArgument, message);
    assert_serving(&mut kv).await;
}

#[tokio::test]
async fn compacted_and_future_revisions_are_out_of_range() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    for value in ["1", "2", "3"] {
        kv.put(put("k", value.to_owned())).await.unwrap();
    }
    kv.compact(CompactionRequest {
        revision: 3,
        physical: true,
    })
    .await
    .unwrap();
    let compacted = "etcdserver: mvcc: required revision has been compacted";
    let future = "etcdserver: mvcc: required revision is a future revision";
    let at = |revision| RangeRequest {
        revision,
        ..range("k")
    };
    assert_status(kv.range(at(2)).await, Code::OutOfRange, compacted);
    assert_status(kv.range(at(5)).await, Code::OutOfRange, future);
    let old = kv.range(at(3)).await.unwrap().into_inner();
    assert_eq!(
        (old.kvs[0].value.as_ref(), old.header.unwrap().revision),
        (&b"2"[..], 4)
    );
    let again = CompactionRequest {
        revision: 3,
        physical: false,
    };
    assert_status(kv.compact(again).await, Code::OutOfRange, compacted);
    let ahead = CompactionRequest {
        revision: 9,
        physical: false,
    };
    assert_status(kv.compact(ahead).await, Code::OutOfRange, future);
    let mut maintenance = MaintenanceClient::new(connect(&server.endpoint).await);
    let hash = maintenance.hash_kv(HashKvRequest { revision: 2 }).await;
    assert_status(hash, Code::OutOfRange, compacted);
    let hash = maintenance
        .hash_kv(HashKvRequest { revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((hash.compact_revision, hash.hash_revision), (3, 4));
    assert_serving(&mut kv).await;
}

#[tokio::test]
async fn txn_limits_and_duplicates_follow_etcd() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    let ops = |n: usize| (0..n).map(|i| put_op(&format!("k{i}"))).collect::<Vec<_>>();
    let too_many = TxnRequest {
        success: ops(129),
        ..TxnRequest::default()
    };
    let message = "etcdserver: too many operations in txn request";
    assert_status(kv.txn(too_many).await, Code::InvalidArgument, message);
    let most = TxnRequest {
        success: ops(128),
        ..TxnRequest::default()
    };
    assert!(kv.txn(most).await.unwrap().into_inner().succeeded);

    let duplicate = TxnRequest {
        success: vec![put_op("d"), put_op("d")],
        ..TxnRequest::default()
    };
    let message = "etcdserver: duplicate key given in txn request";
    assert_status(kv.txn(duplicate).await, Code::InvalidArgument, message);

    let empty_op = TxnRequest {
        success: vec![put_op("a"), RequestOp { request: None }],
        ..TxnRequest::default()
    };
    assert_status(
        kv.txn(empty_op).await,
        Code::InvalidArgument,
        "etcdserver: key not found",
    );
    assert_serving(&mut kv).await;
}

#[tokio::test]
async fn compare_operand_comes_from_the_matching_field() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    kv.put(put("c", "v")).await.unwrap();
    // VERSION target with the operand in mod_revision: etcd compares the version with 0.
    let compare = Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Version as i32,
        key: Bytes::from_static(b"c"),
        range_end: Bytes::new(),
        target_union: Some(TargetUnion::ModRevision(1)),
    };
    let txn = TxnRequest {
        compare: vec![compare.clone()],
        ..TxnRequest::default()
    };
    assert!(!kv.txn(txn).await.unwrap().into_inner().succeeded);
    let greater = Compare {
        result: CompareResult::Greater as i32,
        ..compare
    };
    let txn = TxnRequest {
        compare: vec![greater],
        ..TxnRequest::default()
    };
    assert!(kv.txn(txn).await.unwrap().into_inner().succeeded);
}

#[tokio::test]
async fn flags_set_the_limits() {
    let server = common::start_kvd(&["--max-txn-ops", "2", "--max-request-bytes", "1024"]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    let txn = TxnRequest {
        success: vec![put_op("a"), put_op("b"), put_op("c")],
        ..Default::default()
    };
    let message = "etcdserver: too many operations in txn request";
    assert_status(kv.txn(txn).await, Code::InvalidArgument, message);
    let too_large = kv.put(put("k", vec![b'a'; 2000])).await;
    assert_status(
        too_large,
        Code::InvalidArgument,
        "etcdserver: request is too large",
    );
    let over_grpc = kv.put(put("k", vec![b'a'; 1024 + 524_288])).await;
    let status = over_grpc.expect_err("over the gRPC limit");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(status.message().ends_with(" vs. 525312)"), "{status:?}");
    assert_serving(&mut kv).await;
}

#[tokio::test]
async fn status_and_member_list_describe_one_leader() {
    let server = common::start_kvd(&["--name", "node-a"]);
    let channel = connect(&server.endpoint).await;
    let mut kv = KvClient::new(channel.clone());
    kv.put(put("k", "v")).await.unwrap();
    let status = MaintenanceClient::new(channel.clone())
        .status(StatusRequest {})
        .await;
    let status = status.unwrap().into_inner();
    let header = status.header.unwrap();
    assert_ne!(header.member_id, 0);
    assert_ne!(header.cluster_id, 0);
    assert_eq!((header.revision, header.raft_term), (2, 1));
    assert_eq!(status.leader, header.member_id);
    assert_eq!(
        (
            status.raft_term,
            status.raft_index,
            status.raft_applied_index
        ),
        (1, 5, 5),
        "etcd's 4 bootstrap entries, then the put"
    );
    assert_eq!(status.version, "3.6.0");
    assert_eq!(status.db_size_quota, 2 << 30);
    assert!(status.db_size >= status.db_size_in_use && status.db_size_in_use > 0);
    assert!(!status.is_learner && status.errors.is_empty());

    let mut cluster = ClusterClient::new(channel.clone());
    let members = cluster
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner();
    let list_header = members.header.unwrap();
    assert_eq!(
        (list_header.member_id, list_header.revision),
        (header.member_id, 0)
    );
    assert_eq!(members.members.len(), 1);
    let member = &members.members[0];
    assert_eq!(
        (member.id, member.name.as_str()),
        (header.member_id, "node-a")
    );
    assert_eq!(member.client_ur_ls, vec![server.endpoint.clone()]);
    assert!(!member.is_learner);

    let range_header = kv
        .range(range("k"))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap();
    assert_eq!(
        (range_header.cluster_id, range_header.member_id),
        (header.cluster_id, header.member_id)
    );

    let alarms = MaintenanceClient::new(channel)
        .alarm(AlarmRequest::default())
        .await
        .unwrap();
    assert!(alarms.into_inner().alarms.is_empty());
}

#[tokio::test]
async fn membership_changes_and_move_leader_answer_as_a_one_member_etcd_does() {
    // CLUSTER-3, MAINT-7: etcd 3.4.23's codes and messages on a one-member cluster, and
    // nothing changes.
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut cluster = ClusterClient::new(channel.clone());
    let listed = cluster
        .member_list(MemberListRequest::default())
        .await
        .unwrap()
        .into_inner()
        .members;
    let me = listed[0].clone();
    let other = me.id ^ 1;
    let not_found = "etcdserver: member not found";
    let removed = cluster
        .member_remove(MemberRemoveRequest { id: other })
        .await;
    assert_status(removed, Code::NotFound, not_found);
    let promoted = cluster
        .member_promote(MemberPromoteRequest { id: other })
        .await;
    assert_status(promoted, Code::NotFound, not_found);
    let update = |id: u64, urls: &[String]| MemberUpdateRequest {
        id,
        peer_ur_ls: urls.to_vec(),
    };
    let updated = cluster.member_update(update(other, &me.peer_ur_ls)).await;
    assert_status(updated, Code::NotFound, not_found);
    let removed = cluster
        .member_remove(MemberRemoveRequest { id: me.id })
        .await;
    let last = "etcdserver: re-configuration failed due to not enough started members";
    assert_status(removed, Code::FailedPrecondition, last);
    let promoted = cluster
        .member_promote(MemberPromoteRequest { id: me.id })
        .await;
    let voting = "etcdserver: can only promote a learner member";
    assert_status(promoted, Code::FailedPrecondition, voting);
    let same = cluster
        .member_update(update(me.id, &me.peer_ur_ls))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        same.members, listed,
        "an update to the URLs it has changes nothing"
    );
    let elsewhere = ["http://127.0.0.1:1".to_owned()];
    let moved = cluster.member_update(update(me.id, &elsewhere)).await;
    assert_eq!(
        moved.expect_err("kvd has no peers").code(),
        Code::Unimplemented
    );

    let mut maintenance = MaintenanceClient::new(channel);
    let stays = maintenance
        .move_leader(MoveLeaderRequest { target_id: me.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stays.header.unwrap().member_id, me.id);
    let away = maintenance
        .move_leader(MoveLeaderRequest { target_id: other })
        .await;
    let transferee = "etcdserver: bad leader transferee";
    assert_status(away, Code::FailedPrecondition, transferee);
    let after = cluster.member_list(MemberListRequest::default()).await;
    assert_eq!(after.unwrap().into_inner().members, listed);
}

#[tokio::test]
async fn unserved_rpcs_say_what_is_missing() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let add = ClusterClient::new(channel.clone())
        .member_add(MemberAddRequest::default())
        .await;
    let add = add.expect_err("no membership changes");
    assert_eq!(add.code(), Code::Unimplemented);
    assert!(
        add.message()
            .starts_with("kvd: member reconfiguration is not supported")
    );

    let mut auth = AuthClient::new(channel.clone());
    let authenticate = auth.authenticate(AuthenticateRequest::default()).await;
    let message = "etcdserver: authentication is not enabled";
    assert_status(authenticate, Code::FailedPrecondition, message);
    assert!(
        !auth
            .auth_status(AuthStatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .enabled
    );
    assert_serving(&mut KvClient::new(channel)).await;
}

/// HTTP-6: a request with a gRPC content type goes straight to the gRPC services, without
/// the HTTP routes' CORS layer; a gRPC path asked with another content type goes through
/// the HTTP routes (CORS headers) and is still answered by tonic, not by the 404 fallback.
#[tokio::test]
async fn grpc_calls_skip_the_http_layers_and_other_content_types_reach_tonic_through_them() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await);
    let mut request = tonic::Request::new(range("k"));
    request
        .metadata_mut()
        .insert("origin", "http://example.test".parse().unwrap());
    let answer = kv.range(request).await.unwrap();
    assert!(
        answer
            .metadata()
            .get("access-control-allow-origin")
            .is_none(),
        "a gRPC answer got CORS headers: {:?}",
        answer.metadata()
    );

    let host = server.endpoint.trim_start_matches("http://").to_owned();
    let head = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&host).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        write!(
            stream,
            "POST /etcdserverpb.KV/Range HTTP/1.1\r\nHost: {host}\r\nOrigin: http://example.test\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        response.to_ascii_lowercase()
    })
    .await
    .unwrap();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("grpc-status:"),
        "tonic did not answer: {head}"
    );
    assert!(
        head.contains("access-control-allow-origin:"),
        "the HTTP routes' CORS layer did not run: {head}"
    );
}

#[tokio::test]
async fn unknown_methods_are_unimplemented() {
    let server = common::start_kvd(&[]);
    let mut grpc = tonic::client::Grpc::new(connect(&server.endpoint).await);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/RangeStream");
    let codec = tonic_prost::ProstCodec::<RangeRequest, RangeRequest>::default();
    let answer = grpc
        .unary(tonic::Request::new(range("k")), path, codec)
        .await;
    assert_eq!(
        answer.expect_err("no such method").code(),
        Code::Unimplemented
    );
    // A path naming no service of etcd's gets kvd's own message.
    for path in [
        "/etcdserverpb.Nope/Range",
        "/v3lockpb.Mutex/Lock",
        "/etcdserverpb.KV",
    ] {
        grpc.ready().await.unwrap();
        let codec = tonic_prost::ProstCodec::<RangeRequest, RangeRequest>::default();
        let answer = grpc
            .unary(
                tonic::Request::new(range("k")),
                tonic::codegen::http::uri::PathAndQuery::from_static(path),
                codec,
            )
            .await;
        let status = answer.expect_err("no such service");
        assert_eq!(status.code(), Code::Unimplemented, "{path}");
        assert_eq!(
            status.message(),
            format!("kvd: unknown gRPC method {path}"),
            "{path}"
        );
    }
}

/// Answers far larger than one HTTP/2 frame, than the client's flow-control window and than
/// what the connection gathers into one write (GATHER-1..4 in `write_gather.rs`) arrive
/// whole and in order, and small answers still follow on the same connection.
#[tokio::test]
async fn large_answers_arrive_whole_and_in_order() {
    let server = common::start_kvd(&[]);
    let mut kv = KvClient::new(connect(&server.endpoint).await).max_decoding_message_size(8 << 20);
    // 24 values of 100,000 bytes: a 2.4 MB answer, each value's bytes telling it apart.
    let value = |i: usize| -> Vec<u8> { (0..100_000).map(|j| ((i * 7 + j) % 251) as u8).collect() };
    for i in 0..24 {
        kv.put(put(&format!("large/{i:02}"), value(i)))
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let answer = kv
            .range(RangeRequest {
                key: Bytes::from_static(b"large/"),
                range_end: Bytes::from_static(b"large0"),
                ..RangeRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.count, 24);
        assert_eq!(answer.kvs.len(), 24);
        for (i, kv) in answer.kvs.iter().enumerate() {
            assert_eq!(kv.key, Bytes::from(format!("large/{i:02}")));
            assert!(kv.value == value(i), "value {i} differs");
        }
        assert_serving(&mut kv).await;
    }
}
