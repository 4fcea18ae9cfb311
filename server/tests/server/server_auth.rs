//! Authentication and authorization over the wire (issue 13), beyond the etcdctl
//! differential of `etcdctl::auth`: the auth store across a restart (etcdctl, against etcd
//! 3.4.23 restarted the same way), the three etcd 3.4
//! holes closed (nested Txn, from-key watch, RoleGrantPermission without a permission),
//! bad credentials and tokens with etcd's errors changing nothing, token expiry, LeaseRevoke
//! and Maintenance checks, failed logins delayed but answered as etcd, the `etcd-client`
//! crate logging in, and the tenant story (auth
//! role `dev` is quota role `dev`; the operator API needs root).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;
use crate::common::assert_status;
use crate::common::connect;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::authpb::{Permission, UserAddOptions};
use kvd_server::pb::etcdserverpb as pb;
use kvd_server::pb::etcdserverpb::auth_client::AuthClient;
use kvd_server::pb::etcdserverpb::cluster_client::ClusterClient;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
use kvd_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use kvd_server::pb::etcdserverpb::watch_client::WatchClient;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

/// The longest a test waits for one answer.
const PATIENCE: Duration = Duration::from_secs(20);
const DENIED: &str = "etcdserver: permission denied";

fn put(key: &str, value: &str) -> pb::PutRequest {
    pb::PutRequest {
        key: Bytes::from(key.to_owned()),
        value: Bytes::from(value.to_owned()),
        ..pb::PutRequest::default()
    }
}

fn range(key: &str, range_end: &[u8]) -> pb::RangeRequest {
    pb::RangeRequest {
        key: Bytes::from(key.to_owned()),
        range_end: Bytes::copy_from_slice(range_end),
        ..pb::RangeRequest::default()
    }
}

fn readwrite(key: &str, range_end: &str) -> Permission {
    Permission {
        perm_type: 2,
        key: Bytes::from(key.to_owned()),
        range_end: Bytes::from(range_end.to_owned()),
    }
}

async fn authenticate(auth: &mut AuthClient<Channel>, name: &str, password: &str) -> String {
    let request = pb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    auth.authenticate(request).await.unwrap().into_inner().token
}

async fn auth_revision(auth: &mut AuthClient<Channel>) -> (bool, u64) {
    let status = auth
        .auth_status(pb::AuthStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    (status.enabled, status.auth_revision)
}

async fn user_add(auth: &mut AuthClient<Channel>, name: &str, password: &str) {
    let request = pb::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..pb::AuthUserAddRequest::default()
    };
    auth.user_add(request).await.unwrap();
}

/// Root (role root), alice in role `dev` with readwrite on `/dev/`, auth enabled; returns
/// root's and alice's tokens.
async fn tenant(channel: &Channel) -> (String, String) {
    let mut auth = AuthClient::new(channel.clone());
    user_add(&mut auth, "root", "rootpw").await;
    let grant = |user: &str, role: &str| pb::AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    };
    auth.user_grant_role(grant("root", "root")).await.unwrap();
    user_add(&mut auth, "alice", "alicepw").await;
    auth.role_add(pb::AuthRoleAddRequest { name: "dev".into() })
        .await
        .unwrap();
    let perm = pb::AuthRoleGrantPermissionRequest {
        name: "dev".into(),
        perm: Some(readwrite("/dev/", "/dev0")),
    };
    auth.role_grant_permission(perm).await.unwrap();
    auth.user_grant_role(grant("alice", "dev")).await.unwrap();
    auth.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
    let root = authenticate(&mut auth, "root", "rootpw").await;
    let alice = authenticate(&mut auth, "alice", "alicepw").await;
    (root, alice)
}

/// What one etcdctl step printed, as compared: exit code, stdout and the `Error:` lines.
type Printed = (String, i32, String, String);

