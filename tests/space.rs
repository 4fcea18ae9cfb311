//! The space quota, the latched NOSPACE alarm, online defrag and Status: the recovery
//! story of `docs/operations.md`, the filesystem guard on a real small filesystem, defrag
//! under load and interrupted at each step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvd::{
    AlarmAction, AlarmMember, AlarmRequest, AlarmType, CompactionRequest, Config, DefragFailpoint,
    DeleteRangeRequest, Engine, Error, LeaseGrantRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};

const QUOTA_BYTES: i64 = 1 << 20;
const VALUE_BYTES: usize = 4096;

fn config(quota: i64) -> Config {
    Config {
        quota_backend_bytes: quota,
        cache_size_bytes: 4 << 20,
        fs_reserve_bytes: Some(0),
        ..Config::default()
    }
}

fn value() -> Vec<u8> {
    vec![b'x'; VALUE_BYTES]
}

/// Writes distinct keys until the engine refuses one; returns how many were written.
fn fill(engine: &Engine, prefix: &str) -> usize {
    for i in 0..10_000 {
        match engine.put(PutRequest::new(format!("{prefix}{i:05}"), value())) {
            Ok(_) => {}
            Err(Error::NoSpace) => return i,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    panic!("the quota never filled")
}

fn nospace_alarms(engine: &Engine) -> Vec<AlarmMember> {
    engine
        .alarm(AlarmRequest {
            alarm: AlarmType::NoSpace,
            ..AlarmRequest::default()
        })
        .unwrap()
        .alarms
}

/// Compacts the history at the current revision, physically; returns the revision.
fn compact_to_current(engine: &Engine) -> i64 {
    let revision = engine.status().unwrap().header.revision;
    engine
        .compact(CompactionRequest {
            revision,
            physical: true,
        })
        .unwrap();
    revision
}

fn disarm(engine: &Engine, member: AlarmMember) {
    engine
        .alarm(AlarmRequest {
            action: AlarmAction::Deactivate,
            member_id: member.member_id,
            alarm: member.alarm,
        })
        .unwrap();
}

#[test]
fn nospace_recovery_story_fill_read_delete_compact_defrag_disarm_write() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(QUOTA_BYTES)).unwrap();
    let written = fill(&engine, "k");
    assert!(written > 10, "only {written} writes fit a 1 MiB quota");
    let alarms = nospace_alarms(&engine);
    assert_eq!(alarms.len(), 1, "the first refusal raises NOSPACE");
    assert_eq!(engine.status().unwrap().alarms, alarms);

    // While NOSPACE is active: writes with a cost are refused, the rest works.
    assert!(
        engine
            .put(PutRequest::new("tiny", "v"))
            .unwrap_err()
            .is_no_space()
    );
    assert!(
        engine
            .put(PutRequest::new("", "v"))
            .unwrap_err()
            .is_no_space(),
        "quota before validation, as etcd"
    );
    assert!(
        engine
            .lease_grant(LeaseGrantRequest { ttl: 10, id: 0 })
            .unwrap_err()
            .is_no_space()
    );
    let writing_txn = TxnRequest {
        failure: vec![RequestOp::Put(PutRequest::new("t", "v"))],
        ..TxnRequest::default()
    };
    assert!(
        engine.txn(writing_txn).unwrap_err().is_no_space(),
        "a put in either branch counts"
    );
    assert_eq!(
        engine.range(&RangeRequest::prefix("k")).unwrap().count,
        written as i64
    );
    let delete_only = TxnRequest {
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest::key("k00000"))],
        ..TxnRequest::default()
    };
    assert!(engine.txn(delete_only).is_ok());
    let deleted = engine
        .delete_range(DeleteRangeRequest::prefix("k"))
        .unwrap();
    assert_eq!(deleted.deleted, written as i64 - 1);

    // Compact, defrag: space comes back, the alarm stays until disarmed (etcd).
    compact_to_current(&engine);
    let defrag = engine.defrag().unwrap();
    assert!(defrag.db_size_after < defrag.db_size_before, "{defrag:?}");
    assert!(
        engine
            .put(PutRequest::new("after-defrag", "v"))
            .unwrap_err()
            .is_no_space(),
        "still latched"
    );
    disarm(&engine, alarms[0]);
    assert!(nospace_alarms(&engine).is_empty());
    engine
        .put(PutRequest::new("after-disarm", value()))
        .unwrap();
    let again = fill(&engine, "m");
    assert!(again > 10, "space came back: {again} writes fit");
}

