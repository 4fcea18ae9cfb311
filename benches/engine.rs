//! Performance benchmarks of the `kvd` engine, each next to the raw redb figure it is judged
//! against, so that results read as ratios on whatever machine runs them.
//!
//! Groups (see `benches/README.md` and `docs/benchmarks.md`):
//! 1. `put_durable_64_writers`: 64 threads doing durable Puts against one engine, and
//!    `raw_redb_batched`: one thread appending revision-keyed records to redb in durable
//!    transactions of 64 records.
//! 2. `put_durable_1_writer`: one Put at a time, and `raw_redb_commit_per_put`: one insert
//!    and one durable commit per record.
//! 3. `range_1000_keys`: a prefix Range returning 1,000 keys out of 100,000.
//! 4. `compaction_100k`: a physical compaction deleting 100,000 superseded revisions.
//! 5. `reopen_1m_keys`: `Engine::open` of a store holding 1,000,000 keys (the index rebuild),
//!    and the index's resident memory per key, measured in a child process.
//!
//! Every measurement uses `iter_custom`; the bench records the samples it returns and prints,
//! after each group, the median throughput of the measured samples, the engine/raw ratio, and
//! a paired ratio from alternating engine and raw blocks. Nothing is asserted about timings.
//!
//! Quick mode (`KVD_BENCH_QUICK=1`, and automatically under `--test` or `cargo test
//! --benches`) shrinks every data set 10–100× and the measurement times, for CI smoke runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::ffi::OsString;
use std::fs;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, measurement::WallTime};
use kvd::{CompactionRequest, Config, Engine, PutRequest, RangeRequest};
use redb::{Database, ReadableDatabase, TableDefinition};
use tempfile::TempDir;

/// Environment variable that turns quick mode on.
const QUICK_ENV: &str = "KVD_BENCH_QUICK";
/// Environment variable that overrides the raw redb batch size of group 1 (default 64).
const RAW_BATCH_ENV: &str = "KVD_BENCH_RAW_BATCH";
/// Set (to a data directory) in the child process that measures the index's memory.
const RSS_PROBE_ENV: &str = "KVD_BENCH_RSS_PROBE";
/// The redb cache size the memory probe opens with.
const RSS_CACHE_ENV: &str = "KVD_BENCH_RSS_CACHE";

/// Concurrent writers of group 1.
const WRITERS: usize = 64;
/// Value size of every Put.
const VALUE_BYTES: usize = 256;
/// Threads that load data sets (with `unsafe_no_fsync`), so the apply thread batches.
const LOADERS: usize = 16;
/// Samples per benchmark (criterion's minimum).
const SAMPLES: usize = 10;
const HISTORY: TableDefinition<[u8; 16], &[u8]> = TableDefinition::new("history");

/// The engine's default redb cache size, which the raw comparisons use too.
fn kvd_cache_default() -> usize {
    Config::default().cache_size_bytes
}

/// The sizes of one run.
#[derive(Debug)]
struct Scale {
    quick: bool,
    /// Keys in the store that group 3 ranges over.
    range_total: usize,
    /// Keys one Range returns.
    range_len: usize,
    /// Keys of group 4.
    compact_keys: usize,
    /// Puts per key in group 4: one create and `compact_rounds - 1` overwrites.
    compact_rounds: usize,
    /// Keys of group 5.
    reopen_keys: usize,
    warm_up: Duration,
    measurement: Duration,
}

