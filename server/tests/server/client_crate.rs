//! The Rust client users would reach for, the `etcd-client` crate (0.21), against a kvd
//! started on a free port: KV put/get/delete, Txn, a watch from a past revision, lease grant
//! with keep-alive and time-to-live, maintenance status and HashKV, member list, and its
//! lock and election clients (etcd's Lock and Election services).
//!
//! Building `etcd-client` needs `protoc` and the protobuf well-known types (its build script
//! compiles etcd's protos); `.ci/install-deps.sh` installs them. Without them this test does
//! not build, so it fails rather than skips.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaseTimeToLiveOptions,
    LockOptions, ProclaimOptions, PutOptions, ResignOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};

/// The longest one answer may take.
const PATIENCE: Duration = Duration::from_secs(10);

async fn client(server: &common::Server) -> Client {
    tokio::time::timeout(PATIENCE, Client::connect([server.endpoint.as_str()], None))
        .await
        .expect("connect within the patience")
        .unwrap()
}

#[tokio::test]
async fn kv_and_txn() {
    let server = common::start_kvd(&[]);
    let mut client = client(&server).await;

    let first = client.put("app/a", "1", None).await.unwrap();
    assert_eq!(first.header().unwrap().revision(), 2);
    let second = client
        .put("app/a", "2", Some(PutOptions::new().with_prev_key()))
        .await
        .unwrap();
    assert_eq!(second.prev_key().unwrap().value(), b"1");
    client.put("app/b", "3", None).await.unwrap();

    let got = client
        .get("app/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    let pairs: Vec<(&[u8], &[u8])> = got.kvs().iter().map(|kv| (kv.key(), kv.value())).collect();
    assert_eq!(pairs, vec![(&b"app/a"[..], &b"2"[..]), (b"app/b", b"3")]);
    assert_eq!(got.count(), 2);
    let a = &got.kvs()[0];
    assert_eq!(
        (a.create_revision(), a.mod_revision(), a.version()),
        (2, 3, 2)
    );
    let old = client
        .get("app/a", Some(GetOptions::new().with_revision(2)))
        .await
        .unwrap();
    assert_eq!(old.kvs()[0].value(), b"1");

    // Compare-and-swap: succeeds once, then fails and reads instead.
    let swap = |expected: &str| {
        Txn::new()
            .when([Compare::value("app/a", CompareOp::Equal, expected)])
            .and_then([TxnOp::put("app/a", "swapped", None)])
            .or_else([TxnOp::get("app/a", None)])
    };
    let won = client.txn(swap("2")).await.unwrap();
    assert!(won.succeeded());
    assert!(matches!(won.op_responses()[0], TxnOpResponse::Put(_)));
    let lost = client.txn(swap("2")).await.unwrap();
    assert!(!lost.succeeded());
    let TxnOpResponse::Get(read) = &lost.op_responses()[0] else {
        panic!("expected the failure branch's get");
    };
    assert_eq!(read.kvs()[0].value(), b"swapped");

    let deleted = client
        .delete("app/", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(deleted.deleted(), 2);
    let empty = client
        .get("app/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert!(empty.kvs().is_empty());
    // etcd's errors reach the client with etcd's text.
    let future = client
        .get("app/a", Some(GetOptions::new().with_revision(1_000)))
        .await
        .expect_err("a future revision");
    assert!(
        future
            .to_string()
            .contains("etcdserver: mvcc: required revision is a future revision"),
        "{future}"
    );
}

#[tokio::test]
async fn watch_from_a_past_revision_then_live() {
    let server = common::start_kvd(&[]);
    let mut client = client(&server).await;
    client.put("w/1", "a", None).await.unwrap(); // revision 2
    client.put("w/2", "b", None).await.unwrap(); // revision 3
    client.delete("w/1", None).await.unwrap(); // revision 4

    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(2)
        .with_prev_key();
    let mut stream = client.watch("w/", Some(options)).await.unwrap();
    let mut seen: Vec<(EventType, String, i64)> = Vec::new();
    let mut created = false;
    while seen.len() < 4 {
        let response = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("a watch response within the patience")
            .unwrap()
            .expect("the stream is open");
        created |= response.created();
        assert!(!response.canceled(), "{response:?}");
        for event in response.events() {
            let kv = event.kv().unwrap();
            seen.push((
                event.event_type(),
                kv.key_str().unwrap().to_owned(),
                kv.mod_revision(),
            ));
            if event.event_type() == EventType::Delete {
                assert_eq!(event.prev_kv().unwrap().value(), b"a");
            }
        }
        if seen.len() == 3 {
            // History is in; this one arrives live.
            client.put("w/3", "c", None).await.unwrap(); // revision 5
        }
    }
    assert!(created);
    assert_eq!(
        seen,
        vec![
            (EventType::Put, "w/1".to_owned(), 2),
            (EventType::Put, "w/2".to_owned(), 3),
            (EventType::Delete, "w/1".to_owned(), 4),
            (EventType::Put, "w/3".to_owned(), 5),
        ]
    );
}

#[tokio::test]
async fn lease_grant_keep_alive_and_time_to_live() {
    let server = common::start_kvd(&[]);
    let mut client = client(&server).await;
    let lease = client.lease_grant(30, None).await.unwrap();
    assert_eq!(lease.ttl(), 30);
    client
        .put(
            "leased",
            "v",
            Some(PutOptions::new().with_lease(lease.id())),
        )
        .await
        .unwrap();

    let (mut keeper, mut answers) = client.lease_keep_alive(lease.id()).await.unwrap();
    for _ in 0..2 {
        keeper.keep_alive().await.unwrap();
        let answer = tokio::time::timeout(PATIENCE, answers.message())
            .await
            .expect("a keep-alive answer within the patience")
            .unwrap()
            .expect("the stream is open");
        assert_eq!((answer.id(), answer.ttl()), (lease.id(), 30));
    }

    let ttl = client
        .lease_time_to_live(lease.id(), Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(ttl.granted_ttl(), 30);
    assert!((28..=30).contains(&ttl.ttl()), "{ttl:?}");
    assert_eq!(ttl.keys(), &[b"leased".to_vec()]);
    let leases = client.leases().await.unwrap();
    assert_eq!(leases.leases().len(), 1);

    client.lease_revoke(lease.id()).await.unwrap();
    assert!(client.get("leased", None).await.unwrap().kvs().is_empty());
    let gone = client.lease_time_to_live(lease.id(), None).await.unwrap();
    assert_eq!(gone.ttl(), -1);
}

#[tokio::test]
async fn maintenance_and_cluster() {
    let server = common::start_kvd(&["--name", "crate-test"]);
    let mut client = client(&server).await;
    client.put("k", "v", None).await.unwrap();

    let status = client.status().await.unwrap();
    let header = status.header().unwrap();
    assert_eq!(header.revision(), 2);
    assert_ne!(header.member_id(), 0);
    assert_eq!(status.leader(), header.member_id());
    assert!(status.db_size() > 0);

    let hash = client.hash_kv(0).await.unwrap();
    let again = client.hash_kv(0).await.unwrap();
    assert_eq!(hash.hash(), again.hash(), "HashKV is stable without writes");
    client.put("k", "w", None).await.unwrap();
    assert_ne!(client.hash_kv(0).await.unwrap().hash(), hash.hash());
    assert_eq!(client.hash_kv(2).await.unwrap().hash(), hash.hash());

    let members = client.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    let member = &members.members()[0];
    assert_eq!(member.name(), "crate-test");
    assert_eq!(member.id(), header.member_id());
    assert_eq!(member.client_urls(), std::slice::from_ref(&server.endpoint));
}

/// The crate's lock and election clients, which call etcd's Lock and Election services: a
/// second Lock waits until the first holder unlocks; a Campaign leads, Observe follows its
/// proclaimed values, and after Resign there is no leader.
#[tokio::test]
async fn lock_and_election_clients() {
    let server = common::start_kvd(&[]);
    let mut client = client(&server).await;
    let first = client.lease_grant(60, None).await.unwrap().id();
    let second = client.lease_grant(60, None).await.unwrap().id();
    let held = client
        .lock("job", Some(LockOptions::new().with_lease(first)))
        .await
        .unwrap();
    assert_eq!(held.key(), format!("job/{first:x}").as_bytes());
    let mut other = client.clone();
    let waiting = tokio::spawn(async move {
        other
            .lock("job", Some(LockOptions::new().with_lease(second)))
            .await
    });
    // Once the waiter's key is there, it is queued behind the holder.
    let queued = common::wait_until_async(PATIENCE, || {
        let mut client = client.clone();
        async move {
            let keys = client
                .get("job/", Some(GetOptions::new().with_prefix()))
                .await
                .unwrap();
            keys.count() == 2
        }
    })
    .await;
    assert!(queued, "the second Lock never queued");
    assert!(!waiting.is_finished(), "the lock was given twice");
    client.unlock(held.key()).await.unwrap();
    let taken = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the lock passes on within the patience")
        .unwrap()
        .unwrap();
    assert_eq!(taken.key(), format!("job/{second:x}").as_bytes());

    let campaign = client.campaign("primary", "a", first).await.unwrap();
    let leader = campaign.leader().unwrap().clone();
    assert_eq!(leader.key(), format!("primary/{first:x}").as_bytes());
    let mut observed = client.observe("primary").await.unwrap();
    assert_eq!(observed_value(&mut observed).await, b"a");
    client
        .proclaim(
            "b",
            Some(ProclaimOptions::new().with_leader(leader.clone())),
        )
        .await
        .unwrap();
    assert_eq!(observed_value(&mut observed).await, b"b");
    let now = client.leader("primary").await.unwrap();
    assert_eq!(now.kv().unwrap().value(), b"b");
    client
        .resign(Some(ResignOptions::new().with_leader(leader)))
        .await
        .unwrap();
    let none = client.leader("primary").await.unwrap_err();
    assert!(none.to_string().contains("election: no leader"), "{none}");
}

/// The value of the next leader `observed` reports.
async fn observed_value(observed: &mut etcd_client::ObserveStream) -> Vec<u8> {
    let answer = tokio::time::timeout(PATIENCE, observed.message())
        .await
        .expect("an observed leader within the patience")
        .unwrap()
        .expect("the observe stream is open");
    answer.kv().unwrap().value().to_vec()
}