/// Runs the auth story with a restart in the middle on the server `start` gives, stopped with
/// SIGTERM (its exit code and the server handed to `check_exit`) and restarted by `restart`;
/// returns each step's outcome.
fn story_across_a_restart(
    start: impl FnOnce() -> common::Server,
    check_exit: impl FnOnce(Option<i32>, &common::Server),
    restart: impl FnOnce(&common::Server) -> common::Server,
) -> Vec<Printed> {
    let ctl = |server: &common::Server, args: &str| -> Printed {
        let args: Vec<&str> = args.split(' ').collect();
        let run = common::etcdctl(&server.endpoint, &args, None);
        let errors: String = run
            .stderr
            .lines()
            .filter(|l| l.starts_with("Error:"))
            .collect::<Vec<_>>()
            .join("\n");
        (args.join(" "), run.code, run.stdout, errors)
    };
    let before = [
        "user add root --new-user-password=rootpw --interactive=false",
        "role add root",
        "user grant-role root root",
        "user add alice --new-user-password=alicepw --interactive=false",
        "role add dev",
        "role grant-permission dev readwrite /dev/ --prefix",
        "user grant-role alice dev",
        "auth enable",
        "--user alice:alicepw put /dev/a 1",
    ];
    let after = [
        // Tokens die with the process; etcdctl logs in again at dial.
        "--user alice:alicepw get /dev/a",
        "--user alice:alicepw put /other x",
        "get /dev/a",
        "--user root:rootpw user list",
        "--user root:rootpw role list",
        "--user root:rootpw role get dev",
        "--user root:rootpw user get alice",
        "--user alice:wrong get /dev/a",
        "--user root:rootpw auth disable",
        "get /dev/a",
    ];
    let mut first = start();
    let mut printed: Vec<Printed> = before.iter().map(|a| ctl(&first, a)).collect();
    let code = first.signal_and_wait("-TERM");
    check_exit(code, &first);
    let second = restart(&first);
    printed.extend(after.iter().map(|a| ctl(&second, a)));
    drop(second);
    drop(first);
    printed
}

#[test]
fn the_auth_store_and_the_enabled_state_survive_a_restart_as_in_etcd() {
    let kvd = story_across_a_restart(
        || common::start_kvd(&[]),
        |code, stopped| assert_eq!(code, Some(0), "kvd's exit; log:\n{}", stopped.log()),
        |stopped| common::start_kvd_in(&stopped.data_dir, &[]).unwrap(),
    );
    // etcd's exit code is not checked: only kvd's is under test.
    let etcd = story_across_a_restart(common::start_etcd, |_, _| {}, common::restart_etcd);
    // The story itself, as etcd 3.4.23 tells it.
    let outcome = |printed: &[Printed], i: usize| {
        let (_, code, stdout, errors) = &printed[i];
        (*code, stdout.clone(), errors.clone())
    };
    assert_eq!(outcome(&kvd, 9), (0, "/dev/a\n1\n".into(), String::new()));
    assert_eq!(
        outcome(&kvd, 10).2,
        format!("Error: {DENIED}"),
        "alice is still limited to /dev/"
    );
    assert_eq!(
        outcome(&kvd, 11).2,
        "Error: etcdserver: user name is empty",
        "auth is still enabled"
    );
    assert_eq!(outcome(&kvd, 12).1, "alice\nroot\n");
    assert_eq!(
        outcome(&kvd, 14).1,
        "Role dev\nKV Read:\n\t[/dev/, /dev0) (prefix /dev/)\nKV Write:\n\t[/dev/, /dev0) (prefix /dev/)\n"
    );
    assert_eq!(outcome(&kvd, 18).1, "/dev/a\n1\n");
    assert_eq!(kvd.len(), etcd.len());
    for (ours, theirs) in kvd.iter().zip(&etcd) {
        assert_eq!(ours, theirs, "kvd and etcd 3.4.23 differ");
    }
}

