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

mod common;

use std::ffi::OsString;
use std::fs;
use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    LOADERS, Samples, VALUE_BYTES, copy_store, db_sizes, durable_config, fmt_rate, fresh_engine,
    load_config, on_loaders, paired_ratio, paired_rounds, quick, report, report_load,
    run_async_writers, run_groups, run_writers, start_group, value,
};
use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use kvd::{CompactionRequest, Config, Engine, PutRequest, RangeRequest};
use redb::{Database, ReadableDatabase, TableDefinition};
use tempfile::TempDir;

/// Environment variable that overrides the raw redb batch size of group 1 (default 64).
const RAW_BATCH_ENV: &str = "KVD_BENCH_RAW_BATCH";
/// Set (to a data directory) in the child process that measures the index's memory.
const RSS_PROBE_ENV: &str = "KVD_BENCH_RSS_PROBE";
/// The redb cache size the memory probe opens with.
const RSS_CACHE_ENV: &str = "KVD_BENCH_RSS_CACHE";

/// Concurrent writers of group 1.
const WRITERS: usize = 64;
const HISTORY: TableDefinition<[u8; 16], &[u8]> = TableDefinition::new("history");

/// The engine's default redb cache size, which the raw comparisons use too.
fn kvd_cache_default() -> usize {
    Config::default().cache_size_bytes
}

/// The sizes of one run.
#[derive(Debug)]
struct Scale {
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
}

