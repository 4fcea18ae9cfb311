//! Leases and watches through the engine's public API: etcd's lease semantics (grant,
//! attach, revoke in one revision, expiry from the engine's clock, restart), and watch
//! semantics (live and catch-up delivery with no loss or duplicate across the switch,
//! compaction, filters, prev_kv, cancel, progress, a stalled watcher).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvd::{
    CompactionRequest, Config, DeleteRangeRequest, Engine, Error, EventType, LeaseGrantRequest,
    ManualClock, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest,
    WatchResponse, WatchStream,
};

/// The longest a test waits for something the engine does in the background.
const PATIENCE: Duration = Duration::from_secs(10);

fn open_with(dir: &tempfile::TempDir, clock: &Arc<ManualClock>) -> Engine {
    let config = Config {
        cache_size_bytes: 4 << 20,
        clock: clock.clone(),
        ..Config::default()
    };
    Engine::open(dir.path(), config).unwrap()
}

fn put(engine: &Engine, key: &str, lease: i64) -> i64 {
    let req = PutRequest {
        lease,
        ..PutRequest::new(key.to_owned(), "v")
    };
    engine.put(req).unwrap().header.revision
}

fn exists(engine: &Engine, key: &str) -> bool {
    engine
        .range(&RangeRequest::key(key.to_owned()))
        .unwrap()
        .count
        == 1
}

fn next(stream: &WatchStream) -> WatchResponse {
    stream
        .recv_timeout(PATIENCE)
        .unwrap()
        .expect("no watch response within the patience")
}

/// Waits until `done` holds, polling: the engine acts on a manual clock in its own threads.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn lease_revoke_deletes_its_keys_in_one_revision() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let lease = engine
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .unwrap();
    assert_eq!(lease.header.revision, 1, "a grant moves no revision");
    put(&engine, "a", lease.id);
    put(&engine, "b", lease.id);
    put(&engine, "c", 0);
    let ttl = engine.lease_time_to_live(lease.id, true).unwrap();
    assert_eq!(
        ttl.keys.iter().map(|k| &k[..]).collect::<Vec<_>>(),
        vec![b"a", b"b"]
    );
    assert_eq!(engine.lease_revoke(lease.id).unwrap().header.revision, 5);
    assert!(!exists(&engine, "a") && !exists(&engine, "b") && exists(&engine, "c"));
    assert_eq!(
        engine.lease_revoke(lease.id).unwrap_err(),
        Error::LeaseNotFound
    );
    let empty = engine
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .unwrap();
    assert_eq!(
        engine.lease_revoke(empty.id).unwrap().header.revision,
        5,
        "no keys, no revision"
    );
}

#[test]
fn unknown_lease_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let put_err = engine
        .put(PutRequest {
            lease: 99,
            ..PutRequest::new("k", "v")
        })
        .unwrap_err();
    assert_eq!(put_err.to_string(), "etcdserver: requested lease not found");
    let txn = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest::new("first", "v")),
            RequestOp::Put(PutRequest {
                lease: 99,
                ..PutRequest::new("second", "v")
            }),
        ],
        ..TxnRequest::default()
    };
    assert_eq!(engine.txn(txn).unwrap_err(), Error::LeaseNotFound);
    assert_eq!(engine.status().unwrap().header.revision, 1);
    assert!(!exists(&engine, "first"));
}

#[test]
fn put_without_lease_detaches_and_ignore_lease_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let lease = engine
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 5 })
        .unwrap();
    put(&engine, "kept", lease.id);
    put(&engine, "dropped", lease.id);
    engine
        .put(PutRequest {
            ignore_lease: true,
            ..PutRequest::new("kept", "v2")
        })
        .unwrap();
    put(&engine, "dropped", 0);
    let keys = engine.lease_time_to_live(5, true).unwrap().keys;
    assert_eq!(
        keys.iter().map(|k| &k[..]).collect::<Vec<_>>(),
        vec![b"kept"]
    );
    let kv = &engine.range(&RangeRequest::key("kept")).unwrap().kvs[0];
    assert_eq!((kv.lease, &kv.value[..]), (5, &b"v2"[..]));
}

#[test]
fn lease_grant_rules_match_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    for ttl in [1, 0, -5] {
        let lease = engine
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .unwrap();
        assert_eq!(lease.ttl, 2, "TTL {ttl} is raised to the 2 s minimum");
    }
    assert_eq!(
        engine
            .lease_grant(LeaseGrantRequest {
                ttl: 9_000_000_001,
                id: 0
            })
            .unwrap_err()
            .to_string(),
        "etcdserver: too large lease TTL"
    );
    engine
        .lease_grant(LeaseGrantRequest { ttl: 10, id: 42 })
        .unwrap();
    assert_eq!(
        engine
            .lease_grant(LeaseGrantRequest { ttl: 10, id: 42 })
            .unwrap_err()
            .to_string(),
        "etcdserver: lease already exists"
    );
    let unknown = engine.lease_time_to_live(777, true).unwrap();
    assert_eq!((unknown.ttl, unknown.granted_ttl), (-1, 0));
    assert_eq!(engine.lease_keep_alive(777).unwrap().ttl, 0);
}

