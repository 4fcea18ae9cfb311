//! The `kvd` command: a single-member server speaking etcd's v3 gRPC API over a data
//! directory, with etcd's flag names.
//!
//! Owns: flag parsing, log setup and the exit code.
//!
//! Invariants:
//! - BIN-1: every flag carries etcd's name and default where etcd has one; flags kvd accepts
//!   but does not act on yet say so in their help text and in a warning at startup.
//! - BIN-2: the process exits 0 after a clean shutdown (SIGINT/SIGTERM) and non-zero with
//!   one clear line on stderr when it cannot start (for example, the data directory is in
//!   use by another kvd).
//! - BIN-3: the listening URLs are printed on stdout, one line each, once every listener is
//!   bound: `kvd: listening for client requests on http://HOST:PORT`.
//! - BIN-4: `kvd bench WORKLOAD [flags]` runs the load generator against any etcd endpoint
//!   instead of serving; it prints its report on stdout (text, or one JSON line with
//!   `--json`) and exits 0 if every request succeeded, 2 if some failed, 1 if the run could
//!   not be made. Serving flags and `bench` do not mix.
//!
//! Contact points: `kvd_server::run`; `docs/operations.md` documents the flags.

mod cli {
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::ExitCode;
    use std::time::Duration;

    use clap::{Args, Parser, Subcommand, ValueEnum};
    use kvd_server::loadgen::{self, BenchConfig, Workload};

    /// Default of `--max-request-bytes` (etcd's 1.5 MiB).
    const MAX_REQUEST_BYTES_DEFAULT: usize = 1_572_864;
    /// Default of `--max-txn-ops` (etcd's).
    const MAX_TXN_OPS_DEFAULT: usize = 128;

