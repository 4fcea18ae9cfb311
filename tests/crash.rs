//! Crash tests: a child process writing (or compacting) under load is killed with SIGKILL at
//! a random point; after reopening, every acknowledged write is present, every txn is
//! all-or-nothing, the revision is at or after the last acknowledged one, and an interrupted
//! compaction resumes and ends equal to an uninterrupted one.
//!
//! This file has its own `main` (harness = false): run with `KVD_CRASH_CHILD=<mode>` it is
//! the child, otherwise it runs the parent scenarios. Seeds are fixed so a failure replays;
//! `KVD_CRASH_ROUNDS` raises the number of kills.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvd::{
    CommitFailpoint, CommitStep, CompactionRequest, Config, Engine, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};

/// Writer threads in the child, so that commits carry several requests.
const CHILD_WRITERS: usize = 4;
/// Writes each child thread attempts before it stops on its own.
const CHILD_WRITES_MAX: usize = 200_000;
/// Keys of the compaction scenario, and writes per key.
const COMPACTION_KEYS: usize = 300;
const COMPACTION_ROUNDS: usize = 12;
/// The longest a child may run before the parent gives up on it.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    match std::env::var("KVD_CRASH_CHILD").ok().as_deref() {
        Some("writer") => child_writer(&std::env::var("KVD_CRASH_DIR").unwrap(), CHILD_WRITERS),
        Some("lone-writer") => child_writer(&std::env::var("KVD_CRASH_DIR").unwrap(), 1),
        Some("compactor") => child_compactor(&std::env::var("KVD_CRASH_DIR").unwrap()),
        Some(other) => panic!("unknown child mode {other}"),
        None => {
            let rounds = std::env::var("KVD_CRASH_ROUNDS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(5);
            let acked = acknowledged_writes_survive_sigkill(rounds);
            println!(
                "test acknowledged_writes_survive_sigkill ... ok ({rounds} kills, {acked} acknowledged writes checked)"
            );
            let (crashes, acked) =
                acknowledged_writes_survive_a_crash_at_every_commit_step("writer", rounds);
            println!(
                "test acknowledged_writes_survive_a_crash_at_every_commit_step ... ok ({crashes} crashes, {acked} acknowledged writes checked)"
            );
            // One writer: its writes are applied and made durable in its own thread
            // (APPLY-5), so the failpoints fire there.
            let (crashes, acked) =
                acknowledged_writes_survive_a_crash_at_every_commit_step("lone-writer", rounds);
            println!(
                "test a_lone_writers_acknowledged_writes_survive_a_crash_at_every_commit_step ... ok ({crashes} crashes, {acked} acknowledged writes checked)"
            );
            a_crashed_database_without_its_log_is_refused_until_accepted();
            println!("test a_crashed_database_without_its_log_is_refused_until_accepted ... ok");
            interrupted_compaction_resumes_and_equals_uninterrupted(rounds.min(4));
            println!("test interrupted_compaction_resumes_and_equals_uninterrupted ... ok");
            ExitCode::SUCCESS
        }
    }
}

/// The smallest write-ahead log, so that the child's load fills it and makes checkpoints.
const CHILD_WAL_FILE_BYTES: u64 = 1 << 20;

fn config() -> Config {
    Config {
        cache_size_bytes: 8 << 20,
        wal_file_bytes: CHILD_WAL_FILE_BYTES,
        ..Config::default()
    }
}

/// The commit step and passage the child aborts at, from `KVD_CRASH_FAILPOINT`
/// (`<step>:<nth>`).
fn failpoint_from_env() -> Option<CommitFailpoint> {
    let spec = std::env::var("KVD_CRASH_FAILPOINT").ok()?;
    let (step, nth) = spec.split_once(':').unwrap();
    let step = match step {
        "after-apply" => CommitStep::AfterApply,
        "after-checkpoint" => CommitStep::AfterCheckpoint,
        "after-log-write" => CommitStep::AfterLogWrite,
        "after-log-sync" => CommitStep::AfterLogSync,
        other => panic!("unknown commit step {other}"),
    };
    Some(CommitFailpoint {
        step,
        nth: nth.parse().unwrap(),
    })
}

