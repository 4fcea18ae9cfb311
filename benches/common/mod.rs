//! Setup and reporting shared by the criterion benches `engine.rs` and `features.rs` (each
//! includes it with `mod common;`): quick-mode detection, the criterion configuration and the
//! run of the groups, sample recording and medians, the `kvd-bench:` report lines and the
//! summary that repeats them at the end, and the engine setup (temporary directories, the
//! durable and the loading configuration, parallel writers and loaders, the paired ratio).
//!
//! Invariants:
//! 1. Quick mode is decided once per process: on under criterion's test mode (`--test`, or no
//!    `--bench` as `cargo test --benches` runs it) or with `KVD_BENCH_QUICK=1`.
//! 2. Every `kvd-bench:` line goes through [`report`], so the summary holds each of them once,
//!    in the order they were printed.
//! 3. Medians are taken over the last [`SAMPLES`] values, the samples criterion measures after
//!    its warm-up; nothing here asserts anything about timings.

// Each bench uses a different subset of these helpers; what one of them leaves unused is
// dead code in that bench's build only.
#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::sync::{Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, measurement::WallTime};
use kvd::{Config, Engine, PutRequest};
use tempfile::TempDir;

/// Environment variable that turns quick mode on.
pub const QUICK_ENV: &str = "KVD_BENCH_QUICK";
/// Samples per benchmark (criterion's minimum).
pub const SAMPLES: usize = 10;
/// Value size of every Put of the write-throughput groups.
pub const VALUE_BYTES: usize = 256;
/// Threads that load data sets (with `unsafe_no_fsync`), so the apply thread batches.
pub const LOADERS: usize = 16;

// ---------------------------------------------------------------------------------------
// Quick mode and the run of the groups
// ---------------------------------------------------------------------------------------

/// Returns whether this run uses the quick sizes (invariant 1).
pub fn quick() -> bool {
    static QUICK: OnceLock<bool> = OnceLock::new();
    *QUICK.get_or_init(|| {
        let args: Vec<String> = std::env::args().collect();
        // criterion runs in test mode under `--test`, and when `--bench` is absent
        // (`cargo test --benches`): keep the setup small there too.
        let test_mode = args.iter().any(|a| a == "--test") || !args.iter().any(|a| a == "--bench");
        test_mode || std::env::var(QUICK_ENV).is_ok_and(|v| v == "1")
    })
}

/// Alternating blocks of the paired ratios: 10, or 2 in quick mode.
pub fn paired_rounds() -> usize {
    if quick() { 2 } else { 10 }
}