#[test]
fn expiry_follows_the_engine_clock_and_deletes_in_one_revision() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = open_with(&dir, &clock);
    let short = engine
        .lease_grant(LeaseGrantRequest { ttl: 5, id: 1 })
        .unwrap();
    let long = engine
        .lease_grant(LeaseGrantRequest { ttl: 50, id: 2 })
        .unwrap();
    put(&engine, "s1", short.id);
    put(&engine, "s2", short.id);
    put(&engine, "l1", long.id);
    let stream = engine.watch_stream().unwrap();
    stream.create(WatchCreateRequest::prefix("s")).unwrap();
    assert!(next(&stream).created);
    clock.advance(Duration::from_secs(3));
    assert_eq!(
        engine.lease_keep_alive(1).unwrap().ttl,
        5,
        "renewed at t=3 until t=8"
    );
    clock.advance(Duration::from_secs(4));
    assert_eq!(engine.lease_time_to_live(1, false).unwrap().ttl, 1);
    assert!(exists(&engine, "s1"), "t=7: not expired yet");
    clock.advance(Duration::from_secs(2));
    let deleted = next(&stream);
    assert_eq!(deleted.events.len(), 2, "both keys in one response");
    assert!(deleted.events.iter().all(|e| e.kind == EventType::Delete));
    assert_eq!(
        deleted.header.revision, 5,
        "one revision for the whole expiry"
    );
    assert!(exists(&engine, "l1"));
    assert_eq!(engine.lease_time_to_live(1, false).unwrap().ttl, -1);
    assert_eq!(engine.lease_leases().unwrap().leases, vec![2]);
}

#[test]
fn leases_survive_restart_with_full_ttl_and_keep_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = open_with(&dir, &clock);
    engine
        .lease_grant(LeaseGrantRequest { ttl: 10, id: 3 })
        .unwrap();
    put(&engine, "x", 3);
    clock.advance(Duration::from_secs(8));
    engine.close().unwrap();

    let engine = open_with(&dir, &clock);
    let ttl = engine.lease_time_to_live(3, true).unwrap();
    assert_eq!(
        (ttl.ttl, ttl.granted_ttl, ttl.keys.len()),
        (10, 10, 1),
        "full TTL after restart"
    );
    clock.advance(Duration::from_secs(11));
    eventually("expiry after restart", || !exists(&engine, "x"));
    assert_eq!(engine.lease_time_to_live(3, false).unwrap().ttl, -1);
}

#[test]
fn watch_delivers_each_write_request_once_in_one_response() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let stream = engine.watch_stream().unwrap();
    let id = stream.create(WatchCreateRequest::prefix("t/")).unwrap();
    assert_eq!(id, 0, "the first automatic id of a stream is 0");
    assert!(next(&stream).created);
    let txn = TxnRequest {
        success: vec![
            RequestOp::Put(PutRequest::new("t/a", "1")),
            RequestOp::Put(PutRequest::new("other", "1")),
            RequestOp::Put(PutRequest::new("t/b", "1")),
        ],
        ..TxnRequest::default()
    };
    engine.txn(txn).unwrap();
    engine
        .delete_range(DeleteRangeRequest::prefix("t/"))
        .unwrap();
    let puts = next(&stream);
    let keys: Vec<_> = puts.events.iter().map(|e| e.kv.key.clone()).collect();
    assert_eq!(keys, vec!["t/a", "t/b"]);
    assert_eq!(puts.header.revision, 2);
    let deletes = next(&stream);
    assert_eq!(deletes.events.len(), 2);
    assert_eq!(deletes.events[0].kv.mod_revision, 3);
    assert_eq!(
        deletes.events[0].kv.create_revision, 0,
        "a delete event carries key and mod revision only"
    );
    assert!(
        stream
            .recv_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
}

