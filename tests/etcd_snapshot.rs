//! Snapshots in etcd's format through the engine's public API: a store with history,
//! deletions, a compaction and leases goes out as an etcd snapshot file and comes back in
//! through `restore_etcd_snapshot` with the same revisions, values and HashKV; an auth
//! store comes back with the same users, roles, permissions, enabled flag and revision; the
//! file's status equals what etcdctl 3.4.23 reports for it (this test fails without
//! `etcdctl`). Both restores (etcd's format and kvd's dump) build aside and rename into
//! place: no temporary stays, and what a killed restore left does not count.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use kvd::{
    CompactionRequest, Config, DeleteRangeRequest, Engine, EtcdMember, LeaseGrantRequest,
    PutRequest, RangeRequest, etcd_snapshot_status, restore_etcd_snapshot,
};

fn open(dir: &std::path::Path) -> Engine {
    Engine::open(dir, Config::default()).unwrap()
}

/// Builds the store: 300 revisions over 40 keys, range deletes, a 9 000-byte value, a
/// compaction at 150 and two leases (one with keys).
fn populate(engine: &Engine) -> (i64, i64) {
    let lease = engine
        .lease_grant(LeaseGrantRequest {
            ttl: 600,
            id: 0x1234,
        })
        .unwrap()
        .id;
    engine
        .lease_grant(LeaseGrantRequest { ttl: 77, id: 0x99 })
        .unwrap();
    for i in 0..300 {
        let key = format!("k/{:02}", i % 40);
        if i % 13 == 12 {
            engine
                .delete_range(DeleteRangeRequest {
                    range_end: format!("k/{:02}", i % 40 + 3).into(),
                    ..DeleteRangeRequest::key(key)
                })
                .unwrap();
            continue;
        }
        let value = if i == 100 {
            "x".repeat(9000)
        } else {
            format!("v{i}")
        };
        engine
            .put(PutRequest {
                lease: if i % 9 == 0 { lease } else { 0 },
                ..PutRequest::new(key, value)
            })
            .unwrap();
    }
    engine
        .compact(CompactionRequest {
            revision: 150,
            physical: true,
        })
        .unwrap();
    (engine.status().unwrap().header.revision, 150)
}

fn export(engine: &Engine) -> Vec<u8> {
    let member = EtcdMember {
        id: 0xbdae_9bbc_11dd_390d,
        name: "default".into(),
        peer_urls: vec!["http://127.0.0.1:2380".into()],
        client_urls: vec!["http://127.0.0.1:2379".into()],
    };
    let mut stream = engine.etcd_snapshot_stream(&member).unwrap();
    let mut file = Vec::new();
    let mut calls = 0;
    loop {
        // Each call appends at least one chunk's worth to an empty buffer.
        let mut chunk = Vec::new();
        let more = stream.next_chunk(&mut chunk, 32 * 1024).unwrap();
        file.extend_from_slice(&chunk);
        calls += 1;
        assert!(calls < 100_000, "the stream never ends");
        if !more {
            break;
        }
    }
    assert_eq!(file.len() as u64, stream.size());
    file
}

fn range_at(engine: &Engine, revision: i64) -> String {
    let got = engine
        .range(&RangeRequest {
            revision,
            ..RangeRequest::prefix("k/")
        })
        .unwrap();
    format!("{:?} {:?}", got.header.revision, got.kvs)
}