#[test]
fn disarm_without_freeing_space_raises_nospace_again_on_next_write() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(QUOTA_BYTES)).unwrap();
    fill(&engine, "k");
    let alarm = nospace_alarms(&engine)[0];
    disarm(&engine, alarm);
    assert!(
        engine
            .put(PutRequest::new("more", value()))
            .unwrap_err()
            .is_no_space()
    );
    assert_eq!(nospace_alarms(&engine), vec![alarm]);
}

#[test]
fn nospace_alarm_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(QUOTA_BYTES)).unwrap();
    fill(&engine, "k");
    engine.close().unwrap();
    // Reopen with the quota disabled: the alarm is latched, not recomputed.
    let engine = Engine::open(dir.path(), config(-1)).unwrap();
    assert_eq!(nospace_alarms(&engine).len(), 1);
    assert!(
        engine
            .put(PutRequest::new("k", "v"))
            .unwrap_err()
            .is_no_space()
    );
}

#[test]
fn admitted_writes_never_take_size_in_use_past_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let quota = 3 * QUOTA_BYTES;
    {
        let engine = Engine::open(dir.path(), config(quota)).unwrap();
        // Mixed sizes, overwrites and txns until refused.
        let mut seed = 7_u64;
        for i in 0..20_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let size = (seed >> 33) as usize % 8000;
            let key = format!("k{}", (seed >> 20) % 300);
            let result = if i % 5 == 0 {
                let ops = vec![
                    RequestOp::Put(PutRequest::new(format!("{key}/a"), vec![1u8; size])),
                    RequestOp::Put(PutRequest::new(format!("{key}/b"), vec![2u8; size / 2])),
                ];
                engine
                    .txn(TxnRequest {
                        success: ops,
                        ..TxnRequest::default()
                    })
                    .map(drop)
            } else {
                engine.put(PutRequest::new(key, vec![0u8; size])).map(drop)
            };
            match result {
                Ok(()) => {}
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(nospace_alarms(&engine).len(), 1, "the quota was reached");
        engine.close().unwrap();
    }
    // Measure the allocated pages exactly.
    let engine = Engine::open(dir.path(), config(quota)).unwrap();
    engine.measure_space().unwrap();
    let status = engine.status().unwrap();
    assert!(
        status.db_size_in_use < quota as u64,
        "in use {} >= quota {quota}",
        status.db_size_in_use
    );
    assert_eq!(status.db_size_quota, quota as u64);
}

#[test]
fn defrag_under_load_keeps_every_acknowledged_write_and_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), config(-1)).unwrap());
    // A big history, mostly superseded and compacted away.
    for round in 0..10 {
        let ops: Vec<RequestOp> = (0..100)
            .map(|k| {
                RequestOp::Put(PutRequest::new(
                    format!("base/{k:03}"),
                    vec![round as u8; 2000],
                ))
            })
            .collect();
        engine
            .txn(TxnRequest {
                success: ops,
                ..TxnRequest::default()
            })
            .unwrap();
    }
    let revision = compact_to_current(&engine);
    let hash_at = engine.hash_kv(revision).unwrap();

    let writers: Vec<_> = (0..3)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..400 {
                    let key = format!("live/{t}/{i}");
                    let rev = engine
                        .put(PutRequest::new(key.clone(), format!("{i}")))
                        .unwrap()
                        .header
                        .revision;
                    acked.push((key, rev));
                }
                acked
            })
        })
        .collect();
    let reader = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            for _ in 0..300 {
                let all = engine.range(&RangeRequest::prefix("base/")).unwrap();
                assert_eq!(all.count, 100, "readers never see a mix of files");
            }
        })
    };
    let defrag = engine.defrag().unwrap();
    let acked: Vec<(String, i64)> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    reader.join().unwrap();
    for (key, rev) in &acked {
        let got = engine.range(&RangeRequest::key(key.clone())).unwrap();
        assert_eq!(got.kvs[0].mod_revision, *rev, "{key} lost by defrag");
    }
    assert_eq!(
        engine.hash_kv(revision).unwrap().hash,
        hash_at.hash,
        "HashKV unchanged by defrag"
    );
    assert!(defrag.db_size_after < defrag.db_size_before, "{defrag:?}");
    let progress = engine.defrag_progress().unwrap();
    assert!(!progress.running && progress.copied_bytes > 0);
    // Live data is about 100 × 2 KB + 1200 small keys; the file holds little more.
    assert!(
        defrag.db_size_after < 2 << 20,
        "file after defrag {} bytes",
        defrag.db_size_after
    );
}

