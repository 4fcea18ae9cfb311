//! The auth store through the engine: every Auth request's change and refusal (etcd's
//! texts), the auth revision's moves (AUTH-STORE-2), the root rules (AUTH-STORE-4),
//! persistence across a restart (AUTH-STORE-1), and the permission checks (PERM-1..3),
//! including the three etcd 3.4 holes closed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kvd::{
    Access, AuthError, AuthRequest, Compare, CompareResult, CompareTarget, Config,
    DeleteRangeRequest, Engine, Error, LeaseGrantRequest, Permission, PermissionType, PutRequest,
    RangeRequest, RequestOp, TxnRequest,
};

fn open(dir: &std::path::Path) -> Engine {
    Engine::open(dir, Config::default()).unwrap()
}

fn refused(engine: &Engine, request: AuthRequest) -> AuthError {
    match engine.auth(request) {
        Err(Error::Auth(e)) => e,
        other => panic!("expected an auth refusal, got {other:?}"),
    }
}

fn user_add(name: &str) -> AuthRequest {
    AuthRequest::UserAdd {
        name: name.into(),
        password_hash: Some(format!("hash-of-{name}")),
    }
}

fn grant(user: &str, role: &str) -> AuthRequest {
    AuthRequest::UserGrantRole {
        user: user.into(),
        role: role.into(),
    }
}

fn prefix_perm(role: &str, perm_type: PermissionType, key: &str, end: &str) -> AuthRequest {
    AuthRequest::RoleGrantPermission {
        role: role.into(),
        permission: Some(Permission {
            perm_type,
            key: key.as_bytes().to_vec(),
            range_end: end.as_bytes().to_vec(),
        }),
    }
}

/// Root with role root, alice in role dev with readwrite on `/dev/`, auth enabled.
fn tenant(engine: &Engine) {
    for request in [
        user_add("root"),
        grant("root", "root"),
        user_add("alice"),
        AuthRequest::RoleAdd { name: "dev".into() },
        prefix_perm("dev", PermissionType::ReadWrite, "/dev/", "/dev0"),
        grant("alice", "dev"),
        AuthRequest::Enable,
    ] {
        engine.auth(request).unwrap();
    }
}

/// Options that check a write as `name` (PERM-4, PERM-5).
fn as_user(name: &str) -> kvd::WriteOptions {
    kvd::WriteOptions {
        caller: Some(Some(name.into())),
        ..kvd::WriteOptions::default()
    }
}

fn denied(result: kvd::Result<()>) -> bool {
    result == Err(Error::Auth(AuthError::PermissionDenied))
}

#[test]
fn auth_revision_moves_as_etcds_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    assert_eq!(engine.auth_status().unwrap(), (false, 1));
    assert_eq!(
        refused(&engine, AuthRequest::Enable),
        AuthError::RootUserNotExist
    );
    assert_eq!(engine.auth(user_add("root")).unwrap(), 2);
    assert_eq!(
        refused(&engine, user_add("root")),
        AuthError::UserAlreadyExist
    );
    assert_eq!(refused(&engine, user_add("")), AuthError::UserEmpty);
    assert_eq!(
        refused(&engine, AuthRequest::Enable),
        AuthError::RootRoleNotGranted
    );
    assert_eq!(
        refused(&engine, grant("root", "nosuch")),
        AuthError::RoleNotFound
    );
    assert_eq!(
        refused(&engine, grant("nobody", "root")),
        AuthError::UserNotFound
    );
    // Role root need not exist to be granted.
    assert_eq!(engine.auth(grant("root", "root")).unwrap(), 3);
    assert_eq!(
        engine.auth(grant("root", "root")).unwrap(),
        3,
        "no-op grant"
    );
    assert_eq!(engine.auth_status().unwrap(), (false, 3));
    // AuthEnable does not move the revision; enabling twice is a no-op.
    assert_eq!(engine.auth(AuthRequest::Enable).unwrap(), 3);
    assert_eq!(engine.auth(AuthRequest::Enable).unwrap(), 3);
    assert_eq!(engine.auth_status().unwrap(), (true, 3));
    // Root cannot be removed while enabled.
    let root = || AuthRequest::UserDelete {
        name: "root".into(),
    };
    assert_eq!(refused(&engine, root()), AuthError::InvalidAuthMgmt);
    let revoke = AuthRequest::UserRevokeRole {
        user: "root".into(),
        role: "root".into(),
    };
    assert_eq!(refused(&engine, revoke.clone()), AuthError::InvalidAuthMgmt);
    let role_root = AuthRequest::RoleDelete {
        name: "root".into(),
    };
    assert_eq!(refused(&engine, role_root), AuthError::InvalidAuthMgmt);
    assert_eq!(engine.auth_status().unwrap(), (true, 3));
    // AuthDisable moves it.
    assert_eq!(engine.auth(AuthRequest::Disable).unwrap(), 4);
    assert_eq!(engine.auth(AuthRequest::Disable).unwrap(), 4);
    assert_eq!(engine.auth(revoke).unwrap(), 5);
    assert_eq!(engine.auth(root()).unwrap(), 6);
    assert_eq!(refused(&engine, root()), AuthError::UserNotFound);
    engine.close().unwrap();
}

