//! Behaviour tests of the engine through its public API: etcd's revision rules, the verified
//! 3.4.23 examples of etcd's API reference, bad input, restart, the directory lock, corruption and
//! the poisoned state after an I/O error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use kvd::{
    AlarmAction, AlarmRequest, AlarmType, CompactionRequest, Compare, CompareResult, CompareTarget,
    Config, DeleteRangeRequest, Engine, Error, Faults, PutRequest, RangeRequest, RequestOp,
    SortOrder, SortTarget, TxnRequest,
};

fn config() -> Config {
    Config {
        cache_size_bytes: 4 << 20,
        ..Config::default()
    }
}

fn open(dir: &tempfile::TempDir) -> Engine {
    Engine::open(dir.path(), config()).unwrap()
}

fn put(engine: &Engine, key: &str, value: &str) -> i64 {
    engine
        .put(PutRequest::new(key.to_owned(), value.to_owned()))
        .unwrap()
        .header
        .revision
}

/// Flips the lowest bit of the last byte of every copy of `needle` in the file at `path`
/// (redb may leave earlier copies of a page in free space), in place, as a failing disk
/// would change it; returns how many copies there were.
fn damage_every_copy(path: &std::path::Path, needle: &[u8]) -> usize {
    let bytes = std::fs::read(path).unwrap();
    let copies: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(at, _)| at + needle.len() - 1)
        .collect();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for &at in &copies {
        std::os::unix::fs::FileExt::write_all_at(&file, &[bytes[at] ^ 0x01], at as u64).unwrap();
    }
    copies.len()
}

fn get(
    engine: &Engine,
    key: &str,
    revision: i64,
) -> Result<Option<(String, i64, i64, i64)>, Error> {
    let got = engine.range(&RangeRequest {
        revision,
        ..RangeRequest::key(key.to_owned())
    })?;
    Ok(got.kvs.first().map(|kv| {
        let value = String::from_utf8(kv.value.to_vec()).unwrap();
        (value, kv.create_revision, kv.mod_revision, kv.version)
    }))
}

#[test]
fn fresh_store_is_at_revision_one_and_first_put_makes_two() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    assert_eq!(engine.status().unwrap().header.revision, 1);
    assert_eq!(put(&engine, "a", "1"), 2);
    assert_eq!(get(&engine, "a", 0).unwrap(), Some(("1".into(), 2, 2, 1)));
}

#[test]
fn delete_and_recreate_starts_a_new_generation() {
    // etcd's example: put a@2, put a@3 (ver 2), del a@4, put a@5 → {create 5, mod 5, ver 1}.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    put(&engine, "a", "x");
    put(&engine, "a", "y");
    assert_eq!(
        engine
            .delete_range(DeleteRangeRequest::key("a"))
            .unwrap()
            .header
            .revision,
        4
    );
    assert_eq!(put(&engine, "a", "z"), 5);
    assert_eq!(get(&engine, "a", 0).unwrap(), Some(("z".into(), 5, 5, 1)));
    assert_eq!(get(&engine, "a", 3).unwrap(), Some(("y".into(), 2, 3, 2)));
    assert_eq!(get(&engine, "a", 4).unwrap(), None);
}

#[test]
fn requests_that_change_nothing_keep_the_revision() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    put(&engine, "a", "x");
    let nothing = engine
        .delete_range(DeleteRangeRequest::key("missing"))
        .unwrap();
    assert_eq!((nothing.deleted, nothing.header.revision), (0, 2));
    let failed_compare = TxnRequest {
        compare: vec![Compare::new(
            "a",
            CompareResult::Equal,
            CompareTarget::Value("no".into()),
        )],
        success: vec![RequestOp::Put(PutRequest::new("b", "1"))],
        failure: vec![RequestOp::DeleteRange(DeleteRangeRequest::key("missing"))],
    };
    let txn = engine.txn(failed_compare).unwrap();
    assert!(!txn.succeeded);
    assert_eq!(txn.header.revision, 2);
    engine
        .compact(CompactionRequest {
            revision: 2,
            physical: true,
        })
        .unwrap();
    assert_eq!(engine.status().unwrap().header.revision, 2);
}