/// A small deterministic generator (splitmix64), so kill points replay from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The child: `writers` threads write puts and two-key txns and print an `ack` line for
/// each acknowledged one: `put <key> <revision>` or `txn <id> <revision>`.
fn child_writer(dir: &str, writers: usize) -> ExitCode {
    let config = Config {
        commit_failpoint: failpoint_from_env(),
        ..config()
    };
    let engine = Arc::new(Engine::open(dir, config).unwrap());
    let stdout = Arc::new(Mutex::new(std::io::stdout()));
    let epoch = std::process::id();
    let threads: Vec<_> = (0..writers)
        .map(|t| {
            let (engine, stdout) = (engine.clone(), stdout.clone());
            std::thread::spawn(move || {
                for i in 0..CHILD_WRITES_MAX {
                    let id = format!("{epoch}-{t}-{i}");
                    let line = if i % 3 == 0 {
                        let txn = TxnRequest {
                            success: vec![
                                RequestOp::Put(PutRequest::new(format!("txn/{id}/a"), id.clone())),
                                RequestOp::Put(PutRequest::new(format!("txn/{id}/b"), id.clone())),
                            ],
                            ..TxnRequest::default()
                        };
                        let rev = engine.txn(txn).unwrap().header.revision;
                        format!("txn {id} {rev}\n")
                    } else {
                        let rev = engine
                            .put(PutRequest::new(format!("put/{id}"), id.clone()))
                            .unwrap()
                            .header
                            .revision;
                        format!("put {id} {rev}\n")
                    };
                    let mut out = stdout.lock().unwrap();
                    out.write_all(line.as_bytes()).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    ExitCode::SUCCESS
}

/// Runs the child in `mode` on `dir`, kills it with SIGKILL once `kill_after` has passed
/// since its first output line, and returns every line it printed.
fn run_and_kill(mode: &str, dir: &Path, kill_after: Duration) -> Vec<String> {
    run_child(mode, dir, None, kill_after)
}

/// Runs the child in `mode` on `dir`; with a `failpoint` (`<step>:<nth>`) waits for it to
/// abort there, else kills it `kill_after` after its first output line. Returns every line
/// it printed.
fn run_child(mode: &str, dir: &Path, failpoint: Option<&str>, kill_after: Duration) -> Vec<String> {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(failpoint) = failpoint {
        command.env("KVD_CRASH_FAILPOINT", failpoint);
    }
    let mut child = command
        .env("KVD_CRASH_CHILD", mode)
        .env("KVD_CRASH_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        })
    };
    let started = Instant::now();
    while lines.lock().unwrap().is_empty() {
        assert!(started.elapsed() < CHILD_DEADLINE, "child printed nothing");
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if failpoint.is_some() {
        while child.try_wait().unwrap().is_none() {
            assert!(
                started.elapsed() < CHILD_DEADLINE,
                "child never reached its failpoint"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "the child must die at its failpoint: {status}"
        );
    } else {
        std::thread::sleep(kill_after);
        // Child::kill sends SIGKILL on Unix: no destructor, no clean close.
        let _ = child.kill();
        child.wait().unwrap();
    }
    reader.join().unwrap();
    Arc::try_unwrap(lines).unwrap().into_inner().unwrap()
}

fn acknowledged_writes_survive_sigkill(rounds: usize) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x6b76_6400_c7a5);
    let mut acked = Acked::default();
    for round in 0..rounds {
        let kill_after = Duration::from_millis(20 + rng.below(400));
        let lines = run_and_kill("writer", dir.path(), kill_after);
        acked.check_after_crash(dir.path(), &lines, &format!("round {round}"));
    }
    assert!(!acked.writes.is_empty(), "no write was ever acknowledged");
    acked.writes.len()
}

/// A crash (the child aborts itself) at each step of the commit protocol, at a passage
/// drawn from a fixed seed, on one data directory, with the child in `mode`: after each,
/// every acknowledged write is there (APPLY-1, WAL-3). Returns the crashes and the
/// acknowledged writes checked.
fn acknowledged_writes_survive_a_crash_at_every_commit_step(
    mode: &str,
    rounds: usize,
) -> (usize, usize) {
    const STEPS: [&str; 4] = [
        "after-apply",
        "after-log-write",
        "after-log-sync",
        "after-checkpoint",
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x0c0a_3317_57e9);
    let mut acked = Acked::default();
    let mut crashes = 0;
    for round in 0..rounds.max(1) {
        for step in STEPS {
            // A checkpoint comes once the 1 MiB log is full, a few thousand writes apart.
            let nth = if step == "after-checkpoint" {
                1 + rng.below(2)
            } else {
                20 + rng.below(500)
            };
            let failpoint = format!("{step}:{nth}");
            let lines = run_child(mode, dir.path(), Some(&failpoint), Duration::ZERO);
            acked.check_after_crash(dir.path(), &lines, &format!("round {round} at {failpoint}"));
            crashes += 1;
        }
    }
    assert!(!acked.writes.is_empty(), "no write was ever acknowledged");
    (crashes, acked.writes.len())
}

/// STORE-7: after a crash the log holds acknowledged writes redb's durable state lacks, so
/// a directory whose log was then lost is refused as damaged, and left so, until the caller
/// accepts the loss; the clean close after that open makes it whole on its own.
fn a_crashed_database_without_its_log_is_refused_until_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let lines = run_and_kill("writer", dir.path(), Duration::from_millis(200));
    assert!(!lines.is_empty(), "the child acknowledged nothing");
    let log = dir.path().join("kvd.wal");
    std::fs::remove_file(&log).unwrap();
    for attempt in ["first", "second"] {
        let error = Engine::open(dir.path(), config()).unwrap_err();
        assert!(error.is_corrupted(), "{attempt} open: {error}");
        assert!(
            error.to_string().contains("kvd.wal is missing"),
            "{attempt} open: {error}"
        );
        assert!(!log.exists(), "{attempt} open made a log");
    }
    let accepting = Config {
        accept_missing_log: true,
        ..config()
    };
    let engine = Engine::open(dir.path(), accepting).unwrap();
    // Whatever the last checkpoint held is served, and writes go on.
    let revision = engine.status().unwrap().header.revision;
    let put = PutRequest::new("after-the-loss", "v");
    assert_eq!(engine.put(put).unwrap().header.revision, revision + 1);
    engine.close().unwrap();
    std::fs::remove_file(&log).unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let got = engine.range(&RangeRequest::key("after-the-loss")).unwrap();
    assert_eq!(got.kvs.len(), 1, "the write after the loss");
    engine.close().unwrap();
}

/// Every write the children acknowledged so far, and the highest revision acknowledged.
#[derive(Default)]
struct Acked {
    writes: BTreeMap<String, (String, i64)>,
    last: i64,
}

impl Acked {
    /// Adds the acknowledgements in `lines`, reopens `dir` and checks that every write
    /// acknowledged so far is there, txns whole, and the revision did not go back.
    fn check_after_crash(&mut self, dir: &Path, lines: &[String], round: &str) {
        let (acked, last_acked) = (&mut self.writes, &mut self.last);
        *last_acked = (*last_acked).max(1);
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            let (kind, id, rev) = (parts[0], parts[1], parts[2].parse::<i64>().unwrap());
            acked.insert(format!("{kind} {id}"), (id.to_owned(), rev));
            *last_acked = (*last_acked).max(rev);
        }
        let last_acked = *last_acked;
        let engine = Engine::open(dir, config()).unwrap();
        let current = engine.status().unwrap().header.revision;
        assert!(
            current >= last_acked,
            "round {round}: revision {current} went below acknowledged {last_acked}"
        );
        for (what, (id, rev)) in acked.iter() {
            let keys: Vec<String> = if what.starts_with("txn") {
                vec![format!("txn/{id}/a"), format!("txn/{id}/b")]
            } else {
                vec![format!("put/{id}")]
            };
            for key in keys {
                let got = engine.range(&RangeRequest::key(key.clone())).unwrap();
                let kv = got
                    .kvs
                    .first()
                    .unwrap_or_else(|| panic!("round {round}: acknowledged {key} lost"));
                assert_eq!(
                    (&kv.value[..], kv.mod_revision),
                    (id.as_bytes(), *rev),
                    "round {round}: {key}"
                );
            }
        }
        // All-or-nothing: every txn key has its partner at the same revision.
        let txns = engine.range(&RangeRequest::prefix("txn/")).unwrap();
        let mut halves: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        for kv in &txns.kvs {
            let key = String::from_utf8(kv.key.to_vec()).unwrap();
            let id = key.rsplit_once('/').unwrap().0.to_owned();
            halves.entry(id).or_default().push(kv.mod_revision);
        }
        for (id, revs) in halves {
            assert!(
                revs.len() == 2 && revs[0] == revs[1],
                "round {round}: txn {id} is half applied: {revs:?}"
            );
        }
        engine.close().unwrap();
    }
}

/// The child of the compaction scenario: loads a deterministic history, prints `loaded`,
/// then compacts physically in small steps and prints `compacted`.
fn child_compactor(dir: &str) -> ExitCode {
    let config = Config {
        compaction_batch_records: 16,
        ..config()
    };
    let engine = Engine::open(dir, config).unwrap();
    let target = load_compaction_history(&engine);
    println!("loaded");
    std::io::stdout().flush().unwrap();
    match engine.compact(CompactionRequest {
        revision: target,
        physical: true,
    }) {
        Ok(_) | Err(kvd::Error::Compacted) => println!("compacted"),
        Err(e) => panic!("{e}"),
    }
    ExitCode::SUCCESS
}

/// Writes the compaction scenario's history unless it is there already; returns the
/// compaction revision.
fn load_compaction_history(engine: &Engine) -> i64 {
    let total = (COMPACTION_KEYS * COMPACTION_ROUNDS) as i64;
    if engine.status().unwrap().header.revision == 1 {
        for round in 0..COMPACTION_ROUNDS {
            let ops = (0..COMPACTION_KEYS)
                .map(|k| RequestOp::Put(PutRequest::new(format!("c/{k:04}"), format!("{round}"))))
                .collect::<Vec<_>>();
            for chunk in ops.chunks(100) {
                engine
                    .txn(TxnRequest {
                        success: chunk.to_vec(),
                        ..TxnRequest::default()
                    })
                    .unwrap();
            }
        }
    }
    let current = engine.status().unwrap().header.revision;
    assert_eq!(current, 1 + total / 100, "history is deterministic");
    current - 5
}

fn interrupted_compaction_resumes_and_equals_uninterrupted(rounds: usize) {
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = Engine::open(reference_dir.path(), config()).unwrap();
    let target = load_compaction_history(&reference);
    reference
        .compact(CompactionRequest {
            revision: target,
            physical: true,
        })
        .unwrap();
    let mut rng = Rng(0xc0_3ac7);
    let mut interrupted = 0;
    for round in 0..rounds {
        let dir = tempfile::tempdir().unwrap();
        let kill_after = Duration::from_millis(rng.below(60));
        let lines = run_and_kill("compactor", dir.path(), kill_after);
        assert_eq!(
            lines.first().map(String::as_str),
            Some("loaded"),
            "round {round}"
        );
        let engine = Engine::open(dir.path(), config()).unwrap();
        // The kill came while the compaction was in progress if its request was committed
        // (the reopened store is compacted at the target) and the child had not printed
        // `compacted`, which it does as soon as the physical compaction is answered.
        let scheduled = engine.status().unwrap().compact_revision == target;
        let finished = lines.len() > 1;
        if scheduled && !finished {
            interrupted += 1;
        }
        println!(
            "  round {round}: killed {kill_after:?} after load; scheduled: {scheduled}, finished: {finished}"
        );
        // Either the compaction was scheduled before the kill (then this waits for the
        // resumed job and reports "compacted"), or it runs now.
        match engine.compact(CompactionRequest {
            revision: target,
            physical: true,
        }) {
            Ok(_) | Err(kvd::Error::Compacted) => {}
            Err(e) => panic!("round {round}: {e}"),
        }
        assert_eq!(
            engine.hash_kv(0).unwrap(),
            reference.hash_kv(0).unwrap(),
            "round {round}"
        );
        let current = engine.status().unwrap().header.revision;
        for revision in target..=current {
            let req = RangeRequest {
                revision,
                ..RangeRequest::prefix("c/")
            };
            assert_eq!(
                engine.range(&req).unwrap(),
                reference.range(&req).unwrap(),
                "round {round} at {revision}"
            );
        }
        let below = RangeRequest {
            revision: target - 1,
            ..RangeRequest::prefix("c/")
        };
        assert!(
            engine.range(&below).unwrap_err().is_compacted(),
            "round {round}"
        );
        engine.close().unwrap();
    }
    assert!(
        interrupted > 0,
        "no round killed the child while its compaction was in progress"
    );
}
