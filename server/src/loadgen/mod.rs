//! The load generator of `kvd bench`: N clients over M gRPC connections send etcd KV
//! requests (put, range or txn) to any etcd v3 endpoint — kvd or etcd — and measure
//! throughput and latency.
//!
//! Owns: the workloads, the client loops, the optional preload of the key space, the
//! progress line, and the report (`report.rs`).
//!
//! Invariants:
//! - BENCH-1: every loop is bounded in count and in time: the run stops after `total`
//!   requests or after `duration`, whichever comes first (with a `rate`, a request due
//!   after the deadline is not sent); each request has a deadline
//!   ([`REQUEST_TIMEOUT`]); the preload writes each key of the key space once; the run stops
//!   early after `max_errors` failed requests.
//! - BENCH-2: counts add up: `requests = succeeded + errors`, and the latency histogram holds
//!   exactly the succeeded requests. Preload requests are not counted.
//! - BENCH-3: the requests are determined by the seed: client `i` draws keys from its own
//!   generator seeded from `seed` and `i`, so two runs send the same key sequences.
//! - BENCH-4: keys are `prefix` + a zero-padded number of a fixed width, so key order is
//!   number order and a range of `range_keys` consecutive numbers holds exactly that many
//!   keys once the key space is loaded.
//!
//! Contact points: `server/src/bin/kvd.rs` parses `kvd bench` flags into [`BenchConfig`] and prints
//! the [`report::Report`]; `tests/server_bench.rs` checks the JSON report.

mod histogram;
pub mod report;

use std::fmt;
use std::io::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::transport::{Channel, Endpoint};

use crate::loadgen::histogram::Histogram;
use crate::loadgen::report::{Preload, Report};
use crate::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::pb::etcdserverpb::kv_client::KvClient;
use crate::pb::etcdserverpb::request_op::Request as Op;
use crate::pb::etcdserverpb::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use kvd::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering, lock};

/// Deadline of one request (BENCH-1).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest key space (keys the preload may write).
pub const KEY_SPACE_MAX: u64 = 10_000_000;
/// Most clients (concurrent requests).
pub const CLIENTS_MAX: usize = 10_000;
/// Longest run.
pub const DURATION_MAX: Duration = Duration::from_secs(3_600);
/// Puts per preload transaction, at most (etcd's default `--max-txn-ops`).
pub const PRELOAD_TXN_OPS_MAX: usize = 128;
/// Value bytes per preload transaction, at most (well under etcd's 1.5 MiB request limit).
pub const PRELOAD_TXN_BYTES_MAX: usize = 512 * 1024;
/// Puts in one txn of the txn workload, at most (etcd's default `--max-txn-ops`).
pub const TXN_OPS_MAX: usize = 128;
/// Largest value.
pub const VALUE_SIZE_MAX: usize = 1 << 20;
/// How often the progress line is printed.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

const _: () = assert!(PRELOAD_TXN_BYTES_MAX < 1_572_864);

/// What each request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One Put of a random key.
    Put,
    /// One Range over `range_keys` consecutive keys from a random start.
    Range,
    /// One Txn: a compare on the first key (always true) and `txn_ops` Puts of distinct keys.
    Txn,
}

impl Workload {
    /// Returns the workload's name as the command line and the report spell it.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::Range => "range",
            Workload::Txn => "txn",
        }
    }
}

/// A benchmark run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Client URLs (`http://host:port`); connections are spread over them.
    pub endpoints: Vec<String>,
    /// What each request does.
    pub workload: Workload,
    /// Concurrent clients, each with one request in flight.
    pub clients: usize,
    /// gRPC connections (HTTP/2) the clients share, round-robin.
    pub connections: usize,
    /// Number of distinct keys.
    pub key_space: u64,
    /// Prefix of every key.
    pub key_prefix: String,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys per range (range workload).
    pub range_keys: u64,
    /// Puts per txn (txn workload).
    pub txn_ops: usize,
    /// Serializable ranges (etcd's `--consistency=s`); linearizable otherwise.
    pub serializable: bool,
    /// Requests to send, at most (BENCH-1).
    pub total: u64,
    /// Longest the measured run may take (BENCH-1).
    pub duration: Duration,
    /// Write every key of the key space before measuring.
    pub preload: bool,
    /// Seed of the key generators (BENCH-3).
    pub seed: u64,
    /// Stop after this many failed requests.
    pub max_errors: u64,
    /// Requests per second across all clients, at most (requests start on a fixed
    /// schedule); 0 sends as fast as the clients can.
    pub rate: u64,
    /// After a refusal with a retry hint, wait that long before the next request (never past
    /// the run's deadline, BENCH-1).
    pub honour_retry_after: bool,
    /// Print a progress line on stderr every [`PROGRESS_INTERVAL`].
    pub progress: bool,
}