#[test]
fn txn_inner_headers_follow_etcd() {
    // spec §1.3: txn{range a; put a; range a} at rev 22 → range 22, put 23, range 23.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    put(&engine, "a", "old");
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Range(RangeRequest::key("a")),
            RequestOp::Put(PutRequest::new("a", "new")),
            RequestOp::Range(RangeRequest::key("a")),
            RequestOp::Txn(TxnRequest::default()),
        ],
        failure: vec![],
    };
    let resp = engine.txn(txn).unwrap();
    let revisions: Vec<i64> = resp
        .responses
        .iter()
        .map(|r| match r {
            kvd::ResponseOp::Range(r) => r.header.revision,
            kvd::ResponseOp::Put(r) => r.header.revision,
            kvd::ResponseOp::DeleteRange(r) => r.header.revision,
            kvd::ResponseOp::Txn(r) => r.header.revision,
        })
        .collect();
    assert_eq!(revisions, vec![2, 3, 3, 0], "nested txn header is all zero");
    match &resp.responses[2] {
        kvd::ResponseOp::Range(r) => assert_eq!(&r.kvs[0].value[..], b"new"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn nested_compare_sees_state_at_txn_start() {
    // spec §4.3: put nc then nested version(nc)==0 → nested success branch taken.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    let nested = TxnRequest {
        compare: vec![Compare::new(
            "nc",
            CompareResult::Equal,
            CompareTarget::Version(0),
        )],
        success: vec![RequestOp::Put(PutRequest::new("took", "success"))],
        failure: vec![RequestOp::Put(PutRequest::new("took", "failure"))],
    };
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Put(PutRequest::new("nc", "1")),
            RequestOp::Txn(nested),
        ],
        failure: vec![],
    };
    engine.txn(txn).unwrap();
    assert_eq!(get(&engine, "took", 0).unwrap().unwrap().0, "success");
}

#[test]
fn ignore_flags_after_a_from_key_delete_of_the_same_txn_are_refused() {
    // etcd's duplicate-key check lets a from-key delete (range end "\0") and a Put it covers
    // into one branch; a Put with an ignore flag after that delete finds no key to keep,
    // and etcd panics at apply. kvd refuses the whole Txn with `key not found` (WRITE-4).
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    put(&engine, "a/1", "one");
    let before = put(&engine, "b", "two");
    let delete_from_a = || {
        RequestOp::DeleteRange(DeleteRangeRequest {
            key: "a".into(),
            range_end: "\0".into(),
            prev_kv: false,
        })
    };
    let keep_value = PutRequest {
        ignore_value: true,
        ..PutRequest::new("a/1", "")
    };
    let keep_lease = PutRequest {
        ignore_lease: true,
        ..PutRequest::new("b", "new")
    };
    let nested = |op| {
        RequestOp::Txn(TxnRequest {
            compare: vec![],
            success: vec![op],
            failure: vec![],
        })
    };
    for branch in [
        vec![delete_from_a(), RequestOp::Put(keep_value.clone())],
        vec![delete_from_a(), RequestOp::Put(keep_lease.clone())],
        vec![
            nested(delete_from_a()),
            nested(RequestOp::Put(keep_value.clone())),
        ],
    ] {
        let txn = TxnRequest {
            compare: vec![],
            success: branch.clone(),
            failure: vec![],
        };
        assert!(
            matches!(engine.txn(txn), Err(Error::KeyNotFound)),
            "{branch:?}"
        );
        assert_eq!(
            engine.status().unwrap().header.revision,
            before,
            "{branch:?}"
        );
        assert_eq!(get(&engine, "a/1", 0).unwrap().unwrap().0, "one");
    }

    // The same Put before the delete keeps its key when it runs, as in etcd: accepted, and
    // the delete that follows removes the key in the same revision.
    let txn = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Put(keep_value), delete_from_a()],
        failure: vec![],
    };
    let resp = engine.txn(txn).unwrap();
    assert_eq!(resp.header.revision, before + 1);
    assert_eq!(get(&engine, "a/1", 0).unwrap(), None);
    assert_eq!(get(&engine, "a/1", before + 1).unwrap(), None);
    // A delete from a key above the Put's leaves it alone.
    put(&engine, "b", "again");
    let txn = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::DeleteRange(DeleteRangeRequest {
                key: "c".into(),
                range_end: "\0".into(),
                prev_kv: false,
            }),
            RequestOp::Put(keep_lease),
        ],
        failure: vec![],
    };
    engine.txn(txn).unwrap();
    assert_eq!(get(&engine, "b", 0).unwrap().unwrap().0, "new");
}

#[test]
fn range_limit_count_and_sort_quirk_match_etcd() {
    // spec §2.4: s1(v3), s2(v3), s3(v2), s4(v1); target VERSION, limit 2:
    // order NONE → [s3, s1], ASCEND → [s4, s3]; count is 4 either way.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for (key, versions) in [("s1", 3), ("s2", 3), ("s3", 2), ("s4", 1)] {
        for _ in 0..versions {
            put(&engine, key, "v");
        }
    }
    let keys = |order| {
        let req = RangeRequest {
            sort_order: order,
            sort_target: SortTarget::Version,
            limit: 2,
            ..RangeRequest::prefix("s")
        };
        let resp = engine.range(&req).unwrap();
        assert_eq!((resp.count, resp.more), (4, true));
        resp.kvs
            .iter()
            .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(SortOrder::None), vec!["s3", "s1"]);
    assert_eq!(keys(SortOrder::Ascend), vec!["s4", "s3"]);
    let count_only = engine
        .range(&RangeRequest {
            count_only: true,
            limit: 1,
            ..RangeRequest::prefix("s")
        })
        .unwrap();
    assert_eq!(
        (count_only.count, count_only.kvs.len(), count_only.more),
        (4, 0, false)
    );
}