/// DEFRAG-3 with the real swap: a snapshot stream opened before a defrag reads the rest of
/// its image from the file it began on, after the swap and the writes that follow it, and
/// the image restores to the state at its start.
#[test]
fn a_snapshot_begun_before_a_defrag_is_read_whole_from_the_file_it_began_on() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(-1)).unwrap();
    for round in 0..5u8 {
        for k in 0..200 {
            engine
                .put(PutRequest::new(format!("base/{k:03}"), vec![round; 1000]))
                .unwrap();
        }
    }
    let revision = compact_to_current(&engine);
    let hash_before = engine.hash_kv(0).unwrap().hash;

    let mut stream = engine.snapshot_stream().unwrap();
    assert_eq!(stream.revision(), revision);
    let mut image = Vec::new();
    assert!(
        stream.next_chunk(&mut image, 4096).unwrap(),
        "the image must not fit in the first chunk, or the test reads nothing after the swap"
    );
    let defrag = engine.defrag().unwrap();
    assert!(defrag.db_size_after < defrag.db_size_before, "{defrag:?}");
    // Writes after the swap go to the new file; the stream must not see them.
    for k in 0..50 {
        engine
            .put(PutRequest::new(format!("base/{k:03}"), "after"))
            .unwrap();
    }
    engine
        .delete_range(DeleteRangeRequest::prefix("base/1"))
        .unwrap();
    while stream.next_chunk(&mut image, 4096).unwrap() {}
    drop(stream);

    let restored = tempfile::tempdir().unwrap();
    kvd::restore_snapshot(&image, restored.path()).unwrap();
    let copy = Engine::open(restored.path(), config(-1)).unwrap();
    assert_eq!(copy.status().unwrap().header.revision, revision);
    assert_eq!(copy.hash_kv(0).unwrap().hash, hash_before);
    assert_eq!(
        copy.range(&RangeRequest::prefix("base/")).unwrap().count,
        200
    );
    copy.close().unwrap();
    // The engine itself kept the writes made after the swap.
    assert_eq!(
        engine.range(&RangeRequest::prefix("base/")).unwrap().count,
        100
    );
    engine.close().unwrap();
}