#[test]
fn a_store_goes_out_to_etcds_format_and_comes_back_the_same() {
    let source_dir = tempfile::tempdir().unwrap();
    let source = open(source_dir.path());
    let (revision, compacted) = populate(&source);
    let file = export(&source);
    let status = etcd_snapshot_status(&file).unwrap();
    assert_eq!(status.revision, revision);

    let restored_dir = tempfile::tempdir().unwrap();
    let target = restored_dir.path().join("restored");
    let summary = restore_etcd_snapshot(&file, &target).unwrap();
    assert_eq!(summary.revision, revision);
    assert_eq!(summary.compact_revision, compacted);
    assert_eq!(summary.leases, 2);
    let copy = open(&target);
    assert_eq!(copy.status().unwrap().header.revision, revision);
    assert_eq!(
        copy.consumption_drift().unwrap(),
        Vec::new(),
        "counters after the import"
    );
    for rev in [compacted, compacted + 1, revision - 10, revision, 0] {
        assert_eq!(range_at(&copy, rev), range_at(&source, rev), "at {rev}");
    }
    assert!(
        copy.range(&RangeRequest {
            revision: compacted - 1,
            ..RangeRequest::prefix("k/")
        })
        .unwrap_err()
        .is_compacted()
    );
    assert_eq!(
        copy.hash_kv(0).unwrap().hash,
        source.hash_kv(0).unwrap().hash
    );
    let leases = copy.lease_leases().unwrap();
    assert_eq!(leases.leases.len(), 2);
    assert_eq!(
        copy.lease_time_to_live(0x1234, true).unwrap().granted_ttl,
        600
    );
    assert_eq!(
        copy.lease_time_to_live(0x1234, true).unwrap().keys,
        source.lease_time_to_live(0x1234, true).unwrap().keys
    );
}

#[test]
fn etcdctl_reports_the_same_status_as_kvd() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let (revision, _) = populate(&engine);
    assert_etcdctl_status(dir.path(), &engine, revision);
}

#[test]
fn etcdctl_checks_a_file_with_two_branch_levels() {
    // 20 000 history entries: about 200 leaves, so two levels of branch pages.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    for batch in 0..200 {
        let success = (0..100)
            .map(|i| {
                kvd::RequestOp::Put(PutRequest::new(
                    format!("key/{batch:03}/{i:03}"),
                    format!("{batch}-{i}"),
                ))
            })
            .collect();
        engine
            .txn(kvd::TxnRequest {
                success,
                ..kvd::TxnRequest::default()
            })
            .unwrap();
    }
    let revision = engine.status().unwrap().header.revision;
    let file = export(&engine);
    let branches = (2..file.len() / 4096)
        .filter(|p| file[p * 4096 + 8] == 1 && file[p * 4096 + 9] == 0)
        .count();
    assert!(branches >= 3, "{branches} branch pages: not two levels");
    assert_etcdctl_status(dir.path(), &engine, revision);
}