#[test]
fn compaction_rules_match_etcd() {
    // spec §5.1: fresh store: compact -5 → compacted; 0 → OK; 0 again → compacted;
    // 1 → OK; 2 → future.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    let compact = |revision| {
        engine.compact(CompactionRequest {
            revision,
            physical: false,
        })
    };
    assert_eq!(compact(-5).unwrap_err(), Error::Compacted);
    assert!(compact(0).is_ok());
    assert_eq!(compact(0).unwrap_err(), Error::Compacted);
    assert!(compact(1).is_ok());
    assert_eq!(compact(2).unwrap_err(), Error::FutureRevision);
}

#[test]
fn reads_below_compaction_fail_and_at_it_work() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..5 {
        put(&engine, "k", &i.to_string());
    }
    engine
        .compact(CompactionRequest {
            revision: 4,
            physical: true,
        })
        .unwrap();
    assert_eq!(get(&engine, "k", 3).unwrap_err(), Error::Compacted);
    assert_eq!(get(&engine, "k", 4).unwrap().unwrap().0, "2");
    assert_eq!(get(&engine, "k", 7).unwrap_err(), Error::FutureRevision);
    assert_eq!(engine.hash_kv(3).unwrap_err(), Error::Compacted);
    assert!(engine.hash_kv(4).is_ok());
}

#[test]
fn restart_keeps_history_revisions_compaction_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..20 {
        put(&engine, &format!("k{}", i % 7), &i.to_string());
    }
    engine
        .delete_range(DeleteRangeRequest::prefix("k1"))
        .unwrap();
    engine
        .compact(CompactionRequest {
            revision: 10,
            physical: true,
        })
        .unwrap();
    let before = engine.hash_kv(0).unwrap();
    let range_before = engine.range(&RangeRequest::prefix("k")).unwrap();
    let at_12 = engine
        .range(&RangeRequest {
            revision: 12,
            ..RangeRequest::prefix("k")
        })
        .unwrap();
    engine.close().unwrap();

    let engine = open(&dir);
    assert_eq!(engine.hash_kv(0).unwrap(), before);
    assert_eq!(
        engine.range(&RangeRequest::prefix("k")).unwrap(),
        range_before
    );
    assert_eq!(
        engine
            .range(&RangeRequest {
                revision: 12,
                ..RangeRequest::prefix("k")
            })
            .unwrap(),
        at_12
    );
    let status = engine.status().unwrap();
    assert_eq!((status.header.revision, status.compact_revision), (22, 10));
    assert_eq!(get(&engine, "k1", 9).unwrap_err(), Error::Compacted);
}