fn scale() -> &'static Scale {
    static SCALE: OnceLock<Scale> = OnceLock::new();
    SCALE.get_or_init(|| {
        let args: Vec<String> = std::env::args().collect();
        // criterion runs in test mode under `--test`, and when `--bench` is absent
        // (`cargo test --benches`): keep the setup small there too.
        let test_mode = args.iter().any(|a| a == "--test") || !args.iter().any(|a| a == "--bench");
        let quick = test_mode || std::env::var(QUICK_ENV).is_ok_and(|v| v == "1");
        if quick {
            Scale {
                quick,
                range_total: 2_000,
                range_len: 100,
                compact_keys: 100,
                compact_rounds: 11,
                reopen_keys: 16_000,
                warm_up: Duration::from_millis(100),
                measurement: Duration::from_millis(500),
            }
        } else {
            Scale {
                quick,
                range_total: 100_000,
                range_len: 1_000,
                compact_keys: 1_000,
                compact_rounds: 101,
                reopen_keys: 1_000_000,
                warm_up: Duration::from_secs(1),
                measurement: Duration::from_secs(4),
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Recording and reporting
// ---------------------------------------------------------------------------------------

/// The (iterations, time) pairs one benchmark's `iter_custom` returned, warm-up included.
#[derive(Debug, Default)]
struct Samples {
    runs: Vec<(u64, Duration)>,
}

impl Samples {
    fn record(&mut self, iters: u64, elapsed: Duration) {
        self.runs.push((iters, elapsed));
    }

    /// The measured samples: criterion runs the warm-up first, then `SAMPLES` samples.
    fn measured(&self) -> &[(u64, Duration)] {
        &self.runs[self.runs.len().saturating_sub(SAMPLES)..]
    }

    /// Median of `elements × iterations / seconds` over the measured samples.
    fn median_rate(&self, elements_per_iter: f64) -> Option<f64> {
        let rates: Vec<f64> = self
            .measured()
            .iter()
            .map(|(iters, d)| *iters as f64 * elements_per_iter / d.as_secs_f64().max(1e-12))
            .collect();
        median(rates)
    }

    /// Iterations run in total, warm-up included.
    fn total_iters(&self) -> u64 {
        self.runs.iter().map(|(iters, _)| iters).sum()
    }

    /// Median seconds per iteration over the measured samples.
    fn median_secs(&self) -> Option<f64> {
        let secs = self
            .measured()
            .iter()
            .map(|(iters, d)| d.as_secs_f64() / (*iters).max(1) as f64)
            .collect();
        median(secs)
    }
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    })
}

/// Lines printed again at the end of the run.
fn summary() -> &'static Mutex<Vec<String>> {
    static SUMMARY: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SUMMARY.get_or_init(|| Mutex::new(Vec::new()))
}

fn report(line: String) {
    println!("kvd-bench: {line}");
    summary()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);
}

fn fmt_rate(rate: f64) -> String {
    let whole = rate.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The first three fields of `/proc/loadavg`: how busy the shared machine was.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Reports the machine's load taken as a group started, so noisy figures can be recognised.
fn report_load(group: &str, load: &str) {
    report(format!("{group}: load average at start {load}"));
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    // Flat: every sample runs the same number of iterations, which suits long and
    // one-shot measurements; criterion's own settings come from `main`.
    group.sampling_mode(SamplingMode::Flat);
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn value() -> Bytes {
    Bytes::from(vec![b'v'; VALUE_BYTES])
}

fn durable_config() -> Config {
    Config::default()
}

fn load_config() -> Config {
    Config {
        unsafe_no_fsync: true,
        ..Config::default()
    }
}

/// Puts `total` keys from `LOADERS` threads; thread `t` writes indexes `t, t + LOADERS, ..`.
fn load(engine: &Engine, total: usize, key_of: impl Fn(usize) -> String + Sync) {
    let value = value();
    std::thread::scope(|s| {
        for t in 0..LOADERS {
            let (value, key_of) = (value.clone(), &key_of);
            s.spawn(move || {
                for n in (t..total).step_by(LOADERS) {
                    engine
                        .put(PutRequest::new(key_of(n), value.clone()))
                        .expect("load put");
                }
            });
        }
    });
}

/// Builds a store in a new directory with `load_config`, then closes it (the close makes
/// every commit durable).
fn build_store(total: usize, key_of: impl Fn(usize) -> String + Sync) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(dir.path(), load_config()).expect("open for load");
    load(&engine, total, key_of);
    engine.close().expect("close after load");
    dir
}

fn count_prefix(engine: &Engine, prefix: &str) -> i64 {
    let req = RangeRequest {
        count_only: true,
        ..RangeRequest::prefix(prefix.to_owned())
    };
    engine.range(&req).expect("count").count
}

/// A history record as the engine lays it out: a 29-byte head, the key, the value.
fn raw_record(key_len: usize) -> Vec<u8> {
    let mut record = vec![0u8; 29 + key_len + VALUE_BYTES];
    record[29..29 + key_len].fill(b'k');
    record
}

fn raw_key(main: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&main.to_be_bytes());
    key
}