/// Why a run could not be made.
#[derive(Debug)]
pub enum BenchError {
    /// A setting is out of range.
    Config(String),
    /// An endpoint could not be reached.
    Connect(String),
    /// The preload failed.
    Preload(String),
    /// The async runtime could not start.
    Runtime(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Config(what) => write!(f, "kvd bench: {what}"),
            BenchError::Connect(what) => write!(f, "kvd bench: cannot connect: {what}"),
            BenchError::Preload(what) => write!(f, "kvd bench: preload failed: {what}"),
            BenchError::Runtime(what) => write!(f, "kvd bench: {what}"),
        }
    }
}

impl std::error::Error for BenchError {}

impl BenchConfig {
    fn validate(&self) -> Result<(), BenchError> {
        let fail = |what: String| Err(BenchError::Config(what));
        if self.endpoints.is_empty() {
            return fail("no endpoint given".into());
        }
        if self.clients == 0 || self.clients > CLIENTS_MAX {
            return fail(format!("--clients must be 1..={CLIENTS_MAX}"));
        }
        if self.connections == 0 || self.connections > self.clients {
            return fail("--conns must be 1..=--clients".into());
        }
        if self.key_space == 0 || self.key_space > KEY_SPACE_MAX {
            return fail(format!("--key-space must be 1..={KEY_SPACE_MAX}"));
        }
        if self.value_size > VALUE_SIZE_MAX {
            return fail(format!("--value-size must be at most {VALUE_SIZE_MAX}"));
        }
        if self.workload == Workload::Range
            && (self.range_keys == 0 || self.range_keys > self.key_space)
        {
            return fail("--range-keys must be 1..=--key-space".into());
        }
        if self.workload == Workload::Txn
            && (self.txn_ops == 0
                || self.txn_ops > TXN_OPS_MAX
                || self.txn_ops as u64 > self.key_space)
        {
            return fail(format!(
                "--txn-ops must be 1..={TXN_OPS_MAX} and at most --key-space"
            ));
        }
        if self.duration.is_zero() || self.duration > DURATION_MAX {
            return fail(format!(
                "--duration must be more than 0 and at most {}s",
                DURATION_MAX.as_secs()
            ));
        }
        if self.total == 0 {
            return fail("--total must be at least 1".into());
        }
        Ok(())
    }
}

/// Names keys (BENCH-4).
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
    width: usize,
}

impl Keys {
    fn new(prefix: &str, key_space: u64) -> Keys {
        // The width of `key_space` itself, so the end of a range at the last key is as wide
        // as the keys and sorts after them.
        Keys {
            prefix: prefix.to_owned(),
            width: key_space.to_string().len(),
        }
    }

    fn key(&self, n: u64) -> Bytes {
        Bytes::from(format!("{}{:0width$}", self.prefix, n, width = self.width))
    }
}

/// xorshift64*: small, fast, and deterministic from its seed (BENCH-3).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        // splitmix64 of the pair, so neighbouring clients get unrelated sequences; never 0.
        let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Returns a number in `0..bound` (`bound > 0`).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u64
    }
}

/// What every client shares.
#[derive(Debug)]
struct Shared {
    config: BenchConfig,
    keys: Keys,
    value: Bytes,
    /// Requests started (BENCH-1: a client takes a ticket before each request).
    tickets: AtomicU64,
    succeeded: AtomicU64,
    errors: AtomicU64,
    keys_returned: AtomicU64,
    stop: AtomicBool,
    started: Instant,
    deadline: Instant,
    first_error: Mutex<Option<String>>,
}

impl Shared {
    /// Takes a ticket for one more request, or `None` when the run is over (BENCH-1); with
    /// a rate, the ticket says when its request is due.
    fn next_ticket(&self) -> Option<Instant> {
        if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return None;
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        if ticket >= self.config.total {
            return None;
        }
        let due = match self.config.rate {
            0 => self.started,
            rate => self.started + Duration::from_secs_f64(ticket as f64 / rate as f64),
        };
        // A request due after the deadline is not sent (BENCH-1 bounds the run in time).
        (due < self.deadline).then_some(due)
    }