#[test]
fn hash_is_equal_for_equal_histories_and_unchanged_by_physical_compaction() {
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let (a, b) = (open(&a_dir), open(&b_dir));
    for engine in [&a, &b] {
        for i in 0..30 {
            put(engine, &format!("k{}", i % 4), &i.to_string());
        }
    }
    assert_eq!(a.hash_kv(0).unwrap(), b.hash_kv(0).unwrap());
    a.compact(CompactionRequest {
        revision: 20,
        physical: true,
    })
    .unwrap();
    b.compact(CompactionRequest {
        revision: 20,
        physical: false,
    })
    .unwrap();
    assert_eq!(a.hash_kv(0).unwrap().hash, b.hash_kv(0).unwrap().hash);
    assert_eq!(a.hash_kv(25).unwrap().hash, b.hash_kv(25).unwrap().hash);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    put(&engine, "k", "v");
    let cases: Vec<(&str, Result<(), Error>, Error)> = vec![
        (
            "empty put key",
            engine.put(PutRequest::new("", "v")).map(drop),
            Error::KeyNotProvided,
        ),
        (
            "empty range key",
            engine.range(&RangeRequest::key("")).map(drop),
            Error::KeyNotProvided,
        ),
        (
            "ignore_value with a value",
            engine
                .put(PutRequest {
                    ignore_value: true,
                    ..PutRequest::new("k", "v")
                })
                .map(drop),
            Error::ValueProvided,
        ),
        (
            "ignore_lease with a lease",
            engine
                .put(PutRequest {
                    ignore_lease: true,
                    lease: 7,
                    ..PutRequest::new("k", "")
                })
                .map(drop),
            Error::LeaseProvided,
        ),
        (
            "ignore_value on a missing key",
            engine
                .put(PutRequest {
                    ignore_value: true,
                    ..PutRequest::new("nope", "")
                })
                .map(drop),
            Error::KeyNotFound,
        ),
        (
            "request too large",
            engine
                .put(PutRequest::new("big", vec![0u8; 1_572_838]))
                .map(drop),
            Error::RequestTooLarge,
        ),
        (
            "too many txn ops",
            engine
                .txn(TxnRequest {
                    success: (0..129)
                        .map(|i| RequestOp::Put(PutRequest::new(format!("t{i}"), "v")))
                        .collect(),
                    ..TxnRequest::default()
                })
                .map(drop),
            Error::TooManyTxnOps,
        ),
        (
            "duplicate key in txn",
            engine
                .txn(TxnRequest {
                    success: vec![
                        RequestOp::Put(PutRequest::new("d", "1")),
                        RequestOp::Put(PutRequest::new("d", "2")),
                    ],
                    ..TxnRequest::default()
                })
                .map(drop),
            Error::DuplicateKey,
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
    }
    assert_eq!(
        engine.status().unwrap().header.revision,
        2,
        "no refused request moved the revision"
    );
    assert!(
        engine
            .put(PutRequest::new("big", vec![0u8; 1_572_836]))
            .is_ok(),
        "etcd's boundary"
    );
}

#[test]
fn error_messages_are_etcds() {
    let cases = [
        (
            Error::Compacted,
            "etcdserver: mvcc: required revision has been compacted",
        ),
        (
            Error::FutureRevision,
            "etcdserver: mvcc: required revision is a future revision",
        ),
        (Error::KeyNotProvided, "etcdserver: key is not provided"),
        (
            Error::TooManyTxnOps,
            "etcdserver: too many operations in txn request",
        ),
        (
            Error::DuplicateKey,
            "etcdserver: duplicate key given in txn request",
        ),
        (Error::RequestTooLarge, "etcdserver: request is too large"),
        (
            Error::TooManyRequests { retry_after_ms: 5 },
            "etcdserver: too many requests",
        ),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
}

#[test]
fn second_open_of_a_data_directory_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    let err = Engine::open(dir.path(), config()).unwrap_err();
    assert!(err.is_locked());
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    engine.close().unwrap();
    open(&dir).close().unwrap();
}

#[test]
fn truncated_or_garbage_data_file_gives_a_clear_error_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..200 {
        put(&engine, &format!("k{i}"), "some value to make pages");
    }
    let whole = engine.hash_kv(0).unwrap();
    engine.close().unwrap();
    let path = dir.path().join("kvd.redb");
    let bytes = std::fs::read(&path).unwrap();
    // Every file of the directory as the clean close left it, to restore before each damage
    // (an open may repair or replay into what it finds).
    let originals: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect();
    let damages: [(&str, Vec<u8>, bool); 5] = [
        ("cut inside the header", bytes[..100].to_vec(), true),
        ("cut to its first page", bytes[..4096].to_vec(), false),
        ("cut to a third", bytes[..bytes.len() / 3].to_vec(), false),
        ("8 KiB of garbage", vec![0x5a; 8192], true),
        ("garbage of the same length", vec![0xa5; bytes.len()], true),
    ];
    for (what, damaged, must_refuse) in damages {
        for (p, data) in &originals {
            std::fs::write(p, data).unwrap();
        }
        std::fs::write(&path, &damaged).unwrap();
        match Engine::open(dir.path(), config()) {
            Err(e) => {
                let text = e.to_string();
                assert!(
                    matches!(e, Error::Storage(_))
                        && text.starts_with("kvd:")
                        && text.contains("kvd.redb"),
                    "{what}: the refusal must be a storage error that names the file: {text}"
                );
            }
            Ok(engine) => {
                // redb may route around damage it can repair: then the store is the one that
                // was closed, whole, or the damage went unnoticed.
                assert!(!must_refuse, "{what}: opened a file with no valid header");
                let status = engine.status().unwrap();
                assert_eq!(
                    status.header.revision, 201,
                    "{what}: opened, so every acknowledged write is there"
                );
                assert_eq!(
                    engine.hash_kv(0).unwrap(),
                    whole,
                    "{what}: the same history"
                );
                let all = engine.range(&RangeRequest::prefix("k")).unwrap();
                assert_eq!(all.count, 200, "{what}: every key");
                engine.close().unwrap();
            }
        }
    }
}

#[test]
fn io_error_poisons_writes_until_reopen_and_keeps_acknowledged_data() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let engine = Engine::open(
        dir.path(),
        Config {
            faults: Some(faults.clone()),
            ..config()
        },
    )
    .unwrap();
    for i in 0..10 {
        put(&engine, &format!("k{i}"), "v");
    }
    faults.fail_after(0);
    let failed = engine.put(PutRequest::new("lost", "v")).unwrap_err();
    assert!(matches!(failed, Error::Storage(_)), "{failed}");
    faults.heal();
    let refused = engine.put(PutRequest::new("after", "v")).unwrap_err();
    assert!(refused.is_poisoned(), "{refused}");
    assert!(refused.to_string().contains("reopen"), "{refused}");
    assert_eq!(
        get(&engine, "k9", 0).unwrap().unwrap().0,
        "v",
        "reads keep working"
    );
    drop(engine);

    // A write answered with a storage error has an unknown outcome (the batch was applied
    // in memory when its log write failed; closing the database may still make it durable),
    // as with etcd, which stops on a failed fsync. What reopen shows is a prefix of the
    // applied batches: every acknowledged write, then the failed one or not.
    let engine = open(&dir);
    let all = engine.range(&RangeRequest::prefix("k")).unwrap();
    assert_eq!(all.count, 10, "every acknowledged write survives");
    let revision = engine.status().unwrap().header.revision;
    let lost = get(&engine, "lost", 0).unwrap();
    match lost {
        None => assert_eq!(revision, 11),
        Some((value, ..)) => assert_eq!((value.as_str(), revision), ("v", 12)),
    }
    assert_eq!(put(&engine, "after", "v"), revision + 1);
}