#[test]
fn watch_from_the_past_switches_to_live_without_loss_or_duplicate() {
    // A writer runs while watches are created from past revisions: each watch must see
    // every revision from its start exactly once, in order.
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open_with(&dir, &Arc::new(ManualClock::new())));
    for i in 0..200 {
        put(&engine, &format!("w/{}", i % 10), 0);
    }
    // The writer says when it is under way, and holds its last 100 puts until the watches
    // are created, so they are created while it runs and it writes after them.
    let (under_way, wait_under_way) = std::sync::mpsc::channel();
    let (watches_created, wait_watches) = std::sync::mpsc::channel::<()>();
    let writer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            for i in 0..400 {
                if i == 100 {
                    under_way.send(()).unwrap();
                }
                if i == 300 {
                    wait_watches.recv_timeout(PATIENCE).unwrap();
                }
                put(&engine, &format!("w/{}", i % 10), 0);
            }
        })
    };
    wait_under_way.recv_timeout(PATIENCE).unwrap();
    let stream = engine.watch_stream().unwrap();
    let starts = [2_i64, 50, 150, 201];
    for start in starts {
        stream
            .create(WatchCreateRequest {
                start_revision: start,
                ..WatchCreateRequest::prefix("w/")
            })
            .unwrap();
    }
    watches_created.send(()).unwrap();
    writer.join().unwrap();
    let last = engine.status().unwrap().header.revision;
    let mut seen: Vec<Vec<i64>> = vec![Vec::new(); starts.len()];
    let mut created_at = Vec::new();
    while created_at.len() < starts.len()
        || seen
            .iter()
            .zip(starts)
            .any(|(s, start)| s.len() < (last - start + 1) as usize)
    {
        let r = next(&stream);
        if r.created {
            created_at.push(r.header.revision);
            continue;
        }
        let watch = usize::try_from(r.watch_id).unwrap();
        seen[watch].extend(r.events.iter().map(|e| e.kv.mod_revision));
    }
    // Nothing more comes: a duplicate would arrive after the expected events.
    assert!(
        stream
            .recv_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    for (watch, start) in starts.iter().enumerate() {
        let want: Vec<i64> = (*start..=last).collect();
        assert_eq!(seen[watch], want, "watch from {start}");
    }
    // Every watch was created before the writer's last writes: each switched from history
    // to live events while the writer ran.
    assert!(
        created_at.iter().all(|&at| at < last),
        "created at {created_at:?}, last revision {last}"
    );
}

#[test]
fn watch_from_a_compacted_revision_is_canceled_with_the_compaction_revision() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    for _ in 0..5 {
        put(&engine, "k", 0);
    }
    engine
        .compact(CompactionRequest {
            revision: 4,
            physical: true,
        })
        .unwrap();
    let stream = engine.watch_stream().unwrap();
    stream
        .create(WatchCreateRequest {
            start_revision: 3,
            ..WatchCreateRequest::key("k")
        })
        .unwrap();
    assert!(next(&stream).created);
    let canceled = next(&stream);
    assert!(canceled.canceled);
    assert_eq!(canceled.compact_revision, 4);
    stream
        .create(WatchCreateRequest {
            start_revision: 4,
            ..WatchCreateRequest::key("k")
        })
        .unwrap();
    assert!(next(&stream).created);
    let replay = next(&stream);
    assert_eq!(
        replay
            .events
            .iter()
            .map(|e| e.kv.mod_revision)
            .collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
}

#[test]
fn watch_filters_prev_kv_cancel_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    put(&engine, "k", 0);
    let stream = engine.watch_stream().unwrap();
    let no_put = stream
        .create(WatchCreateRequest {
            no_put: true,
            prev_kv: true,
            ..WatchCreateRequest::key("k")
        })
        .unwrap();
    assert!(next(&stream).created);
    put(&engine, "k", 0);
    engine.delete_range(DeleteRangeRequest::key("k")).unwrap();
    let deleted = next(&stream);
    assert_eq!(deleted.events.len(), 1);
    assert_eq!(deleted.events[0].kind, EventType::Delete);
    assert_eq!(
        deleted.events[0].prev_kv.as_ref().map(|kv| kv.mod_revision),
        Some(3),
        "prev_kv is the key before the delete"
    );
    stream.cancel(no_put);
    let canceled = next(&stream);
    assert!(canceled.canceled && canceled.watch_id == no_put);
    let empty = stream
        .create(WatchCreateRequest {
            range_end: "a".into(),
            ..WatchCreateRequest::key("b")
        })
        .unwrap();
    let refused = next(&stream);
    assert_eq!(
        (empty, refused.canceled, refused.cancel_reason.as_str()),
        (-1, true, "mvcc: watcher range is empty")
    );
    stream
        .create(WatchCreateRequest {
            watch_id: 7,
            ..WatchCreateRequest::key("k")
        })
        .unwrap();
    assert!(next(&stream).created);
    stream
        .create(WatchCreateRequest {
            watch_id: 7,
            ..WatchCreateRequest::key("k")
        })
        .unwrap();
    let duplicate = next(&stream);
    assert_eq!(
        duplicate.cancel_reason,
        "mvcc: duplicate watch ID provided on the WatchStream"
    );
    stream.request_progress();
    let progress = next(&stream);
    assert_eq!((progress.watch_id, progress.header.revision), (-1, 4));
}