fn raw_db(dir: &Path) -> Database {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(kvd_cache_default());
    let db = builder
        .create(dir.join("raw.redb"))
        .expect("create raw redb");
    let txn = db.begin_write().expect("begin");
    txn.open_table(HISTORY).expect("table");
    txn.commit().expect("commit");
    db
}

/// Appends `count` records after revision `*next` in durable transactions of `batch`.
fn raw_append(db: &Database, next: &mut u64, count: u64, batch: u64, record: &[u8]) {
    let mut left = count;
    while left > 0 {
        let n = left.min(batch);
        let txn = db.begin_write().expect("begin");
        {
            let mut table = txn.open_table(HISTORY).expect("table");
            for _ in 0..n {
                *next += 1;
                table.insert(&raw_key(*next), record).expect("insert");
            }
        }
        txn.commit().expect("commit");
        left -= n;
    }
}

// ---------------------------------------------------------------------------------------
// 1. put_durable_64_writers
// ---------------------------------------------------------------------------------------

/// Runs `total` durable Puts spread over `writers` threads; returns the wall time from the
/// moment all threads are ready to the last answer.
fn run_writers(engine: &Engine, writers: usize, total: u64, call: u64) -> Duration {
    let value = value();
    let barrier = Barrier::new(writers + 1);
    let per = total / writers as u64;
    let extra = total % writers as u64;
    std::thread::scope(|s| {
        for t in 0..writers {
            let count = per + u64::from((t as u64) < extra);
            let (value, barrier) = (value.clone(), &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..count {
                    let key = format!("/bench/{t}/{call}/{i}");
                    engine
                        .put(PutRequest::new(key, value.clone()))
                        .expect("put");
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Leaving the scope joins every writer.
        start
    })
    .elapsed()
}

/// Alternates `engine` and `raw` blocks of the same number of operations, `rounds` times
/// (switching which goes first), and returns the median of `raw time / engine time`, that is
/// of engine throughput over raw throughput. Pairing neighbouring blocks cancels most of the
/// drift a shared machine adds between two benchmarks run one after the other.
fn paired_ratio(
    rounds: usize,
    mut engine: impl FnMut() -> Duration,
    mut raw: impl FnMut() -> Duration,
) -> Option<f64> {
    let mut ratios = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (e, r) = if round % 2 == 0 {
            let e = engine();
            (e, raw())
        } else {
            let r = raw();
            (engine(), r)
        };
        ratios.push(r.as_secs_f64() / e.as_secs_f64().max(1e-12));
    }
    median(ratios)
}

fn paired_rounds() -> usize {
    if scale().quick { 2 } else { 10 }
}

fn put_durable_64_writers(c: &mut Criterion) {
    let load = load_average();
    let mut group = c.benchmark_group("put_durable_64_writers");
    configure(&mut group);
    group.throughput(Throughput::Elements(1));

    let mut engine_samples = Samples::default();
    let mut engine_state: Option<(TempDir, Engine)> = None;
    let mut calls = 0u64;
    group.bench_function("engine", |b| {
        let (_, engine) = engine_state.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let engine = Engine::open(dir.path(), durable_config()).expect("open");
            (dir, engine)
        });
        b.iter_custom(|iters| {
            calls += 1;
            let elapsed = run_writers(engine, WRITERS, iters, calls);
            engine_samples.record(iters, elapsed);
            elapsed
        });
    });

    let batch: u64 = std::env::var(RAW_BATCH_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b| *b > 0)
        .unwrap_or(64);
    let mut raw_samples = Samples::default();
    let mut raw_state: Option<(TempDir, Database, u64)> = None;
    let record = raw_record("/bench/63/1000/100000".len());
    group.bench_function(format!("raw_redb_batched_{batch}"), |b| {
        let (_, db, next) = raw_state.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let db = raw_db(dir.path());
            (dir, db, 0)
        });
        b.iter_custom(|iters| {
            let start = Instant::now();
            raw_append(db, next, iters, batch, &record);
            let elapsed = start.elapsed();
            raw_samples.record(iters, elapsed);
            elapsed
        });
    });
    group.finish();

    let mut paired = None;
    if let (Some((_, engine)), Some((_, db, next))) = (&engine_state, &mut raw_state) {
        let block = WRITERS as u64 * if scale().quick { 10 } else { 50 };
        paired = paired_ratio(
            paired_rounds(),
            || {
                calls += 1;
                run_writers(engine, WRITERS, block, calls)
            },
            || {
                let start = Instant::now();
                raw_append(db, next, block, batch, &record);
                start.elapsed()
            },
        );
    }
    if let Some((_dir, engine)) = engine_state.take() {
        engine.close().expect("close");
    }

    let engine = engine_samples.median_rate(1.0);
    let raw = raw_samples.median_rate(1.0);
    if engine.is_some() {
        report_load("put_durable_64_writers", &load);
    }
    if let Some(engine) = engine {
        report(format!(
            "put_durable_64_writers: engine {} puts/s (target >= 50,000/s; {} puts run in all)",
            fmt_rate(engine),
            fmt_rate(engine_samples.total_iters() as f64)
        ));
    }
    if let Some(raw) = raw {
        report(format!(
            "put_durable_64_writers: raw_redb_batched ({batch} per durable txn) {} puts/s",
            fmt_rate(raw)
        ));
    }
    if let (Some(engine), Some(raw)) = (engine, raw) {
        report(format!(
            "put_durable_64_writers: ratio engine/raw {:.3} (target >= 0.3)",
            engine / raw
        ));
    }
    if let Some(paired) = paired {
        report(format!(
            "put_durable_64_writers: paired ratio engine/raw {paired:.3} (median of {} alternating blocks)",
            paired_rounds()
        ));
    }
}