    /// kvd: an etcd-compatible single-member key-value server on an embedded MVCC engine.
    ///
    /// Speaks etcd's v3 gRPC API (etcdctl and etcd client libraries work unchanged) and
    /// serves /health, /version and /metrics on the same port.
    #[derive(Debug, Parser)]
    #[command(
        name = "kvd",
        version,
        about,
        long_about = None,
        args_conflicts_with_subcommands = true
    )]
    struct Cli {
        #[command(subcommand)]
        command: Option<Command>,
        #[command(flatten)]
        serve: Flags,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        /// Load generator: sends etcd KV requests (put, range or txn) to any etcd v3
        /// endpoint, kvd or etcd, and reports throughput and latency percentiles.
        Bench(BenchFlags),
    }

    /// The serving flags (the default command).
    #[derive(Debug, Args)]
    struct Flags {
        /// Path to the data directory (created if missing; locked while kvd runs).
        #[arg(long, value_name = "DIR", default_value = "./default.kvd")]
        data_dir: PathBuf,

        /// Human-readable name of this member, shown by `etcdctl member list`.
        #[arg(long, default_value = "default")]
        name: String,

        /// Comma-separated URLs to listen on for client traffic (gRPC and HTTP on each);
        /// only http:// is supported. Port 0 picks a free port (printed at startup).
        #[arg(
            long,
            value_name = "URLS",
            value_delimiter = ',',
            default_value = "http://127.0.0.1:2379"
        )]
        listen_client_urls: Vec<String>,

        /// Comma-separated client URLs to advertise in MemberList [default: the listening
        /// URLs].
        #[arg(long, value_name = "URLS", value_delimiter = ',')]
        advertise_client_urls: Vec<String>,

        /// Space quota in bytes: 0 means the default (2 GiB), a negative value disables it.
        /// Past it, writes that need space fail with "database space exceeded" and raise
        /// the NOSPACE alarm, as in etcd; reported by `endpoint status` (dbSizeQuota).
        #[arg(
            long,
            value_name = "BYTES",
            default_value_t = 0,
            allow_negative_numbers = true
        )]
        quota_backend_bytes: i64,

        /// Largest client request the server accepts, in bytes. gRPC messages up to this
        /// plus 512 KiB are read; larger ones are refused before decoding.
        #[arg(long, value_name = "BYTES", default_value_t = MAX_REQUEST_BYTES_DEFAULT)]
        max_request_bytes: usize,

        /// Largest number of operations in one transaction.
        #[arg(long, value_name = "N", default_value_t = MAX_TXN_OPS_DEFAULT)]
        max_txn_ops: usize,

        /// Writes admitted and not yet committed, at most, shared fairly between the roles
        /// that own them; past it a write gets "etcdserver: too many requests" with a retry
        /// hint. Zero or negative is refused (Velero ignores such a value silently).
        #[arg(
            long,
            value_name = "N",
            default_value_t = kvd_server::PREPARE_QUEUE_LENGTH_DEFAULT,
            allow_negative_numbers = true
        )]
        prepare_queue_length: i64,

        /// Automatic compaction mode: 'periodic' (keep the history of the last RETENTION,
        /// a duration like '1h' or a number of hours) or 'revision' (keep the last RETENTION
        /// revisions).
        #[arg(long, value_name = "MODE", default_value = "periodic")]
        auto_compaction_mode: String,

        /// Automatic compaction retention ('0' disables; e.g. '1h', '30m' or '1000').
        #[arg(long, value_name = "RETENTION", default_value = "0")]
        auto_compaction_retention: String,

        /// Most allocations preparing at once (ALLOCATE with "prepare"), across all roles,
        /// each role within its fair share; 0 turns the queue off. Persisted: a start
        /// without the flag keeps the last value set (by a flag or UPDATE_PREPARE_QUEUE).
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        allocation_prepare_queue_length: Option<i64>,

        /// Comma-separated origins allowed by CORS on the HTTP answers (the JSON gateway,
        /// /health, /version, /metrics); '*' (etcd's default) allows every origin.
        #[arg(
            long,
            value_name = "ORIGINS",
            value_delimiter = ',',
            default_value = kvd_server::CORS_DEFAULT
        )]
        cors: Vec<String>,

        /// Log level: debug, info, warn or error. Debug logs one line per gRPC request.
        #[arg(long, value_name = "LEVEL", default_value = "info")]
        log_level: tracing::Level,
    }

    /// What each benchmark request does.
    #[derive(Debug, Clone, Copy, ValueEnum)]
    enum WorkloadArg {
        /// One Put of a random key of the key space.
        Put,
        /// One Range over --range-keys consecutive keys (the key space is preloaded first).
        Range,
        /// One Txn with a compare and --txn-ops Puts of distinct random keys.
        Txn,
    }

    /// Flags of `kvd bench` (BIN-4).
    #[derive(Debug, Args)]
    struct BenchFlags {
        /// What each request does.
        #[arg(value_enum)]
        workload: WorkloadArg,

        /// Comma-separated client URLs (`http://host:port`, or `host:port`); connections
        /// are spread over them.
        #[arg(
            long,
            value_name = "URLS",
            value_delimiter = ',',
            default_value = "http://127.0.0.1:2379"
        )]
        endpoints: Vec<String>,

        /// Concurrent clients, each with one request in flight.
        #[arg(long, value_name = "N", default_value_t = 16)]
        clients: usize,

        /// gRPC connections the clients share.
        #[arg(long, value_name = "M", default_value_t = 4)]
        conns: usize,

        /// Number of distinct keys.
        #[arg(long, value_name = "N", default_value_t = 10_000)]
        key_space: u64,

        /// Prefix of every key.
        #[arg(long, value_name = "PREFIX", default_value = "bench/")]
        key_prefix: String,

        /// Bytes per value.
        #[arg(long, value_name = "BYTES", default_value_t = 256)]
        value_size: usize,

        /// Keys per range (range workload).
        #[arg(long, value_name = "N", default_value_t = 1_000)]
        range_keys: u64,

        /// Puts per txn (txn workload).
        #[arg(long, value_name = "N", default_value_t = 1)]
        txn_ops: usize,

        /// Range consistency: l (linearizable) or s (serializable), as etcdctl's.
        #[arg(long, value_name = "C", default_value = "l", value_parser = ["l", "s"])]
        consistency: String,

        /// Requests to send, at most.
        #[arg(long, value_name = "N", default_value_t = 10_000)]
        total: u64,

        /// Longest the measured run may take (e.g. 30s, 500ms, 2m).
        #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_duration)]
        duration: Duration,

        /// Write every key of the key space before measuring (the default for range).
        #[arg(long, conflicts_with = "no_preload")]
        preload: bool,

        /// Do not preload, even for range.
        #[arg(long)]
        no_preload: bool,

        /// Seed of the key generators; the same seed sends the same keys.
        #[arg(long, default_value_t = 1)]
        seed: u64,

        /// Stop after this many failed requests.
        #[arg(long, value_name = "N", default_value_t = 100)]
        max_errors: u64,

        /// Requests per second across all clients, at most, on a fixed schedule (latency
        /// counts from each request's due time); 0 sends as fast as the clients can.
        #[arg(long, value_name = "N", default_value_t = 0)]
        rate: u64,

        /// Print the report as one JSON line.
        #[arg(long)]
        json: bool,

        /// No progress line on stderr.
        #[arg(long)]
        quiet: bool,
    }

    /// Parses `30s`, `500ms`, `2m` or a bare number of seconds.
    fn parse_duration(text: &str) -> Result<Duration, String> {
        let text = text.trim();
        let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
            Some(at) => text.split_at(at),
            None => (text, "s"),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a duration like 30s, 500ms or 2m"))?;
        let seconds = match unit {
            "ms" => value / 1_000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3_600.0,
            _ => return Err(format!("unknown unit {unit:?} in {text:?} (ms, s, m or h)")),
        };
        Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
    }

    /// Returns `endpoint` with `http://` in front if it has no scheme.
    fn with_scheme(endpoint: &str) -> String {
        if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        }
    }

    /// Runs `kvd bench` and returns its exit code (BIN-4).
    fn bench_main(flags: BenchFlags) -> ExitCode {
        let workload = match flags.workload {
            WorkloadArg::Put => Workload::Put,
            WorkloadArg::Range => Workload::Range,
            WorkloadArg::Txn => Workload::Txn,
        };
        let config = BenchConfig {
            endpoints: flags.endpoints.iter().map(|e| with_scheme(e)).collect(),
            workload,
            clients: flags.clients,
            connections: flags.conns,
            key_space: flags.key_space,
            key_prefix: flags.key_prefix,
            value_size: flags.value_size,
            range_keys: flags.range_keys,
            txn_ops: flags.txn_ops,
            serializable: flags.consistency == "s",
            total: flags.total,
            duration: flags.duration,
            preload: flags.preload || (workload == Workload::Range && !flags.no_preload),
            seed: flags.seed,
            max_errors: flags.max_errors.max(1),
            rate: flags.rate,
            progress: !flags.quiet,
        };
        let report = match loadgen::run(config) {
            Ok(report) => report,
            Err(err) => {
                eprintln!("{err}");
                return ExitCode::FAILURE;
            }
        };
        let mut out = std::io::stdout().lock();
        let printed = if flags.json {
            writeln!(out, "{}", report.json())
        } else {
            write!(out, "{}", report.text())
        };
        if printed.and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
        if report.errors > 0 {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    }

    /// Parses the flags, runs the server (or `bench`) and returns the exit code (BIN-2).
    pub fn main() -> ExitCode {
        let cli = Cli::parse();
        if let Some(Command::Bench(flags)) = cli.command {
            return bench_main(flags);
        }
        let flags = cli.serve;
        tracing_subscriber::fmt()
            .with_max_level(flags.log_level)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        let auto_compaction = match auto_compaction(
            &flags.auto_compaction_mode,
            &flags.auto_compaction_retention,
        ) {
            Ok(mode) => mode,
            Err(message) => {
                eprintln!("kvd: {message}");
                return ExitCode::FAILURE;
            }
        };
        let allocation_prepare_queue_length = match flags.allocation_prepare_queue_length {
            None => None,
            Some(n) => match u64::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => {
                    eprintln!(
                        "kvd: --allocation-prepare-queue-length must be 0 (off) or more, not {n}"
                    );
                    return ExitCode::FAILURE;
                }
            },
        };
        let config = kvd_server::ServerConfig {
            allocation_prepare_queue_length,
            auto_compaction,
            data_dir: flags.data_dir,
            name: flags.name,
            listen_client_urls: flags.listen_client_urls,
            advertise_client_urls: flags.advertise_client_urls,
            quota_backend_bytes: flags.quota_backend_bytes,
            max_request_bytes: flags.max_request_bytes,
            max_txn_ops: flags.max_txn_ops,
            prepare_queue_length: flags.prepare_queue_length,
            cors: flags.cors,
        };
        match kvd_server::run(config, print_urls) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = %err, "kvd stopped");
                eprintln!("{err}");
                ExitCode::FAILURE
            }
        }
    }

    /// Prints the listening URLs on stdout (BIN-3) and flushes, so a supervisor reading a
    /// pipe sees them at once.
    fn print_urls(urls: &[String]) {
        let mut out = std::io::stdout().lock();
        for url in urls {
            // Nothing useful can be done if stdout is closed; the log has the URLs too.
            let _ = writeln!(out, "kvd: listening for client requests on {url}");
        }
        let _ = out.flush();
    }

    /// Parses etcd's auto-compaction flags: retention '0' disables; periodic takes a
    /// duration ('90s', '30m', '1h') or a plain number of hours; revision takes a count.
    fn auto_compaction(mode: &str, retention: &str) -> Result<Option<kvd::AutoCompaction>, String> {
        let retention = retention.trim();
        if retention == "0" || retention.is_empty() {
            return Ok(None);
        }
        let bad = || format!("invalid --auto-compaction-retention {retention:?} for mode {mode:?}");
        match mode {
            "revision" => retention
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .map(kvd::AutoCompaction::Revision)
                .map(Some)
                .ok_or_else(bad),
            "periodic" => {
                let (number, unit) = match retention
                    .char_indices()
                    .find(|(_, c)| c.is_ascii_alphabetic())
                {
                    Some((at, _)) => retention.split_at(at),
                    None => (retention, "h"),
                };
                let seconds_per = match unit {
                    "s" => 1.0,
                    "m" => 60.0,
                    "h" => 3600.0,
                    _ => return Err(bad()),
                };
                let value: f64 = number.parse().map_err(|_| bad())?;
                if !(value.is_finite() && value > 0.0) {
                    return Err(bad());
                }
                Ok(Some(kvd::AutoCompaction::Periodic(
                    Duration::from_secs_f64(value * seconds_per),
                )))
            }
            _ => Err(format!(
                "invalid --auto-compaction-mode {mode:?}: want 'periodic' or 'revision'"
            )),
        }
    }
}

fn main() -> std::process::ExitCode {
    cli::main()
}