/// Runs `groups` in order with criterion configured for this mode, then prints criterion's
/// final summary and every `kvd-bench:` line again under a `kvd-bench summary` heading.
pub fn run_groups(groups: &[fn(&mut Criterion)]) {
    let (warm_up, measurement) = if quick() {
        (Duration::from_millis(100), Duration::from_millis(500))
    } else {
        (Duration::from_secs(1), Duration::from_secs(4))
    };
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(warm_up)
        .measurement_time(measurement)
        .configure_from_args();
    let start = Instant::now();
    for group in groups {
        group(&mut c);
    }
    c.final_summary();
    let lines = summary().lock().unwrap_or_else(|p| p.into_inner());
    println!();
    println!(
        "kvd-bench summary ({}, {:.0} s):",
        if quick() {
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

/// Reads the load average, then opens the benchmark group `name` with the settings every
/// group shares; returns both (the load is reported with the group's figures).
pub fn start_group<'a>(c: &'a mut Criterion, name: &str) -> (String, BenchmarkGroup<'a, WallTime>) {
    let load = load_average();
    let mut group = c.benchmark_group(name);
    // Flat: every sample runs the same number of iterations, which suits long and
    // one-shot measurements; criterion's own settings come from `run_groups`.
    group.sampling_mode(SamplingMode::Flat);
    (load, group)
}

// ---------------------------------------------------------------------------------------
// Recording and reporting
// ---------------------------------------------------------------------------------------

/// The (iterations, time) pairs one benchmark's `iter_custom` returned, warm-up included.
#[derive(Debug, Default)]
pub struct Samples {
    runs: Vec<(u64, Duration)>,
}

impl Samples {
    pub fn record(&mut self, iters: u64, elapsed: Duration) {
        self.runs.push((iters, elapsed));
    }

    /// Returns whether nothing was recorded (the benchmark was filtered out).
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The measured samples: criterion runs the warm-up first, then `SAMPLES` samples.
    fn measured(&self) -> &[(u64, Duration)] {
        &self.runs[self.runs.len().saturating_sub(SAMPLES)..]
    }

    /// Median of `elements × iterations / seconds` over the measured samples.
    pub fn median_rate(&self, elements_per_iter: f64) -> Option<f64> {
        let rates: Vec<f64> = self
            .measured()
            .iter()
            .map(|(iters, d)| *iters as f64 * elements_per_iter / d.as_secs_f64().max(1e-12))
            .collect();
        median(rates)
    }

    /// Iterations run in total, warm-up included.
    pub fn total_iters(&self) -> u64 {
        self.runs.iter().map(|(iters, _)| iters).sum()
    }

    /// Median seconds per iteration over the measured samples.
    pub fn median_secs(&self) -> Option<f64> {
        let secs = self
            .measured()
            .iter()
            .map(|(iters, d)| d.as_secs_f64() / (*iters).max(1) as f64)
            .collect();
        median(secs)
    }
}

/// Returns the median of `values`, `None` when there are none.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
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

/// Prints `line` as a `kvd-bench:` line and keeps it for the summary (invariant 2).
pub fn report(line: String) {
    println!("kvd-bench: {line}");
    summary()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(line);
}

/// Returns `rate` rounded to a whole number, with thousands separated by commas.
pub fn fmt_rate(rate: f64) -> String {
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
pub fn report_load(group: &str, load: &str) {
    report(format!("{group}: load average at start {load}"));
}

// ---------------------------------------------------------------------------------------
// Engine setup
// ---------------------------------------------------------------------------------------

/// The value of every write-throughput Put: `VALUE_BYTES` bytes.
pub fn value() -> Bytes {
    Bytes::from(vec![b'v'; VALUE_BYTES])
}

/// The configuration every measurement runs with: the default, durable one.
pub fn durable_config() -> Config {
    Config::default()
}

/// The configuration data sets are loaded with: no fsync (the close makes it durable).
pub fn load_config() -> Config {
    Config {
        unsafe_no_fsync: true,
        ..Config::default()
    }
}

/// Opens a durable engine in a new directory.
pub fn fresh_engine() -> (TempDir, Engine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::open(dir.path(), durable_config()).expect("open");
    (dir, engine)
}

/// Copies the database file of `from` into a new directory.
pub fn copy_store(from: &Path) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("kvd.redb");
    fs::copy(from.join("kvd.redb"), &copy).expect("copy store");
    // The copy's pages reach the disk now, not by the kernel's writeback in the middle of
    // the measurement that follows (a 1 GiB copy left dirty delayed a defrag's log syncs).
    fs::File::open(&copy)
        .and_then(|f| f.sync_all())
        .expect("sync the copy");
    dir
}

/// Returns (bytes allocated inside the file, file length) of the closed store in `dir`, read
/// with redb directly.
pub fn db_sizes(dir: &Path) -> (u64, u64) {
    let path = dir.join("kvd.redb");
    let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let db = redb::Database::open(&path).expect("open closed store with redb");
    let txn = db.begin_write().expect("begin");
    let stats = txn.stats().expect("stats");
    let in_use = stats.allocated_pages() * stats.page_size() as u64;
    txn.abort().expect("abort");
    (in_use, len)
}

/// Runs `each(n)` for every `n` in `0..count` from `LOADERS` threads; thread `t` takes
/// `t, t + LOADERS, ..`.
pub fn on_loaders(count: u64, each: impl Fn(u64) + Sync) {
    std::thread::scope(|s| {
        for t in 0..LOADERS as u64 {
            let each = &each;
            s.spawn(move || {
                for n in (t..count).step_by(LOADERS) {
                    each(n);
                }
            });
        }
    });
}

/// Runs `total` durable Puts spread over `writers` threads, writer `t`'s `i`-th Put going to
/// `key_of(t, i)`; returns the wall time from the moment all threads are ready to the last
/// answer.
pub fn run_writers(
    engine: &Engine,
    writers: usize,
    total: u64,
    key_of: impl Fn(usize, u64) -> String + Sync,
) -> Duration {
    let value = value();
    let barrier = Barrier::new(writers + 1);
    let per = total / writers as u64;
    let extra = total % writers as u64;
    std::thread::scope(|s| {
        for t in 0..writers {
            let count = per + u64::from((t as u64) < extra);
            let (value, barrier, key_of) = (value.clone(), &barrier, &key_of);
            s.spawn(move || {
                barrier.wait();
                for i in 0..count {
                    engine
                        .put(PutRequest::new(key_of(t, i), value.clone()))
                        .expect("put");
                }
            });
        }
        barrier.wait();
        // Leaving the scope joins every writer.
        Instant::now()
    })
    .elapsed()
}

/// Runs `total` durable Puts from `writers` asynchronous writers and returns the elapsed
/// time: each writer has one Put in flight at a time, submitted with `Engine::submit_put`,
/// and one driver thread submits a writer's next Put when its completion arrives. This is
/// how the server drives the engine (many requests in flight, few threads), where
/// [`run_writers`] blocks one thread per writer. A driver's burst of submissions (every
/// completion ready at once) runs inside `kvd::in_burst`, as the server's connection
/// threads do, so the burst shares a batch.
pub fn run_async_writers(
    engine: &Engine,
    writers: usize,
    total: u64,
    key_of: impl Fn(usize, u64) -> String,
) -> Duration {
    let value = value();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<usize>();
    let per = total / writers as u64;
    let extra = total % writers as u64;
    let quota: Vec<u64> = (0..writers)
        .map(|t| per + u64::from((t as u64) < extra))
        .collect();
    let mut issued = vec![0u64; writers];
    let submit = |t: usize, issued: &mut [u64]| {
        let i = issued[t];
        issued[t] += 1;
        let done_tx = done_tx.clone();
        engine.submit_put(
            PutRequest::new(key_of(t, i), value.clone()),
            Box::new(move |r| {
                r.expect("put");
                let _ = done_tx.send(t);
            }),
        );
    };
    let started = Instant::now();
    kvd::in_burst(|| {
        for t in (0..writers).filter(|t| quota[*t] > 0) {
            submit(t, &mut issued);
        }
    });
    let mut completed = 0u64;
    while completed < total {
        let first = done_rx.recv().expect("a writer's completion");
        let ready: Vec<usize> = std::iter::once(first).chain(done_rx.try_iter()).collect();
        completed += ready.len() as u64;
        kvd::in_burst(|| {
            for t in ready {
                if issued[t] < quota[t] {
                    submit(t, &mut issued);
                }
            }
        });
    }
    started.elapsed()
}

/// Alternates blocks of `first` and `second` doing the same work, `rounds` times (switching
/// which goes first), and returns the median of `time of second / time of first`, that is of
/// the throughput of `first` over that of `second`. Pairing neighbouring blocks cancels most
/// of the drift a shared machine adds between two benchmarks run one after the other.
pub fn paired_ratio(
    rounds: usize,
    mut first: impl FnMut() -> Duration,
    mut second: impl FnMut() -> Duration,
) -> Option<f64> {
    let mut ratios = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (a, b) = if round % 2 == 0 {
            let a = first();
            (a, second())
        } else {
            let b = second();
            (first(), b)
        };
        ratios.push(b.as_secs_f64() / a.as_secs_f64().max(1e-12));
    }
    median(ratios)
}
