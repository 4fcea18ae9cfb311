//! Snapshots between kvd and Debian's etcd 3.4.23 (issue 15), both directions, with a
//! store that has history, deletions, a compaction and leases:
//! - kvd → `etcdctl snapshot save` → `etcdctl snapshot status` (kvd's revision, the key
//!   count, the hash `kvd snapshot status` computes) → `etcdctl snapshot restore` → an
//!   etcd started on it serves the same `get --prefix -w json` (revisions included), the
//!   same old revision, refuses the same compacted one, and has the lease with its TTL;
//! - etcd → `etcdctl snapshot save` → `kvd snapshot restore` → `kvd check` passes → a kvd
//!   started on it serves the same;
//! - `kvd snapshot save --format kvd|etcd` and `kvd snapshot status` for both formats;
//!   damaged files are refused by `kvd snapshot restore` with no directory left behind;
//!   a restore killed part way (SIGKILL, both formats, into a missing or an empty directory)
//!   leaves no database in the data directory, and the next restore into it works;
//! - both directions again with auth enabled (root, alice in role dev with readwrite on
//!   /dev/): the restored server lets alice write /dev/x and refuses /other and a request
//!   without a user, and root sees the same users, roles, permissions as on the source.
//!
//! These tests fail when etcd or etcdctl is missing.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::common::{self, Run, etcdctl};

/// Runs etcdctl and asserts success.
fn ok(ep: &str, args: &[&str]) -> Run {
    let run = etcdctl(ep, args, None);
    assert_eq!(run.code, 0, "etcdctl {args:?}: {run:?}");
    run
}

/// Writes the same history on any server: 60 puts over 12 keys, deletes (one a range),
/// a leased key, a 9 000-byte value, a compaction; returns (lease id in hex, compaction
/// revision, an old revision above it).
fn write_history(ep: &str) -> (String, i64, i64) {
    let grant = ok(ep, &["lease", "grant", "600"]).stdout;
    // "lease 694d77aa9e7e3a0b granted with TTL(600s)"
    let lease = grant.split_whitespace().nth(1).unwrap().to_owned();
    for i in 0..60 {
        let key = format!("k/{:02}", i % 12);
        ok(ep, &["put", &key, &format!("v{i}")]);
        if i % 17 == 16 {
            ok(ep, &["del", &key]);
        }
    }
    ok(ep, &["put", "k/big", &"x".repeat(9000)]);
    ok(ep, &["put", "k/leased", "l", "--lease", &lease]);
    ok(ep, &["del", "k/03", "k/05"]);
    let compact = revision(ep) - 20;
    ok(ep, &["compaction", &compact.to_string()]);
    ok(ep, &["put", "k/after", "compaction"]);
    (lease, compact, compact + 5)
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:?}"))
}

fn revision(ep: &str) -> i64 {
    json(&ok(ep, &["get", "k/", "--prefix", "-w", "json"]))["header"]["revision"]
        .as_i64()
        .unwrap()
}

/// What must be equal on both sides: the kvs and the revision of each read.
fn observe(ep: &str, lease: &str, compact: i64, old: i64) -> Vec<String> {
    let mut seen = Vec::new();
    for rev in [0, old, compact] {
        let run = ok(
            ep,
            &[
                "get",
                "k/",
                "--prefix",
                "-w",
                "json",
                "--rev",
                &rev.to_string(),
            ],
        );
        let v = json(&run);
        seen.push(format!(
            "rev {rev}: revision {} kvs {}",
            v["header"]["revision"], v["kvs"]
        ));
    }
    let below = etcdctl(
        ep,
        &["get", "k/", "--prefix", "--rev", &(compact - 1).to_string()],
        None,
    );
    seen.push(format!(
        "below the compaction: {} {}",
        below.code,
        below
            .stderr
            .contains("required revision has been compacted")
    ));
    let ttl = json(&ok(
        ep,
        &["lease", "timetolive", lease, "--keys", "-w", "json"],
    ));
    seen.push(format!(
        "lease granted {} keys {}",
        ttl["granted-ttl"], ttl["keys"]
    ));
    seen
}