// ---------------------------------------------------------------------------------------
// 2. put_durable_1_writer
// ---------------------------------------------------------------------------------------

/// Runs `count` durable Puts one after the other from this thread.
fn run_single(engine: &Engine, next: &mut u64, count: u64, value: &Bytes) -> Duration {
    let start = Instant::now();
    for _ in 0..count {
        *next += 1;
        let key = format!("/bench/single/{next}");
        engine
            .put(PutRequest::new(key, value.clone()))
            .expect("put");
    }
    start.elapsed()
}

fn put_durable_1_writer(c: &mut Criterion) {
    let load = load_average();
    let mut group = c.benchmark_group("put_durable_1_writer");
    configure(&mut group);
    group.throughput(Throughput::Elements(1));

    let value = value();
    let mut engine_samples = Samples::default();
    let mut engine_state: Option<(TempDir, Engine, u64)> = None;
    group.bench_function("engine", |b| {
        let (_, engine, next) = engine_state.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let engine = Engine::open(dir.path(), durable_config()).expect("open");
            (dir, engine, 0)
        });
        b.iter_custom(|iters| {
            let elapsed = run_single(engine, next, iters, &value);
            engine_samples.record(iters, elapsed);
            elapsed
        });
    });

    let mut raw_samples = Samples::default();
    let mut raw_state: Option<(TempDir, Database, u64)> = None;
    let record = raw_record("/bench/single/100000".len());
    group.bench_function("raw_redb_commit_per_put", |b| {
        let (_, db, next) = raw_state.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let db = raw_db(dir.path());
            (dir, db, 0)
        });
        b.iter_custom(|iters| {
            let start = Instant::now();
            raw_append(db, next, iters, 1, &record);
            let elapsed = start.elapsed();
            raw_samples.record(iters, elapsed);
            elapsed
        });
    });
    group.finish();

    let mut paired = None;
    if let (Some((_, engine, engine_next)), Some((_, db, raw_next))) =
        (&mut engine_state, &mut raw_state)
    {
        let block = if scale().quick { 20 } else { 300 };
        paired = paired_ratio(
            paired_rounds(),
            || run_single(engine, engine_next, block, &value),
            || {
                let start = Instant::now();
                raw_append(db, raw_next, block, 1, &record);
                start.elapsed()
            },
        );
    }
    if let Some((_dir, engine, _)) = engine_state.take() {
        engine.close().expect("close");
    }

    let engine = engine_samples.median_rate(1.0);
    let raw = raw_samples.median_rate(1.0);
    if engine.is_some() {
        report_load("put_durable_1_writer", &load);
    }
    if let Some(engine) = engine {
        report(format!(
            "put_durable_1_writer: engine {} puts/s",
            fmt_rate(engine)
        ));
    }
    if let Some(raw) = raw {
        report(format!(
            "put_durable_1_writer: raw_redb_commit_per_put {} puts/s",
            fmt_rate(raw)
        ));
    }
    if let (Some(engine), Some(raw)) = (engine, raw) {
        report(format!(
            "put_durable_1_writer: ratio engine/raw {:.3} (target >= 0.8)",
            engine / raw
        ));
    }
    if let Some(paired) = paired {
        report(format!(
            "put_durable_1_writer: paired ratio engine/raw {paired:.3} (median of {} alternating blocks)",
            paired_rounds()
        ));
    }
}