#[test]
fn a_write_reaches_exactly_its_watchers_among_many() {
    // `Hub::publish` finds the matched watchers by one search each when few match and by
    // one walk along all of them when many do: both ways each watch gets its events only.
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let stream = engine.watch_stream().unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("m/{i:02}")).collect();
    let mut ids = Vec::new();
    for key in &keys {
        ids.push(stream.create(WatchCreateRequest::key(key.clone())).unwrap());
    }
    let prefix = stream.create(WatchCreateRequest::prefix("m/")).unwrap();
    for _ in 0..=keys.len() {
        assert!(next(&stream).created);
    }
    // The next `n` responses as (watch id, [(key, revision)]), sorted by watch id.
    let received = |n: usize| -> Vec<(i64, Vec<(String, i64)>)> {
        let mut got: Vec<_> = (0..n)
            .map(|_| next(&stream))
            .map(|r| {
                let events = r.events.iter().map(|e| {
                    let key = String::from_utf8_lossy(&e.kv.key).into_owned();
                    (key, e.kv.mod_revision)
                });
                (r.watch_id, events.collect())
            })
            .collect();
        got.sort();
        got
    };

    // Few match (2 of 41): one search each.
    let rev = put(&engine, &keys[7], 0);
    let mut want = vec![
        (ids[7], vec![(keys[7].clone(), rev)]),
        (prefix, vec![(keys[7].clone(), rev)]),
    ];
    want.sort();
    assert_eq!(received(2), want);

    // All match: one walk.
    let txn = TxnRequest {
        success: keys
            .iter()
            .map(|k| RequestOp::Put(PutRequest::new(k.clone(), "w")))
            .collect(),
        ..TxnRequest::default()
    };
    let rev = engine.txn(txn).unwrap().header.revision;
    let mut want: Vec<(i64, Vec<(String, i64)>)> = ids
        .iter()
        .zip(&keys)
        .map(|(id, key)| (*id, vec![(key.clone(), rev)]))
        .collect();
    want.push((prefix, keys.iter().map(|k| (k.clone(), rev)).collect()));
    want.sort();
    assert_eq!(received(keys.len() + 1), want);
    assert!(
        stream
            .recv_timeout(Duration::from_millis(50))
            .unwrap()
            .is_none(),
        "nothing more"
    );
}

#[test]
fn stalled_watcher_stays_bounded_and_later_gets_everything_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open_with(&dir, &Arc::new(ManualClock::new())));
    let stalled = engine.watch_stream().unwrap();
    stalled.create(WatchCreateRequest::prefix("s/")).unwrap();
    let writes = 3_000;
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..writes / 4 {
                    put(&engine, &format!("s/{t}/{i}"), 0);
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    // Apply never waited for the stalled consumer; what waits for it is bounded.
    assert!(
        stalled.queued() <= kvd_pending_bound(),
        "queued {}",
        stalled.queued()
    );
    let last = engine.status().unwrap().header.revision;
    let mut revisions = Vec::new();
    while revisions.len() < writes {
        let r = next(&stalled);
        revisions.extend(r.events.iter().map(|e| e.kv.mod_revision));
    }
    assert_eq!(revisions, (2..=last).collect::<Vec<_>>());
}

/// The most responses a stream with one watch can hold: the per-watch bound (128) plus
/// its created response.
fn kvd_pending_bound() -> usize {
    128 + 1
}

#[test]
fn watch_id_reused_after_cancel_keeps_flowing() {
    // A client that cancels a watch and re-creates its id before reading the cancel must
    // not inherit the old watch's back-pressure accounting.
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let stream = engine.watch_stream().unwrap();
    stream
        .create(WatchCreateRequest {
            watch_id: 5,
            ..WatchCreateRequest::prefix("r/")
        })
        .unwrap();
    stream.cancel(5);
    stream
        .create(WatchCreateRequest {
            watch_id: 5,
            ..WatchCreateRequest::prefix("r/")
        })
        .unwrap();
    for i in 0..300 {
        put(&engine, &format!("r/{i}"), 0);
    }
    let mut events = 0;
    while events < 300 {
        let r = next(&stream);
        events += r.events.len();
    }
    assert_eq!(events, 300);
}

#[test]
fn duplicate_watch_id_is_refused_with_id_minus_one() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open_with(&dir, &Arc::new(ManualClock::new()));
    let stream = engine.watch_stream().unwrap();
    assert_eq!(
        stream
            .create(WatchCreateRequest {
                watch_id: 3,
                ..WatchCreateRequest::key("k")
            })
            .unwrap(),
        3
    );
    assert!(next(&stream).created);
    assert_eq!(
        stream
            .create(WatchCreateRequest {
                watch_id: 3,
                ..WatchCreateRequest::key("k")
            })
            .unwrap(),
        -1
    );
    let refused = next(&stream);
    assert_eq!((refused.watch_id, refused.canceled), (-1, true));
}