#[test]
fn concurrent_writers_each_get_one_revision_per_put() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(&dir));
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    engine
                        .put(PutRequest::new(format!("t{t}/{i}"), "v"))
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(engine.status().unwrap().header.revision, 401);
    let engine = Arc::try_unwrap(engine).unwrap();
    engine.close().unwrap();
}

#[test]
fn current_reads_never_fail_as_compacted_while_compactions_land() {
    // ENG-5: a writer compacts at the current revision after every put; concurrent readers
    // at revision 0 must always succeed.
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(open(&dir));
    put(&engine, "k", "0");
    let writer = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            for i in 1..300 {
                let revision = put(&engine, "k", &i.to_string());
                engine
                    .compact(CompactionRequest {
                        revision,
                        physical: false,
                    })
                    .unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    engine.range(&RangeRequest::key("k")).unwrap();
                    engine.hash_kv(0).unwrap();
                }
            })
        })
        .collect();
    writer.join().unwrap();
    for r in readers {
        r.join().unwrap();
    }
}

/// Waits, boundedly, until `ready` holds; fails the test otherwise.
fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn write_is_answered_only_after_its_commit_even_when_the_next_batch_fails() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::new());
    let engine = Arc::new(
        Engine::open(
            dir.path(),
            Config {
                faults: Some(faults.clone()),
                ..config()
            },
        )
        .unwrap(),
    );
    faults.hold_log_syncs();
    let (first_tx, first) = std::sync::mpsc::channel();
    engine.submit_put(
        PutRequest::new("first", "v"),
        Box::new(move |r| first_tx.send(r).unwrap()),
    );
    // The first batch is applied and its record written; its fdatasync is held.
    wait_until("the first batch's log sync", || {
        faults.log_syncs_waiting() == 1
    });
    assert!(
        first.try_recv().is_err(),
        "APPLY-1: answered before its commit"
    );
    // The next batch fails in apply, while the first is still in flight.
    faults.fail_next_batch();
    let second = engine.put(PutRequest::new("second", "v")).unwrap_err();
    assert!(matches!(second, Error::Storage(_)), "{second}");
    assert!(
        first.try_recv().is_err(),
        "APPLY-1: the next batch's failure answered the first early"
    );
    assert_eq!(
        engine.status().unwrap().header.revision,
        1,
        "ENG-1: nothing is visible before its commit"
    );
    faults.release_log_syncs();
    let answered = first
        .recv_timeout(std::time::Duration::from_secs(30))
        .unwrap()
        .unwrap();
    assert_eq!(answered.header.revision, 2);
    assert_eq!(get(&engine, "first", 0).unwrap().unwrap().0, "v");
    assert!(get(&engine, "second", 0).unwrap().is_none());
    drop(engine);
    let engine = open(&dir);
    assert_eq!(get(&engine, "first", 0).unwrap().unwrap().0, "v", "durable");
}

#[test]
fn range_of_many_keys_scanned_in_order_equals_one_lookup_per_key() {
    // READ-3: 300 keys written in order, then a third overwritten and some deleted, so the
    // records a Range needs are dense (scanned) at some revisions and spread (looked up) at
    // others; either way each key's record is the one a single-key Range returns.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..300 {
        put(&engine, &format!("many/{i:03}"), &format!("v{i}"));
    }
    let dense = engine.status().unwrap().header.revision;
    for i in (0..300).step_by(3) {
        put(&engine, &format!("many/{i:03}"), &format!("w{i}"));
    }
    for i in (1..300).step_by(7) {
        engine
            .delete_range(DeleteRangeRequest::key(format!("many/{i:03}")))
            .unwrap();
    }
    let current = engine.status().unwrap().header.revision;
    for at in [dense, dense + 50, current] {
        let all = engine
            .range(&RangeRequest {
                revision: at,
                ..RangeRequest::prefix("many/")
            })
            .unwrap();
        assert!(all.kvs.len() > 200, "at {at}: {} keys", all.kvs.len());
        for kv in &all.kvs {
            let one = engine
                .range(&RangeRequest {
                    revision: at,
                    ..RangeRequest::key(kv.key.clone())
                })
                .unwrap();
            assert_eq!(one.kvs, vec![kv.clone()], "at {at}");
        }
    }
}

#[test]
fn clean_close_leaves_a_database_that_needs_no_log() {
    // The last batches are only in the write-ahead log until a durable commit; close makes
    // one, so the file is whole on its own (a copy of a closed kvd.redb loses nothing).
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..50 {
        put(&engine, &format!("k{i}"), "v");
    }
    engine.close().unwrap();
    std::fs::remove_file(dir.path().join("kvd.wal")).unwrap();
    let engine = open(&dir);
    assert_eq!(engine.range(&RangeRequest::prefix("k")).unwrap().count, 50);
    assert_eq!(engine.status().unwrap().header.revision, 51);
}