fn assert_etcdctl_status(dir: &std::path::Path, engine: &Engine, revision: i64) {
    let file = export(engine);
    let path = dir.join("snap.db");
    std::fs::write(&path, &file).unwrap();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()
        .expect("etcdctl (etcd 3.4) must be installed for this test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = etcd_snapshot_status(&file).unwrap();
    let want = format!(
        r#"{{"hash":{},"revision":{},"totalKey":{},"totalSize":{}}}"#,
        status.hash, revision, status.total_keys, status.total_size
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want);
}

/// The names in `dir`, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_restore_builds_aside_and_what_a_killed_one_left_does_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("src"));
    let (revision, _) = populate(&engine);
    let etcd_file = export(&engine);
    let mut dump = Vec::new();
    let mut stream = engine.snapshot_stream().unwrap();
    while stream.next_chunk(&mut dump, 32 * 1024).unwrap() {}
    // Another store's whole database stands for what a killed restore left: a restore must
    // neither take it for the data directory nor be stopped by it.
    let other = open(&dir.path().join("other"));
    other.put(PutRequest::new("other", "x")).unwrap();
    let other_file = export(&other);
    drop(other);
    type Restore<'a> = Box<dyn Fn(&std::path::Path) -> kvd::Result<()> + 'a>;
    let restores: [(&str, Restore<'_>); 2] = [
        (
            "etcd",
            Box::new(|d| restore_etcd_snapshot(&etcd_file, d).map(|_| ())),
        ),
        ("kvd", Box::new(|d| kvd::restore_snapshot(&dump, d))),
    ];
    let pid = std::process::id();
    for (format, restore) in &restores {
        for existing in [false, true] {
            let what = format!("{format}, existing directory: {existing}");
            let parent = dir.path().join(format!("{format}-{existing}"));
            std::fs::create_dir(&parent).unwrap();
            let data = parent.join("data");
            // Beside a missing directory, or inside an existing one; one under this
            // process's id, the name this restore builds under.
            let leftovers = if existing {
                std::fs::create_dir(&data).unwrap();
                [
                    data.join(".restoring-1"),
                    data.join(format!(".restoring-{pid}")),
                ]
            } else {
                [
                    parent.join("data.restoring-1"),
                    parent.join(format!("data.restoring-{pid}")),
                ]
            };
            for leftover in &leftovers {
                restore_etcd_snapshot(&other_file, leftover).unwrap();
            }
            restore(&data).unwrap();
            // The database and nothing else, and no temporary beside it.
            assert_eq!(names(&data), ["kvd.redb"], "{what}");
            assert_eq!(names(&parent), ["data"], "{what}");
            let copy = open(&data);
            assert_eq!(copy.status().unwrap().header.revision, revision, "{what}");
            assert_eq!(
                copy.range(&RangeRequest::key("other")).unwrap().count,
                0,
                "{what}"
            );

            // A failed restore leaves neither the directory nor a temporary.
            let failed = parent.join("failed");
            let truncated = &etcd_file[..etcd_file.len() / 2];
            assert!(restore_etcd_snapshot(truncated, &failed).is_err(), "{what}");
            assert!(kvd::restore_snapshot(&dump[..dump.len() / 2], &failed).is_err());
            assert_eq!(names(&parent), ["data"], "{what}");
        }
    }
}

#[test]
fn damaged_files_leave_no_directory_behind() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("src"));
    populate(&engine);
    let file = export(&engine);
    for (what, bytes) in [
        ("truncated", file[..file.len() - 4096].to_vec()),
        ("foreign", b"SQLite format 3\0".repeat(600)),
        ("zeroed page", {
            let mut f = file.clone();
            f[2 * 4096..3 * 4096].fill(0);
            f
        }),
        // The last key leaf: found only after the records before it were written.
        ("late damage", {
            let mut f = file.clone();
            let last_leaf = last_key_leaf(&f);
            f[last_leaf * 4096 + 16..last_leaf * 4096 + 48].fill(0xFF);
            f
        }),
    ] {
        let target = dir.path().join(what);
        let err = restore_etcd_snapshot(&bytes, &target).unwrap_err();
        assert!(err.is_corrupted(), "{what}: {err}");
        assert!(!target.exists(), "{what}: a directory was left behind");
        // An empty directory given by the caller stays, empty.
        std::fs::create_dir(&target).unwrap();
        assert!(restore_etcd_snapshot(&bytes, &target).is_err());
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "{what}");
    }
}

/// Returns the page number of the last leaf page before the first branch page.
fn last_key_leaf(file: &[u8]) -> usize {
    let flags = |page: usize| u16::from_le_bytes([file[page * 4096 + 8], file[page * 4096 + 9]]);
    let first_branch = (2..file.len() / 4096).find(|p| flags(*p) == 1).unwrap();
    (2..first_branch).rev().find(|p| flags(*p) == 2).unwrap()
}

#[test]
fn alarms_go_out_under_the_member_id_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("src"));
    engine.put(PutRequest::new("k", "v")).unwrap();
    for member_id in [0, 42] {
        engine
            .alarm(kvd::AlarmRequest {
                action: kvd::AlarmAction::Activate,
                member_id,
                alarm: kvd::AlarmType::Corrupt,
            })
            .unwrap();
    }
    let file = export(&engine);
    let target = dir.path().join("restored");
    restore_etcd_snapshot(&file, &target).unwrap();
    let copy = open(&target);
    let mut listed: Vec<_> = copy
        .alarm(kvd::AlarmRequest::default())
        .unwrap()
        .alarms
        .into_iter()
        .map(|a| (a.member_id, a.alarm))
        .collect();
    listed.sort();
    // The engine's own member 0 went out as the member's id, as the wire shows it.
    assert_eq!(
        listed,
        [
            (42, kvd::AlarmType::Corrupt),
            (0xbdae_9bbc_11dd_390d, kvd::AlarmType::Corrupt)
        ]
    );
}