#[tokio::test]
async fn an_invalid_request_gets_its_validation_error_before_a_denial() {
    // etcd validates a request in its gRPC layer and checks permissions only when it
    // serves or applies it (PERM-5): alice, who may not touch /other/, gets the
    // validation's error for an invalid request there, and the denial for a valid one.
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let (_root, alice) = tenant(&channel).await;
    let mut kv = KvClient::new(channel);
    let op = |key: &str| pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(put(key, "x"))),
    };
    let twice = pb::TxnRequest {
        success: vec![op("/other/a"), op("/other/a")],
        ..pb::TxnRequest::default()
    };
    let message = "etcdserver: duplicate key given in txn request";
    assert_status(
        kv.txn(common::with_token(&alice, twice)).await,
        Code::InvalidArgument,
        message,
    );
    let keep_value = pb::PutRequest {
        ignore_value: true,
        ..put("/other/a", "x")
    };
    assert_status(
        kv.put(common::with_token(&alice, keep_value)).await,
        Code::InvalidArgument,
        "etcdserver: value is provided",
    );
    let once = pb::TxnRequest {
        success: vec![op("/other/a")],
        ..pb::TxnRequest::default()
    };
    assert_status(
        kv.txn(common::with_token(&alice, once)).await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(
        kv.put(common::with_token(&alice, put("/other/a", "x")))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    // An empty key is `key is not provided` for every kind, never a denial.
    let empty = "etcdserver: key is not provided";
    assert_status(
        kv.range(common::with_token(&alice, range("", b""))).await,
        Code::InvalidArgument,
        empty,
    );
    assert_status(
        kv.put(common::with_token(&alice, put("", "x"))).await,
        Code::InvalidArgument,
        empty,
    );
    let delete = pb::DeleteRangeRequest::default();
    assert_status(
        kv.delete_range(common::with_token(&alice, delete)).await,
        Code::InvalidArgument,
        empty,
    );
}

#[tokio::test]
async fn the_three_etcd_3_4_holes_are_closed() {
    let mut server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let (root, alice) = tenant(&channel).await;
    let mut kv = KvClient::new(channel.clone());
    // 1. A nested Txn writing outside alice's permissions is denied and writes nothing.
    let evil = pb::RequestOp {
        request: Some(pb::request_op::Request::RequestPut(put("/other/evil", "x"))),
    };
    let inner = pb::TxnRequest {
        success: vec![evil],
        ..pb::TxnRequest::default()
    };
    let nested = pb::TxnRequest {
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestTxn(inner)),
        }],
        ..pb::TxnRequest::default()
    };
    let before = kv
        .range(common::with_token(&root, range("\0", b"\0")))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    assert_status(
        kv.txn(common::with_token(&alice, nested)).await,
        Code::PermissionDenied,
        DENIED,
    );
    let after = kv
        .range(common::with_token(&root, range("/other/evil", b"")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((after.count, after.header.unwrap().revision), (0, before));
    // 2. A from-key watch beyond alice's range is canceled as etcd cancels a denied watch.
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: Bytes::from_static(b"/dev/"),
                range_end: Bytes::from_static(b"\0"),
                ..pb::WatchCreateRequest::default()
            },
        )),
    };
    let requests = tonic::codegen::tokio_stream::iter(vec![create]);
    let mut responses = WatchClient::new(channel.clone())
        .watch(common::with_token(&alice, requests))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(PATIENCE, responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            first.watch_id,
            first.created,
            first.canceled,
            first.cancel_reason.as_str()
        ),
        (
            -1,
            true,
            true,
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
        )
    );
    // 3. RoleGrantPermission without a permission is refused; the server goes on.
    let mut auth = AuthClient::new(channel.clone());
    let revision = auth_revision(&mut auth).await;
    let no_perm = pb::AuthRoleGrantPermissionRequest {
        name: "dev".into(),
        perm: None,
    };
    assert_status(
        auth.role_grant_permission(common::with_token(&root, no_perm))
            .await,
        Code::InvalidArgument,
        "etcdserver: permission not given",
    );
    assert_eq!(auth_revision(&mut auth).await, revision, "nothing changed");
    kv.put(common::with_token(&alice, put("/dev/after", "1")))
        .await
        .unwrap();
    // ... and restarts cleanly.
    drop((kv, auth, channel, responses));
    assert_eq!(server.signal_and_wait("-TERM"), Some(0));
    let again = common::start_kvd_in(&server.data_dir, &[]).unwrap();
    let channel = connect(&again.endpoint).await;
    let mut auth = AuthClient::new(channel.clone());
    assert_eq!(auth_revision(&mut auth).await, revision);
    let alice = authenticate(&mut auth, "alice", "alicepw").await;
    let got = KvClient::new(channel)
        .range(common::with_token(&alice, range("/dev/after", b"")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.count, 1);
}