#[test]
fn roles_and_permissions_follow_etcds_rules() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let add = |name: &str| AuthRequest::RoleAdd { name: name.into() };
    engine.auth(add("dev")).unwrap();
    assert_eq!(refused(&engine, add("dev")), AuthError::RoleAlreadyExist);
    assert_eq!(refused(&engine, add("")), AuthError::RoleEmpty);
    // etcd 3.4 crashes on a grant without a permission; kvd refuses it.
    let none = AuthRequest::RoleGrantPermission {
        role: "dev".into(),
        permission: None,
    };
    assert_eq!(refused(&engine, none), AuthError::PermissionNotGiven);
    let empty_key = prefix_perm("dev", PermissionType::Read, "", "");
    assert_eq!(refused(&engine, empty_key), AuthError::InvalidAuthMgmt);
    let inverted = prefix_perm("dev", PermissionType::Read, "b", "a");
    assert_eq!(refused(&engine, inverted), AuthError::InvalidAuthMgmt);
    let missing = prefix_perm("nosuch", PermissionType::Read, "a", "");
    assert_eq!(refused(&engine, missing), AuthError::RoleNotFound);
    let revision = engine.auth_status().unwrap().1;
    engine
        .auth(prefix_perm("dev", PermissionType::Read, "/z/", "/z0"))
        .unwrap();
    engine
        .auth(prefix_perm("dev", PermissionType::Read, "/a/", "/a0"))
        .unwrap();
    // Same key and range end: the type is replaced.
    engine
        .auth(prefix_perm("dev", PermissionType::ReadWrite, "/z/", "/z0"))
        .unwrap();
    let role = engine.auth_role("dev").unwrap().unwrap();
    let keys: Vec<_> = role.permissions.iter().map(|p| p.key.clone()).collect();
    assert_eq!(keys, vec![b"/a/".to_vec(), b"/z/".to_vec()]);
    assert_eq!(role.permissions[1].perm_type, PermissionType::ReadWrite);
    assert_eq!(engine.auth_status().unwrap().1, revision + 3);
    let revoke = |key: &str, end: &str| AuthRequest::RoleRevokePermission {
        role: "dev".into(),
        key: key.as_bytes().to_vec(),
        range_end: end.as_bytes().to_vec(),
    };
    assert_eq!(
        refused(&engine, revoke("/a/", "")),
        AuthError::PermissionNotGranted
    );
    engine.auth(revoke("/a/", "/a0")).unwrap();
    // Deleting a role takes it from every user.
    engine.auth(user_add("bob")).unwrap();
    engine.auth(grant("bob", "dev")).unwrap();
    let not_held = AuthRequest::UserRevokeRole {
        user: "bob".into(),
        role: "ops".into(),
    };
    assert_eq!(refused(&engine, not_held), AuthError::RoleNotGranted);
    engine
        .auth(AuthRequest::RoleDelete { name: "dev".into() })
        .unwrap();
    assert!(engine.auth_user("bob").unwrap().unwrap().roles.is_empty());
    assert_eq!(engine.auth_role_names().unwrap(), Vec::<String>::new());
    engine.close().unwrap();
}

#[test]
fn the_auth_store_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    tenant(&engine);
    engine
        .auth(AuthRequest::UserAdd {
            name: "cert-only".into(),
            password_hash: None,
        })
        .unwrap();
    let before = (
        engine.auth_status().unwrap(),
        engine.auth_user("alice").unwrap(),
        engine.auth_role("dev").unwrap(),
        engine.auth_user_names().unwrap(),
    );
    engine.close().unwrap();
    let engine = open(dir.path());
    let after = (
        engine.auth_status().unwrap(),
        engine.auth_user("alice").unwrap(),
        engine.auth_role("dev").unwrap(),
        engine.auth_user_names().unwrap(),
    );
    assert_eq!(before, after);
    assert!(after.0.0, "still enabled");
    assert!(engine.auth_user("cert-only").unwrap().unwrap().no_password);
    engine.close().unwrap();
}