    fn failed(&self, error: String) {
        let errors = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
        let mut first = lock(&self.first_error);
        if first.is_none() {
            *first = Some(error);
        }
        if errors >= self.config.max_errors {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Runs the benchmark described by `config` and returns its report.
pub fn run(config: BenchConfig) -> Result<Report, BenchError> {
    config.validate()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kvd-bench")
        .build()
        .map_err(|e| BenchError::Runtime(format!("start the async runtime: {e}")))?;
    runtime.block_on(run_async(config))
}

async fn run_async(config: BenchConfig) -> Result<Report, BenchError> {
    let channels = connect_all(&config).await?;
    let keys = Keys::new(&config.key_prefix, config.key_space);
    let value = Bytes::from(vec![b'v'; config.value_size]);
    let preload = if config.preload {
        Some(preload(&config, &channels, &keys, &value).await?)
    } else {
        None
    };
    let started = Instant::now();
    let shared = Arc::new(Shared {
        keys,
        value,
        tickets: AtomicU64::new(0),
        succeeded: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        keys_returned: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        started,
        deadline: started + config.duration,
        first_error: Mutex::new(None),
        config,
    });
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..shared.config.clients {
        let kv = KvClient::new(channels[i % channels.len()].clone())
            .max_decoding_message_size(usize::MAX);
        let shared = shared.clone();
        clients.spawn(async move { client(&shared, kv, i as u64).await });
    }
    let progress = shared
        .config
        .progress
        .then(|| tokio::spawn(progress_loop(shared.clone(), started)));
    let mut latencies = Histogram::default();
    while let Some(joined) = clients.join_next().await {
        match joined {
            Ok(h) => latencies.merge(&h),
            Err(e) => shared.failed(format!("a client task failed: {e}")),
        }
    }
    let elapsed = started.elapsed();
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }
    let succeeded = shared.succeeded.load(Ordering::Relaxed);
    let errors = shared.errors.load(Ordering::Relaxed);
    debug_assert_eq!(latencies.count(), succeeded, "BENCH-2");
    let first_error = lock(&shared.first_error).clone();
    Ok(Report {
        workload: shared.config.workload,
        endpoints: shared.config.endpoints.clone(),
        clients: shared.config.clients,
        connections: shared.config.connections,
        key_space: shared.config.key_space,
        value_size: shared.config.value_size,
        range_keys: shared.config.range_keys,
        txn_ops: shared.config.txn_ops,
        serializable: shared.config.serializable,
        requests: succeeded + errors,
        succeeded,
        errors,
        keys_returned: shared.keys_returned.load(Ordering::Relaxed),
        elapsed,
        latencies,
        preload,
        first_error,
    })
}

/// Opens the gRPC connections, spread over the endpoints.
async fn connect_all(config: &BenchConfig) -> Result<Vec<Channel>, BenchError> {
    let mut channels = Vec::with_capacity(config.connections);
    for i in 0..config.connections {
        let url = &config.endpoints[i % config.endpoints.len()];
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| BenchError::Config(format!("endpoint {url:?}: {e}")))?
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| BenchError::Connect(format!("{url}: {e}")))?;
        channels.push(channel);
    }
    Ok(channels)
}