// ---------------------------------------------------------------------------------------
// 3. range_1000_keys
// ---------------------------------------------------------------------------------------

fn range_key(n: usize, len: usize) -> String {
    format!("/range/{:05}/{:05}", n / len, n % len)
}

fn range_1000_keys(c: &mut Criterion) {
    let s = scale();
    let (total, len) = (s.range_total, s.range_len);
    let prefixes = total / len;
    let load = load_average();
    let mut group = c.benchmark_group("range_1000_keys");
    configure(&mut group);
    group.throughput(Throughput::Elements(len as u64));

    let mut engine_samples = Samples::default();
    {
        let mut state: Option<(TempDir, Engine)> = None;
        let mut turn = 0usize;
        group.bench_function("engine", |b| {
            let (_, engine) = state.get_or_insert_with(|| {
                let dir = build_store(total, |n| range_key(n, len));
                let engine = Engine::open(dir.path(), durable_config()).expect("open");
                assert_eq!(
                    count_prefix(&engine, "/range/"),
                    total as i64,
                    "loaded keys"
                );
                (dir, engine)
            });
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    turn = (turn + 1) % prefixes;
                    let req = RangeRequest::prefix(format!("/range/{turn:05}/"));
                    let got = engine.range(&req).expect("range");
                    debug_assert_eq!(got.kvs.len(), len);
                    black_box(got);
                }
                let elapsed = start.elapsed();
                engine_samples.record(iters, elapsed);
                elapsed
            });
        });
        if let Some((_dir, engine)) = state.take() {
            engine.close().expect("close");
        }
    }

    // Context, not a target: reading the same number of consecutive records straight from
    // a redb table (one range scan), the floor under any Range implementation on redb.
    let mut raw_samples = Samples::default();
    {
        let mut state: Option<(TempDir, Database)> = None;
        let mut turn = 0u64;
        group.bench_function("raw_redb_scan", |b| {
            let (_, db) = state.get_or_insert_with(|| {
                let dir = tempfile::tempdir().expect("tempdir");
                let db = raw_db(dir.path());
                let record = raw_record(range_key(0, len).len());
                let mut next = 0;
                raw_append(&db, &mut next, total as u64, 10_000, &record);
                (dir, db)
            });
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    turn = (turn + 1) % prefixes as u64;
                    let first = turn * len as u64 + 1;
                    let txn = db.begin_read().expect("begin_read");
                    let table = txn.open_table(HISTORY).expect("table");
                    let mut bytes = 0usize;
                    let range = table.range(raw_key(first)..raw_key(first + len as u64));
                    for entry in range.expect("range") {
                        let (_, value) = entry.expect("entry");
                        // Copy the value out, as a Range response must.
                        bytes += black_box(value.value().to_vec()).len();
                    }
                    black_box(bytes);
                }
                let elapsed = start.elapsed();
                raw_samples.record(iters, elapsed);
                elapsed
            });
        });
    }
    group.finish();

    let engine = engine_samples.median_rate(len as f64);
    let raw = raw_samples.median_rate(len as f64);
    if engine.is_some() {
        report_load("range_1000_keys", &load);
    }
    if let Some(engine) = engine {
        report(format!(
            "range_1000_keys: engine {} keys/s ({len} of {total} keys per Range; target >= 1,000,000 keys/s)",
            fmt_rate(engine)
        ));
    }
    if let Some(raw) = raw {
        report(format!(
            "range_1000_keys: raw_redb_scan {} records/s (context)",
            fmt_rate(raw)
        ));
    }
    if let (Some(engine), Some(raw)) = (engine, raw) {
        report(format!(
            "range_1000_keys: ratio engine/raw {:.3}",
            engine / raw
        ));
    }
}

