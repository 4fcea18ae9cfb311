//! etcd's Lock and Election services over the wire (`v3lockpb.Lock`, `v3electionpb.Election`),
//! with the generated clients against a kvd process: a lock taken at once, a second Lock
//! waiting for an Unlock or for the holder's lease to be revoked, a cancelled waiter's key
//! removed, an unknown lease refused with nothing written, lease 0's session lease; an
//! election's Campaign, Leader, Proclaim, Resign and Observe, with etcd's error texts and
//! codes (checked by hand against etcd 3.4.23's gateway); one JSON gateway call per
//! service; and auth: a user without permission on the name's prefix is refused.
//!
//! Every wait is bounded by [`PATIENCE`]; "still waiting" is asserted only after the waiter's
//! key is seen in the store, never from elapsed time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::assert_status;
use crate::common::connect;
use crate::gateway;

use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::authpb::Permission;
use kvd_server::pb::etcdserverpb as pb;
use kvd_server::pb::etcdserverpb::auth_client::AuthClient;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
use kvd_server::pb::v3electionpb::election_client::ElectionClient;
use kvd_server::pb::v3electionpb::{
    CampaignRequest, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest, ResignRequest,
};
use kvd_server::pb::v3lockpb::lock_client::LockClient;
use kvd_server::pb::v3lockpb::{LockRequest, UnlockRequest};
use tonic::Code;
use tonic::transport::Channel;

/// The longest a test waits for one answer or one change.
const PATIENCE: Duration = Duration::from_secs(20);

/// Awaits `future` for at most [`PATIENCE`].
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {PATIENCE:?}"))
}