/// Writes every key of the key space once, in transactions spread over the clients
/// (BENCH-1: each chunk of keys is written once).
async fn preload(
    config: &BenchConfig,
    channels: &[Channel],
    keys: &Keys,
    value: &Bytes,
) -> Result<Preload, BenchError> {
    let started = Instant::now();
    let per_txn = (PRELOAD_TXN_BYTES_MAX / config.value_size.max(1)).clamp(1, PRELOAD_TXN_OPS_MAX);
    let chunks = config.key_space.div_ceil(per_txn as u64);
    let next = Arc::new(AtomicU64::new(0));
    let mut loaders = tokio::task::JoinSet::new();
    for i in 0..config.clients.min(chunks as usize) {
        let mut kv = KvClient::new(channels[i % channels.len()].clone());
        let next = next.clone();
        let (keys, value, key_space) = (keys.clone(), value.clone(), config.key_space);
        loaders.spawn(async move {
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                if chunk >= chunks {
                    return Ok::<(), String>(());
                }
                let first = chunk * per_txn as u64;
                let last = (first + per_txn as u64).min(key_space);
                let success = (first..last)
                    .map(|n| put_op(keys.key(n), value.clone()))
                    .collect();
                let txn = TxnRequest {
                    success,
                    ..TxnRequest::default()
                };
                kv.txn(txn).await.map_err(|s| s.message().to_owned())?;
            }
        });
    }
    let mut ticker = tokio::time::interval(PROGRESS_INTERVAL);
    ticker.tick().await;
    loop {
        let joined = tokio::select! {
            joined = loaders.join_next() => joined,
            _ = ticker.tick() => {
                if config.progress {
                    let done = (next.load(Ordering::Relaxed).min(chunks) * per_txn as u64)
                        .min(config.key_space);
                    eprint!("\rkvd bench: preloading {done}/{} keys   ", config.key_space);
                }
                continue;
            }
        };
        match joined {
            None => break,
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(message))) => return Err(BenchError::Preload(message)),
            Some(Err(e)) => return Err(BenchError::Preload(e.to_string())),
        }
    }
    if config.progress && started.elapsed() >= PROGRESS_INTERVAL {
        eprintln!();
    }
    Ok(Preload {
        keys: config.key_space,
        elapsed: started.elapsed(),
    })
}

fn put_op(key: Bytes, value: Bytes) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key,
            value,
            ..PutRequest::default()
        })),
    }
}

/// One client: requests one after another until the run is over; returns its latencies.
async fn client(shared: &Shared, mut kv: KvClient<Channel>, index: u64) -> Histogram {
    let mut rng = Rng::new(shared.config.seed, index);
    let mut latencies = Histogram::default();
    while let Some(due) = shared.next_ticket() {
        // A paced run measures from the request's due time, so a late start counts (no
        // coordinated omission); an unpaced one from the send.
        let started = if shared.config.rate == 0 {
            Instant::now()
        } else {
            tokio::time::sleep_until(due.into()).await;
            due
        };
        let outcome = one_request(shared, &mut kv, &mut rng).await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        match outcome {
            Ok(keys) => {
                latencies.record(micros);
                shared.succeeded.fetch_add(1, Ordering::Relaxed);
                shared.keys_returned.fetch_add(keys, Ordering::Relaxed);
            }
            Err(status) => {
                shared.failed(format!("{:?}: {}", status.code(), status.message()));
                let hint = retry_hint(&status).filter(|_| shared.config.honour_retry_after);
                if let Some(hint) = hint {
                    let until = (Instant::now() + hint).min(shared.deadline);
                    tokio::time::sleep_until(until.into()).await;
                }
            }
        }
    }
    latencies
}

/// The wait a refusal asks for: the `retry-after-ms` of a `ResourceExhausted` status.
fn retry_hint(status: &tonic::Status) -> Option<Duration> {
    if status.code() != tonic::Code::ResourceExhausted {
        return None;
    }
    let millis = status
        .metadata()
        .get(crate::status::RETRY_AFTER_MS_METADATA)?
        .to_str()
        .ok()?
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_millis(millis))
}

/// Sends one request of the workload; returns the number of keys a range returned.
async fn one_request(
    shared: &Shared,
    kv: &mut KvClient<Channel>,
    rng: &mut Rng,
) -> Result<u64, tonic::Status> {
    let config = &shared.config;
    match config.workload {
        Workload::Put => {
            let key = shared.keys.key(rng.below(config.key_space));
            let put = PutRequest {
                key,
                value: shared.value.clone(),
                ..PutRequest::default()
            };
            kv.put(put).await?;
            Ok(0)
        }
        Workload::Range => {
            let start = rng.below(config.key_space - config.range_keys + 1);
            let range = RangeRequest {
                key: shared.keys.key(start),
                range_end: shared.keys.key(start + config.range_keys),
                serializable: config.serializable,
                ..RangeRequest::default()
            };
            let resp = kv.range(range).await?.into_inner();
            Ok(resp.kvs.len() as u64)
        }
        Workload::Txn => {
            let mut chosen: Vec<u64> = Vec::with_capacity(config.txn_ops);
            // Distinct keys: etcd refuses a txn that writes one key twice. Bounded: at most
            // `txn_ops` keys are kept and each draw is kept unless already chosen; with
            // `txn_ops ≤ key_space` the expected draws are small, and the cap below ends it.
            let mut draws = 0;
            while chosen.len() < config.txn_ops && draws < config.txn_ops * 64 {
                let n = rng.below(config.key_space);
                if !chosen.contains(&n) {
                    chosen.push(n);
                }
                draws += 1;
            }
            let first = shared.keys.key(chosen[0]);
            let compare = Compare {
                result: CompareResult::NotEqual as i32,
                target: CompareTarget::Version as i32,
                key: first,
                range_end: Bytes::new(),
                target_union: Some(TargetUnion::Version(-1)),
            };
            let success = chosen
                .into_iter()
                .map(|n| put_op(shared.keys.key(n), shared.value.clone()))
                .collect();
            let txn = TxnRequest {
                compare: vec![compare],
                success,
                failure: Vec::new(),
            };
            kv.txn(txn).await?;
            Ok(0)
        }
    }
}

