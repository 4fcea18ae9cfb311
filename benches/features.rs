//! Feature benchmarks of the `kvd` engine: what watches, online defrag and the quota
//! registry cost the write path, each next to the baseline it is judged against.
//!
//! Groups (see `docs/benchmarks-features.md`):
//! 1. `watch_fanout_1000`: 1,000 watches (10 streams × 100) on one prefix; 16 threads do
//!    durable Puts under it while one consumer thread per stream drains it. Reports events
//!    delivered per second (Puts × 1,000 / time from the first Put to the last event) and
//!    the Put throughput meanwhile.
//! 2. `watch_idle_10000`: durable Put throughput of 64 writers on an engine without watches
//!    and on one with 10,000 idle single-key watches on other keys; the cost in percent.
//! 3. `defrag_stall`: `Engine::defrag` of a fragmented store (about 100 MiB and 500 MiB of
//!    live 4-KiB values, the rest of the file superseded and compacted away) while 4 threads
//!    do durable Puts of 256 bytes and time each one (the write-path issue's conditions). Reports the longest Put during the defrag and the 3 s after it returned (the write stall; the replaced file's close falls after the return), the engine's
//!    `pause_micros`, the defrag's duration and the bytes given back.
//! 4. `quota_1000_roles`: durable Put throughput of 64 writers without a quota registry and
//!    with 1,000 roles with `kv_bytes`/`kv_keys` limits, writes spread over the roles'
//!    namespaces (`/role-N/...`); the accounting cost in percent.
//! 5. `scrub_1m`: `Engine::scrub` over 1,000,000 records of 256-byte values (10,000 in quick
//!    mode) on an idle engine reopened after the load. Reports the wall time of a pass
//!    (which sleeps as long as it reads, SCRUB-2), records per second, and the process's CPU
//!    per record over the measured passes (`/proc/self/stat`).
//!
//! Every measurement uses `iter_custom`; the bench records the samples it returns and prints,
//! after each group, the medians of the measured samples. The with/without comparisons also
//! run alternating blocks on the two engines and report the median of the paired ratios,
//! which cancels most of the drift of a shared machine. Nothing is asserted about timings.
//!
//! Quick mode (`KVD_BENCH_QUICK=1`, and automatically under `--test` or `cargo test
//! --benches`) shrinks the data sets and the measurement times, and runs the defrag case at
//! about 10 MiB only, for CI smoke runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    SAMPLES, Samples, copy_store, db_sizes, durable_config, fmt_rate, fresh_engine, load_config,
    median, on_loaders, paired_ratio, paired_rounds, quick, report, report_load, run_groups,
    run_writers, start_group, value,
};
use criterion::{Criterion, Throughput};
use kvd::quota::RawQuotaConfig;
use kvd::{
    CompactionRequest, DeleteRangeRequest, Engine, KV_BYTES, KV_KEYS, PutRequest, RequestOp,
    TxnRequest, WatchCreateRequest, WatchStream,
};
use tempfile::TempDir;

/// Operations per load transaction.
const LOAD_TXN_OPS: u64 = 64;

/// Group 1: streams, watches per stream, writer threads and the watched prefix.
const FANOUT_STREAMS: usize = 10;
const FANOUT_WATCHES_PER_STREAM: usize = 100;
const FANOUT_WATCHES: usize = FANOUT_STREAMS * FANOUT_WATCHES_PER_STREAM;
const FANOUT_WRITERS: usize = 16;
const FANOUT_PREFIX: &str = "/fanout/";

/// Group 2: writer threads, idle watches and the streams they are spread over.
const WRITERS: usize = 64;
const IDLE_WATCHES: usize = 10_000;
const IDLE_STREAMS: usize = 10;

/// Group 3: writer threads during the defrag, the value size of the loaded keys.
const DEFRAG_WRITERS: usize = 4;
const DEFRAG_VALUE_BYTES: usize = 4096;
/// The share of the loaded transactions whose odd keys are deleted before the compaction.
const DEFRAG_DELETE_SHARE: f64 = 0.9;
/// Free space the defrag cases need, as a multiple of their size: the source store, the
/// copy a sample runs on, the defrag's new file, and room to spare.
const DEFRAG_SPACE_FACTOR: u64 = 4;
/// Puts a defrag writer does at most (the stop flag normally ends it long before).
const DEFRAG_WRITER_PUTS_MAX: usize = 5_000_000;
/// How long a defrag writer runs at most.
const DEFRAG_WRITER_TIME_MAX: Duration = Duration::from_secs(900);

/// Group 4: roles with a quota.
const QUOTA_ROLES: usize = 1_000;