fn kvd(args: &[&str]) -> std::process::Output {
    Command::new(common::kvd_binary())
        .args(args)
        .output()
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `kvd snapshot restore FILE --data-dir DATA`, which must succeed (`what` names the
/// case in the failure message); returns its output.
fn kvd_restore(file: &Path, data: &Path, what: &str) -> Output {
    let restore = kvd(&["snapshot", "restore", path(file), "--data-dir", path(data)]);
    assert!(restore.status.success(), "{what}: {restore:?}");
    restore
}

/// Runs `kvd snapshot save FILE` from `source` (`--endpoints URL` or `--data-dir DIR`) in
/// `format`, which must succeed.
fn kvd_save(file: &Path, source: [&str; 2], format: &str) {
    let saved = kvd(&[
        "snapshot",
        "save",
        path(file),
        source[0],
        source[1],
        "--format",
        format,
    ]);
    assert!(saved.status.success(), "{saved:?}");
}

#[test]
fn a_kvd_snapshot_restores_into_etcd_with_its_history() {
    let source = common::start_kvd(&[]);
    let ep = source.endpoint.as_str();
    let (lease, compact, old) = write_history(ep);
    let want = observe(ep, &lease, compact, old);
    assert!(
        want[3].contains("true"),
        "kvd refuses below the compaction: {want:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kvd.snap");
    ok(ep, &["snapshot", "save", path(&file)]);
    let status = json(&ok(ep, &["snapshot", "status", path(&file), "-w", "json"]));
    assert_eq!(status["revision"].as_i64(), Some(revision(ep)));
    let ours = kvd(&["snapshot", "status", path(&file), "-w", "json"]);
    assert!(ours.status.success(), "{ours:?}");
    let ours: Value = serde_json::from_slice(&ours.stdout).unwrap();
    for field in ["hash", "revision", "totalKey", "totalSize"] {
        assert_eq!(
            ours[field], status[field],
            "{field}: {ours} vs etcdctl's {status}"
        );
    }
    assert_eq!(ours["sha256Ok"], Value::Bool(true));

    let [client_port, peer_port] = common::free_ports();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let restored = dir.path().join("etcd-restored");
    ok(
        ep,
        &[
            "snapshot",
            "restore",
            path(&file),
            "--data-dir",
            path(&restored),
            "--name",
            "default",
            "--initial-cluster",
            &format!("default={peer}"),
            "--initial-advertise-peer-urls",
            &peer,
        ],
    );
    let etcd = common::start_etcd_on(&restored, client_port, &peer)
        .unwrap_or_else(|log| panic!("etcd did not start on the restored snapshot:\n{log}"));
    assert_eq!(observe(&etcd.endpoint, &lease, compact, old), want);
}

#[test]
fn an_etcd_snapshot_restores_into_kvd_with_its_history() {
    let etcd = common::start_etcd();
    let ep = etcd.endpoint.as_str();
    let (lease, compact, old) = write_history(ep);
    let want = observe(ep, &lease, compact, old);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd.snap");
    ok(ep, &["snapshot", "save", path(&file)]);
    let data = dir.path().join("kvd-data");
    let restore = kvd_restore(&file, &data, "");
    let stdout = String::from_utf8_lossy(&restore.stdout);
    assert!(
        stdout.contains(&format!("revision {}", revision(ep))),
        "{stdout}"
    );
    let status = kvd(&["snapshot", "status", path(&file), "-w", "json"]);
    let ours: Value = serde_json::from_slice(&status.stdout).unwrap();
    let theirs = json(&ok(ep, &["snapshot", "status", path(&file), "-w", "json"]));
    for field in ["hash", "revision", "totalKey", "totalSize"] {
        assert_eq!(ours[field], theirs[field], "{field}");
    }

    // The imported directory passes kvd's own check before a kvd starts on it.
    let check = kvd(&["check", "--data-dir", path(&data)]);
    assert!(check.status.success(), "{check:?}");

    let server = common::start_kvd_in(&data, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(observe(&server.endpoint, &lease, compact, old), want);
    assert_eq!(revision(&server.endpoint), revision(ep));
}

#[test]
fn kvd_snapshot_save_writes_either_format_and_restores_it() {
    let source = common::start_kvd(&[]);
    let ep = source.endpoint.as_str();
    let (lease, compact, old) = write_history(ep);
    let want = observe(ep, &lease, compact, old);
    let dir = tempfile::tempdir().unwrap();
    for format in ["kvd", "etcd"] {
        let file = dir.path().join(format!("{format}.snap"));
        kvd_save(&file, ["--endpoints", ep], format);
        let status = kvd(&["snapshot", "status", path(&file), "-w", "json"]);
        assert!(status.status.success(), "{status:?}");
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["format"], Value::from(format));
        assert_eq!(status["revision"].as_i64(), Some(revision(ep)), "{status}");
        assert_eq!(status["sha256Ok"], Value::Bool(true));
        let data = dir.path().join(format!("{format}-data"));
        kvd_restore(&file, &data, "");
        let server = common::start_kvd_in(&data, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            observe(&server.endpoint, &lease, compact, old),
            want,
            "{format}"
        );
    }
}

#[test]
fn damaged_snapshots_are_refused_and_leave_no_directory() {
    let source = common::start_kvd(&[]);
    let ep = source.endpoint.as_str();
    for i in 0..40 {
        ok(ep, &["put", &format!("a{i}"), &"v".repeat(300)]);
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("good.snap");
    ok(ep, &["snapshot", "save", path(&file)]);
    let good = std::fs::read(&file).unwrap();
    let mut flipped = good.clone();
    flipped[3 * 4096 + 100] ^= 0xFF;
    let cases: Vec<(&str, Vec<u8>, &[&str], &str)> = vec![
        ("flipped", flipped.clone(), &[], "expected sha256"),
        ("flipped-unchecked", flipped, &["--skip-hash-check"], ""),
        (
            "truncated",
            good[..good.len() - 1000].to_vec(),
            &[],
            "missing hash",
        ),
        (
            "truncated-unchecked",
            good[..2 * 4096].to_vec(),
            &["--skip-hash-check"],
            "etcd snapshot",
        ),
        (
            "foreign",
            b"SQLite format 3\0".repeat(64),
            &["--skip-hash-check"],
            "neither",
        ),
    ];
    for (name, bytes, flags, message) in cases {
        let bad = dir.path().join(format!("{name}.snap"));
        std::fs::write(&bad, &bytes).unwrap();
        let data = dir.path().join(format!("{name}-data"));
        let mut args = vec!["snapshot", "restore", path(&bad), "--data-dir", path(&data)];
        args.extend_from_slice(flags);
        let out = kvd(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if name == "flipped-unchecked" {
            // A flipped byte inside a value's bytes may still be a valid file; either way
            // a failure leaves nothing behind.
            assert!(out.status.success() || !data.exists(), "{name}: {stderr}");
            continue;
        }
        assert!(!out.status.success(), "{name}: accepted");
        assert!(stderr.contains(message), "{name}: {stderr}");
        assert!(!data.exists(), "{name}: {} left behind", data.display());
    }
    // An existing, non-empty directory is refused and kept.
    let busy = dir.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("keep"), b"x").unwrap();
    let out = kvd(&[
        "snapshot",
        "restore",
        path(&file),
        "--data-dir",
        path(&busy),
    ]);
    assert!(!out.status.success());
    assert!(busy.join("keep").exists());
}

/// Writes a stopped data directory with `keys` keys of 1 KiB, 1 000 to a txn.
fn big_store(data: &Path, keys: usize) {
    let config = kvd::Config {
        max_txn_ops: 1000,
        unsafe_no_fsync: true,
        ..kvd::Config::default()
    };
    let engine = kvd::Engine::open(data, config).unwrap();
    for chunk in 0..keys / 1000 {
        let success = (0..1000)
            .map(|i| {
                let key = format!("big/{:07}", chunk * 1000 + i);
                kvd::RequestOp::Put(kvd::PutRequest::new(key, "v".repeat(1024)))
            })
            .collect();
        engine
            .txn(kvd::TxnRequest {
                success,
                ..kvd::TxnRequest::default()
            })
            .unwrap();
    }
}

#[test]
fn a_killed_restore_leaves_no_database_and_the_next_restore_works() {
    const KEYS: usize = 20_000;
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    big_store(&source, KEYS);
    for format in ["kvd", "etcd"] {
        let file = dir.path().join(format!("{format}.snap"));
        kvd_save(&file, ["--data-dir", path(&source)], format);
        // The directory code is the same for both formats: an existing one is tried with one.
        let modes: &[bool] = if format == "kvd" {
            &[false]
        } else {
            &[false, true]
        };
        for &existing in modes {
            let what = format!("{format}, existing directory: {existing}");
            let data = dir.path().join(format!("{format}-{existing}-data"));
            if existing {
                std::fs::create_dir(&data).unwrap();
            }
            let mut child = Command::new(common::kvd_binary())
                .args([
                    "snapshot",
                    "restore",
                    path(&file),
                    "--data-dir",
                    path(&data),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // Where the restore builds (engine SNAP-4): beside a missing directory, inside an
            // existing one.
            let building = if existing {
                data.join(format!(".restoring-{}", child.id()))
            } else {
                dir.path()
                    .join(format!("{format}-{existing}-data.restoring-{}", child.id()))
            };
            let partial = building.join("kvd.redb");
            let target = data.join("kvd.redb");
            // Wait until the restore has committed rows (10 000 to a commit), then kill it.
            loop {
                if partial.metadata().is_ok_and(|m| m.len() > 4 << 20) {
                    break;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("{what}: the restore ended ({status}) before it was seen writing");
                }
                assert!(!target.exists(), "{what}: a database appeared part way");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(!target.exists(), "{what}: a database appeared part way");
            child.kill().unwrap();
            child.wait().unwrap();
            assert!(
                !target.exists(),
                "{what}: the killed restore left a database"
            );
            assert_eq!(data.exists(), existing, "{what}");
            assert!(building.exists(), "{what}: the temporary is gone already");

            // The next restore into the same directory works and removes the leftover.
            kvd_restore(&file, &data, &what);
            assert!(!building.exists(), "{what}: the leftover stayed");
            let mut left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| name.contains(".restoring-"))
                .collect();
            left.extend(
                std::fs::read_dir(&data)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .filter(|name| name != "kvd.redb"),
            );
            assert_eq!(left, Vec::<String>::new(), "{what}");
            let check = kvd(&["check", "--data-dir", path(&data)]);
            assert!(check.status.success(), "{what}: {check:?}");
            let report: Value = serde_json::from_slice(&check.stdout).unwrap();
            assert_eq!(
                report["keys"].as_u64(),
                Some(KEYS as u64),
                "{what}: {report}"
            );
        }
    }
}

const ROOT: &str = "--user=root:rootpw";

/// Sets up auth with etcdctl on any server: root with role root, alice in role dev with
/// readwrite on the /dev/ prefix, auth enabled.
fn set_up_auth(ep: &str) {
    for args in [
        "user add root --new-user-password=rootpw --interactive=false",
        "role add root",
        "user grant-role root root",
        "role add dev",
        "role grant-permission dev readwrite /dev/ --prefix=true",
        "user add alice --new-user-password=alicepw --interactive=false",
        "user grant-role alice dev",
        "auth enable",
    ] {
        ok(ep, &args.split(' ').collect::<Vec<_>>());
    }
}

/// Returns what a server with [`set_up_auth`]'s store shows, after checking that it
/// enforces it: alice may write under /dev/ only, root lists both users.
fn observe_auth(ep: &str) -> Vec<String> {
    let alice = "--user=alice:alicepw";
    ok(ep, &[alice, "put", "/dev/x", "1"]);
    let denied = etcdctl(ep, &[alice, "put", "/other", "1"], None);
    assert_ne!(denied.code, 0, "{denied:?}");
    assert!(denied.stderr.contains("permission denied"), "{denied:?}");
    let anonymous = etcdctl(ep, &["put", "/dev/y", "1"], None);
    assert_ne!(anonymous.code, 0, "no user: {anonymous:?}");
    let users = ok(ep, &[ROOT, "user", "list"]).stdout;
    assert_eq!(users.trim(), "alice\nroot");
    vec![
        users,
        ok(ep, &[ROOT, "role", "list"]).stdout,
        ok(ep, &[ROOT, "role", "get", "dev"]).stdout,
        ok(ep, &[ROOT, "user", "get", "alice"]).stdout,
        ok(ep, &[ROOT, "auth", "enable"]).stdout,
    ]
}

#[test]
fn a_kvd_snapshot_with_auth_restores_into_etcd_that_enforces_it() {
    let source = common::start_kvd(&[]);
    let ep = source.endpoint.as_str();
    set_up_auth(ep);
    let want = observe_auth(ep);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kvd.snap");
    ok(ep, &[ROOT, "snapshot", "save", path(&file)]);
    ok(ep, &["snapshot", "status", path(&file)]);
    let [client_port, peer_port] = common::free_ports();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let restored = dir.path().join("etcd-restored");
    ok(
        ep,
        &[
            "snapshot",
            "restore",
            path(&file),
            "--data-dir",
            path(&restored),
            "--name",
            "default",
            "--initial-cluster",
            &format!("default={peer}"),
            "--initial-advertise-peer-urls",
            &peer,
        ],
    );
    let etcd = common::start_etcd_on(&restored, client_port, &peer)
        .unwrap_or_else(|log| panic!("etcd did not start on the restored snapshot:\n{log}"));
    assert_eq!(observe_auth(&etcd.endpoint), want);
}

#[test]
fn an_etcd_snapshot_with_auth_restores_into_kvd_that_enforces_it() {
    let etcd = common::start_etcd();
    let ep = etcd.endpoint.as_str();
    set_up_auth(ep);
    let want = observe_auth(ep);

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd.snap");
    ok(ep, &[ROOT, "snapshot", "save", path(&file)]);
    let data = dir.path().join("kvd-data");
    let restore = kvd_restore(&file, &data, "");
    let stdout = String::from_utf8_lossy(&restore.stdout);
    assert!(
        stdout.contains("auth enabled with 2 users and 2 roles"),
        "{stdout}"
    );
    let check = kvd(&["check", "--data-dir", path(&data)]);
    assert!(check.status.success(), "{check:?}");
    let server = common::start_kvd_in(&data, &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(observe_auth(&server.endpoint), want);
}