async fn grant(channel: &Channel, ttl: i64) -> i64 {
    let mut lease = LeaseClient::new(channel.clone());
    let granted = lease
        .lease_grant(pb::LeaseGrantRequest { ttl, id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(granted.id > 0);
    granted.id
}

/// Returns the key-values under `prefix`, oldest first.
async fn keys_under(channel: &Channel, prefix: &str) -> Vec<String> {
    let mut kv = KvClient::new(channel.clone());
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let answer = kv
        .range(pb::RangeRequest {
            key: Bytes::from(prefix.to_owned()),
            range_end: Bytes::from(end),
            sort_order: 1,
            sort_target: 2,
            ..pb::RangeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    answer
        .kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
        .collect()
}

/// Waits until the key `key` exists (`true`) or is gone (`false`).
async fn await_key(channel: &Channel, key: &str, exists: bool) {
    let prefix = key.rsplit_once('/').map_or(key, |(p, _)| p).to_owned() + "/";
    let seen = common::wait_until_async(PATIENCE, || {
        let prefix = prefix.clone();
        async move { keys_under(channel, &prefix).await.iter().any(|k| k == key) == exists }
    })
    .await;
    assert!(
        seen,
        "{key} should {}exist",
        if exists { "" } else { "not " }
    );
}

fn lock(name: &str, lease: i64) -> LockRequest {
    LockRequest {
        name: Bytes::from(name.to_owned()),
        lease,
    }
}

fn campaign(name: &str, lease: i64, value: &str) -> CampaignRequest {
    CampaignRequest {
        name: Bytes::from(name.to_owned()),
        lease,
        value: Bytes::from(value.to_owned()),
    }
}

fn leader(name: &str) -> LeaderRequest {
    LeaderRequest {
        name: Bytes::from(name.to_owned()),
    }
}

fn value_of(answer: &LeaderResponse) -> &[u8] {
    answer.kv.as_ref().map_or(&b""[..], |kv| kv.value.as_ref())
}

/// A second Lock holding `second`'s lease waits (its key queued) until `release` ends the
/// first holder's claim, and then gets the lock with its own key.
async fn second_lock_waits_until(release: impl AsyncFnOnce(&Channel, i64, Bytes)) {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let (first, second) = (grant(&channel, 60).await, grant(&channel, 60).await);
    let mut locks = LockClient::new(channel.clone());
    let held = within("the first lock", locks.lock(lock("job", first)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        held.key,
        format!("job/{first:x}"),
        "LOCK-1: name/<lease in hex>"
    );
    let revision = held.header.as_ref().unwrap().revision;
    assert!(revision > 0);

    let mut waiter = LockClient::new(channel.clone());
    let waiting = tokio::spawn(async move { waiter.lock(lock("job", second)).await });
    let second_key = format!("job/{second:x}");
    await_key(&channel, &second_key, true).await;
    assert!(!waiting.is_finished(), "LOCK-1: the lock is held");

    release(&channel, first, held.key).await;
    let got = within("the second lock", waiting)
        .await
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(got.key, second_key);
    assert!(got.header.unwrap().revision > revision);
    assert_eq!(keys_under(&channel, "job/").await, [second_key]);
}

#[tokio::test]
async fn lock_is_taken_at_once_and_a_second_waits_for_the_unlock() {
    second_lock_waits_until(async |channel, _, key| {
        let mut locks = LockClient::new(channel.clone());
        let unlocked = locks
            .unlock(UnlockRequest { key })
            .await
            .unwrap()
            .into_inner();
        assert!(unlocked.header.is_some());
    })
    .await;
}

#[tokio::test]
async fn a_waiting_lock_is_taken_when_the_holders_lease_is_revoked() {
    second_lock_waits_until(async |channel, lease, _| {
        let mut leases = LeaseClient::new(channel.clone());
        leases
            .lease_revoke(pb::LeaseRevokeRequest { id: lease })
            .await
            .unwrap();
    })
    .await;
}

/// A waiting Lock whose deadline (`grpc-timeout`) passes ends, and its key goes as a
/// cancelled waiter's does (HTTP-7 drops the call; LOCK-2 undoes it).
#[tokio::test]
async fn a_waiting_lock_past_its_deadline_removes_its_key() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let (first, second) = (grant(&channel, 60).await, grant(&channel, 60).await);
    let mut locks = LockClient::new(channel.clone());
    locks.lock(lock("deadline", first)).await.unwrap();
    let mut late = tonic::Request::new(lock("deadline", second));
    late.set_timeout(Duration::from_secs(2));
    let mut waiter = locks.clone();
    let waiting = tokio::spawn(async move { waiter.lock(late).await });
    let second_key = format!("deadline/{second:x}");
    await_key(&channel, &second_key, true).await;
    let status = within("the late Lock", waiting).await.unwrap().unwrap_err();
    // tonic's client enforces the deadline too: whichever side ends the call first.
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    await_key(&channel, &second_key, false).await;
    assert_eq!(
        keys_under(&channel, "deadline/").await,
        [format!("deadline/{first:x}")]
    );
}

#[tokio::test]
async fn a_cancelled_waiting_lock_removes_its_key() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let (first, second) = (grant(&channel, 60).await, grant(&channel, 60).await);
    let mut locks = LockClient::new(channel.clone());
    locks.lock(lock("cancel", first)).await.unwrap();

    // A call of its own connection: dropping it resets the stream, as a client's cancel.
    let mut waiter = LockClient::new(connect(&server.endpoint).await);
    let waiting = tokio::spawn(async move { waiter.lock(lock("cancel", second)).await });
    let second_key = format!("cancel/{second:x}");
    await_key(&channel, &second_key, true).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());

    // LOCK-2: the abandoned waiter's key goes; the holder's stays.
    await_key(&channel, &second_key, false).await;
    assert_eq!(
        keys_under(&channel, "cancel/").await,
        [format!("cancel/{first:x}")]
    );
}

#[tokio::test]
async fn lock_with_an_unknown_lease_fails_and_writes_nothing() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut locks = LockClient::new(channel.clone());
    assert_status(
        locks.lock(lock("nolease", 12_345)).await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    let mut kv = KvClient::new(channel.clone());
    let everything = kv
        .range(pb::RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..pb::RangeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(everything.count, 0);
    assert_eq!(
        everything.header.unwrap().revision,
        1,
        "no revision was written"
    );
    // An empty key is refused as the DeleteRange refuses it.
    assert_status(
        locks.unlock(UnlockRequest { key: Bytes::new() }).await,
        Code::InvalidArgument,
        "etcdserver: key is not provided",
    );
}

#[tokio::test]
async fn lock_with_lease_zero_takes_a_session_lease_of_sixty_seconds() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut locks = LockClient::new(channel.clone());
    let held = locks.lock(lock("session", 0)).await.unwrap().into_inner();
    let mut leases = LeaseClient::new(channel.clone());
    let all = leases
        .lease_leases(pb::LeaseLeasesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.leases.len(), 1, "CONC-2: one lease granted");
    let id = all.leases[0].id;
    assert_eq!(held.key, format!("session/{id:x}"));
    let ttl = leases
        .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ttl.granted_ttl, 60);
    assert_eq!(ttl.keys, [held.key]);
}

#[tokio::test]
async fn election_campaign_leader_proclaim_resign_and_observe() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut election = ElectionClient::new(channel.clone());
    assert_status(
        election.leader(leader("vote")).await,
        Code::Unknown,
        "election: no leader",
    );
    // Observing an election with no leader waits for its first candidate.
    let mut observed = election.observe(leader("vote")).await.unwrap().into_inner();
    let (alice, bob) = (grant(&channel, 60).await, grant(&channel, 60).await);

    let won = within(
        "alice's campaign",
        election.campaign(campaign("vote", alice, "a")),
    )
    .await
    .unwrap()
    .into_inner();
    let alice_key = won.leader.clone().unwrap();
    assert_eq!(alice_key.key, format!("vote/{alice:x}"));
    assert_eq!(alice_key.rev, won.header.unwrap().revision);
    assert_eq!(
        (alice_key.name.as_ref(), alice_key.lease),
        (&b"vote"[..], alice)
    );
    let first = within("the first leader", observed.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value_of(&first), b"a");
    let current = election.leader(leader("vote")).await.unwrap().into_inner();
    assert_eq!(value_of(&current), b"a");
    assert_eq!(current.kv.unwrap().create_revision, alice_key.rev);

    // Bob waits behind alice.
    let mut bobs = ElectionClient::new(channel.clone());
    let bob_campaign = tokio::spawn(async move { bobs.campaign(campaign("vote", bob, "b")).await });
    await_key(&channel, &format!("vote/{bob:x}"), true).await;
    assert!(!bob_campaign.is_finished(), "ELECT-1: alice leads");
    let bob_as_if_leader = LeaderKey {
        name: Bytes::from_static(b"vote"),
        key: Bytes::from(format!("vote/{bob:x}")),
        rev: alice_key.rev,
        lease: bob,
    };
    assert_status(
        election
            .proclaim(ProclaimRequest {
                leader: Some(bob_as_if_leader),
                value: Bytes::from_static(b"b!"),
            })
            .await,
        Code::Unknown,
        "election: not leader",
    );

    election
        .proclaim(ProclaimRequest {
            leader: Some(alice_key.clone()),
            value: Bytes::from_static(b"a2"),
        })
        .await
        .unwrap();
    let proclaimed = within("the proclamation", observed.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value_of(&proclaimed), b"a2");

    let resigned = election
        .resign(ResignRequest {
            leader: Some(alice_key.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resigned.header.is_some());
    let bob_won = within("bob's campaign", bob_campaign)
        .await
        .unwrap()
        .unwrap()
        .into_inner();
    let bob_key = bob_won.leader.unwrap();
    assert_eq!(bob_key.key, format!("vote/{bob:x}"));
    let next = within("the next leader", observed.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value_of(&next), b"b");
    assert_eq!(next.kv.unwrap().key, bob_key.key);

    // ELECT-3: resigning as a former leader succeeds and deletes nothing.
    election
        .resign(ResignRequest {
            leader: Some(alice_key),
        })
        .await
        .unwrap();
    let current = election.leader(leader("vote")).await.unwrap().into_inner();
    assert_eq!(value_of(&current), b"b");
    for missing in [
        election
            .proclaim(ProclaimRequest::default())
            .await
            .map(drop),
        election.resign(ResignRequest::default()).await.map(drop),
    ] {
        assert_status(missing, Code::Unknown, "\"leader\" field must be provided");
    }
}

#[tokio::test]
async fn campaign_again_with_the_same_lease_keeps_the_place_and_proclaims_the_new_value() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let lease = grant(&channel, 60).await;
    let mut election = ElectionClient::new(channel.clone());
    let first = election
        .campaign(campaign("again", lease, "v1"))
        .await
        .unwrap()
        .into_inner();
    let again = election
        .campaign(campaign("again", lease, "v2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        again.leader, first.leader,
        "ELECT-1: the same key and revision"
    );
    assert_eq!(
        again.header, first.header,
        "the campaign txn's header, as etcd's"
    );
    let current = election.leader(leader("again")).await.unwrap().into_inner();
    assert_eq!(value_of(&current), b"v2");
}

#[tokio::test]
async fn observe_ends_its_watch_when_the_client_goes_away() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let lease = grant(&channel, 60).await;
    let mut election = ElectionClient::new(channel.clone());
    election
        .campaign(campaign("watched", lease, "x"))
        .await
        .unwrap();
    let watchers = || common::watchers(&server.endpoint).unwrap_or(u64::MAX);
    assert_eq!(watchers(), 0);
    let mut observed = election
        .observe(leader("watched"))
        .await
        .unwrap()
        .into_inner();
    let first = within("the leader", observed.message())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value_of(&first), b"x");
    // Waited for asynchronously: the client's connection task must run to reset the stream.
    assert!(
        common::wait_until_async(PATIENCE, || async { watchers() == 1 }).await,
        "the observer watches the leader's key"
    );
    drop(observed);
    assert!(
        common::wait_until_async(PATIENCE, || async { watchers() == 0 }).await,
        "ELECT-4: the watch is released"
    );
}