#[tokio::test]
async fn bad_credentials_and_tokens_get_etcds_errors_and_change_nothing() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    let mut auth = AuthClient::new(channel.clone());
    let mut kv = KvClient::new(channel.clone());
    let login = |name: &str, password: &str| pb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    assert_status(
        auth.authenticate(login("root", "x")).await,
        Code::FailedPrecondition,
        "etcdserver: authentication is not enabled",
    );
    assert_status(
        auth.auth_enable(pb::AuthEnableRequest {}).await,
        Code::FailedPrecondition,
        "etcdserver: root user does not exist",
    );
    user_add(&mut auth, "root", "rootpw").await;
    assert_status(
        auth.auth_enable(pb::AuthEnableRequest {}).await,
        Code::FailedPrecondition,
        "etcdserver: root user does not have root role",
    );
    assert_eq!(auth_revision(&mut auth).await, (false, 2));
    drop(auth);
    let (root, alice) = tenant_after_root(&channel).await;
    let mut auth = AuthClient::new(channel.clone());
    let revision = auth_revision(&mut auth).await;
    let failed = "etcdserver: authentication failed, invalid user ID or password";
    assert_status(
        auth.authenticate(login("alice", "wrong")).await,
        Code::InvalidArgument,
        failed,
    );
    assert_status(
        auth.authenticate(login("nobody", "x")).await,
        Code::InvalidArgument,
        failed,
    );
    assert_status(
        auth.authenticate(login("", "")).await,
        Code::InvalidArgument,
        failed,
    );
    let invalid = "etcdserver: invalid auth token";
    for forged in ["abcdefghijklmnop.1", "garbage", &format!("{alice}x")] {
        assert_status(
            kv.range(common::with_token(forged, range("/dev/a", b"")))
                .await,
            Code::Unauthenticated,
            invalid,
        );
    }
    // AUTHN-6: calls that need no permission still refuse a dead token, and change nothing.
    let mut lease = LeaseClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let grant = pb::LeaseGrantRequest { ttl: 60, id: 77 };
    let compact = pb::CompactionRequest {
        revision: 1,
        physical: false,
    };
    let listing = pb::AlarmRequest::default();
    assert_status(
        lease
            .lease_grant(common::with_token("garbage", grant))
            .await,
        Code::Unauthenticated,
        invalid,
    );
    assert_status(
        kv.compact(common::with_token("garbage", compact)).await,
        Code::Unauthenticated,
        invalid,
    );
    assert_status(
        maintenance
            .alarm(common::with_token("garbage", listing))
            .await,
        Code::Unauthenticated,
        invalid,
    );
    let leases = lease.lease_leases(pb::LeaseLeasesRequest {}).await.unwrap();
    assert!(
        leases.get_ref().leases.is_empty(),
        "the refused grant granted nothing"
    );
    // Without a token they need no login, as in etcd; alice's live token works too.
    lease.lease_grant(grant).await.unwrap();
    kv.compact(common::with_token(&alice, compact))
        .await
        .unwrap();
    maintenance.alarm(listing).await.unwrap();
    // A password-less user cannot log in with a password (etcd's unmapped error).
    let cert_only = pb::AuthUserAddRequest {
        name: "cert".into(),
        options: Some(UserAddOptions { no_password: true }),
        ..pb::AuthUserAddRequest::default()
    };
    auth.user_add(common::with_token(&root, cert_only))
        .await
        .unwrap();
    assert_status(
        auth.authenticate(login("cert", "")).await,
        Code::Unknown,
        "auth: authentication failed, password was given for no password user",
    );
    // A permission on an empty key is refused (etcd 3.6).
    let empty = pb::AuthRoleGrantPermissionRequest {
        name: "dev".into(),
        perm: Some(readwrite("", "")),
    };
    assert_status(
        auth.role_grant_permission(common::with_token(&root, empty))
            .await,
        Code::InvalidArgument,
        "etcdserver: invalid auth management",
    );
    // Alice is no administrator, and anonymous callers are nobody.
    assert_status(
        auth.user_add(common::with_token(
            &alice,
            pb::AuthUserAddRequest {
                name: "eve".into(),
                ..Default::default()
            },
        ))
        .await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(
        auth.role_list(pb::AuthRoleListRequest {}).await,
        Code::InvalidArgument,
        "etcdserver: user name is empty",
    );
    assert_eq!(
        auth_revision(&mut auth).await.1,
        revision.1 + 1,
        "only the user add"
    );
    // A changed password drops alice's tokens; so does deleting a user, for good.
    let changed = pb::AuthUserChangePasswordRequest {
        name: "alice".into(),
        password: "newpw".into(),
        ..Default::default()
    };
    auth.user_change_password(common::with_token(&root, changed))
        .await
        .unwrap();
    assert_status(
        kv.range(common::with_token(&alice, range("/dev/a", b"")))
            .await,
        Code::Unauthenticated,
        invalid,
    );
    let alice = authenticate(&mut auth, "alice", "newpw").await;
    kv.range(common::with_token(&alice, range("/dev/a", b"")))
        .await
        .unwrap();
    let delete = pb::AuthUserDeleteRequest {
        name: "alice".into(),
    };
    auth.user_delete(common::with_token(&root, delete))
        .await
        .unwrap();
    let readd = pb::AuthUserAddRequest {
        name: "alice".into(),
        password: "newpw".into(),
        ..Default::default()
    };
    auth.user_add(common::with_token(&root, readd))
        .await
        .unwrap();
    assert_status(
        kv.range(common::with_token(&alice, range("/dev/a", b"")))
            .await,
        Code::Unauthenticated,
        invalid,
    );
    // Admin-only Maintenance, and LeaseRevoke of a lease with a key alice cannot write.
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let bob = {
        user_add_as(&mut auth, &root, "bob", "bobpw").await;
        authenticate(&mut auth, "bob", "bobpw").await
    };
    assert_status(
        maintenance
            .defragment(common::with_token(&bob, pb::DefragmentRequest {}))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    assert_status(
        maintenance
            .hash_kv(common::with_token(&bob, pb::HashKvRequest { revision: 0 }))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    maintenance
        .hash_kv(common::with_token(&root, pb::HashKvRequest { revision: 0 }))
        .await
        .unwrap();
    // MoveLeader and the membership changes: the admin check comes first (CLUSTER-3,
    // MAINT-7), so bob learns nothing of which ids exist.
    let unknown = pb::MoveLeaderRequest { target_id: 1 };
    let moved = maintenance
        .move_leader(common::with_token(&bob, unknown))
        .await;
    assert_status(moved, Code::PermissionDenied, DENIED);
    let mut cluster = ClusterClient::new(channel.clone());
    let removed = cluster
        .member_remove(common::with_token(&bob, pb::MemberRemoveRequest { id: 1 }))
        .await;
    assert_status(removed, Code::PermissionDenied, DENIED);
    let unknown = pb::MemberRemoveRequest { id: 1 };
    let removed = cluster
        .member_remove(common::with_token(&root, unknown))
        .await;
    assert_status(removed, Code::NotFound, "etcdserver: member not found");
    maintenance
        .status(common::with_token(&bob, pb::StatusRequest {}))
        .await
        .unwrap();
    let mut lease = LeaseClient::new(channel.clone());
    let id = lease
        .lease_grant(common::with_token(
            &bob,
            pb::LeaseGrantRequest { ttl: 600, id: 0 },
        ))
        .await
        .unwrap()
        .into_inner()
        .id;
    let mut on_lease = put("/other/leased", "x");
    on_lease.lease = id;
    kv.put(common::with_token(&root, on_lease)).await.unwrap();
    assert_status(
        lease
            .lease_revoke(common::with_token(&bob, pb::LeaseRevokeRequest { id }))
            .await,
        Code::PermissionDenied,
        DENIED,
    );
    let still = kv
        .range(common::with_token(&root, range("/other/leased", b"")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.count, 1, "the denied revoke deleted nothing");
    lease
        .lease_revoke(common::with_token(&root, pb::LeaseRevokeRequest { id }))
        .await
        .unwrap();
}

async fn user_add_as(auth: &mut AuthClient<Channel>, token: &str, name: &str, password: &str) {
    let request = pb::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..pb::AuthUserAddRequest::default()
    };
    auth.user_add(common::with_token(token, request))
        .await
        .unwrap();
}

/// [`tenant`] on a server where user root exists already.
async fn tenant_after_root(channel: &Channel) -> (String, String) {
    let mut auth = AuthClient::new(channel.clone());
    let grant = |user: &str, role: &str| pb::AuthUserGrantRoleRequest {
        user: user.into(),
        role: role.into(),
    };
    auth.user_grant_role(grant("root", "root")).await.unwrap();
    user_add(&mut auth, "alice", "alicepw").await;
    auth.role_add(pb::AuthRoleAddRequest { name: "dev".into() })
        .await
        .unwrap();
    let perm = pb::AuthRoleGrantPermissionRequest {
        name: "dev".into(),
        perm: Some(readwrite("/dev/", "/dev0")),
    };
    auth.role_grant_permission(perm).await.unwrap();
    auth.user_grant_role(grant("alice", "dev")).await.unwrap();
    auth.auth_enable(pb::AuthEnableRequest {}).await.unwrap();
    let root = authenticate(&mut auth, "root", "rootpw").await;
    let alice = authenticate(&mut auth, "alice", "alicepw").await;
    (root, alice)
}

#[tokio::test]
async fn an_idle_token_expires_after_the_ttl() {
    const TTL: Duration = Duration::from_secs(3);
    let server = common::start_kvd(&["--auth-token-ttl", &TTL.as_secs().to_string()]);
    let channel = connect(&server.endpoint).await;
    let (_, alice) = tenant(&channel).await;
    let issued = std::time::Instant::now();
    let mut kv = KvClient::new(channel);
    // The token works at once, and a token in use every second stays valid for longer than
    // the TTL: each use pushes its expiry. The last use is sent more than the TTL after the
    // token was issued.
    for uses in 0.. {
        let sent = issued.elapsed();
        let answer = kv
            .range(common::with_token(&alice, range("/dev/a", b"")))
            .await;
        assert!(
            answer.is_ok(),
            "use {uses}, {sent:?} after issue: {answer:?}"
        );
        if sent > TTL {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Idle for longer than the TTL since the last use was answered: the token has expired.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert_status(
        kv.range(common::with_token(&alice, range("/dev/a", b"")))
            .await,
        Code::Unauthenticated,
        "etcdserver: invalid auth token",
    );
}

#[tokio::test]
async fn the_etcd_client_crate_logs_in_with_user_and_password() {
    let server = common::start_kvd(&[]);
    tenant(&connect(&server.endpoint).await).await;
    let options = etcd_client::ConnectOptions::new().with_user("alice", "alicepw");
    let mut client = tokio::time::timeout(
        PATIENCE,
        etcd_client::Client::connect([server.endpoint.as_str()], Some(options)),
    )
    .await
    .unwrap()
    .unwrap();
    client.put("/dev/crate", "1", None).await.unwrap();
    let got = client.get("/dev/crate", None).await.unwrap();
    assert_eq!(got.kvs()[0].value(), b"1");
    let denied = client.put("/other/crate", "1", None).await.unwrap_err();
    assert!(denied.to_string().contains(DENIED), "{denied}");
    let wrong = etcd_client::ConnectOptions::new().with_user("alice", "wrong");
    let refused = etcd_client::Client::connect([server.endpoint.as_str()], Some(wrong)).await;
    let refused = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        refused.contains("authentication failed, invalid user ID or password"),
        "{refused}"
    );
}

/// Sends one HTTP/1.1 request and returns the status code and body.
fn http(
    endpoint: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(token) = token {
        request.push_str(&format!("Authorization: {token}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_owned())
}

#[tokio::test]
async fn the_tenant_story_alice_in_dev_is_authorized_and_counted() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.clone();
    let channel = connect(&ep).await;
    let (root, alice) = tenant(&channel).await;
    let quota = json!({"type": "UPDATE_QUOTA", "update_quota": {"quota_configs": [
        {"role": "dev", "limits": {"kv_keys": {"value": 10}}}]}})
    .to_string();
    let (code, body) = http(&ep, "POST", "/api/v1", None, &quota);
    assert_eq!(code, 401, "{body}");
    assert!(
        body.contains("needs a token of a user with role root"),
        "{body}"
    );
    let (code, body) = http(&ep, "POST", "/api/v1", Some("forged.1"), &quota);
    assert_eq!(code, 401, "{body}");
    assert!(body.starts_with("etcdserver: invalid auth token"), "{body}");
    let (code, body) = http(&ep, "POST", "/api/v1", Some(&alice), &quota);
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("user 'alice' does not hold it"), "{body}");
    assert_eq!(http(&ep, "GET", "/roles", None, "").0, 401);
    let (code, body) = http(
        &ep,
        "POST",
        "/api/v1",
        Some(&format!("Bearer {root}")),
        &quota,
    );
    assert_eq!((code, body.as_str()), (200, ""));
    let mut kv = KvClient::new(channel);
    kv.put(common::with_token(&alice, put("/dev/a", "1")))
        .await
        .unwrap();
    kv.put(common::with_token(&alice, put("/dev/b", "2")))
        .await
        .unwrap();
    assert_status(
        kv.put(common::with_token(&alice, put("/ops/a", "1"))).await,
        Code::PermissionDenied,
        DENIED,
    );
    let (code, body) = http(&ep, "GET", "/roles", Some(&root), "");
    assert_eq!(code, 200, "{body}");
    let roles: Value = serde_json::from_str(&body).unwrap();
    let dev = roles["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "dev")
        .cloned()
        .unwrap();
    assert_eq!(dev["quota"]["consumed"]["kv_keys"], json!(2), "{dev}");
}

#[tokio::test]
async fn repeated_failed_logins_are_only_delayed_never_answered_differently() {
    let server = common::start_kvd(&[]);
    let channel = connect(&server.endpoint).await;
    tenant(&channel).await;
    let mut auth = AuthClient::new(channel.clone());
    let login = |password: &str| pb::AuthenticateRequest {
        name: "alice".into(),
        password: password.into(),
    };
    // Past the free failures each attempt waits for its slot (AUTHN-3); the answers stay
    // etcd's, and the right password still logs in.
    for _ in 0..7 {
        let attempt = tokio::time::timeout(PATIENCE, auth.authenticate(login("wrong"))).await;
        assert_status(
            attempt.unwrap(),
            Code::InvalidArgument,
            "etcdserver: authentication failed, invalid user ID or password",
        );
    }
    let token = tokio::time::timeout(PATIENCE, auth.authenticate(login("alicepw")))
        .await
        .unwrap()
        .unwrap()
        .into_inner()
        .token;
    KvClient::new(channel)
        .put(common::with_token(&token, put("/dev/after-login", "1")))
        .await
        .unwrap();
    // Each user name has its own count: root logs in as usual.
    let root = tokio::time::timeout(PATIENCE, authenticate(&mut auth, "root", "rootpw")).await;
    assert!(!root.unwrap().is_empty());
}
