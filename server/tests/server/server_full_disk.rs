//! A full disk on a small tmpfs the test mounts (the tests run as root): the filesystem
//! reserve scales with a small filesystem, a real ENOSPC poisons the store and kvd reopens
//! it by itself once space is back (no acknowledged write lost, HashKV of the old history
//! unchanged), and a NOSPACE raised by the reserve is logged once with its figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use kvd_server::pb::etcdserverpb as pb;
use kvd_server::pb::etcdserverpb::kv_client::KvClient;
use kvd_server::pb::etcdserverpb::maintenance_client::MaintenanceClient;
use tonic::transport::Channel;

use crate::common;

/// The size of the reserve test's filesystem.
const FS_MIB: u64 = 64;
/// The size of the full-disk test's filesystem: small enough that its reserve (5 %, about
/// 0.8 MiB) is below what one checkpoint writes (a 2 MiB log's records and redb's pages
/// for them), so a real ENOSPC can come before the reserve check.
const FULL_FS_MIB: u64 = 16;
/// Free space the filler leaves before the writes that end in ENOSPC: above the reserve
/// plus one write, below one checkpoint, so a checkpoint runs into the full disk before the
/// reserve check sees the space go.
const LEFT_FREE_KIB: u64 = 1536;
/// Bytes of each value written: the store's pages reach the disk only at a checkpoint,
/// after the reserve check has admitted the batches before it.
const VALUE_BYTES: usize = 200_000;
/// Most puts the test tries before the disk must have filled.
const PUTS_MAX: usize = 400;
/// How long kvd may take to notice free space and reopen.
const RECOVERY_WAIT: Duration = Duration::from_secs(30);

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs failed: this test needs root (mount -t tmpfs)"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Returns the free KiB (`df`'s figure).
    fn free_kib(&self) -> u64 {
        let out = Command::new("df")
            .args(["-k", "--output=avail"])
            .arg(self.path())
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        text.lines().nth(1).unwrap().trim().parse().unwrap()
    }

    /// Fills the filesystem from outside until `leave_kib` KiB are free; returns the file.
    fn fill(&self, leave_kib: u64, name: &str) -> PathBuf {
        let path = self.path().join(name);
        let kib = self.free_kib().saturating_sub(leave_kib);
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 1024];
        for _ in 0..kib {
            use std::io::Write;
            if file.write_all(&block).is_err() {
                break;
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn put(key: String, value: Bytes) -> pb::PutRequest {
    pb::PutRequest {
        key: Bytes::from(key),
        value,
        ..pb::PutRequest::default()
    }
}

async fn hash_kv(channel: &Channel, revision: i64) -> u32 {
    MaintenanceClient::new(channel.clone())
        .hash_kv(pb::HashKvRequest { revision })
        .await
        .unwrap()
        .into_inner()
        .hash
}

fn health(endpoint: &str) -> (u16, String) {
    common::http_get(endpoint, "/health").unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_recovers_without_a_restart_and_loses_no_acknowledged_write() {
    let fs = Tmpfs::mount(FULL_FS_MIB);
    let data_dir = fs.path().join("data");
    // The 2 MiB log this geometry was made for: its checkpoints write more than is left.
    let server = common::start_kvd_in(&data_dir, &["--wal-file-bytes", "2097152"]).unwrap();
    let channel = Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel.clone());
    // A 16 MiB filesystem is usable: the reserve is 5% of it, not the 64 MiB minimum.
    kv.put(put("first".into(), Bytes::from_static(b"v")))
        .await
        .expect("the first put on a small filesystem");
    assert!(
        server.log().contains("fs_reserve_bytes=838860"),
        "{}",
        server.log()
    );
    let checkpoint = kv
        .put(put("checkpoint".into(), Bytes::from_static(b"v")))
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision;
    let hash_before = hash_kv(&channel, checkpoint).await;

    let filler = fs.fill(LEFT_FREE_KIB, "filler");
    let value = Bytes::from(vec![b'x'; VALUE_BYTES]);
    let mut acknowledged = Vec::new();
    let mut failure = None;
    for n in 0..PUTS_MAX {
        let key = format!("k{n:04}");
        match kv.put(put(key.clone(), value.clone())).await {
            Ok(answer) => acknowledged.push((key, answer.into_inner().header.unwrap().revision)),
            Err(status) => {
                failure = Some(status);
                break;
            }
        }
    }
    let failure = failure.expect("the disk filled up");
    assert_eq!(failure.code(), tonic::Code::Unavailable, "{failure:?}");
    assert!(
        failure.message().contains("No space left on device"),
        "{failure:?}"
    );
    // While poisoned: writes say what kvd waits for, /health and /metrics name the state.
    let refused = kv
        .put(put("refused".into(), Bytes::from_static(b"v")))
        .await
        .expect_err("a poisoned store refuses writes");
    assert!(
        refused
            .message()
            .contains("reserve free again, or on `alarm disarm`"),
        "{refused:?}"
    );
    let (code, body) = health(&server.endpoint);
    assert_eq!(code, 503);
    assert!(body.contains("\"reason\":\"STORAGE POISONED: "), "{body}");
    let (_, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
    assert!(metrics.contains("kvd_storage_poisoned 1"), "{metrics}");

    // Space comes back: kvd reopens by itself, no restart.
    std::fs::remove_file(&filler).unwrap();
    let healthy = common::wait_until_async(RECOVERY_WAIT, || async {
        health(&server.endpoint).0 == 200
    })
    .await;
    assert!(healthy, "not healthy again; log:\n{}", server.log());
    assert!(server.log().contains("database reopened"));
    let after = KvClient::new(channel.clone())
        .put(put("after".into(), Bytes::from_static(b"v")))
        .await
        .expect("writes resume without a restart")
        .into_inner();
    let last_acknowledged = acknowledged.last().map_or(checkpoint, |(_, r)| *r);
    assert_eq!(
        after.header.unwrap().revision,
        last_acknowledged + 1,
        "nothing acknowledged lost, nothing unacknowledged applied"
    );
    for (key, revision) in &acknowledged {
        let found = kv
            .range(pb::RangeRequest {
                key: Bytes::from(key.clone()),
                ..pb::RangeRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(found.kvs.len(), 1, "{key} lost");
        assert_eq!(found.kvs[0].mod_revision, *revision);
        assert_eq!(found.kvs[0].value.len(), VALUE_BYTES);
    }
    assert_eq!(hash_kv(&channel, checkpoint).await, hash_before, "HashKV");
    let (_, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
    assert!(metrics.contains("kvd_storage_poisoned 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nospace_from_the_reserve_is_logged_once_with_its_figures() {
    let fs = Tmpfs::mount(FS_MIB);
    let data_dir = fs.path().join("data");
    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let channel = Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut kv = KvClient::new(channel.clone());
    kv.put(put("first".into(), Bytes::from_static(b"v")))
        .await
        .unwrap();
    // Less than the 3.2 MiB reserve left: the guard refuses before any I/O.
    let filler = fs.fill(1024, "filler");
    for n in 0..3 {
        let refused = kv
            .put(put(format!("over{n}"), Bytes::from_static(b"v")))
            .await
            .expect_err("below the reserve");
        assert_eq!(
            refused.message(),
            "etcdserver: mvcc: database space exceeded"
        );
    }
    let logged = common::wait_until_async(RECOVERY_WAIT, || async {
        server.log().contains("NOSPACE alarm raised")
    })
    .await;
    assert!(logged, "{}", server.log());
    // Give the watcher a few more looks: still one line for the episode.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = server.log();
    assert_eq!(log.matches("NOSPACE alarm raised").count(), 1, "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("NOSPACE alarm raised"))
        .unwrap();
    for figure in [
        "reason=\"the filesystem has less than the reserve free\"",
        "fs_reserve_bytes=3355440",
        "fs_free_bytes=Some(",
        "quota_bytes=2147483648",
        "db_size_in_use_bytes=",
    ] {
        assert!(line.contains(figure), "{figure} missing from: {line}");
    }
    // The store was never poisoned; freeing space and disarming is the whole remedy.
    std::fs::remove_file(&filler).unwrap();
    let status = common::etcdctl(&server.endpoint, &["alarm", "disarm"], None);
    assert_eq!(status.code, 0, "{status:?}");
    kv.put(put("after".into(), Bytes::from_static(b"v")))
        .await
        .expect("writes after disarm");
}