#[test]
fn a_panic_in_the_apply_thread_refuses_writes_and_close_returns() {
    let dir = tempfile::tempdir().unwrap();
    let failpoint = kvd::CommitFailpoint {
        step: kvd::CommitStep::ApplyPanic,
        nth: 2,
    };
    let engine = Engine::open(
        dir.path(),
        Config {
            commit_failpoint: Some(failpoint),
            ..config()
        },
    )
    .unwrap();
    assert_eq!(put(&engine, "a", "1"), 2);
    // The second batch panics after its redb commit, before it is answered (ENG-6).
    let err = engine.put(PutRequest::new("b", "2")).unwrap_err();
    assert!(
        matches!(err, Error::Closed | Error::Storage(_)),
        "unanswered, not acknowledged: {err:?}"
    );
    let later = engine.put(PutRequest::new("c", "3")).unwrap_err();
    assert!(
        matches!(later, Error::Closed | Error::Storage(_)),
        "{later:?}"
    );
    // Reads still serve the last published state.
    assert!(get(&engine, "a", 0).unwrap().is_some());
    // Close returns (it waited forever for the commit thread before).
    let _ = engine.close();
    let engine = open(&dir);
    assert!(
        get(&engine, "a", 0).unwrap().is_some(),
        "the acknowledged write is there"
    );
    assert!(
        get(&engine, "c", 0).unwrap().is_none(),
        "a refused write is not"
    );
    let revision = engine.status().unwrap().header.revision;
    assert!(
        (2..=3).contains(&revision),
        "the unanswered write may or may not be: {revision}"
    );
}

/// Lone writes made by [`lone_writes_until_inline`] at most.
const LONE_WRITES_MAX: u64 = 1_000;

/// Puts keys `prefix0`, `prefix1`, ... one at a time until one is applied in its caller's
/// thread (APPLY-5), at most [`LONE_WRITES_MAX`]; returns how many it put, or `None` if none
/// was inline. A lone write goes inline only once the commit thread sleeps again, which it
/// does just after it answers: on a busy machine the next write can come first and go to
/// the apply thread, so one lone write is not enough to tell.
fn lone_writes_until_inline(engine: &Engine, prefix: &str) -> Option<u64> {
    let before = engine.apply_stats().unwrap().inline_batches;
    for n in 1..=LONE_WRITES_MAX {
        put(engine, &format!("{prefix}{n}"), "v");
        if engine.apply_stats().unwrap().inline_batches > before {
            return Some(n);
        }
    }
    None
}

#[test]
fn writes_submitted_in_a_burst_go_to_the_apply_thread_even_when_alone() {
    // APPLY-5: a caller that says more writes follow (kvd::in_burst) never has its write
    // applied in its own thread, so the writes after it can join its batch.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    let before = engine.apply_stats().unwrap().inline_batches;
    for i in 0..20 {
        let revision = kvd::in_burst(|| put(&engine, &format!("k{i:02}"), "v"));
        assert_eq!(revision, i + 2);
    }
    assert!(!kvd::burst_hinted(), "the hint ends with the closure");
    let during = engine.apply_stats().unwrap().inline_batches;
    assert_eq!(during, before, "none inline inside the burst");
    let lone = lone_writes_until_inline(&engine, "after/");
    assert!(
        lone.is_some(),
        "lone writes inline again: none of {LONE_WRITES_MAX}"
    );
    engine.close().unwrap();
    let engine = open(&dir);
    assert_eq!(engine.range(&RangeRequest::prefix("k")).unwrap().count, 20);
}

#[test]
fn a_lone_writer_is_applied_and_answered_in_its_own_thread() {
    // APPLY-5: one write at a time, with nothing else in flight, needs no hand-off to the
    // apply thread; it goes through the same batch and the same durable log.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    for i in 0..20 {
        assert_eq!(put(&engine, &format!("k{i:02}"), "v"), i + 2);
        let (value, _, modified, _) = get(&engine, &format!("k{i:02}"), 0).unwrap().unwrap();
        assert_eq!(
            (value.as_str(), modified),
            ("v", i + 2),
            "visible once answered"
        );
    }
    let stats = engine.apply_stats().unwrap();
    let commits: u64 = stats.batch_sizes.iter().map(|(_, n)| n).sum();
    assert_eq!(commits, 20, "one batch per write: {stats:?}");
    assert!(stats.inline_batches <= 20, "{stats:?}");
    assert!(
        stats.inline_batches >= 1 || lone_writes_until_inline(&engine, "lone/").is_some(),
        "the apply thread slept between the writes, so callers applied them: {stats:?}"
    );
    // After a burst of concurrent writers, whose batches went to the commit thread, a lone
    // writer is applied in its own thread again.
    let engine = std::sync::Arc::new(engine);
    let writers: Vec<_> = (0..8)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    put(&engine, &format!("burst/{t}/{i}"), "v");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    assert!(
        lone_writes_until_inline(&engine, "after/").is_some(),
        "inline again after the burst: none of {LONE_WRITES_MAX} lone writes"
    );
    let engine = std::sync::Arc::into_inner(engine).unwrap();
    engine.close().unwrap();
    let engine = open(&dir);
    assert_eq!(engine.range(&RangeRequest::prefix("k")).unwrap().count, 20);
    assert_eq!(
        engine.range(&RangeRequest::prefix("burst/")).unwrap().count,
        400
    );
}