#[test]
fn key_checks_cover_ranges_and_every_txn_branch() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    tenant(&engine);
    let alice = Some("alice");
    assert!(
        engine
            .auth_check(alice, b"/dev/a", b"", Access::Write)
            .is_ok()
    );
    assert!(
        engine
            .auth_check(alice, b"/dev/", b"/dev0", Access::Read)
            .is_ok()
    );
    assert!(
        denied(engine.auth_check(alice, b"/dev/", b"\0", Access::Read)),
        "from-key"
    );
    assert!(denied(engine.auth_check(
        alice,
        b"/other",
        b"",
        Access::Read
    )));
    assert!(denied(engine.auth_check(
        Some("ghost"),
        b"/dev/a",
        b"",
        Access::Read
    )));
    assert_eq!(
        engine.auth_check(None, b"/dev/a", b"", Access::Read),
        Err(Error::Auth(AuthError::UserEmpty))
    );
    assert!(
        engine
            .auth_check(Some("root"), b"\0", b"\0", Access::Write)
            .is_ok()
    );
    assert!(engine.auth_check_admin(Some("root")).is_ok());
    assert!(denied(engine.auth_check_admin(alice)));
    assert_eq!(
        engine.auth_check_admin(Some("ghost")),
        Err(Error::Auth(AuthError::UserNotFound))
    );
    let put = |k: &str| RequestOp::Put(PutRequest::new(k.to_owned(), "v"));
    let txn = |success, failure| TxnRequest {
        compare: vec![],
        success,
        failure,
    };
    assert!(
        engine
            .auth_check_txn(alice, &txn(vec![put("/dev/a")], vec![]))
            .is_ok()
    );
    // The failure branch counts even if the compares would succeed.
    assert!(denied(engine.auth_check_txn(
        alice,
        &txn(vec![put("/dev/a")], vec![put("/x")])
    )));
    // etcd 3.4 did not check nested Txns.
    let nested = txn(
        vec![RequestOp::Txn(txn(vec![put("/other/evil")], vec![]))],
        vec![],
    );
    assert!(denied(engine.auth_check_txn(alice, &nested)));
    let compare = TxnRequest {
        compare: vec![Compare {
            key: "/secret".into(),
            range_end: Default::default(),
            result: CompareResult::Equal,
            target: CompareTarget::Version(0),
        }],
        success: vec![],
        failure: vec![],
    };
    assert!(denied(engine.auth_check_txn(alice, &compare)));
    let read = RequestOp::Range(RangeRequest::prefix("/"));
    assert!(denied(
        engine.auth_check_txn(alice, &txn(vec![read], vec![]))
    ));
    let del = DeleteRangeRequest {
        prev_kv: true,
        ..DeleteRangeRequest::key("/other")
    };
    assert!(denied(engine.auth_check_delete_range(alice, &del)));
    engine.close().unwrap();
}

#[test]
fn lease_keys_need_write_permission() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let lease = engine
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .unwrap()
        .id;
    let mut put = PutRequest::new("/other/k", "v");
    put.lease = lease;
    engine.put(put).unwrap();
    tenant(&engine);
    let alice = Some("alice");
    assert!(denied(engine.auth_check_lease_revoke(alice, lease)));
    let mut attach = PutRequest::new("/dev/k", "v");
    attach.lease = lease;
    assert!(
        denied(engine.auth_check_put(alice, &attach)),
        "lease holds /other/k"
    );
    assert!(engine.auth_check_lease_revoke(Some("root"), lease).is_ok());
    let empty = engine
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .unwrap()
        .id;
    assert!(engine.auth_check_lease_revoke(alice, empty).is_ok());
    engine.close().unwrap();
}

#[test]
fn the_auth_store_travels_in_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    tenant(&engine);
    let mut image = Vec::new();
    let mut stream = engine.snapshot_stream().unwrap();
    while stream.next_chunk(&mut image, 32 * 1024).unwrap() {}
    drop(stream);
    let restored = tempfile::tempdir().unwrap();
    kvd::restore_snapshot(&image, restored.path()).unwrap();
    let copy = open(restored.path());
    assert_eq!(copy.auth_status().unwrap(), engine.auth_status().unwrap());
    assert_eq!(
        copy.auth_role("dev").unwrap(),
        engine.auth_role("dev").unwrap()
    );
    assert_eq!(
        copy.auth_user("alice").unwrap(),
        engine.auth_user("alice").unwrap()
    );
    assert!(denied(copy.auth_check(
        Some("alice"),
        b"/other",
        b"",
        Access::Read
    )));
    copy.close().unwrap();
    engine.close().unwrap();
}