// ---------------------------------------------------------------------------------------
// 4. compaction_100k
// ---------------------------------------------------------------------------------------

/// Copies the database file of `from` into a new directory.
fn copy_store(from: &Path) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::copy(from.join("kvd.redb"), dir.path().join("kvd.redb")).expect("copy store");
    dir
}

/// Returns (bytes allocated inside the file, file length) of the closed store in `dir`, read
/// with redb directly.
fn db_sizes(dir: &Path) -> (u64, u64) {
    let path = dir.join("kvd.redb");
    let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let db = Database::open(&path).expect("open closed store with redb");
    let txn = db.begin_write().expect("begin");
    let stats = txn.stats().expect("stats");
    let in_use = stats.allocated_pages() * stats.page_size() as u64;
    txn.abort().expect("abort");
    (in_use, len)
}

fn compaction_100k(c: &mut Criterion) {
    let s = scale();
    let (keys, rounds) = (s.compact_keys, s.compact_rounds);
    let superseded = keys * (rounds - 1);
    let load = load_average();
    let mut group = c.benchmark_group("compaction_100k");
    configure(&mut group);
    group.throughput(Throughput::Elements(superseded as u64));

    let mut samples = Samples::default();
    let mut sizes: Option<String> = None;
    {
        let mut source: Option<TempDir> = None;
        group.bench_function("compact_physical", |b| {
            let source = source.get_or_insert_with(|| {
                // Thread `t` writes every LOADERS-th put; key `n % keys` gets `rounds` puts.
                build_store(keys * rounds, |n| format!("/compact/{:05}", n % keys))
            });
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = copy_store(source.path());
                    let engine = Engine::open(dir.path(), durable_config()).expect("open");
                    let revision = engine.status().expect("status").header.revision;
                    let start = Instant::now();
                    engine
                        .compact(CompactionRequest {
                            revision,
                            physical: true,
                        })
                        .expect("compact");
                    total += start.elapsed();
                    engine.close().expect("close");
                    if sizes.is_none() {
                        let (before, after) = (db_sizes(source.path()), db_sizes(dir.path()));
                        sizes = Some(format!(
                            "compaction_100k: bytes in use {} -> {}, file {} -> {} bytes",
                            fmt_rate(before.0 as f64),
                            fmt_rate(after.0 as f64),
                            fmt_rate(before.1 as f64),
                            fmt_rate(after.1 as f64),
                        ));
                    }
                }
                samples.record(iters, total);
                total
            });
        });
    }
    group.finish();

    if let Some(secs) = samples.median_secs() {
        report_load("compaction_100k", &load);
        report(format!(
            "compaction_100k: compact(physical) of {} superseded revisions ({keys} keys x {rounds} puts) {:.3} s ({} revisions/s)",
            fmt_rate(superseded as f64),
            secs,
            fmt_rate(superseded as f64 / secs)
        ));
    }
    if let Some(sizes) = sizes {
        report(sizes);
    }
}

// ---------------------------------------------------------------------------------------
// 5. reopen_1m_keys
// ---------------------------------------------------------------------------------------

fn reopen_key(n: usize) -> String {
    format!("/reopen/{n:08}")
}