/// Appends etcd's wire form of `kvs` as `RangeResponse.kvs` (field 2) entries.
fn kvs_entries(kvs: &[kvd::KeyValue]) -> Vec<u8> {
    let mut out = Vec::new();
    for kv in kvs {
        let mut message = Vec::new();
        kvd::bbolt::proto::encode_key_value(&mut message, kv);
        out.push(0x12);
        let mut len = message.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(&message);
    }
    out
}

#[test]
fn a_ranges_wire_form_is_the_encoding_of_its_key_values() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir);
    // Keys written in reverse order, so revision order is not key order, enough of them to
    // be read by a scan of the history (READ-3), one overwritten, one deleted, one with a
    // value long enough for a two-byte length.
    for i in (0..200).rev() {
        put(&engine, &format!("k/{i:03}"), &format!("value {i}"));
    }
    let before_overwrite = put(&engine, "k/050", &"x".repeat(300));
    engine
        .delete_range(DeleteRangeRequest::key("k/060".to_owned()))
        .unwrap();
    let requests = [
        RangeRequest::prefix("k/"),
        RangeRequest::key("k/050".to_owned()),
        RangeRequest::key("absent".to_owned()),
        RangeRequest {
            limit: 10,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            limit: 10,
            keys_only: true,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            keys_only: true,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            count_only: true,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            sort_order: SortOrder::Descend,
            limit: 5,
            ..RangeRequest::prefix("k/")
        },
        // etcd's quirk: a target without an order sorts the fetched keys ascending by it.
        RangeRequest {
            sort_target: SortTarget::Mod,
            limit: 5,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            min_mod_revision: 150,
            ..RangeRequest::prefix("k/")
        },
        RangeRequest {
            revision: before_overwrite - 1,
            ..RangeRequest::prefix("k/")
        },
    ];
    for req in requests {
        let answer = engine.range(&req).unwrap();
        let wire = engine.prepare_range(&req).unwrap().finish_wire().unwrap();
        assert_eq!(wire.kvs, kvs_entries(&answer.kvs), "{req:?}");
        assert_eq!(
            (wire.revision, wire.more, wire.count),
            (answer.header.revision, answer.more, answer.count),
            "{req:?}"
        );
    }
    // The Range is checked as Range is: a compacted revision is refused either way.
    engine
        .compact(CompactionRequest {
            revision: before_overwrite,
            physical: false,
        })
        .unwrap();
    let old = RangeRequest {
        revision: 2,
        ..RangeRequest::prefix("k/")
    };
    assert!(matches!(engine.prepare_range(&old), Err(Error::Compacted)));
}

/// REC-4: a byte of a stored value changed on the disk after a clean close is found by the
/// record's checksum: the open fails as damaged, naming the revision, instead of serving the
/// changed value; with the byte put back the same directory opens and serves the value.
#[test]
fn a_value_byte_changed_on_the_disk_is_refused_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let value = "a value to find in the file: 7f3a9c1e";
    let engine = open(&dir);
    put(&engine, "other", "x");
    let revision = put(&engine, "k", value);
    engine.close().unwrap();
    let db = dir.path().join("kvd.redb");
    let sound = std::fs::read(&db).unwrap();
    assert!(
        damage_every_copy(&db, value.as_bytes()) > 0,
        "the value is in the file"
    );
    let error = Engine::open(dir.path(), config()).unwrap_err();
    assert!(error.is_corrupted(), "{error}");
    assert!(
        error
            .to_string()
            .contains(&format!("checksum mismatch at revision ({revision}, 0)")),
        "{error}"
    );
    std::fs::write(&db, &sound).unwrap();
    let engine = open(&dir);
    assert_eq!(
        get(&engine, "k", 0).unwrap(),
        Some((value.to_owned(), revision, revision, 1))
    );
}