#[test]
fn writes_with_a_caller_are_checked_again_in_apply_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    tenant(&engine);
    let as_alice = as_user("alice");
    engine
        .put_with(PutRequest::new("/dev/a", "1"), &as_alice)
        .unwrap();
    // The revoke is applied before the write queued after it: the write is refused there,
    // whatever was checked at admission (PERM-4).
    let revoke = AuthRequest::RoleRevokePermission {
        role: "dev".into(),
        key: b"/dev/".to_vec(),
        range_end: b"/dev0".to_vec(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let tx2 = tx.clone();
    engine.submit_auth(revoke, Box::new(move |r| tx.send(r.map(|_| ())).unwrap()));
    engine.submit_put_with(
        PutRequest::new("/dev/b", "2"),
        &as_alice,
        Box::new(move |r| tx2.send(r.map(|_| ())).unwrap()),
    );
    assert_eq!(rx.recv().unwrap(), Ok(()));
    assert_eq!(
        rx.recv().unwrap(),
        Err(Error::Auth(AuthError::PermissionDenied))
    );
    let got = engine.range(&RangeRequest::key("/dev/b")).unwrap();
    assert_eq!(got.count, 0, "the refused write changed nothing");
    // No identity is `user name is empty`; no caller at all checks nothing.
    let anonymous = kvd::WriteOptions {
        caller: Some(None),
        ..kvd::WriteOptions::default()
    };
    let txn = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Put(PutRequest::new("/dev/c", "3"))],
        failure: vec![],
    };
    assert_eq!(
        engine.txn_with(txn.clone(), &anonymous).unwrap_err(),
        Error::Auth(AuthError::UserEmpty)
    );
    engine.txn(txn).unwrap();
    // With an operation id too: the retry gets the recorded answer.
    let once = kvd::WriteOptions {
        operation_id: Some("op-1".into()),
        caller: Some(Some("root".into())),
    };
    let first = engine.put_with(PutRequest::new("/x", "1"), &once).unwrap();
    let retry = engine.put_with(PutRequest::new("/x", "1"), &once).unwrap();
    assert_eq!(first, retry);
    let lease = engine
        .lease_grant(LeaseGrantRequest { ttl: 600, id: 0 })
        .unwrap()
        .id;
    let mut leased = PutRequest::new("/x", "2");
    leased.lease = lease;
    engine.put(leased).unwrap();
    let as_alice_revoke = engine.lease_revoke_with(lease, &as_alice).map(|_| ());
    assert_eq!(
        as_alice_revoke,
        Err(Error::Auth(AuthError::PermissionDenied))
    );
    assert_eq!(engine.range(&RangeRequest::key("/x")).unwrap().count, 1);
    engine.close().unwrap();
}

#[test]
fn a_write_with_a_caller_gets_its_own_errors_before_a_denial_and_reads_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    tenant(&engine);
    let as_alice = as_user("alice");
    // Invalid and denied: the validation's error, as etcd (PERM-5).
    let invalid = PutRequest {
        ignore_value: true,
        ..PutRequest::new("/other/a", "v")
    };
    assert_eq!(
        engine.put_with(invalid, &as_alice).unwrap_err(),
        Error::ValueProvided
    );
    let no_key = DeleteRangeRequest::key("");
    assert_eq!(
        engine.delete_range_with(no_key, &as_alice).unwrap_err(),
        Error::KeyNotProvided
    );
    let revision = engine.status().unwrap().header.revision;
    assert_eq!(
        engine
            .put_with(PutRequest::new("/other/a", "v"), &as_alice)
            .unwrap_err(),
        Error::Auth(AuthError::PermissionDenied)
    );
    assert_eq!(
        engine.status().unwrap().header.revision,
        revision,
        "the denied write changed nothing"
    );
    // A read-only Txn is served only if the caller may read every range it names.
    engine
        .put_with(PutRequest::new("/dev/a", "1"), &as_alice)
        .unwrap();
    let reads = |key: &str| TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Range(RangeRequest::key(key.to_owned()))],
        failure: vec![],
    };
    let mine = engine.txn_with(reads("/dev/a"), &as_alice).unwrap();
    assert!(mine.succeeded);
    assert_eq!(mine.responses.len(), 1);
    assert_eq!(
        engine.txn_with(reads("/other/a"), &as_alice).unwrap_err(),
        Error::Auth(AuthError::PermissionDenied)
    );
    assert_eq!(
        engine.txn_with(reads(""), &as_alice).unwrap_err(),
        Error::KeyNotProvided,
        "validation first"
    );
    // Without a caller nothing is checked (the embedder's own reads).
    assert!(engine.txn(reads("/other/a")).unwrap().succeeded);
    engine.close().unwrap();
}