/// Resident set size of this process in KiB, from `/proc/self/status`.
fn rss_kib() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The child process: opens the store in `dir` with the cache size of `RSS_CACHE_ENV` and
/// prints the resident set size before and after the open.
fn rss_probe(dir: OsString) {
    let cache = std::env::var(RSS_CACHE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(kvd_cache_default);
    let before = rss_kib().unwrap_or(0);
    let engine = Engine::open(
        Path::new(&dir),
        Config {
            cache_size_bytes: cache,
            ..Config::default()
        },
    )
    .expect("probe open");
    let after = rss_kib().unwrap_or(0);
    let keys = count_prefix(&engine, "/reopen/");
    println!("rss_before_kib={before} rss_after_kib={after} keys={keys}");
    engine.close().expect("probe close");
}

/// Runs the memory probe in a fresh process (so no memory freed earlier by this one is
/// reused) and returns (RSS growth in bytes, keys).
fn run_rss_probe(dir: &Path, cache: usize) -> Option<(u64, u64)> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new(exe)
        .env(RSS_PROBE_ENV, dir)
        .env(RSS_CACHE_ENV, cache.to_string())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let start = text.find(name)? + name.len();
        text[start..].split_whitespace().next()?.parse().ok()
    };
    let (before, after, keys) = (
        field("rss_before_kib=")?,
        field("rss_after_kib=")?,
        field("keys=")?,
    );
    Some((after.saturating_sub(before) * 1024, keys))
}

fn reopen_1m_keys(c: &mut Criterion) {
    let total = scale().reopen_keys;
    let load = load_average();
    let mut group = c.benchmark_group("reopen_1m_keys");
    configure(&mut group);
    group.throughput(Throughput::Elements(total as u64));

    let mut samples = Samples::default();
    let mut built: Option<TempDir> = None;
    {
        let mut checked = false;
        group.bench_function("open", |b| {
            let dir = built.get_or_insert_with(|| {
                let start = Instant::now();
                let dir = build_store(total, reopen_key);
                let secs = start.elapsed().as_secs_f64();
                report(format!(
                    "reopen_1m_keys: loaded {} keys in {secs:.1} s (unsafe_no_fsync, {LOADERS} threads); file {} bytes",
                    fmt_rate(total as f64),
                    fmt_rate(db_sizes(dir.path()).1 as f64)
                ));
                dir
            });
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let engine = Engine::open(dir.path(), durable_config()).expect("open");
                    elapsed += start.elapsed();
                    if !checked {
                        assert_eq!(count_prefix(&engine, "/reopen/"), total as i64, "keys");
                        checked = true;
                    }
                    engine.close().expect("close");
                }
                samples.record(iters, elapsed);
                elapsed
            });
        });
    }
    group.finish();

    if let Some(secs) = samples.median_secs() {
        report_load("reopen_1m_keys", &load);
        report(format!(
            "reopen_1m_keys: Engine::open with {} keys {:.3} s (target <= 3 s)",
            fmt_rate(total as f64),
            secs
        ));
    }
    if let Some(dir) = built {
        let small_cache = 4 << 20;
        let default_label = format!("default {} MiB", kvd_cache_default() >> 20);
        for (label, cache) in [
            ("4 MiB".to_owned(), small_cache),
            (default_label, kvd_cache_default()),
        ] {
            match run_rss_probe(dir.path(), cache) {
                Some((bytes, keys)) if keys > 0 => report(format!(
                    "reopen_1m_keys: RSS growth over open, redb cache {label}: {:.1} MiB = {:.0} bytes/key ({} keys)",
                    bytes as f64 / (1 << 20) as f64,
                    bytes as f64 / keys as f64,
                    fmt_rate(keys as f64)
                )),
                _ => report(format!("reopen_1m_keys: memory probe ({label}) failed")),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------

fn main() {
    if let Some(dir) = std::env::var_os(RSS_PROBE_ENV) {
        rss_probe(dir);
        return;
    }
    let s = scale();
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(s.warm_up)
        .measurement_time(s.measurement)
        .configure_from_args();
    let start = Instant::now();
    put_durable_64_writers(&mut c);
    put_durable_1_writer(&mut c);
    range_1000_keys(&mut c);
    compaction_100k(&mut c);
    reopen_1m_keys(&mut c);
    c.final_summary();
    let lines = summary().lock().unwrap_or_else(|p| p.into_inner());
    println!();
    println!(
        "kvd-bench summary ({}, {:.0} s):",
        if s.quick {
            "quick mode, small data sets: a smoke test, not a measurement"
        } else {
            "full mode"
        },
        start.elapsed().as_secs_f64()
    );
    for line in lines.iter() {
        println!("  {line}");
    }
}