/// Sets up auth as an operator would: root with role root, alice in role dev (readwrite on
/// the /dev/ prefix, read on key `pub`), a password-less bob in dev and ops (write from
/// `/` on), auth enabled.
fn set_up_auth(engine: &Engine) {
    use kvd::AuthRequest::*;
    let hash = |s: &str| Some(format!("$2b$10${s}"));
    let perm = |perm_type, key: &str, range_end: &str| {
        Some(kvd::Permission {
            perm_type,
            key: key.into(),
            range_end: range_end.into(),
        })
    };
    for request in [
        UserAdd {
            name: "root".into(),
            password_hash: hash("root"),
        },
        RoleAdd {
            name: "root".into(),
        },
        UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        RoleAdd { name: "dev".into() },
        RoleAdd { name: "ops".into() },
        RoleGrantPermission {
            role: "dev".into(),
            permission: perm(kvd::PermissionType::ReadWrite, "/dev/", "/dev0"),
        },
        RoleGrantPermission {
            role: "dev".into(),
            permission: perm(kvd::PermissionType::Read, "pub", ""),
        },
        RoleGrantPermission {
            role: "ops".into(),
            permission: perm(kvd::PermissionType::Write, "/", "\0"),
        },
        UserAdd {
            name: "alice".into(),
            password_hash: hash("alice"),
        },
        UserGrantRole {
            user: "alice".into(),
            role: "dev".into(),
        },
        UserAdd {
            name: "bob".into(),
            password_hash: None,
        },
        UserGrantRole {
            user: "bob".into(),
            role: "ops".into(),
        },
        UserGrantRole {
            user: "bob".into(),
            role: "dev".into(),
        },
        Enable,
    ] {
        engine.auth(request).unwrap();
    }
}

fn auth_state(engine: &Engine) -> String {
    let users: Vec<_> = engine
        .auth_user_names()
        .unwrap()
        .iter()
        .map(|n| engine.auth_user(n).unwrap().unwrap())
        .collect();
    let roles: Vec<_> = engine
        .auth_role_names()
        .unwrap()
        .iter()
        .map(|n| engine.auth_role(n).unwrap().unwrap())
        .collect();
    format!("{:?}\n{users:?}\n{roles:?}", engine.auth_status().unwrap())
}

#[test]
fn an_auth_store_goes_out_to_etcds_format_and_comes_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let source = open(&dir.path().join("src"));
    source.put(PutRequest::new("/dev/a", "1")).unwrap();
    set_up_auth(&source);
    let (enabled, auth_revision) = source.auth_status().unwrap();
    assert!(enabled);
    assert_eq!(auth_revision, 14, "13 changes after the fresh store's 1");
    let file = export(&source);
    let target = dir.path().join("restored");
    let summary = restore_etcd_snapshot(&file, &target).unwrap();
    assert_eq!(
        (summary.auth_users, summary.auth_roles, summary.auth_enabled),
        (3, 3, true)
    );
    let copy = open(&target);
    assert_eq!(auth_state(&copy), auth_state(&source));
    assert!(auth_state(&copy).contains("$2b$10$alice"));
    // The restored store enforces what the source did.
    let put =
        |user, key: &str| copy.auth_check(Some(user), key.as_bytes(), b"", kvd::Access::Write);
    assert!(put("alice", "/dev/x").is_ok());
    assert!(put("alice", "/other").is_err());
    assert!(put("bob", "/other").is_ok());
    assert!(copy.auth_check_admin(Some("root")).is_ok());
    assert!(copy.auth_check_admin(Some("alice")).is_err());
    // etcdctl's tx.Check accepts the file with the auth buckets, and counts their keys.
    let status = etcd_snapshot_status(&file).unwrap();
    let plain = export(&open(&dir.path().join("plain")));
    let plain_keys = etcd_snapshot_status(&plain).unwrap().total_keys;
    assert_eq!(
        status.total_keys,
        plain_keys + 1 + 2 + 3 + 3,
        "one more revision, auth's 2 keys, 3 users, 3 roles"
    );
    assert_etcdctl_status(&dir.path().join("src"), &source, 2);
}

#[test]
fn a_fresh_auth_store_writes_no_auth_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    engine.put(PutRequest::new("k", "v")).unwrap();
    let file = export(&engine);
    for name in [&b"authUsers"[..], b"authRoles", b"authRevision"] {
        assert!(
            !file.windows(name.len()).any(|w| w == name),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    let target = dir.path().join("restored");
    let summary = restore_etcd_snapshot(&file, &target).unwrap();
    assert_eq!((summary.auth_users, summary.auth_roles), (0, 0));
    assert_eq!(open(&target).auth_status().unwrap(), (false, 1));
}
