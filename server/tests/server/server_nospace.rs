//! The NOSPACE story through etcdctl 3.4 against a kvd with a small `--quota-backend-bytes`:
//! fill until refused, the alarm is listed and `/health` turns 503 (200 with
//! `?exclude=NOSPACE`), reads and deletes work, compact, defrag, disarm, writes work again;
//! and `snapshot save` produces etcd's format (a database image plus a SHA-256 trailer); an
//! alarm kept across a restart is logged as kept.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::common;
use crate::common::etcdctl;

#[test]
fn nospace_story_through_etcdctl() {
    let server = common::start_kvd(&["--quota-backend-bytes", "400000"]);
    let ep = server.endpoint.as_str();
    let value = "x".repeat(8000);
    let mut written = 0;
    let refused = loop {
        let run = etcdctl(ep, &["put", &format!("k{written:03}"), &value], None);
        if run.code != 0 {
            break run;
        }
        written += 1;
        assert!(written < 500, "the quota never filled");
    };
    assert!(
        refused
            .stderr
            .contains("Error: etcdserver: mvcc: database space exceeded"),
        "{refused:?}"
    );
    assert!(written > 5, "only {written} puts fit");

    let alarms = etcdctl(ep, &["alarm", "list"], None);
    assert!(
        alarms.stdout.starts_with("memberID:") && alarms.stdout.ends_with("alarm:NOSPACE \n"),
        "{alarms:?}"
    );
    assert_eq!(
        common::http_get(ep, "/health").unwrap(),
        (
            503,
            "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}".into()
        )
    );
    assert_eq!(
        common::http_get(ep, "/health?exclude=NOSPACE").unwrap().0,
        200
    );
    let status = etcdctl(ep, &["endpoint", "status", "-w", "json"], None);
    assert!(
        status.stdout.contains("alarm:NOSPACE"),
        "Status lists the alarm in errors: {status:?}"
    );

    // Reads and deletes keep working; the alarm is latched through compact and defrag.
    let got = etcdctl(ep, &["get", "k000", "--print-value-only"], None);
    assert_eq!(got.stdout.trim_end(), value);
    let deleted = etcdctl(ep, &["del", "--prefix", "k"], None);
    assert_eq!(deleted.stdout.trim(), written.to_string());
    let revision = {
        let json = etcdctl(ep, &["get", "k", "-w", "json"], None).stdout;
        let at = json.find("\"revision\":").unwrap() + "\"revision\":".len();
        json[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(etcdctl(ep, &["compaction", &revision], None).code, 0);
    let defrag = etcdctl(ep, &["defrag"], None);
    assert!(
        defrag
            .stdout
            .starts_with("Finished defragmenting etcd member"),
        "{defrag:?}"
    );
    assert_ne!(
        etcdctl(ep, &["put", "still", "latched"], None).code,
        0,
        "defrag clears no alarm"
    );
    let disarmed = etcdctl(ep, &["alarm", "disarm"], None);
    assert!(disarmed.stdout.contains("alarm:NOSPACE"), "{disarmed:?}");
    assert_eq!(etcdctl(ep, &["alarm", "list"], None).stdout, "");
    assert_eq!(etcdctl(ep, &["put", "after", "disarm"], None).code, 0);
    assert_eq!(common::http_get(ep, "/health").unwrap().0, 200);
}

#[test]
fn snapshot_save_writes_an_image_with_a_sha256_trailer() {
    let server = common::start_kvd(&[]);
    let ep = server.endpoint.as_str();
    for i in 0..50 {
        assert_eq!(etcdctl(ep, &["put", &format!("s{i}"), "v"], None).code, 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snap.db");
    let saved = etcdctl(ep, &["snapshot", "save", path.to_str().unwrap()], None);
    assert_eq!(saved.code, 0, "{saved:?}");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(
        bytes.len() % 512,
        32,
        "etcdctl's check: image plus a 32-byte trailer"
    );
    use sha2::Digest;
    let (image, trailer) = bytes.split_at(bytes.len() - 32);
    assert_eq!(sha2::Sha256::digest(image).as_slice(), trailer);
    // The image is etcd's bbolt file: restored, a kvd opened on it has the keys.
    let restored = tempfile::tempdir().unwrap();
    kvd::restore_etcd_snapshot(image, restored.path()).unwrap();
    let engine = kvd::Engine::open(restored.path(), kvd::Config::default()).unwrap();
    assert_eq!(
        engine.range(&kvd::RangeRequest::prefix("s")).unwrap().count,
        50
    );
}

/// RECOVERY-5: a NOSPACE alarm persisted from before a restart is logged as kept, with the
/// figures and no guessed cause, not as raised anew.
#[test]
fn an_alarm_from_before_a_restart_is_logged_as_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = ["--quota-backend-bytes", "400000"];
    let mut server = common::start_kvd_in(&data, &flags).unwrap();
    let value = "x".repeat(8000);
    let mut written = 0;
    while etcdctl(
        &server.endpoint,
        &["put", &format!("k{written:03}"), &value],
        None,
    )
    .code
        == 0
    {
        written += 1;
        assert!(written < 500, "the quota never filled");
    }
    assert!(
        common::wait_until(Duration::from_secs(20), || server
            .log()
            .contains("NOSPACE alarm raised")),
        "{}",
        server.log()
    );
    assert_eq!(server.signal_and_wait("-TERM"), Some(0));
    let server = common::start_kvd_in(&data, &flags).unwrap();
    let alarms = etcdctl(&server.endpoint, &["alarm", "list"], None);
    assert!(alarms.stdout.ends_with("alarm:NOSPACE \n"), "{alarms:?}");
    assert!(
        common::wait_until(Duration::from_secs(20), || server
            .log()
            .contains("NOSPACE alarm kept from before the start")),
        "{}",
        server.log()
    );
    let log = server.log();
    assert!(!log.contains("NOSPACE alarm raised"), "{log}");
    assert!(log.contains("quota_bytes=400000"), "{log}");
}