/// ROW-1: a changed byte of a stored row (here a quota registry entry's role name, in its
/// key) is refused at open instead of being read as another role's limits.
#[test]
fn a_row_byte_changed_on_the_disk_is_refused_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let role = "tenant-to-find-in-the-file-5c2e81";
    let engine = open(&dir);
    let limits = std::collections::BTreeMap::from([("kv_keys".to_owned(), 5.0)]);
    engine
        .update_quota(
            vec![kvd::quota::RawQuotaConfig {
                role: role.into(),
                limits,
                ..Default::default()
            }],
            false,
        )
        .unwrap();
    engine.close().unwrap();
    let db = dir.path().join("kvd.redb");
    let sound = std::fs::read(&db).unwrap();
    // The last byte of every copy: `...5c2e81` becomes `...5c2e80`.
    assert!(
        damage_every_copy(&db, role.as_bytes()) > 0,
        "the role's name is in the file"
    );
    let error = Engine::open(dir.path(), config()).unwrap_err();
    assert!(error.is_corrupted(), "{error}");
    assert!(
        error
            .to_string()
            .contains("tenant-to-find-in-the-file-5c2e80\": checksum mismatch"),
        "{error}"
    );
    std::fs::write(&db, &sound).unwrap();
    let engine = open(&dir);
    let quota = engine.get_quota().unwrap();
    assert_eq!(quota.len(), 1);
    assert_eq!(quota[0].role, role);
}

/// SCRUB-3: a value byte changed on the disk while the engine serves, in data nothing reads,
/// is found by the scrub, which raises CORRUPT; reads of other keys go on.
#[test]
fn the_scrub_finds_a_byte_changed_on_the_disk_while_the_engine_serves() {
    let dir = tempfile::tempdir().unwrap();
    // redb serves the pages it caches from memory, so the scrub sees damage on the disk in
    // pages it reads from the file: a cache far smaller than the data makes the oldest
    // record's page one of those.
    let config = || Config {
        cache_size_bytes: 1 << 20,
        ..Config::default()
    };
    let marker = "MARK-oldest-value-9d1c";
    let engine = Engine::open(dir.path(), config()).unwrap();
    put(&engine, "oldest", marker);
    for t in 0..160 {
        let success = (0..128)
            .map(|i| RequestOp::Put(PutRequest::new(format!("k{t}-{i}"), "b".repeat(1_000))))
            .collect();
        engine
            .txn(TxnRequest {
                success,
                ..TxnRequest::default()
            })
            .unwrap();
    }
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert!(engine.scrub().is_ok());

    let db = dir.path().join("kvd.redb");
    assert!(
        damage_every_copy(&db, marker.as_bytes()) > 0,
        "the marker is in the file"
    );

    let damage = engine.scrub().unwrap_err();
    assert!(damage.is_corrupted(), "{damage}");
    assert!(
        damage
            .to_string()
            .contains("checksum mismatch at revision (2, 0)"),
        "{damage}"
    );
    let alarms = engine
        .alarm(AlarmRequest {
            action: AlarmAction::Get,
            member_id: 0,
            alarm: AlarmType::None,
        })
        .unwrap()
        .alarms;
    assert_eq!(alarms.len(), 1);
    assert_eq!(alarms[0].alarm, AlarmType::Corrupt);
    assert_eq!(
        get(&engine, "k7-7", 0).unwrap().unwrap().2,
        10,
        "reads go on"
    );
    assert!(matches!(
        engine.put(PutRequest::new("after", "v")),
        Err(Error::Corrupt)
    ));
}

/// STORE-6: a data directory with its database missing or empty beside a log, or its log cut
/// short, is refused as damaged and left as it was, never opened as a new, empty store.
#[test]
fn a_directory_missing_its_database_or_cut_in_its_log_is_refused_not_taken_for_new() {
    for damage in ["empty database", "no database", "cut log"] {
        let dir = tempfile::tempdir().unwrap();
        let engine = open(&dir);
        put(&engine, "k", "v");
        engine.close().unwrap();
        let db = dir.path().join("kvd.redb");
        let log = dir.path().join("kvd.wal");
        match damage {
            "empty database" => std::fs::File::create(&db).map(drop).unwrap(),
            "no database" => std::fs::remove_file(&db).unwrap(),
            _ => std::fs::File::options()
                .write(true)
                .open(&log)
                .unwrap()
                .set_len(10_000)
                .unwrap(),
        }
        let listing = |dir: &std::path::Path| {
            let mut names: Vec<(String, u64)> = std::fs::read_dir(dir)
                .unwrap()
                .map(|entry| {
                    let entry = entry.unwrap();
                    let name = entry.file_name().to_string_lossy().into_owned();
                    (name, entry.metadata().unwrap().len())
                })
                .collect();
            names.sort();
            names
        };
        let before = listing(dir.path());
        for attempt in ["first", "second"] {
            let error = Engine::open(dir.path(), config()).unwrap_err();
            assert!(error.is_corrupted(), "{damage}, {attempt} open: {error}");
        }
        // No file appears and the log is left as it was. (Opening redb on a database that
        // is there may rewrite its header, which changes nothing the store holds.)
        let after = listing(dir.path());
        let names = |listing: &[(String, u64)]| -> Vec<String> {
            listing.iter().map(|(name, _)| name.clone()).collect()
        };
        assert_eq!(names(&after), names(&before), "{damage}");
        let log_entry =
            |listing: &[(String, u64)]| listing.iter().find(|(name, _)| name == "kvd.wal").cloned();
        assert_eq!(log_entry(&after), log_entry(&before), "{damage}");
    }
}
