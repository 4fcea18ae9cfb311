//! The tools for a stopped data directory (issue 15): `kvd defrag --data-dir` shrinks a
//! file and keeps HashKV; `kvd check --data-dir` passes a sound directory and finds a
//! corruption planted in the database file; `kvd snapshot save --data-dir` writes a
//! snapshot etcdctl reads; each refuses a directory a running kvd holds (OFFLINE-1).

use std::path::Path;
use std::process::{Command, Output};

use crate::common;

fn kvd(args: &[&str]) -> Output {
    Command::new(common::kvd_binary())
        .args(args)
        .output()
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A stopped data directory with 400 values of 4 KiB, most of them deleted and compacted
/// away, so that a defrag has space to give back.
fn stopped_store(dir: &Path) -> u32 {
    let engine = kvd::Engine::open(dir, kvd::Config::default()).unwrap();
    for i in 0..400 {
        // The kept values carry a marker a test can find in the file.
        let value = if i >= 350 {
            format!("LIVE-{i}-").repeat(400)
        } else {
            "v".repeat(4096)
        };
        engine
            .put(kvd::PutRequest::new(format!("k{i:03}"), value))
            .unwrap();
    }
    engine
        .delete_range(kvd::DeleteRangeRequest {
            range_end: "k350".into(),
            ..kvd::DeleteRangeRequest::key("k000")
        })
        .unwrap();
    let revision = engine.status().unwrap().header.revision;
    engine
        .compact(kvd::CompactionRequest {
            revision,
            physical: true,
        })
        .unwrap();
    let hash = engine.hash_kv(0).unwrap().hash;
    engine.close().unwrap();
    hash
}

fn hash_of(dir: &Path) -> u32 {
    let engine = kvd::Engine::open(dir, kvd::Config::default()).unwrap();
    let hash = engine.hash_kv(0).unwrap().hash;
    engine.close().unwrap();
    hash
}

#[test]
fn offline_defrag_shrinks_the_file_and_keeps_hash_kv() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let hash = stopped_store(&data);
    let before = std::fs::metadata(data.join("kvd.redb")).unwrap().len();
    let out = kvd(&["defrag", "--data-dir", path(&data)]);
    assert!(out.status.success(), "{out:?}");
    let after = std::fs::metadata(data.join("kvd.redb")).unwrap().len();
    assert!(after < before, "{before} -> {after} bytes");
    assert_eq!(hash_of(&data), hash);
}

#[test]
fn offline_check_passes_a_sound_directory_and_finds_a_planted_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stopped_store(&data);
    let out = kvd(&["check", "--data-dir", path(&data)]);
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], serde_json::Value::Bool(true), "{report}");
    assert_eq!(report["keys"], serde_json::Value::from(50));
    assert_eq!(report["uncheckedRecords"], serde_json::Value::from(0));
    assert!(report["checkedRows"].as_u64() > Some(0), "{report}");

    // Damage every copy of one live value's bytes in the file.
    let file = data.join("kvd.redb");
    let mut bytes = std::fs::read(&file).unwrap();
    let marker = b"LIVE-377-";
    let mut planted = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(marker.len()).position(|w| w == marker) {
        let start = at + found;
        bytes[start..start + marker.len()].copy_from_slice(b"DEAD-377-");
        at = start + marker.len();
        planted += 1;
    }
    assert!(planted > 0, "the marker is not in the file");
    std::fs::write(&file, &bytes).unwrap();
    let out = kvd(&["check", "--data-dir", path(&data)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], serde_json::Value::Bool(false), "{report}");
    // REC-4: the server refuses the directory by the record's checksum, not serving the
    // changed value.
    let refused = common::start_kvd_in(&data, &[])
        .err()
        .expect("kvd served a changed value");
    assert!(
        refused.contains("checksum mismatch at revision"),
        "{refused}"
    );
}

#[test]
fn offline_tools_refuse_a_directory_a_running_kvd_holds() {
    let server = common::start_kvd(&[]);
    let data = server.data_dir.clone();
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.db");
    for args in [
        vec!["check", "--data-dir", path(&data)],
        vec!["defrag", "--data-dir", path(&data)],
        vec!["snapshot", "save", path(&snap), "--data-dir", path(&data)],
    ] {
        let out = kvd(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("in use"), "{args:?}: {stderr}");
    }
    assert!(!snap.exists());
}