/// ALARM-3 with the real admission and apply: writers keep putting while NOSPACE is raised.
/// Whatever admission saw, every acknowledged Put has a revision at or below the one the
/// activation was applied at, and a Put submitted after the activation returned is refused.
#[test]
fn no_put_is_applied_after_the_nospace_activation_whatever_admission_saw() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), config(-1)).unwrap());
    let raised = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let (engine, raised) = (engine.clone(), raised.clone());
            std::thread::spawn(move || {
                let (mut acked, mut refused) = (Vec::new(), 0);
                for i in 0..20_000 {
                    let after = raised.load(Ordering::SeqCst);
                    match engine.put(PutRequest::new(format!("w{t}/{i}"), "v")) {
                        Ok(put) => {
                            assert!(!after, "a Put submitted after the activation was applied");
                            acked.push(put.header.revision);
                        }
                        Err(Error::NoSpace) => refused += 1,
                        Err(e) => panic!("unexpected {e}"),
                    }
                    if refused == 3 {
                        break;
                    }
                }
                (acked, refused)
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.status().unwrap().header.revision < 200 {
        assert!(std::time::Instant::now() < deadline, "the writers stalled");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let activated_at = engine
        .alarm(AlarmRequest {
            action: AlarmAction::Activate,
            member_id: 1,
            alarm: AlarmType::NoSpace,
        })
        .unwrap()
        .header
        .revision;
    raised.store(true, Ordering::SeqCst);
    for writer in writers {
        let (acked, refused) = writer.join().unwrap();
        assert_eq!(refused, 3, "every writer ends on refusals");
        assert!(!acked.is_empty());
        for revision in acked {
            assert!(
                revision <= activated_at,
                "a Put applied at {revision}, after the activation at {activated_at}"
            );
        }
    }
    assert_eq!(engine.status().unwrap().header.revision, activated_at);
}

#[test]
fn defrag_of_a_store_never_written_leaves_it_readable_and_writable() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), Config::default()).unwrap();
    engine.defrag().unwrap();
    // The new file has every table the old one had, the empty history included.
    assert!(
        engine
            .range(&RangeRequest::key("k"))
            .unwrap()
            .kvs
            .is_empty()
    );
    let put = engine.put(PutRequest::new("k", "v")).unwrap();
    assert_eq!(put.header.revision, 2);
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), Config::default()).unwrap();
    assert_eq!(engine.range(&RangeRequest::key("k")).unwrap().kvs.len(), 1);
    engine.close().unwrap();
}

#[test]
fn defrag_interrupted_at_each_step_loses_nothing() {
    for failpoint in [
        DefragFailpoint::AfterCopy,
        DefragFailpoint::AfterCatchUp,
        DefragFailpoint::AfterRename,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(
            dir.path(),
            Config {
                defrag_failpoint: Some(failpoint),
                ..config(-1)
            },
        )
        .unwrap();
        for i in 0..300 {
            engine
                .put(PutRequest::new(format!("k{}", i % 50), format!("{i}")))
                .unwrap();
        }
        engine
            .delete_range(DeleteRangeRequest::prefix("k1"))
            .unwrap();
        let lease = engine
            .lease_grant(LeaseGrantRequest { ttl: 100, id: 9 })
            .unwrap();
        engine
            .put(PutRequest {
                lease: lease.id,
                ..PutRequest::new("leased", "v")
            })
            .unwrap();
        let before = engine.hash_kv(0).unwrap();
        let status = engine.status().unwrap();
        assert!(engine.defrag().is_err(), "{failpoint:?} stops the defrag");
        assert!(
            engine
                .put(PutRequest::new("after", "v"))
                .unwrap_err()
                .is_poisoned(),
            "{failpoint:?}"
        );
        drop(engine); // the "crash"

        let engine = Engine::open(dir.path(), config(-1)).unwrap();
        assert_eq!(engine.hash_kv(0).unwrap(), before, "{failpoint:?}");
        let after = engine.status().unwrap();
        assert_eq!(
            (after.header.revision, after.compact_revision),
            (status.header.revision, status.compact_revision)
        );
        assert_eq!(
            engine.lease_time_to_live(9, true).unwrap().keys.len(),
            1,
            "{failpoint:?}: leases carried over"
        );
        assert!(
            !dir.path().join("kvd.redb.defrag").exists(),
            "{failpoint:?}: the unfinished copy is removed"
        );
    }
}