#[test]
fn gateway_serves_lock_and_election() {
    let server = common::start_kvd(&[]);
    let b64 = gateway::b64;
    let locked = gateway::post(
        &server.endpoint,
        "/v3/lock/lock",
        &format!(r#"{{"name":"{}"}}"#, b64("gw")),
    );
    assert_eq!(locked.status, 200, "{locked:?}");
    let key = locked.body["key"].as_str().unwrap().to_owned();
    assert!(locked.body["header"]["revision"].is_string(), "{locked:?}");
    let unlocked = gateway::post(
        &server.endpoint,
        "/v3/lock/unlock",
        &format!(r#"{{"key":"{key}"}}"#),
    );
    assert_eq!(unlocked.status, 200, "{unlocked:?}");

    let none = gateway::post(
        &server.endpoint,
        "/v3/election/leader",
        &format!(r#"{{"name":"{}"}}"#, b64("gw")),
    );
    assert_eq!(none.status, 500);
    assert_eq!(none.body["code"], 2);
    assert_eq!(none.body["message"], "election: no leader");
    let won = gateway::post(
        &server.endpoint,
        "/v3/election/campaign",
        &format!(r#"{{"name":"{}","value":"{}"}}"#, b64("gw"), b64("v")),
    );
    assert_eq!(won.status, 200, "{won:?}");
    let current = gateway::post(
        &server.endpoint,
        "/v3/election/leader",
        &format!(r#"{{"name":"{}"}}"#, b64("gw")),
    );
    assert_eq!(current.status, 200, "{current:?}");
    assert_eq!(current.body["kv"]["value"], b64("v"));
    assert_eq!(current.body["kv"]["key"], won.body["leader"]["key"]);
}

/// ELECT-2: a Campaign whose wait cannot start (the only watch stream `--max-watch-streams`
/// allows is taken) answers the refusal and leaves no candidate key that could lead later.
#[tokio::test]
async fn a_campaign_refused_a_watch_leaves_no_candidacy() {
    let server = common::start_kvd(&["--max-watch-streams", "1"]);
    let channel = connect(&server.endpoint).await;
    let (first, second) = (grant(&channel, 60).await, grant(&channel, 60).await);
    let mut elections = ElectionClient::new(channel.clone());
    elections.campaign(campaign("e", first, "a")).await.unwrap();
    // An Observe of an election with no leader waits on a watch: the one stream allowed.
    let mut observer = ElectionClient::new(channel.clone());
    let observing = tokio::spawn(async move { observer.observe(leader("none")).await });
    let taken = common::wait_until_async(PATIENCE, || async {
        common::watchers(&server.endpoint) == Some(1)
    })
    .await;
    assert!(taken, "the Observe holds no watch");
    let refused = within(
        "the second Campaign",
        elections.campaign(campaign("e", second, "b")),
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("too many watch streams"),
        "{refused:?}"
    );
    await_key(&channel, &format!("e/{second:x}"), false).await;
    assert_eq!(keys_under(&channel, "e/").await, [format!("e/{first:x}")]);
    observing.abort();
}

/// HTTP-7 on the gateway: its `Grpc-Timeout` header is the call's deadline, as in etcd's
/// gateway: a passed deadline writes nothing, and a Lock still waiting at its deadline ends
/// with 504 and its key goes.
#[test]
fn the_gateways_grpc_timeout_header_is_the_calls_deadline() {
    let server = common::start_kvd(&[]);
    let b64 = gateway::b64;
    let late = gateway::post_with(
        &server.endpoint,
        "/v3/kv/put",
        &format!(r#"{{"key":"{}","value":"{}"}}"#, b64("late"), b64("v")),
        "Grpc-Timeout: 1n\r\n",
    );
    assert_eq!(late.status, 504, "{late:?}");
    assert_eq!(late.body["code"], 4, "{late:?}");
    assert_eq!(late.body["message"], "context deadline exceeded");
    let read = gateway::post(
        &server.endpoint,
        "/v3/kv/range",
        &format!(r#"{{"key":"{}"}}"#, b64("late")),
    );
    assert!(read.body.get("kvs").is_none(), "{read:?}");

    let held = gateway::post(
        &server.endpoint,
        "/v3/lock/lock",
        &format!(r#"{{"name":"{}"}}"#, b64("gw")),
    );
    assert_eq!(held.status, 200, "{held:?}");
    let waiting = gateway::post_with(
        &server.endpoint,
        "/v3/lock/lock",
        &format!(r#"{{"name":"{}"}}"#, b64("gw")),
        "Grpc-Timeout: 1S\r\n",
    );
    assert_eq!(waiting.status, 504, "{waiting:?}");
    assert_eq!(waiting.body["code"], 4, "{waiting:?}");
    // Only the holder's key is left under the name (the waiter's goes on a task of its own).
    let end = b64("gw0"); // "gw/" + 1
    let only_holder = common::wait_until(PATIENCE, || {
        let keys = gateway::post(
            &server.endpoint,
            "/v3/kv/range",
            &format!(
                r#"{{"key":"{}","range_end":"{end}","keys_only":true}}"#,
                b64("gw/")
            ),
        );
        keys.body["kvs"].as_array().map(Vec::len) == Some(1)
    });
    assert!(only_holder, "the waiter's key stayed");
}

/// Root, and alice with readwrite on `/dev/` only, auth enabled; returns alice's token.
async fn alice_on_dev(channel: &Channel) -> String {
    let mut auth = AuthClient::new(channel.clone());
    for (user, password) in [("root", "rootpw"), ("alice", "alicepw")] {
        auth.user_add(pb::AuthUserAddRequest {
            name: user.into(),
            password: password.into(),
            ..pb::AuthUserAddRequest::default()
        })
        .await
        .unwrap();
    }
    let grant = |user: &str, role: &str| pb::AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    };
    auth.user_grant_role(grant("root", "root")).await.unwrap();
    auth.role_add(pb::AuthRoleAddRequest { name: "dev".into() })
        .await
        .unwrap();
    auth.role_grant_permission(pb::AuthRoleGrantPermissionRequest {
        name: "dev".into(),
        perm: Some(Permission {
            perm_type: 2,
            key: Bytes::from_static(b"/dev/"),
            range_end: Bytes::from_static(b"/dev0"),
        }),
    })
    .await
    .unwrap();
    auth.user_grant_role(grant("alice", "dev")).await.unwrap();
    auth.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
    let login = pb::AuthenticateRequest {
        name: "alice".into(),
        password: "alicepw".into(),
    };
    auth.authenticate(login).await.unwrap().into_inner().token
}

#[tokio::test]
async fn a_user_without_permission_on_the_prefix_is_refused() {
    const DENIED: &str = "etcdserver: permission denied";
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let alice = alice_on_dev(&channel).await;
    let mut locks = LockClient::new(channel.clone());
    let mut election = ElectionClient::new(channel.clone());

    assert_status(
        locks
            .lock(common::with_token(&alice, lock("/ops/job", 0)))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(
        election
            .campaign(common::with_token(&alice, campaign("/ops/vote", 0, "a")))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(
        election
            .observe(common::with_token(&alice, leader("/ops/vote")))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    // Under her own prefix the same calls work, as her own Txn would.
    let held = locks
        .lock(common::with_token(&alice, lock("/dev/job", 0)))
        .await
        .unwrap()
        .into_inner();
    assert!(held.key.starts_with(b"/dev/job/"));
    let won = election
        .campaign(common::with_token(&alice, campaign("/dev/vote", 0, "a")))
        .await
        .unwrap()
        .into_inner();
    let current = election
        .leader(common::with_token(&alice, leader("/dev/vote")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(current.kv.unwrap().key, won.leader.unwrap().key);
    // Nothing of the refused calls was written: root sees only alice's two keys.
    let mut auth = AuthClient::new(channel.clone());
    let root = auth
        .authenticate(pb::AuthenticateRequest {
            name: "root".into(),
            password: "rootpw".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let mut kv = KvClient::new(channel.clone());
    let everything = kv
        .range(common::with_token(
            &root,
            pb::RangeRequest {
                key: Bytes::from_static(b"\0"),
                range_end: Bytes::from_static(b"\0"),
                keys_only: true,
                ..pb::RangeRequest::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let keys: Vec<_> = everything.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k.starts_with(b"/dev/")), "{keys:?}");
}