#[test]
fn offline_snapshot_save_writes_a_file_etcdctl_reads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stopped_store(&data);
    let snap = dir.path().join("s.db");
    let out = kvd(&["snapshot", "save", path(&snap), "--data-dir", path(&data)]);
    assert!(out.status.success(), "{out:?}");
    let status = common::etcdctl(
        "http://127.0.0.1:1",
        &["snapshot", "status", path(&snap), "-w", "json"],
        None,
    );
    assert_eq!(status.code, 0, "{status:?}");
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let engine = kvd::Engine::open(&data, kvd::Config::default()).unwrap();
    let revision = engine.status().unwrap().header.revision;
    engine.close().unwrap();
    // The last write was the range delete; the compaction adds no revision.
    assert_eq!(status["revision"], serde_json::Value::from(revision));
}

/// WAL-7 and STORE-6 through the binary: after a SIGKILL, a flipped byte in a log record that
/// later records prove was durable makes `kvd check` report damage (exit 2) and `kvd` refuse
/// to start, instead of replaying the records before it and handing their revisions out
/// again; a directory whose database file is gone is refused as well, not served as empty.
#[test]
fn a_damaged_log_or_a_lost_database_is_refused_not_served_as_less() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = common::start_kvd_in(&data, &[]).unwrap();
    for i in 0..60 {
        let run = common::etcdctl(&server.endpoint, &["put", &format!("k{i:02}"), "v"], None);
        assert_eq!(run.code, 0, "{}", run.stderr);
    }
    // No checkpoint since the start: the 60 puts live in the log (one record each).
    let _ = server.signal_and_wait("-KILL");
    let wal = data.join("kvd.wal");
    let log = std::fs::read(&wal).unwrap();
    let used = log.iter().rposition(|&b| b != 0).unwrap();
    assert!(used > 3_000, "the log holds {used} bytes of records");
    let sound = tempfile::tempdir().unwrap();
    let copy = sound.path().join("data");
    std::fs::create_dir(&copy).unwrap();
    for name in ["kvd.redb", "kvd.wal"] {
        std::fs::copy(data.join(name), copy.join(name)).unwrap();
    }
    // STORE-7: a copy whose log is lost is refused too, until the loss is accepted.
    let lost = sound.path().join("lost");
    std::fs::create_dir(&lost).unwrap();
    std::fs::copy(data.join("kvd.redb"), lost.join("kvd.redb")).unwrap();
    let mut damaged = log.clone();
    damaged[used / 2] ^= 0xff;
    std::fs::write(&wal, &damaged).unwrap();

    let out = kvd(&["check", "--data-dir", path(&data)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kvd.wal is damaged"),
        "{out:?}"
    );
    let refused = common::start_kvd_in(&data, &[])
        .err()
        .expect("kvd served a damaged log");
    assert!(refused.contains("kvd.wal is damaged"), "{refused}");

    // The undamaged copy replays all 60 puts.
    let out = kvd(&["check", "--data-dir", path(&copy)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"keys\":60"),
        "{out:?}"
    );
    // Without its database file the directory is damaged, not new.
    std::fs::remove_file(copy.join("kvd.redb")).unwrap();
    let refused = common::start_kvd_in(&copy, &[])
        .err()
        .expect("kvd served a lost database");
    assert!(
        refused.contains("kvd.redb is missing or empty"),
        "{refused}"
    );
    assert!(!copy.join("kvd.redb").exists());

    let refused = common::start_kvd_in(&lost, &[])
        .err()
        .expect("kvd served a crashed database without its log");
    assert!(refused.contains("kvd.wal is missing"), "{refused}");
    let out = kvd(&["check", "--data-dir", path(&lost)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!lost.join("kvd.wal").exists());
    let out = kvd(&["check", "--accept-missing-log", "--data-dir", path(&lost)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The 60 puts were only in the log.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"keys\":0"),
        "{out:?}"
    );
    let server = common::start_kvd_in(&lost, &[]).expect("kvd after the accepted loss");
    let run = common::etcdctl(&server.endpoint, &["put", "k", "v"], None);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

/// A database file that is not a redb database is damage: `kvd check` exits 2, not 1.
#[test]
fn check_finds_damage_in_a_file_that_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stopped_store(&data);
    std::fs::write(data.join("kvd.redb"), b"not a database").unwrap();
    let out = kvd(&["check", "--data-dir", path(&data)]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("damage found"),
        "{out:?}"
    );
}

/// A command line that cannot be parsed exits 1 with clap's error, for the offline tools too,
/// so that their 2 means only damage found (BIN-2, BIN-8); `--help` exits 0.
#[test]
fn an_unparsable_command_line_exits_1_and_help_exits_0() {
    for args in [
        vec!["check", "--data-dir"],
        vec!["check", "--no-such-flag", "--data-dir", "x"],
        vec!["defrag"],
        vec!["bench", "put", "--clients", "many"],
        vec!["no-such-command"],
    ] {
        let out = kvd(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
    }
    let help = kvd(&["check", "--help"]);
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    assert!(String::from_utf8_lossy(&help.stdout).contains("--data-dir"));
}