#[test]
fn filesystem_guard_refuses_before_a_real_small_filesystem_fills() {
    // A 48 MiB tmpfs mounted by the test (root is needed, as in CI); the engine must refuse
    // writes before redb meets ENOSPC, stay usable, and keep every acknowledged write.
    let mount = tempfile::tempdir().unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(mount.path())
        .status()
        .expect("mount(8) must be available");
    assert!(
        status.success(),
        "mounting a tmpfs failed: this test needs root"
    );
    let result = std::panic::catch_unwind(|| fill_small_filesystem(mount.path()));
    let unmounted = Command::new("umount")
        .arg(mount.path())
        .status()
        .map(|s| s.success());
    assert!(matches!(unmounted, Ok(true)), "umount failed");
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn fill_small_filesystem(dir: &Path) {
    let config = Config {
        fs_reserve_bytes: Some(8 << 20),
        quota_backend_bytes: -1,
        ..config(-1)
    };
    let engine = Engine::open(dir, config.clone()).unwrap();
    let mut acked = 0;
    let refused = loop {
        match engine.put(PutRequest::new(format!("k{acked:06}"), vec![7u8; 64 << 10])) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        assert!(acked < 10_000, "never refused");
    };
    assert!(refused.is_no_space(), "refused with {refused}, not NOSPACE");
    assert!(acked > 10, "only {acked} writes before the guard");
    assert_eq!(
        engine.range(&RangeRequest::prefix("k")).unwrap().count,
        acked as i64,
        "not poisoned: reads work"
    );
    engine
        .delete_range(DeleteRangeRequest::key("k000000"))
        .unwrap();
    engine.close().unwrap();
    let engine = Engine::open(dir, config).unwrap();
    assert_eq!(
        engine.range(&RangeRequest::prefix("k")).unwrap().count,
        acked as i64 - 1
    );
    engine.close().unwrap();
}

#[test]
fn auto_compaction_in_revision_mode_follows_the_engine_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(kvd::ManualClock::new());
    let config = Config {
        clock: clock.clone(),
        auto_compaction: Some(kvd::AutoCompaction::Revision(10)),
        ..config(-1)
    };
    let engine = Engine::open(dir.path(), config).unwrap();
    for i in 0..50 {
        engine
            .put(PutRequest::new(format!("k{}", i % 5), "v"))
            .unwrap();
    }
    assert_eq!(
        engine.status().unwrap().compact_revision,
        -1,
        "not due before five minutes"
    );
    clock.advance(std::time::Duration::from_secs(301));
    let started = std::time::Instant::now();
    while engine.status().unwrap().compact_revision != 41 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "auto-compaction did not run"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        engine
            .range(&RangeRequest {
                revision: 40,
                ..RangeRequest::key("k0")
            })
            .unwrap_err()
            .is_compacted()
    );
}

#[test]
fn read_only_txn_is_served_under_corrupt_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(-1)).unwrap();
    engine.put(PutRequest::new("k", "v")).unwrap();
    engine
        .alarm(AlarmRequest {
            action: AlarmAction::Activate,
            member_id: 1,
            alarm: AlarmType::Corrupt,
        })
        .unwrap();
    let read = TxnRequest {
        success: vec![RequestOp::Range(RangeRequest::key("k"))],
        ..TxnRequest::default()
    };
    assert!(
        engine.txn(read).unwrap().succeeded,
        "reads keep working under CORRUPT (etcd)"
    );
    assert_eq!(
        engine.put(PutRequest::new("k", "v")).unwrap_err(),
        Error::Corrupt
    );
    assert_eq!(
        engine
            .delete_range(DeleteRangeRequest::key("k"))
            .unwrap_err(),
        Error::Corrupt
    );
}

#[test]
fn quota_estimate_counts_page_growth_and_deletes() {
    // Large keys in 100-put txns, alternating with deletes of the same keys: the pages in
    // use grow faster than etcd's cost says; the quota must still hold.
    let dir = tempfile::tempdir().unwrap();
    let quota = 8 << 20;
    let engine = Engine::open(dir.path(), config(quota)).unwrap();
    let key = |round: usize, i: usize| format!("{round:04}{i:03}{}", "k".repeat(2048));
    'fill: for round in 0..10_000 {
        let ops = (0..100)
            .map(|i| RequestOp::Put(PutRequest::new(key(round, i), "v")))
            .collect();
        match engine.txn(TxnRequest {
            success: ops,
            ..TxnRequest::default()
        }) {
            Ok(_) => {}
            Err(Error::NoSpace) => break 'fill,
            Err(e) => panic!("{e}"),
        }
        if round % 2 == 1 {
            let deletes = (0..100)
                .map(|i| RequestOp::DeleteRange(DeleteRangeRequest::key(key(round, i))))
                .collect();
            engine
                .txn(TxnRequest {
                    success: deletes,
                    ..TxnRequest::default()
                })
                .unwrap();
        }
    }
    let in_use = engine.measure_space().unwrap();
    assert!(
        in_use < quota as u64,
        "in use {in_use} past the quota {quota}"
    );
}