fn scale() -> &'static Scale {
    static SCALE: OnceLock<Scale> = OnceLock::new();
    SCALE.get_or_init(|| {
        if quick() {
            Scale {
                range_total: 2_000,
                range_len: 100,
                compact_keys: 100,
                compact_rounds: 11,
                reopen_keys: 16_000,
            }
        } else {
            Scale {
                range_total: 100_000,
                range_len: 1_000,
                compact_keys: 1_000,
                compact_rounds: 101,
                reopen_keys: 1_000_000,
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Puts `total` keys from `LOADERS` threads; thread `t` writes indexes `t, t + LOADERS, ..`.
fn load(engine: &Engine, total: usize, key_of: impl Fn(usize) -> String + Sync) {
    let value = value();
    on_loaders(total as u64, |n| {
        engine
            .put(PutRequest::new(key_of(n as usize), value.clone()))
            .expect("load put");
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

/// A raw redb database of `HISTORY` records in its own directory, and the last revision
/// appended to it.
struct RawStore {
    _dir: TempDir,
    db: Database,
    next: u64,
}

impl RawStore {
    /// Creates an empty store with the engine's default cache size.
    fn new() -> RawStore {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut builder = redb::Builder::new();
        builder.set_cache_size(kvd_cache_default());
        let db = builder
            .create(dir.path().join("raw.redb"))
            .expect("create raw redb");
        let txn = db.begin_write().expect("begin");
        txn.open_table(HISTORY).expect("table");
        txn.commit().expect("commit");
        RawStore {
            _dir: dir,
            db,
            next: 0,
        }
    }

    /// Appends `count` records after the last revision in durable transactions of `batch`;
    /// returns the time it took.
    fn append(&mut self, count: u64, batch: u64, record: &[u8]) -> Duration {
        let start = Instant::now();
        let mut left = count;
        while left > 0 {
            let n = left.min(batch);
            let txn = self.db.begin_write().expect("begin");
            {
                let mut table = txn.open_table(HISTORY).expect("table");
                for _ in 0..n {
                    self.next += 1;
                    table.insert(&raw_key(self.next), record).expect("insert");
                }
            }
            txn.commit().expect("commit");
            left -= n;
        }
        start.elapsed()
    }
}

/// Benchmarks `name`, appending `record`s to a raw store in durable transactions of `batch`,
/// into `samples`; returns the store for the paired blocks (`None` when filtered out).
fn bench_raw_append(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    batch: u64,
    record: &[u8],
    samples: &mut Samples,
) -> Option<RawStore> {
    let mut state: Option<RawStore> = None;
    group.bench_function(name, |b| {
        let raw = state.get_or_insert_with(RawStore::new);
        b.iter_custom(|iters| {
            let elapsed = raw.append(iters, batch, record);
            samples.record(iters, elapsed);
            elapsed
        });
    });
    state
}

/// The figures of a group that runs the engine next to raw redb, reported in a fixed order:
/// the load (when the engine ran), each side's line, their ratio and the paired ratio.
struct VersusRaw {
    group: &'static str,
    load: String,
    /// The engine's median rate and its line (what follows `group: `).
    engine: Option<(f64, String)>,
    /// Raw redb's median rate and its line.
    raw: Option<(f64, String)>,
    /// What follows the ratio, e.g. ` (target >= 0.3)`.
    ratio_note: &'static str,
    paired: Option<f64>,
}

impl VersusRaw {
    fn report(self) {
        let group = self.group;
        if self.engine.is_some() {
            report_load(group, &self.load);
        }
        if let Some((_, line)) = &self.engine {
            report(format!("{group}: {line}"));
        }
        if let Some((_, line)) = &self.raw {
            report(format!("{group}: {line}"));
        }
        if let (Some((engine, _)), Some((raw, _))) = (&self.engine, &self.raw) {
            report(format!(
                "{group}: ratio engine/raw {:.3}{}",
                engine / raw,
                self.ratio_note
            ));
        }
        if let Some(paired) = self.paired {
            report(format!(
                "{group}: paired ratio engine/raw {paired:.3} (median of {} alternating blocks)",
                paired_rounds()
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. put_durable_64_writers
// ---------------------------------------------------------------------------------------

/// The key of writer `t`'s `i`-th Put in call `call` of group 1.
fn bench_key(t: usize, call: u64, i: u64) -> String {
    format!("/bench/{t}/{call}/{i}")
}

fn put_durable_64_writers(c: &mut Criterion) {
    let (load, mut group) = start_group(c, "put_durable_64_writers");
    group.throughput(Throughput::Elements(1));

    let mut engine_state: Option<(TempDir, Engine)> = None;
    let mut calls = 0u64;
    // The same Puts from 64 blocking threads, then from 64 asynchronous writers.
    let mut samples = [Samples::default(), Samples::default()];
    for (which, name) in ["engine", "engine_async_writers"].into_iter().enumerate() {
        let samples = &mut samples[which];
        group.bench_function(name, |b| {
            let (_, engine) = engine_state.get_or_insert_with(fresh_engine);
            b.iter_custom(|iters| {
                calls += 1;
                let call = calls;
                let key_of = |t, i| bench_key(t, call, i);
                let elapsed = if which == 0 {
                    run_writers(engine, WRITERS, iters, key_of)
                } else {
                    run_async_writers(engine, WRITERS, iters, key_of)
                };
                samples.record(iters, elapsed);
                elapsed
            });
        });
    }
    let [engine_samples, async_samples] = samples;

    let batch: u64 = std::env::var(RAW_BATCH_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b| *b > 0)
        .unwrap_or(64);
    let mut raw_samples = Samples::default();
    let record = raw_record("/bench/63/1000/100000".len());
    let name = format!("raw_redb_batched_{batch}");
    let mut raw_state = bench_raw_append(&mut group, &name, batch, &record, &mut raw_samples);
    group.finish();

    let mut paired = None;
    if let (Some((_, engine)), Some(raw)) = (&engine_state, &mut raw_state) {
        let block = WRITERS as u64 * if quick() { 10 } else { 50 };
        paired = paired_ratio(
            paired_rounds(),
            || {
                calls += 1;
                let call = calls;
                run_writers(engine, WRITERS, block, |t, i| bench_key(t, call, i))
            },
            || raw.append(block, batch, &record),
        );
    }
    if let Some((_dir, engine)) = engine_state.take() {
        engine.close().expect("close");
    }

    VersusRaw {
        group: "put_durable_64_writers",
        load,
        engine: engine_samples.median_rate(1.0).map(|engine| {
            let line = format!(
                "engine {} puts/s (target >= 100,000/s; {} puts run in all)",
                fmt_rate(engine),
                fmt_rate(engine_samples.total_iters() as f64)
            );
            (engine, line)
        }),
        raw: raw_samples.median_rate(1.0).map(|raw| {
            let line = format!(
                "raw_redb_batched ({batch} per durable txn) {} puts/s",
                fmt_rate(raw)
            );
            (raw, line)
        }),
        ratio_note: " (target >= 0.5)",
        paired,
    }
    .report();
    if let Some(rate) = async_samples.median_rate(1.0) {
        report(format!(
            "put_durable_64_writers: engine with 64 asynchronous writers (submit_put, one \
             driver thread) {} puts/s ({} puts run in all)",
            fmt_rate(rate),
            fmt_rate(async_samples.total_iters() as f64)
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
    let (load, mut group) = start_group(c, "put_durable_1_writer");
    group.throughput(Throughput::Elements(1));

    let value = value();
    let mut engine_samples = Samples::default();
    let mut engine_state: Option<(TempDir, Engine, u64)> = None;
    group.bench_function("engine", |b| {
        let (_, engine, next) = engine_state.get_or_insert_with(|| {
            let (dir, engine) = fresh_engine();
            (dir, engine, 0)
        });
        b.iter_custom(|iters| {
            let elapsed = run_single(engine, next, iters, &value);
            engine_samples.record(iters, elapsed);
            elapsed
        });
    });

    let mut raw_samples = Samples::default();
    let record = raw_record("/bench/single/100000".len());
    let name = "raw_redb_commit_per_put";
    let mut raw_state = bench_raw_append(&mut group, name, 1, &record, &mut raw_samples);
    group.finish();

    let mut paired = None;
    if let (Some((_, engine, next)), Some(raw)) = (&mut engine_state, &mut raw_state) {
        let block = if quick() { 20 } else { 300 };
        paired = paired_ratio(
            paired_rounds(),
            || run_single(engine, next, block, &value),
            || raw.append(block, 1, &record),
        );
    }
    if let Some((_dir, engine, _)) = engine_state.take() {
        engine.close().expect("close");
    }

    VersusRaw {
        group: "put_durable_1_writer",
        load,
        engine: engine_samples
            .median_rate(1.0)
            .map(|engine| (engine, format!("engine {} puts/s", fmt_rate(engine)))),
        raw: raw_samples.median_rate(1.0).map(|raw| {
            let line = format!("raw_redb_commit_per_put {} puts/s", fmt_rate(raw));
            (raw, line)
        }),
        ratio_note: " (target >= 0.8)",
        paired,
    }
    .report();
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
    let (load, mut group) = start_group(c, "range_1000_keys");
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
        let mut state: Option<RawStore> = None;
        let mut turn = 0u64;
        group.bench_function("raw_redb_scan", |b| {
            let raw = state.get_or_insert_with(|| {
                let mut raw = RawStore::new();
                let record = raw_record(range_key(0, len).len());
                raw.append(total as u64, 10_000, &record);
                raw
            });
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    turn = (turn + 1) % prefixes as u64;
                    let first = turn * len as u64 + 1;
                    let txn = raw.db.begin_read().expect("begin_read");
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

    VersusRaw {
        group: "range_1000_keys",
        load,
        engine: engine_samples.median_rate(len as f64).map(|engine| {
            let line = format!(
                "engine {} keys/s ({len} of {total} keys per Range; target >= 1,000,000 keys/s)",
                fmt_rate(engine)
            );
            (engine, line)
        }),
        raw: raw_samples.median_rate(len as f64).map(|raw| {
            let line = format!("raw_redb_scan {} records/s (context)", fmt_rate(raw));
            (raw, line)
        }),
        ratio_note: "",
        paired: None,
    }
    .report();
}

// ---------------------------------------------------------------------------------------
// 4. compaction_100k
// ---------------------------------------------------------------------------------------

fn compaction_100k(c: &mut Criterion) {
    let s = scale();
    let (keys, rounds) = (s.compact_keys, s.compact_rounds);
    let superseded = keys * (rounds - 1);
    let (load, mut group) = start_group(c, "compaction_100k");
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
    let (load, mut group) = start_group(c, "reopen_1m_keys");
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
    run_groups(&[
        put_durable_64_writers,
        put_durable_1_writer,
        range_1000_keys,
        compaction_100k,
        reopen_1m_keys,
    ]);
}