/// Group 5: records the scrub reads (full mode, quick mode).
const SCRUB_RECORDS: (u64, u64) = (1_000_000, 10_000);

/// The sizes of one run.
#[derive(Debug)]
struct Scale {
    /// The defrag cases: (name, file size loaded before the deletes, in bytes). About 55 %
    /// of it stays live (every other key of the first 90 % is deleted), which the names
    /// give.
    defrag_cases: Vec<(&'static str, u64)>,
    /// Writes before the defrag starts, so the writers are at full speed.
    defrag_settle: Duration,
    /// Writes after the defrag returned: the replaced file's close and the first checkpoint
    /// fall in it, and a put they delay counts as the defrag's stall. (Runs before
    /// 2026-12-05 evening wrote for 100 ms after; the replaced file's close then flushed
    /// for 1.4–5 s after a 500 MiB defrag and its stalls went unseen.)
    defrag_aftermath: Duration,
    /// Puts per writer thread in one paired block.
    paired_block_per_writer: u64,
    /// How long the consumers of one fan-out call wait for its events, at most.
    fanout_deadline: Duration,
}

fn scale() -> &'static Scale {
    static SCALE: OnceLock<Scale> = OnceLock::new();
    SCALE.get_or_init(|| {
        if quick() {
            Scale {
                defrag_cases: vec![("10MiB", 10 << 20)],
                defrag_settle: Duration::from_millis(100),
                defrag_aftermath: Duration::from_millis(200),
                paired_block_per_writer: 5,
                fanout_deadline: Duration::from_secs(30),
            }
        } else {
            Scale {
                defrag_cases: vec![("100MiB", 180 << 20), ("500MiB", 900 << 20)],
                defrag_settle: Duration::from_millis(500),
                defrag_aftermath: Duration::from_secs(3),
                paired_block_per_writer: 40,
                fanout_deadline: Duration::from_secs(120),
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Recording and reporting
// ---------------------------------------------------------------------------------------

/// Per-sample figures other than the time criterion sees (rates, latencies, sizes).
#[derive(Debug, Default)]
struct Figures {
    values: BTreeMap<&'static str, Vec<f64>>,
}

impl Figures {
    fn record(&mut self, name: &'static str, value: f64) {
        self.values.entry(name).or_default().push(value);
    }

    /// The last `SAMPLES` values of `name` (the measured samples), in recording order.
    fn measured(&self, name: &str) -> Option<&[f64]> {
        let values = self.values.get(name)?;
        Some(&values[values.len().saturating_sub(SAMPLES)..])
    }

    /// Median over the measured samples of `name`.
    fn median(&self, name: &str) -> Option<f64> {
        median(self.measured(name)?.to_vec())
    }

    /// Largest of the measured samples of `name`.
    fn max(&self, name: &str) -> Option<f64> {
        self.measured(name)?.iter().copied().reduce(f64::max)
    }

    /// Sum of every value of `name`, warm-up included.
    fn total(&self, name: &str) -> f64 {
        self.values.get(name).map_or(0.0, |v| v.iter().sum())
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / f64::from(1u32 << 20))
}

fn verdict(met: bool) -> &'static str {
    if quick() {
        "not judged in quick mode"
    } else if met {
        "met"
    } else {
        "NOT met"
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Runs `count` transactions `txn_of(first)`, `txn_of(first + 1)`, .. from
/// `common::LOADERS` threads.
fn run_txns(engine: &Engine, first: u64, count: u64, txn_of: impl Fn(u64) -> TxnRequest + Sync) {
    on_loaders(count, |n| {
        engine.txn(txn_of(first + n)).expect("load txn");
    });
}

/// Throughputs with and without a feature: criterion medians and the paired ratio.
struct Comparison {
    group: &'static str,
    feature: &'static str,
    without: Option<f64>,
    with: Option<f64>,
    paired: Option<f64>,
    target_percent: f64,
}

impl Comparison {
    fn report(&self) {
        let group = self.group;
        if let Some(without) = self.without {
            report(format!(
                "{group}: without {}: {} puts/s",
                self.feature,
                fmt_rate(without)
            ));
        }
        if let Some(with) = self.with {
            report(format!(
                "{group}: with {}: {} puts/s",
                self.feature,
                fmt_rate(with)
            ));
        }
        if let (Some(without), Some(with)) = (self.without, self.with) {
            let cost = (1.0 - with / without) * 100.0;
            report(format!(
                "{group}: cost {cost:.1}% from the medians (target <= {:.0}%: {})",
                self.target_percent,
                verdict(cost <= self.target_percent)
            ));
        }
        if let Some(paired) = self.paired {
            let cost = (1.0 - paired) * 100.0;
            report(format!(
                "{group}: cost {cost:.1}% paired (median of {} alternating blocks; target <= {:.0}%: {})",
                paired_rounds(),
                self.target_percent,
                verdict(cost <= self.target_percent)
            ));
        }
    }
}

/// Benchmarks durable Puts of `WRITERS` threads on `without` and on `with` (the engine with
/// the feature), then the paired blocks; `key_of(call, t, i)` names the keys.
fn compare_writes(
    c: &mut Criterion,
    group_name: &'static str,
    feature: &'static str,
    target_percent: f64,
    without: &Engine,
    with: &Engine,
    key_of: impl Fn(u64, usize, u64) -> String + Sync,
) {
    let (load, mut group) = start_group(c, group_name);
    group.throughput(Throughput::Elements(1));
    let mut calls = 0u64;
    let mut samples = [Samples::default(), Samples::default()];
    let names = [format!("without_{feature}"), format!("with_{feature}")];
    for (which, engine) in [without, with].into_iter().enumerate() {
        let samples = &mut samples[which];
        group.bench_function(&names[which], |b| {
            b.iter_custom(|iters| {
                calls += 1;
                let call = calls;
                let elapsed = run_writers(engine, WRITERS, iters, |t, i| key_of(call, t, i));
                samples.record(iters, elapsed);
                elapsed
            });
        });
    }
    group.finish();
    let ran = samples.iter().any(|s| !s.is_empty());
    let mut paired = None;
    if ran {
        let block = WRITERS as u64 * scale().paired_block_per_writer;
        // Call numbers of the paired blocks, above any criterion call, so keys stay new.
        let next_call = Cell::new(1_000_000u64);
        let block_on = |engine: &Engine| {
            next_call.set(next_call.get() + 1);
            let call = next_call.get();
            run_writers(engine, WRITERS, block, |t, i| key_of(call, t, i))
        };
        paired = paired_ratio(paired_rounds(), || block_on(with), || block_on(without));
        report_load(group_name, &load);
    }
    Comparison {
        group: group_name,
        feature,
        without: samples[0].median_rate(1.0),
        with: samples[1].median_rate(1.0),
        paired,
        target_percent,
    }
    .report();
}

// ---------------------------------------------------------------------------------------
// 1. watch_fanout_1000
// ---------------------------------------------------------------------------------------

/// What one fan-out call measured.
struct Fanout {
    /// From the release of the writers to the last Put's answer.
    write: Duration,
    /// From the release of the writers to the last event received.
    deliver: Duration,
    events: u64,
}

/// Opens the fan-out streams, each with `FANOUT_WATCHES_PER_STREAM` prefix watches, and
/// consumes their created responses.
fn fanout_streams(engine: &Engine) -> Vec<WatchStream> {
    let streams: Vec<WatchStream> = (0..FANOUT_STREAMS)
        .map(|_| engine.watch_stream().expect("watch stream"))
        .collect();
    for stream in &streams {
        for _ in 0..FANOUT_WATCHES_PER_STREAM {
            let id = stream
                .create(WatchCreateRequest::prefix(FANOUT_PREFIX))
                .expect("create watch");
            assert!(id >= 0, "watch refused");
        }
        let mut created = 0;
        for _ in 0..FANOUT_WATCHES_PER_STREAM {
            let got = stream
                .recv_timeout(Duration::from_secs(10))
                .expect("recv")
                .expect("created response");
            created += usize::from(got.created);
        }
        assert_eq!(created, FANOUT_WATCHES_PER_STREAM, "created responses");
    }
    assert_eq!(engine.watchers().expect("watchers"), FANOUT_WATCHES);
    streams
}

/// Does `puts` durable Puts under the watched prefix from `FANOUT_WRITERS` threads while one
/// thread per stream drains it, until every watch got every event or the deadline passed.
fn fanout_once(engine: &Engine, streams: &[WatchStream], puts: u64, call: u64) -> Fanout {
    // Events of earlier calls that arrive late are not counted.
    let base = engine.status().expect("status").header.revision;
    let per_stream = puts * FANOUT_WATCHES_PER_STREAM as u64;
    let deadline = scale().fanout_deadline;
    let value = value();
    let barrier = Barrier::new(FANOUT_WRITERS + streams.len() + 1);
    let per = puts / FANOUT_WRITERS as u64;
    let extra = puts % FANOUT_WRITERS as u64;
    std::thread::scope(|s| {
        let consumers: Vec<_> = streams
            .iter()
            .map(|stream| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let (mut got, mut last) = (0u64, start);
                    while got < per_stream && start.elapsed() < deadline {
                        let Some(response) = stream
                            .recv_timeout(Duration::from_millis(50))
                            .expect("recv")
                        else {
                            continue;
                        };
                        let fresh = response
                            .events
                            .iter()
                            .filter(|e| e.kv.mod_revision > base)
                            .count() as u64;
                        if fresh > 0 {
                            got += fresh;
                            last = Instant::now();
                        }
                    }
                    (got, last)
                })
            })
            .collect();
        let writers: Vec<_> = (0..FANOUT_WRITERS)
            .map(|t| {
                let count = per + u64::from((t as u64) < extra);
                let (value, barrier) = (value.clone(), &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for i in 0..count {
                        let key = format!("{FANOUT_PREFIX}{t}/{call}/{i}");
                        engine
                            .put(PutRequest::new(key, value.clone()))
                            .expect("put");
                    }
                    Instant::now()
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let last_put = writers
            .into_iter()
            .map(|w| w.join().expect("writer"))
            .max()
            .unwrap_or(start);
        let (mut events, mut last_event) = (0, start);
        for consumer in consumers {
            let (got, last) = consumer.join().expect("consumer");
            events += got;
            last_event = last_event.max(last);
        }
        Fanout {
            write: last_put.saturating_duration_since(start),
            deliver: last_event.saturating_duration_since(start),
            events,
        }
    })
}

fn watch_fanout_1000(c: &mut Criterion) {
    let (load, mut group) = start_group(c, "watch_fanout_1000");
    group.throughput(Throughput::Elements(FANOUT_WATCHES as u64));

    let mut figures = Figures::default();
    let mut state: Option<(TempDir, Engine, Vec<WatchStream>)> = None;
    let mut calls = 0u64;
    group.bench_function("events", |b| {
        let (_, engine, streams) = state.get_or_insert_with(|| {
            let (dir, engine) = fresh_engine();
            let streams = fanout_streams(&engine);
            (dir, engine, streams)
        });
        b.iter_custom(|iters| {
            calls += 1;
            let run = fanout_once(engine, streams, iters, calls);
            let secs = run.deliver.as_secs_f64().max(1e-9);
            let expected = iters * FANOUT_WATCHES as u64;
            figures.record(
                "puts_per_sec",
                iters as f64 / run.write.as_secs_f64().max(1e-9),
            );
            figures.record("events_per_sec", expected as f64 / secs);
            figures.record("expected", expected as f64);
            figures.record("missing", expected.saturating_sub(run.events) as f64);
            run.deliver
        });
    });
    group.finish();
    if let Some((_dir, engine, streams)) = state.take() {
        drop(streams);
        engine.close().expect("close");
    }

    let Some(events) = figures.median("events_per_sec") else {
        return;
    };
    report_load("watch_fanout_1000", &load);
    report(format!(
        "watch_fanout_1000: {} events/s delivered to {FANOUT_WATCHES} watches ({FANOUT_STREAMS} streams x {FANOUT_WATCHES_PER_STREAM}, {FANOUT_WRITERS} writers)",
        fmt_rate(events)
    ));
    if let Some(puts) = figures.median("puts_per_sec") {
        report(format!(
            "watch_fanout_1000: {} durable puts/s meanwhile",
            fmt_rate(puts)
        ));
    }
    let (missing, expected) = (figures.total("missing"), figures.total("expected"));
    report(format!(
        "watch_fanout_1000: {} of {} events missing at the deadline ({} s per call)",
        fmt_rate(missing),
        fmt_rate(expected),
        scale().fanout_deadline.as_secs()
    ));
}

// ---------------------------------------------------------------------------------------
// 2. watch_idle_10000
// ---------------------------------------------------------------------------------------

/// Opens `IDLE_STREAMS` streams with `IDLE_WATCHES` single-key watches on `/idle/N` in all,
/// and consumes their created responses.
fn idle_streams(engine: &Engine) -> Vec<WatchStream> {
    let per_stream = IDLE_WATCHES / IDLE_STREAMS;
    let streams: Vec<WatchStream> = (0..IDLE_STREAMS)
        .map(|_| engine.watch_stream().expect("watch stream"))
        .collect();
    for (s, stream) in streams.iter().enumerate() {
        for w in 0..per_stream {
            let key = format!("/idle/{:05}", s * per_stream + w);
            let id = stream
                .create(WatchCreateRequest::key(key))
                .expect("create watch");
            assert!(id >= 0, "watch refused");
        }
        let mut created = 0;
        for _ in 0..per_stream {
            if let Some(r) = stream.try_recv().expect("recv") {
                created += usize::from(r.created);
            }
        }
        assert_eq!(created, per_stream, "created responses");
    }
    assert_eq!(engine.watchers().expect("watchers"), IDLE_WATCHES);
    streams
}

fn watch_idle_10000(c: &mut Criterion) {
    let (_dir_without, without) = fresh_engine();
    let (_dir_with, with) = fresh_engine();
    let start = Instant::now();
    let streams = idle_streams(&with);
    let created = start.elapsed();
    compare_writes(
        c,
        "watch_idle_10000",
        "idle_watchers",
        10.0,
        &without,
        &with,
        |call, t, i| format!("/bench/{t}/{call}/{i}"),
    );
    report(format!(
        "watch_idle_10000: {IDLE_WATCHES} watches created in {:.3} s; no event reached them: {}",
        created.as_secs_f64(),
        streams.iter().all(|s| s.queued() == 0)
    ));
    drop(streams);
    without.close().expect("close");
    with.close().expect("close");
}

// ---------------------------------------------------------------------------------------
// 3. defrag_stall
// ---------------------------------------------------------------------------------------

fn defrag_key(n: u64) -> String {
    format!("/defrag/{n:09}")
}

/// A closed, fragmented store the defrag samples copy.
struct Fragmented {
    dir: TempDir,
    keys: u64,
    file_bytes: u64,
}

/// Loads keys of `DEFRAG_VALUE_BYTES` until about `target` bytes are in use, deletes every
/// other key of the first `DEFRAG_DELETE_SHARE` of the transactions, compacts physically at
/// the last revision and closes the store. redb allocates the lowest free pages and trims
/// free pages at the end of the file, so the untouched last transactions keep the file at
/// its size while the compacted records leave free pages all over the rest of it: the
/// defrag has that to give back. Everything runs with `unsafe_no_fsync`; the close makes it
/// durable.
fn build_fragmented(name: &str, target: u64) -> Fragmented {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let value = Bytes::from(vec![b'd'; DEFRAG_VALUE_BYTES]);
    let load = |engine: &Engine, first: u64, count: u64| {
        run_txns(engine, first, count, |n| TxnRequest {
            success: (n * LOAD_TXN_OPS..(n + 1) * LOAD_TXN_OPS)
                .map(|k| RequestOp::Put(PutRequest::new(defrag_key(k), value.clone())))
                .collect(),
            ..TxnRequest::default()
        });
    };
    // Calibrate: load a tenth of a first estimate and measure the bytes in use per
    // transaction with redb (the file length grows in steps, the engine's in-use figure is
    // refreshed lazily).
    let estimate = (target / (DEFRAG_VALUE_BYTES as u64 + 64) / LOAD_TXN_OPS).max(10);
    let first = estimate / 10;
    let engine = Engine::open(dir.path(), load_config()).expect("open for load");
    load(&engine, 0, first);
    engine.close().expect("close after calibration");
    let per_txn = (db_sizes(dir.path()).0 / first).max(1);
    let txns = (target / per_txn).max(first);
    let engine = Engine::open(dir.path(), load_config()).expect("reopen for load");
    load(&engine, first, txns - first);
    engine.close().expect("close after load");
    let loaded = db_sizes(dir.path());
    let keys = txns * LOAD_TXN_OPS;
    let engine = Engine::open(dir.path(), load_config()).expect("reopen for deletes");
    let delete_txns = (txns as f64 * DEFRAG_DELETE_SHARE) as u64;
    run_txns(&engine, 0, delete_txns, |n| TxnRequest {
        success: (n * LOAD_TXN_OPS..(n + 1) * LOAD_TXN_OPS)
            .filter(|k| k % 2 == 1)
            .map(|k| RequestOp::DeleteRange(DeleteRangeRequest::key(defrag_key(k))))
            .collect(),
        ..TxnRequest::default()
    });
    let revision = engine.status().expect("status").header.revision;
    engine
        .compact(CompactionRequest {
            revision,
            physical: true,
        })
        .expect("compact");
    engine.close().expect("close after load");
    let (in_use, file_bytes) = db_sizes(dir.path());
    report(format!(
        "defrag_stall/{name}: built in {:.1} s: {} keys of {DEFRAG_VALUE_BYTES} B loaded (file {}, {} in use), every other key of the first {:.0}% deleted and compacted: file {}, {} in use",
        started.elapsed().as_secs_f64(),
        fmt_rate(keys as f64),
        mib(loaded.1 as f64),
        mib(loaded.0 as f64),
        DEFRAG_DELETE_SHARE * 100.0,
        mib(file_bytes as f64),
        mib(in_use as f64)
    ));
    Fragmented {
        dir,
        keys,
        file_bytes,
    }
}

/// What one defrag under write load measured.
struct DefragRun {
    duration: Duration,
    /// The longest Put that overlapped the defrag or began in its aftermath.
    stall: Duration,
    /// When the longest Put began, in milliseconds from the defrag's start.
    stall_at_ms: f64,
    /// The longest Put begun in the aftermath.
    stall_after: Duration,
    pause_micros: u64,
    given_back: u64,
    size_before: u64,
    /// The file's length once the engine is closed (redb trims free pages at its end then).
    size_after_close: u64,
    /// Puts answered during the defrag, per second.
    puts_per_sec: f64,
    /// Median and 99th percentile of the Puts that overlapped the defrag or began in its
    /// aftermath.
    p50: Duration,
    p99: Duration,
    /// The longest Put of the settle phase before the defrag (the baseline).
    before_max: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Copies the store of `source` into a new directory, opens it durably and defrags it while
/// `DEFRAG_WRITERS` threads do durable Puts and time each one.
fn defrag_once(source: &Fragmented, call: u64) -> DefragRun {
    let dir = copy_store(source.dir.path());
    let engine = Engine::open(dir.path(), durable_config()).expect("open");
    let value = value();
    let stop = AtomicBool::new(false);
    let (times, window, response) = std::thread::scope(|s| {
        let writers: Vec<_> = (0..DEFRAG_WRITERS)
            .map(|t| {
                let (engine, value, stop) = (&engine, value.clone(), &stop);
                s.spawn(move || {
                    let started = Instant::now();
                    let mut times = Vec::new();
                    for i in 0..DEFRAG_WRITER_PUTS_MAX {
                        if stop.load(Ordering::Relaxed)
                            || started.elapsed() > DEFRAG_WRITER_TIME_MAX
                        {
                            break;
                        }
                        let key = format!("/live/{call}/{t}/{i}");
                        let begin = Instant::now();
                        engine
                            .put(PutRequest::new(key, value.clone()))
                            .expect("put during defrag");
                        times.push((begin, begin.elapsed()));
                    }
                    times
                })
            })
            .collect();
        std::thread::sleep(scale().defrag_settle);
        let begin = Instant::now();
        let response = engine.defrag().expect("defrag");
        let end = Instant::now();
        // Load after the swap, so that a stall the defrag leaves behind is seen.
        std::thread::sleep(scale().defrag_aftermath);
        stop.store(true, Ordering::Relaxed);
        let times: Vec<(Instant, Duration)> = writers
            .into_iter()
            .flat_map(|w| w.join().expect("writer"))
            .collect();
        (times, (begin, end), response)
    });
    engine.close().expect("close");
    let size_after_close = fs::metadata(dir.path().join("kvd.redb"))
        .map(|m| m.len())
        .unwrap_or(0);
    let (begin, end) = window;
    let overlapping = || {
        times.iter().filter(|(start, took)| {
            *start < end + scale().defrag_aftermath && *start + *took > begin
        })
    };
    let mut during: Vec<Duration> = overlapping().map(|(_, took)| *took).collect();
    during.sort();
    // Where the longest put began, in milliseconds from the defrag's start (negative: before).
    let stall_at_ms = overlapping()
        .max_by_key(|(_, took)| *took)
        .map(|(start, _)| {
            if *start >= begin {
                (*start - begin).as_secs_f64() * 1e3
            } else {
                -((begin - *start).as_secs_f64() * 1e3)
            }
        })
        .unwrap_or_default();
    let before_max = times
        .iter()
        .filter(|(start, took)| *start + *took <= begin)
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    let stall_after = overlapping()
        .filter(|(start, _)| *start >= end)
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    let duration = end - begin;
    DefragRun {
        duration,
        stall: during.last().copied().unwrap_or_default(),
        stall_at_ms,
        stall_after,
        pause_micros: response.pause_micros,
        given_back: response
            .db_size_before
            .saturating_sub(response.db_size_after),
        size_before: response.db_size_before,
        size_after_close,
        puts_per_sec: during.len() as f64
            / (duration + scale().defrag_aftermath)
                .as_secs_f64()
                .max(1e-9),
        p50: percentile(&during, 0.5),
        p99: percentile(&during, 0.99),
        before_max,
    }
}

fn defrag_stall(c: &mut Criterion) {
    let (load, mut group) = start_group(c, "defrag_stall");
    // One defrag per sample: the warm-up runs one, then criterion's minimum of samples.
    group.warm_up_time(Duration::from_millis(1));
    group.measurement_time(Duration::from_millis(100));
    let mut results: Vec<(&'static str, Figures)> = Vec::new();
    for &(name, target) in &scale().defrag_cases {
        let free = fs4::available_space(std::env::temp_dir()).unwrap_or(0);
        if free < target * DEFRAG_SPACE_FACTOR {
            report(format!(
                "defrag_stall/{name}: skipped, {} free in the temp directory, {} needed",
                mib(free as f64),
                mib((target * DEFRAG_SPACE_FACTOR) as f64)
            ));
            continue;
        }
        let mut figures = Figures::default();
        let mut source: Option<Fragmented> = None;
        let mut calls = 0u64;
        group.bench_function(name, |b| {
            let source = source.get_or_insert_with(|| build_fragmented(name, target));
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    calls += 1;
                    let run = defrag_once(source, calls);
                    total += run.duration;
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    figures.record("stall_ms", ms(run.stall));
                    figures.record("stall_at_ms", run.stall_at_ms);
                    figures.record("stall_after_ms", ms(run.stall_after));
                    figures.record("stall_duration_ms", ms(run.duration));
                    figures.record("pause_ms", run.pause_micros as f64 / 1e3);
                    figures.record("duration_s", run.duration.as_secs_f64());
                    figures.record("given_back", run.given_back as f64);
                    figures.record("size_before", run.size_before as f64);
                    figures.record("size_after_close", run.size_after_close as f64);
                    figures.record("puts_per_sec", run.puts_per_sec);
                    figures.record("p50_ms", ms(run.p50));
                    figures.record("p99_ms", ms(run.p99));
                    figures.record("before_max_ms", ms(run.before_max));
                }
                total
            });
        });
        if let Some(source) = source {
            report(format!(
                "defrag_stall/{name}: source store {} keys, file {}",
                fmt_rate(source.keys as f64),
                mib(source.file_bytes as f64)
            ));
        }
        if figures.median("stall_ms").is_some() {
            results.push((name, figures));
        }
    }
    group.finish();

    if results.is_empty() {
        return;
    }
    report_load("defrag_stall", &load);
    let get = |f: &Figures, n: &str| f.median(n).unwrap_or(f64::NAN);
    for (name, f) in &results {
        report(format!(
            "defrag_stall/{name}: longest put during the defrag and the {:.1} s after it {:.1} ms (max over samples {:.1} ms), of those begun after it {:.1} ms (max {:.1} ms); pause_micros {:.1} ms; defrag {:.2} s; given back {} of {} (file {} once closed)",
            scale().defrag_aftermath.as_secs_f64(),
            get(f, "stall_ms"),
            f.max("stall_ms").unwrap_or(f64::NAN),
            get(f, "stall_after_ms"),
            f.max("stall_after_ms").unwrap_or(f64::NAN),
            get(f, "pause_ms"),
            get(f, "duration_s"),
            mib(get(f, "given_back")),
            mib(get(f, "size_before")),
            mib(get(f, "size_after_close")),
        ));
        report(format!(
            "defrag_stall/{name}: during the defrag and after it {} puts/s, put p50 {:.1} ms, p99 {:.1} ms; longest put before defrag {:.1} ms ({DEFRAG_WRITERS} writers)",
            fmt_rate(get(f, "puts_per_sec")),
            get(f, "p50_ms"),
            get(f, "p99_ms"),
            get(f, "before_max_ms"),
        ));
        let last = |n: &str| f.measured(n).unwrap_or_default().iter().copied();
        let mut stalls: Vec<(f64, f64, f64)> = last("stall_ms")
            .zip(last("stall_at_ms"))
            .zip(last("stall_duration_ms"))
            .map(|((stall, at), length)| (stall, at, length))
            .collect();
        stalls.sort_by(|a, b| a.0.total_cmp(&b.0));
        let stalls: Vec<String> = stalls
            .iter()
            .map(|(stall, at, length)| format!("{stall:.1} (from {at:.0} of {length:.0})"))
            .collect();
        report(format!(
            "defrag_stall/{name}: longest put of each defrag, sorted, with when it began in the defrag (ms): {}",
            stalls.join(", ")
        ));
    }
    let big = results.iter().find(|(n, _)| *n == "500MiB");
    let small = results.iter().find(|(n, _)| *n == "100MiB");
    if let Some((_, big)) = big {
        let stall = get(big, "stall_ms");
        report(format!(
            "defrag_stall: longest stall at 500 MiB of live data {stall:.1} ms (target <= 100 ms: {})",
            verdict(stall <= 100.0)
        ));
        if let Some((_, small)) = small {
            let small_stall = get(small, "stall_ms");
            let ratio = stall / small_stall;
            // "No growth": the 500 MiB stall is within a quarter (or 10 ms) of the 100 MiB one.
            let flat = stall <= small_stall * 1.25 || stall - small_stall <= 10.0;
            report(format!(
                "defrag_stall: stall 100 MiB -> 500 MiB {small_stall:.1} -> {stall:.1} ms, x{ratio:.2} (target no growth, i.e. <= x1.25 or +10 ms: {}); pause_micros {:.1} -> {:.1} ms",
                verdict(flat),
                get(small, "pause_ms"),
                get(big, "pause_ms"),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// 4. quota_1000_roles
// ---------------------------------------------------------------------------------------

/// Registers `QUOTA_ROLES` roles `role-N` with limits far above what the bench writes.
fn register_roles(engine: &Engine) {
    let configs = (0..QUOTA_ROLES)
        .map(|r| RawQuotaConfig {
            role: format!("role-{r}"),
            limits: BTreeMap::from([(KV_BYTES.to_owned(), 1e11), (KV_KEYS.to_owned(), 1e9)]),
            ..RawQuotaConfig::default()
        })
        .collect();
    engine.update_quota(configs, false).expect("update_quota");
    assert_eq!(engine.get_quota().expect("get_quota").len(), QUOTA_ROLES);
}

/// The key writer `t`'s `i`-th Put of call `call` goes to: the roles in turn.
fn role_key(call: u64, t: usize, i: u64) -> String {
    let role = (t as u64 + i * WRITERS as u64) % QUOTA_ROLES as u64;
    format!("/role-{role}/{call}/{t}/{i}")
}

fn quota_1000_roles(c: &mut Criterion) {
    let (_dir_without, without) = fresh_engine();
    let (_dir_with, with) = fresh_engine();
    let start = Instant::now();
    register_roles(&with);
    let registered = start.elapsed();
    compare_writes(
        c,
        "quota_1000_roles",
        "quota_registry",
        10.0,
        &without,
        &with,
        role_key,
    );
    let roles = with.roles().expect("roles");
    let charged = roles
        .iter()
        .filter(|r| r.quota.is_some() && r.resources.get(KV_KEYS).is_some_and(|c| c.consumed() > 0))
        .count();
    report(format!(
        "quota_1000_roles: {QUOTA_ROLES} roles registered in {:.3} s; {charged} of them charged for keys; drift rows {}",
        registered.as_secs_f64(),
        with.consumption_drift().expect("drift").len()
    ));
    without.close().expect("close");
    with.close().expect("close");
}

// ---------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------
// 5. scrub_1m
// ---------------------------------------------------------------------------------------

/// The CPU time (user + system) this process has used, from `/proc/self/stat` (10 ms ticks
/// on Linux's usual `CLK_TCK` of 100).
fn process_cpu() -> Duration {
    let stat = fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

fn scrub_1m(c: &mut Criterion) {
    let records = if quick() {
        SCRUB_RECORDS.1
    } else {
        SCRUB_RECORDS.0
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let loading = Engine::open(dir.path(), load_config()).expect("open");
    let value = value();
    run_txns(&loading, 0, records / LOAD_TXN_OPS, |n| TxnRequest {
        success: (0..LOAD_TXN_OPS)
            .map(|i| {
                RequestOp::Put(PutRequest::new(
                    format!("/scrub/{:09}", n * LOAD_TXN_OPS + i),
                    value.clone(),
                ))
            })
            .collect(),
        ..TxnRequest::default()
    });
    loading.close().expect("close");
    let engine = Engine::open(dir.path(), durable_config()).expect("reopen");
    let (load, mut group) = start_group(c, "scrub_1m");
    group.throughput(Throughput::Elements(records));
    let samples = Cell::new(Samples::default());
    let cpu = Cell::new(Duration::ZERO);
    let checked = Cell::new(0_u64);
    group.bench_function("pass", |b| {
        b.iter_custom(|iters| {
            let cpu_before = process_cpu();
            let start = Instant::now();
            for _ in 0..iters {
                let report = engine.scrub().expect("a sound store");
                checked.set(report.records);
            }
            let elapsed = start.elapsed();
            cpu.set(process_cpu() - cpu_before);
            let mut all = samples.take();
            all.record(iters, elapsed);
            samples.set(all);
            elapsed
        });
    });
    group.finish();
    let samples = samples.take();
    let file = fs::metadata(dir.path().join("kvd.redb")).map_or(0, |m| m.len());
    if let Some(secs) = samples.median_secs() {
        report(format!(
            "scrub_1m: {} records ({} in the file), a pass {secs:.3} s, {} records/s; \
             the last sample's CPU {:.2} µs per record (load {load})",
            checked.get(),
            mib(file as f64),
            fmt_rate(checked.get() as f64 / secs),
            cpu.get().as_secs_f64() * 1e6 / (checked.get().max(1) as f64)
        ));
    }
    engine.close().expect("close");
}

fn main() {
    run_groups(&[
        watch_fanout_1000,
        watch_idle_10000,
        defrag_stall,
        quota_1000_roles,
        scrub_1m,
    ]);
}