#[test]
fn size_in_use_tracks_continuous_writes_within_the_refresh_spacing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(kvd::ManualClock::new());
    let engine = Arc::new(
        Engine::open(
            dir.path(),
            Config {
                clock: clock.clone(),
                ..config(-1)
            },
        )
        .unwrap(),
    );
    engine.put(PutRequest::new("first", "v")).unwrap();
    let before = engine.measure_space().unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded: at most this many writes, about 40 MiB.
            for i in 0..10_000 {
                if stop.load(std::sync::atomic::Ordering::Acquire) {
                    return i;
                }
                engine
                    .put(PutRequest::new(format!("k{i}"), vec![7u8; 4096]))
                    .unwrap();
            }
            10_000
        })
    };
    // Let the writes pass 4 MiB, then let the engine clock pass the refresh spacing: the
    // figure must move while the writer goes on (SPACE-4), not only when it is idle.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while engine.status().unwrap().header.revision < 1_100 {
        assert!(std::time::Instant::now() < deadline, "writer too slow");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    clock.advance(std::time::Duration::from_secs(11));
    let refreshed = loop {
        let status = engine.status().unwrap();
        if status.db_size_in_use >= before + (4 << 20) {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "in-use figure stayed at {} while writes went on",
            status.db_size_in_use
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    stop.store(true, std::sync::atomic::Ordering::Release);
    let written = writer.join().unwrap();
    assert!(written > 1_000 && refreshed.db_size_in_use <= refreshed.db_size);
}

#[test]
fn a_large_database_is_walked_only_after_a_quiet_pause() {
    let dir = tempfile::tempdir().unwrap();
    {
        // 10,000 values of 4 KiB (about 45 MiB of file), then all deleted and compacted:
        // the file stays large, the pages in use are few.
        let engine = Engine::open(dir.path(), config(-1)).unwrap();
        for t in 0..100 {
            let puts = (0..100)
                .map(|i| RequestOp::Put(PutRequest::new(format!("big/{t:03}/{i:03}"), value())))
                .collect();
            engine
                .txn(TxnRequest {
                    success: puts,
                    ..TxnRequest::default()
                })
                .unwrap();
        }
        let deleted = engine
            .delete_range(DeleteRangeRequest::prefix("big/"))
            .unwrap();
        engine
            .compact(CompactionRequest {
                revision: deleted.header.revision,
                physical: true,
            })
            .unwrap();
        engine.close().unwrap();
    }
    let clock = Arc::new(kvd::ManualClock::new());
    let engine = Engine::open(
        dir.path(),
        Config {
            clock: clock.clone(),
            ..config(-1)
        },
    )
    .unwrap();
    // Open starts from the file length; a walk would replace it with the few pages in use.
    let opened = engine.status().unwrap().db_size_in_use;
    assert!(
        opened > 32 << 20,
        "file of {opened} bytes too small for the test"
    );
    // SPACE-4: the gaps between these writes, and the idle time after them, are pauses of
    // no engine time; a walk of a large file there would stall the next write.
    for i in 0..20 {
        engine
            .put(PutRequest::new(format!("small/{i}"), "v"))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(engine.status().unwrap().db_size_in_use, opened);
    // A quiet pause of engine time: the walk comes at the next idle wake-up.
    clock.advance(std::time::Duration::from_secs(2));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let in_use = engine.status().unwrap().db_size_in_use;
        if in_use < opened / 4 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "in-use figure stayed at {in_use} after a quiet pause"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