/// Prints one progress line on stderr every [`PROGRESS_INTERVAL`] until aborted.
async fn progress_loop(shared: Arc<Shared>, started: Instant) {
    let mut last = 0;
    let mut ticker = tokio::time::interval(PROGRESS_INTERVAL);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let done = shared.succeeded.load(Ordering::Relaxed) + shared.errors.load(Ordering::Relaxed);
        let errors = shared.errors.load(Ordering::Relaxed);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\rkvd bench: {} {:>6.1}s {done}/{} requests, {} req/s, {errors} errors   ",
            shared.config.workload.name(),
            started.elapsed().as_secs_f64(),
            shared.config.total,
            done - last,
        );
        let _ = err.flush();
        last = done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_hint_is_read_from_a_too_many_requests_refusal_only() {
        let refusal = |code: tonic::Code, hint: &str| {
            let mut status = tonic::Status::new(code, "etcdserver: too many requests");
            status.metadata_mut().insert(
                crate::status::RETRY_AFTER_MS_METADATA,
                hint.parse().expect("ascii metadata"),
            );
            status
        };
        let hint = retry_hint(&refusal(tonic::Code::ResourceExhausted, "25"));
        assert_eq!(hint, Some(Duration::from_millis(25)));
        assert_eq!(retry_hint(&refusal(tonic::Code::Unavailable, "25")), None);
        assert_eq!(
            retry_hint(&refusal(tonic::Code::ResourceExhausted, "soon")),
            None
        );
        let bare = tonic::Status::resource_exhausted("etcdserver: too many requests");
        assert_eq!(retry_hint(&bare), None);
    }

    #[test]
    fn keys_sort_in_number_order_and_the_range_end_fits() {
        let keys = Keys::new("b/", 1_000);
        assert_eq!(&keys.key(7)[..], b"b/0007");
        assert!(keys.key(999) < keys.key(1_000));
        assert!(keys.key(99) < keys.key(100));
    }

    #[test]
    fn the_generator_is_determined_by_its_seed_and_stays_in_bounds() {
        let draw = |seed, stream| {
            let mut rng = Rng::new(seed, stream);
            (0..100).map(|_| rng.below(10)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 0), draw(1, 0));
        assert_ne!(draw(1, 0), draw(1, 1));
        assert!(draw(5, 3).iter().all(|n| *n < 10));
        assert!(draw(5, 3).iter().any(|n| *n != draw(5, 3)[0]));
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let good = BenchConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            workload: Workload::Range,
            clients: 4,
            connections: 2,
            key_space: 100,
            key_prefix: "k/".into(),
            value_size: 8,
            range_keys: 10,
            txn_ops: 1,
            serializable: false,
            total: 10,
            duration: Duration::from_secs(1),
            preload: true,
            seed: 1,
            max_errors: 10,
            rate: 0,
            honour_retry_after: false,
            progress: false,
        };
        assert!(good.validate().is_ok());
        let bad = [
            BenchConfig {
                connections: 5,
                ..good.clone()
            },
            BenchConfig {
                range_keys: 101,
                ..good.clone()
            },
            BenchConfig {
                duration: Duration::ZERO,
                ..good.clone()
            },
            BenchConfig {
                workload: Workload::Txn,
                txn_ops: 129,
                ..good.clone()
            },
            BenchConfig {
                endpoints: Vec::new(),
                ..good.clone()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
