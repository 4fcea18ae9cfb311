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
//!   use by another kvd). A command line that cannot be parsed (an unknown flag or command,
//!   a missing argument, a word where a number goes) exits 1 with clap's error, for every
//!   command, so that 2 keeps the meaning `check`, `bench` and `reconcile` give it.
//! - BIN-3: the listening URLs are printed on stdout, one line each, once every listener is
//!   bound and the data directory is open: `kvd: listening for client requests on
//!   http://HOST:PORT` (`https://` for a TLS listener). The listeners are bound before the
//!   data directory is touched (`kvd_server` SRV-5), so a listen address kvd cannot use is
//!   refused (BIN-2) with the data directory left as it was.
//! - BIN-4: `kvd bench WORKLOAD [flags]` runs the load generator against any etcd endpoint
//!   instead of serving; it prints its report on stdout (text, or one JSON line with
//!   `--json`) and exits 0 if every request succeeded, 2 if some failed, 1 if the run could
//!   not be made. Serving flags and `bench` do not mix.
//! - BIN-5: `kvd reconcile [--repair] [--endpoints URLS]` asks a running kvd for its
//!   consumption drift (the operator API's `RECONCILE_CONSUMPTION`), prints the JSON answer
//!   on stdout and a summary on stderr, and exits 0 if the counters agree (or were
//!   repaired), 2 if they drift and were not repaired, 1 if no endpoint answered.
//! - BIN-7: `kvd snapshot save FILE [--endpoints URL | --data-dir DIR] [--format etcd|kvd]`, `kvd snapshot
//!   restore FILE --data-dir DIR [--skip-hash-check]` and `kvd snapshot status FILE [-w
//!   json]` (`snapshot_tool`) exit 0 on success and 1 with one `Error:` line on stderr.
//! - BIN-8: `kvd check --data-dir DIR` prints one JSON report and exits 0 if sound, 2 if
//!   damage was found, 1 if it could not run; `kvd defrag --data-dir DIR` exits 0 after a
//!   defrag that kept HashKV. Both refuse a directory a running kvd holds (OFFLINE-1).
//!   They, and `kvd snapshot restore`, say on stderr every 10 s that they are still at work.
//! - BIN-6: a flag value kvd cannot use is refused at start with a message that names the
//!   flag; durations are written as etcd's (Go's) are: `90s`, `10m`, `1h30m`, `0`.
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
        version = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("KVD_GIT_COMMIT"), ")"),
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
        /// Consumption reconciliation: asks a running kvd whether its consumption counters
        /// agree with a recount from the keys and records, and with --repair replaces the
        /// ones that drifted (the operator API's RECONCILE_CONSUMPTION).
        Reconcile(ReconcileFlags),
        /// Snapshots: save one from a running server, restore one into a new data
        /// directory, or report what a file holds; etcd's format (etcdctl's) or kvd's.
        #[command(subcommand)]
        Snapshot(SnapshotCommand),
        /// Checks a stopped data directory: redb's integrity check, every history record,
        /// row and live key decoded, HashKV, the consumption recount. Exits 0 if sound, 2 if
        /// damage was found, 1 if the check could not run (a running kvd holds the directory,
        /// or the database is of an older schema and `--upgrade` was not given).
        Check {
            /// The data directory.
            #[arg(long, value_name = "DIR")]
            data_dir: PathBuf,
            /// Open a database that was not closed cleanly although its log (kvd.wal) is
            /// missing: the writes acknowledged since its last checkpoint are lost. The check
            /// then closes it cleanly, so kvd starts on it again.
            #[arg(long)]
            accept_missing_log: bool,
            /// Raise the database's schema version if it is older than this build's, as a
            /// start of this kvd would, and check it; the build that wrote it then refuses the
            /// directory. Without it such a directory is refused (exit 1) and left as it was.
            #[arg(long)]
            upgrade: bool,
        },
        /// Defragments a stopped data directory (rewrites its database file to give free
        /// space back), keeping HashKV.
        Defrag {
            /// The data directory.
            #[arg(long, value_name = "DIR")]
            data_dir: PathBuf,
        },
    }

    /// `kvd snapshot` (BIN-7).
    #[derive(Debug, Subcommand)]
    enum SnapshotCommand {
        /// Streams a snapshot from a running server into FILE (written as FILE.part, its
        /// SHA-256 trailer checked, then renamed).
        Save {
            /// The file to write.
            file: PathBuf,
            /// Save from this stopped data directory instead of a running server.
            #[arg(long, value_name = "DIR", conflicts_with = "endpoints")]
            data_dir: Option<PathBuf>,
            /// The client URL of the server (`http://host:port` or `host:port`); the first
            /// of a comma-separated list is used.
            #[arg(
                long,
                value_name = "URLS",
                value_delimiter = ',',
                default_value = "http://127.0.0.1:2379"
            )]
            endpoints: Vec<String>,
            /// etcd: a bbolt file etcdctl and etcd restore; kvd: kvd's own dump.
            #[arg(long, value_enum, default_value_t = FormatArg::Etcd)]
            format: FormatArg,
        },
        /// Creates a kvd data directory from a snapshot file of either format, with its
        /// whole history.
        Restore {
            /// The snapshot file.
            file: PathBuf,
            /// The data directory to create (it must not exist, or be empty).
            #[arg(long, value_name = "DIR")]
            data_dir: PathBuf,
            /// Accept a file whose SHA-256 trailer is missing or does not match.
            #[arg(long)]
            skip_hash_check: bool,
        },
        /// Reports a snapshot file's format, hash, revision, entries and size.
        Status {
            /// The snapshot file.
            file: PathBuf,
            /// `table` or `json`.
            #[arg(long, short = 'w', default_value = "table")]
            write_out: String,
        },
    }

    /// Values of `kvd snapshot save --format`.
    #[derive(Debug, Clone, Copy, ValueEnum)]
    enum FormatArg {
        /// etcd's snapshot (bbolt).
        Etcd,
        /// kvd's dump.
        Kvd,
    }

    /// Flags of `kvd reconcile` (BIN-5).
    #[derive(Debug, Args)]
    struct ReconcileFlags {
        /// Replace drifted counters with the recount (idempotent).
        #[arg(long)]
        repair: bool,

        /// Comma-separated client URLs of the kvd to ask (`http://host:port`, or
        /// `host:port`); the first that answers is used.
        #[arg(
            long,
            value_name = "URLS",
            value_delimiter = ',',
            default_value = "http://127.0.0.1:2379"
        )]
        endpoints: Vec<String>,
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

        /// Comma-separated URLs to listen on for client traffic (gRPC and HTTP on each):
        /// http://HOST:PORT, or https://HOST:PORT for TLS (with --cert-file and --key-file,
        /// or --auto-tls). Port 0 picks a free port (printed at startup).
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
        #[arg(
            long,
            value_name = "BYTES",
            default_value_t = MAX_REQUEST_BYTES_DEFAULT,
            allow_hyphen_values = true
        )]
        max_request_bytes: usize,

        /// Largest number of operations in one transaction.
        #[arg(
            long,
            value_name = "N",
            default_value_t = MAX_TXN_OPS_DEFAULT,
            allow_hyphen_values = true
        )]
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

        /// Runs the engine's apply and commit threads under SCHED_FIFO at this real-time
        /// priority (1-99), so that under a busy CPU a write does not wait for other
        /// threads' time slices at each hand-off (a steadier tail when one tenant floods the
        /// server). Needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO at least this high; kvd
        /// refuses to start without it. Unset: the normal scheduler.
        #[arg(
            long,
            value_name = "PRIORITY",
            value_parser = clap::value_parser!(u8).range(1..=99),
            allow_hyphen_values = true
        )]
        pipeline_priority: Option<u8>,

        /// Bytes of write-ahead log between two checkpoints (65536 to 67108864). A checkpoint
        /// holds writes while it flushes the pages dirtied since the last one, so a shorter
        /// log makes shorter, more frequent stalls; it also bounds the replay at start.
        #[arg(
            long,
            value_name = "BYTES",
            default_value_t = kvd::WAL_FILE_BYTES_DEFAULT,
            value_parser = clap::value_parser!(u64).range(kvd::WAL_FILE_BYTES_MIN..=kvd::WAL_FILE_BYTES_MAX),
            allow_hyphen_values = true
        )]
        wal_file_bytes: u64,

        /// Automatic compaction mode: 'periodic' (keep the history of the last RETENTION,
        /// a duration like '1h' or a number of hours) or 'revision' (keep the last RETENTION
        /// revisions).
        #[arg(long, value_name = "MODE", default_value = "periodic")]
        auto_compaction_mode: String,

        /// Automatic compaction retention ('0' disables; e.g. '1h', '30m' or '1000').
        #[arg(
            long,
            value_name = "RETENTION",
            default_value = "0",
            allow_hyphen_values = true
        )]
        auto_compaction_retention: String,

        /// Most allocations preparing at once (ALLOCATE with "prepare"), across all roles,
        /// each role within its fair share; 0 turns the queue off. Persisted: a start
        /// without the flag keeps the last value set (by a flag or UPDATE_PREPARE_QUEUE).
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        allocation_prepare_queue_length: Option<i64>,

        /// Outcomes of writes with an operation id kept at most (oldest evicted first); a
        /// retry of an evicted one is applied again.
        #[arg(
            long,
            value_name = "N",
            default_value_t = kvd::OPERATION_RETENTION_COUNT_DEFAULT,
            value_parser = parse_retention_count,
            allow_hyphen_values = true
        )]
        operation_retention_count: u64,

        /// How long outcomes of writes with an operation id are kept (engine clock), a
        /// duration like '1h' or '30m'.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "1h",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        operation_retention: Duration,

        /// How long an agent known from before a restart may take to register again
        /// before it is marked unreachable, a duration like '10m'.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "10m",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        agent_reregister_timeout: Duration,

        /// How often the consumption counters are checked against a recount (metric
        /// kvd_consumption_drift_rows; drift is logged, never repaired); '0' disables.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "10m",
            value_parser = parse_go_duration,
            allow_hyphen_values = true
        )]
        consumption_check_interval: Duration,

        /// How often every stored history record, row and meta value is checked against its
        /// checksum while kvd serves (metric kvd_scrub_runs_total); damage raises the CORRUPT
        /// alarm, which stops writes. The first pass runs one interval after the start. '0'
        /// disables.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "24h",
            value_parser = parse_go_duration,
            allow_hyphen_values = true
        )]
        scrub_interval: Duration,
        /// Most client connections served at once; a connection beyond it gets an HTTP/2
        /// GOAWAY (ENHANCE_YOUR_CALM, "kvd: too many open connections") and is closed. Lowered
        /// at start to fit the open-file limit (which kvd raises to its hard limit first).
        #[arg(
            long,
            value_name = "N",
            default_value_t = kvd_server::connections::MAX_CONNECTIONS_DEFAULT,
            allow_hyphen_values = true
        )]
        max_connections: usize,

        /// How long a connection may take to send its HTTP/2 preface, any one frame or
        /// header block, or an HTTP/1 request head before it is closed.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "10s",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        connection_header_timeout: Duration,

        /// How long a connection may stay with no request open (a Watch or LeaseKeepAlive
        /// stream is an open request) before it is shut down gracefully.
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "5m",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        connection_idle_timeout: Duration,

        /// Time without frames after which the server pings an HTTP/2 client (etcd's flag
        /// and default).
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "2h",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        grpc_keepalive_interval: Duration,

        /// How long a ping may go unanswered before the connection is dropped (etcd's flag
        /// and default).
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "20s",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        grpc_keepalive_timeout: Duration,

        /// Most Watch streams open at once; a further Watch call gets Unavailable. A stream
        /// holds no thread: a small task, and up to 128 undelivered responses per watch for a
        /// slow client.
        #[arg(
            long,
            value_name = "N",
            default_value_t = kvd_server::WATCH_STREAMS_MAX_DEFAULT,
            value_parser = positive::<usize>,
            allow_hyphen_values = true
        )]
        max_watch_streams: usize,

        /// Seconds an auth token stays valid without use (etcd's flag and default); every
        /// use pushes its expiry.
        #[arg(
            long,
            value_name = "SECONDS",
            default_value_t = kvd_server::AUTH_TOKEN_TTL_DEFAULT.as_secs(),
            value_parser = positive::<u64>,
            allow_hyphen_values = true
        )]
        auth_token_ttl: u64,

        /// How often an idle watch created with progress_notify gets a progress response
        /// (etcd's flag and default).
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "10m",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        experimental_watch_progress_notify_interval: Duration,

        /// Most Snapshot streams at once; a further Snapshot call gets ResourceExhausted.
        #[arg(
            long,
            value_name = "N",
            default_value_t = kvd_server::snapshot::SNAPSHOTS_MAX_DEFAULT,
            value_parser = positive::<usize>,
            allow_hyphen_values = true
        )]
        max_snapshots: usize,

        /// How long a Snapshot stream waits for a client that reads nothing before it is
        /// abandoned (the client then gets Aborted).
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "60s",
            value_parser = parse_positive_duration,
            allow_hyphen_values = true
        )]
        snapshot_stall_timeout: Duration,

        /// Comma-separated origins allowed by CORS on the HTTP answers (the JSON gateway,
        /// /health, /version, /metrics); '*' (etcd's default) allows every origin.
        #[arg(
            long,
            value_name = "ORIGINS",
            value_delimiter = ',',
            default_value = kvd_server::CORS_DEFAULT
        )]
        cors: Vec<String>,

        /// Path to the client server TLS certificate file (PEM, the chain from the server's
        /// certificate up), served on the https:// client URLs.
        #[arg(long, value_name = "FILE")]
        cert_file: Option<PathBuf>,

        /// Path to the client server TLS key file (PEM: PKCS#8, PKCS#1 or SEC1).
        #[arg(long, value_name = "FILE")]
        key_file: Option<PathBuf>,

        /// Path to the client server TLS trusted CA certificate file (PEM): once given,
        /// every TLS client must present a certificate signed by one of these CAs.
        #[arg(long, value_name = "FILE")]
        trusted_ca_file: Option<PathBuf>,

        /// Require client certificates signed by --trusted-ca-file and let their common
        /// name identify the caller.
        #[arg(long)]
        client_cert_auth: bool,

        /// Serve a self-signed certificate generated at start (kept in
        /// DATA-DIR/fixtures/client) when no --cert-file is given; for trying TLS out.
        #[arg(long)]
        auto_tls: bool,

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
        #[arg(
            long,
            value_name = "DURATION",
            default_value = "60s",
            value_parser = parse_go_duration
        )]
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

        /// After a refusal with a retry hint (`etcdserver: too many requests` and its
        /// `retry-after-ms`), the client waits that long before its next request.
        #[arg(long)]
        honour_retry_after: bool,

        /// Print the report as one JSON line.
        #[arg(long)]
        json: bool,

        /// No progress line on stderr.
        #[arg(long)]
        quiet: bool,
    }

    /// Parses a count that must be at least 1 (zero would refuse every stream or snapshot, or
    /// expire every token at once).
    fn positive<T>(text: &str) -> Result<T, String>
    where
        T: std::str::FromStr<Err = std::num::ParseIntError> + Default + PartialEq,
    {
        match text.parse::<T>() {
            Ok(n) if n == T::default() => Err("must be at least 1".to_owned()),
            Ok(n) => Ok(n),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Parses a duration as etcd's flags (Go's `time.ParseDuration`) write it: `0`, or one
    /// or more numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), such as
    /// `90s`, `1.5h` or `1h30m`.
    fn parse_go_duration(text: &str) -> Result<Duration, String> {
        let bad = || format!("{text:?} is not a duration like 90s, 10m or 1h30m");
        let mut rest = text.trim();
        if rest == "0" {
            return Ok(Duration::ZERO);
        }
        if rest.is_empty() {
            return Err(bad());
        }
        let mut total = 0.0_f64;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            let (number, tail) = rest.split_at(digits);
            let value: f64 = number.parse().map_err(|_| bad())?;
            let unit_len = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            let (unit, tail) = tail.split_at(unit_len);
            let seconds_per = match unit {
                "ns" => 1e-9,
                "us" | "µs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3_600.0,
                _ => {
                    return Err(format!(
                        "unknown unit {unit:?} in {text:?} (ns, us, ms, s, m or h)"
                    ));
                }
            };
            total += value * seconds_per;
            rest = tail;
        }
        Duration::try_from_secs_f64(total).map_err(|e| format!("{text:?}: {e}"))
    }

    /// Parses a duration that must be longer than zero.
    fn parse_positive_duration(text: &str) -> Result<Duration, String> {
        let duration = parse_go_duration(text)?;
        if duration.is_zero() {
            return Err("must be longer than 0".into());
        }
        Ok(duration)
    }

    /// Parses `--operation-retention-count`: at least 1.
    fn parse_retention_count(text: &str) -> Result<u64, String> {
        match text.trim().parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!("{text:?} is not a count of at least 1")),
        }
    }

    /// Returns `endpoint` with `http://` in front if it has no scheme.
    fn with_scheme(endpoint: &str) -> String {
        if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        }
    }

    /// Runs `kvd snapshot ...` and returns its exit code (BIN-7).
    fn snapshot_main(command: SnapshotCommand) -> ExitCode {
        use kvd_server::snapshot_tool::{self, Format};
        let result = match command {
            SnapshotCommand::Save {
                file,
                data_dir: Some(dir),
                format,
                ..
            } => {
                let format = match format {
                    FormatArg::Etcd => Format::Etcd,
                    FormatArg::Kvd => Format::Kvd,
                };
                snapshot_tool::save_offline(&dir, &file, format).map(|saved| {
                    println!(
                        "Snapshot saved at {} ({} bytes)",
                        file.display(),
                        saved.bytes
                    );
                })
            }
            SnapshotCommand::Save {
                file,
                endpoints,
                format,
                data_dir: None,
            } => {
                let format = match format {
                    FormatArg::Etcd => Format::Etcd,
                    FormatArg::Kvd => Format::Kvd,
                };
                let endpoint = with_scheme(endpoints.first().map_or("127.0.0.1:2379", |e| e));
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("start the runtime: {e}"))
                    .and_then(|rt| rt.block_on(snapshot_tool::save(&endpoint, &file, format)))
                    .map(|saved| {
                        println!(
                            "Snapshot saved at {} ({} bytes)",
                            file.display(),
                            saved.bytes
                        );
                    })
            }
            SnapshotCommand::Restore {
                file,
                data_dir,
                skip_hash_check,
            } => with_progress("kvd snapshot restore", || {
                snapshot_tool::restore(&file, &data_dir, skip_hash_check)
            })
            .map(|r| {
                let auth = match r.auth {
                    Some((users, roles, enabled)) if users + roles > 0 => format!(
                        ", auth {} with {users} users and {roles} roles",
                        if enabled { "enabled" } else { "disabled" }
                    ),
                    _ => String::new(),
                };
                println!(
                    "Restored a {} snapshot into {}: revision {}, {} history entries{auth}",
                    r.format.name(),
                    data_dir.display(),
                    r.revision,
                    r.history_entries
                );
            }),
            SnapshotCommand::Status { file, write_out } => {
                snapshot_tool::status(&file).and_then(|r| match write_out.as_str() {
                    "json" => {
                        println!("{}", r.json());
                        Ok(())
                    }
                    "table" => {
                        println!("FORMAT\tHASH\tREVISION\tTOTAL KEYS\tTOTAL SIZE\tSHA256");
                        let sha = match r.hash_ok {
                            Some(true) => "ok",
                            Some(false) => "MISMATCH",
                            None => "none",
                        };
                        println!(
                            "{}\t{:x}\t{}\t{}\t{}\t{}",
                            r.format.name(),
                            r.hash,
                            r.revision,
                            r.total_keys,
                            r.total_size,
                            sha
                        );
                        Ok(())
                    }
                    other => Err(format!("-w {other:?}: table or json")),
                })
            }
        };
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("Error: {err}");
                ExitCode::FAILURE
            }
        }
    }

    /// How often a long offline command says on stderr that it is still at work.
    const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

    /// Runs `work`, printing `<label>: still working (N s)` on stderr every
    /// `PROGRESS_INTERVAL` until it returns (BIN-8: progress for long runs).
    fn with_progress<T>(label: &str, work: impl FnOnce() -> T) -> T {
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let started = std::time::Instant::now();
        let label = label.to_owned();
        let ticker = std::thread::spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(PROGRESS_INTERVAL)
            {
                eprintln!("{label}: still working ({} s)", started.elapsed().as_secs());
            }
        });
        let result = work();
        drop(done);
        let _ = ticker.join();
        result
    }

    /// Runs `kvd check` and returns its exit code (BIN-8).
    fn check_main(data_dir: &std::path::Path, accept_missing_log: bool, upgrade: bool) -> ExitCode {
        eprintln!("kvd check: checking {}", data_dir.display());
        let config = kvd::Config {
            accept_missing_log,
            ..kvd::Config::default()
        };
        let older = if upgrade {
            kvd::OlderSchema::Raise
        } else {
            kvd::OlderSchema::Refuse
        };
        let checked = with_progress("kvd check", || kvd::check_data_dir(data_dir, config, older));
        match checked {
            Ok(report) => {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": report.ok(),
                        "repaired": report.repaired,
                        "revision": report.revision,
                        "compactRevision": report.compact_revision,
                        "keys": report.keys,
                        "hashKv": report.hash_kv,
                        "driftRows": report.drift_rows,
                        "uncheckedRecords": report.unchecked_records,
                        "checkedRows": report.checked_rows,
                        "schemaRaisedFrom": report.schema_raised_from,
                    })
                );
                if let Some(older) = report.schema_raised_from {
                    eprintln!(
                        "kvd check: raised the database schema version from {older} to this \
                         build's; older builds now refuse the directory"
                    );
                }
                if report.ok() {
                    eprintln!("kvd check: no damage found");
                    if report.unchecked_records > 0 {
                        eprintln!(
                            "kvd check: {} history records were written before records carried \
                             checksums: they are read unchecked until compaction removes them",
                            report.unchecked_records
                        );
                    }
                    ExitCode::SUCCESS
                } else {
                    eprintln!(
                        "kvd check: {} consumption rows drift from the recount",
                        report.drift_rows
                    );
                    ExitCode::from(2)
                }
            }
            Err(err) if err.is_corrupted() => {
                println!(
                    "{}",
                    serde_json::json!({ "ok": false, "error": err.to_string() })
                );
                eprintln!("kvd check: damage found: {err}");
                ExitCode::from(2)
            }
            Err(err @ kvd::Error::Storage(kvd::StorageError::OlderSchema { .. })) => {
                eprintln!("Error: {err}");
                eprintln!(
                    "kvd check: its schema was left as it was; check it with the kvd that wrote it, or \
                     with --upgrade to raise its schema and check it"
                );
                ExitCode::FAILURE
            }
            Err(err) => {
                eprintln!("Error: {err}");
                ExitCode::FAILURE
            }
        }
    }

    /// Runs `kvd defrag --data-dir` and returns its exit code (BIN-8).
    fn defrag_main(data_dir: &std::path::Path) -> ExitCode {
        eprintln!("kvd defrag: defragmenting {}", data_dir.display());
        let defragmented = with_progress("kvd defrag", || {
            kvd::defrag_data_dir(data_dir, kvd::Config::default())
        });
        if let Ok(kvd::OfflineDefrag {
            schema_raised_from: Some(older),
            ..
        }) = &defragmented
        {
            eprintln!(
                "kvd defrag: raised the database schema version from {older} to this build's; \
                 older builds now refuse the directory"
            );
        }
        match defragmented {
            Ok(d) if d.hash_kv_before == d.hash_kv_after => {
                println!(
                    "Defragmented {}: {} -> {} bytes (HashKV {} kept)",
                    data_dir.display(),
                    d.size_before,
                    d.size_after,
                    d.hash_kv_after
                );
                ExitCode::SUCCESS
            }
            Ok(d) => {
                eprintln!(
                    "Error: HashKV changed across the defrag ({} -> {})",
                    d.hash_kv_before, d.hash_kv_after
                );
                ExitCode::from(2)
            }
            Err(err) => {
                eprintln!("Error: {err}");
                ExitCode::FAILURE
            }
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
            honour_retry_after: flags.honour_retry_after,
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
        let cli = match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) => {
                let _ = e.print();
                // A command line that cannot be parsed is bad configuration: 1, as BIN-6's
                // refusals, never 2, which `check`, `bench` and `reconcile` give a meaning.
                // `--help` and `--version` print to stdout and are not errors.
                return if e.use_stderr() {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                };
            }
        };
        match cli.command {
            Some(Command::Bench(flags)) => return bench_main(flags),
            Some(Command::Reconcile(flags)) => return reconcile_main(&flags),
            Some(Command::Snapshot(command)) => return snapshot_main(command),
            Some(Command::Check {
                data_dir,
                accept_missing_log,
                upgrade,
            }) => return check_main(&data_dir, accept_missing_log, upgrade),
            Some(Command::Defrag { data_dir }) => return defrag_main(&data_dir),
            None => {}
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
        let drop_responses_after_commit = match drop_responses_after_commit() {
            Ok(n) => n,
            Err(message) => {
                eprintln!("kvd: {message}");
                return ExitCode::FAILURE;
            }
        };
        let config = kvd_server::ServerConfig {
            operation_retention: kvd::Retention {
                count: flags.operation_retention_count,
                age: flags.operation_retention,
            },
            agent_reregister_timeout: flags.agent_reregister_timeout,
            consumption_check_interval: Some(flags.consumption_check_interval)
                .filter(|d| !d.is_zero()),
            scrub_interval: Some(flags.scrub_interval).filter(|d| !d.is_zero()),
            drop_responses_after_commit,
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
            pipeline_priority: flags.pipeline_priority,
            wal_file_bytes: flags.wal_file_bytes,
            watch_progress_notify_interval: flags.experimental_watch_progress_notify_interval,
            max_watch_streams: flags.max_watch_streams,
            auth_token_ttl: Duration::from_secs(flags.auth_token_ttl),
            max_snapshots: flags.max_snapshots,
            snapshot_stall_timeout: flags.snapshot_stall_timeout,
            connections: kvd_server::ConnectionLimits {
                max_connections: flags.max_connections,
                header_timeout: flags.connection_header_timeout,
                idle_timeout: flags.connection_idle_timeout,
                keepalive_interval: flags.grpc_keepalive_interval,
                keepalive_timeout: flags.grpc_keepalive_timeout,
            },
            cors: flags.cors,
            tls: kvd_server::TlsFlags {
                cert_file: flags.cert_file,
                key_file: flags.key_file,
                trusted_ca_file: flags.trusted_ca_file,
                client_cert_auth: flags.client_cert_auth,
                auto_tls: flags.auto_tls,
            },
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

    /// Reads the test failpoint's variable (`server::operation`): unset is 0.
    fn drop_responses_after_commit() -> Result<u64, String> {
        let name = kvd_server::DROP_RESPONSE_AFTER_COMMIT_ENV;
        match std::env::var(name) {
            Err(std::env::VarError::NotPresent) => Ok(0),
            Ok(text) => text
                .trim()
                .parse()
                .map_err(|_| format!("{name}={text:?} is not a count")),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not a count")),
        }
    }

    /// How long `kvd reconcile` waits for an endpoint to connect and to answer.
    const RECONCILE_TIMEOUT: Duration = Duration::from_secs(30);

    /// Runs `kvd reconcile` and returns its exit code (BIN-5).
    fn reconcile_main(flags: &ReconcileFlags) -> ExitCode {
        let body = serde_json::json!({
            "type": "RECONCILE_CONSUMPTION",
            "reconcile_consumption": { "repair": flags.repair },
        })
        .to_string();
        let mut failures = Vec::new();
        for endpoint in &flags.endpoints {
            let endpoint = with_scheme(endpoint);
            match post_json(&endpoint, "/api/v1", &body) {
                Ok((200, answer)) => return report_reconcile(&answer, flags.repair),
                Ok((code, answer)) => failures.push(format!("{endpoint}: HTTP {code}: {answer}")),
                Err(err) => failures.push(format!("{endpoint}: {err}")),
            }
        }
        eprintln!(
            "kvd reconcile: no endpoint answered: {}",
            failures.join("; ")
        );
        ExitCode::FAILURE
    }

    /// Prints a RECONCILE_CONSUMPTION answer and returns the exit code it means (BIN-5).
    fn report_reconcile(answer: &str, repair: bool) -> ExitCode {
        let parsed: serde_json::Value = match serde_json::from_str(answer) {
            Ok(value) => value,
            Err(err) => {
                eprintln!("kvd reconcile: the answer is not JSON ({err}): {answer}");
                return ExitCode::FAILURE;
            }
        };
        println!("{answer}");
        let body = &parsed["reconcile_consumption"];
        let drifted = body["drift"].as_array().map_or(0, Vec::len);
        if repair {
            let repaired = body["repaired"].as_u64().unwrap_or(0);
            eprintln!("kvd reconcile: {drifted} drifted rows found, {repaired} rows repaired");
            return ExitCode::SUCCESS;
        }
        if drifted == 0 {
            eprintln!("kvd reconcile: the consumption counters agree with the recount");
            ExitCode::SUCCESS
        } else {
            eprintln!("kvd reconcile: {drifted} drifted rows; `kvd reconcile --repair` fixes them");
            ExitCode::from(2)
        }
    }

    /// Posts `body` as JSON to `path` at `endpoint` (`http://host:port`) over HTTP/1.1 and
    /// returns the status code and the body of the answer.
    fn post_json(endpoint: &str, path: &str, body: &str) -> Result<(u16, String), String> {
        use std::io::Read;
        use std::net::ToSocketAddrs;
        let Some(host) = endpoint.strip_prefix("http://") else {
            return Err("only http:// endpoints are supported".into());
        };
        let host = host.trim_end_matches('/');
        let address = host
            .to_socket_addrs()
            .map_err(|e| format!("resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("resolve {host}: no address"))?;
        let mut stream = std::net::TcpStream::connect_timeout(&address, RECONCILE_TIMEOUT)
            .map_err(|e| format!("connect: {e}"))?;
        let io = |e: std::io::Error| format!("request: {e}");
        stream
            .set_read_timeout(Some(RECONCILE_TIMEOUT))
            .map_err(io)?;
        stream
            .set_write_timeout(Some(RECONCILE_TIMEOUT))
            .map_err(io)?;
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nAccept: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(io)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).map_err(io)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, rest) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| "the answer has no end of headers".to_owned())?;
        let code = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad status line: {head}"))?;
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            return Err("the answer is chunked, which kvd does not send".into());
        }
        Ok((code, rest.to_owned()))
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

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn durations_read_as_etcds_flags_write_them() {
            let secs = |s: f64| Ok(Duration::from_secs_f64(s));
            assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
            assert_eq!(parse_go_duration("90s"), secs(90.0));
            assert_eq!(parse_go_duration("1h30m"), secs(5_400.0));
            assert_eq!(parse_go_duration("1.5h"), secs(5_400.0));
            assert_eq!(parse_go_duration("250ms"), secs(0.25));
            for bad in ["", "5", "1x", "h", "1h-5m", "-1m"] {
                assert!(parse_go_duration(bad).is_err(), "{bad:?}");
            }
            assert!(parse_positive_duration("0").is_err());
            assert_eq!(parse_retention_count("1"), Ok(1));
            assert!(parse_retention_count("0").is_err());
        }

        #[test]
        fn reconcile_exits_2_on_drift_unless_repaired() {
            let drift = r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"drift":[{"role":"dev","resource":"kv_keys"}]}}"#;
            assert_eq!(report_reconcile(drift, false), ExitCode::from(2));
            let repaired = r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"drift":[{"role":"dev","resource":"kv_keys"}],"repaired":1}}"#;
            assert_eq!(report_reconcile(repaired, true), ExitCode::SUCCESS);
            let clean = r#"{"type":"RECONCILE_CONSUMPTION","reconcile_consumption":{"drift":[]}}"#;
            assert_eq!(report_reconcile(clean, false), ExitCode::SUCCESS);
            assert_eq!(report_reconcile("not json", false), ExitCode::FAILURE);
        }

        /// Every argument `--help` shows, of `kvd` and of each subcommand at any depth,
        /// has a help text.
        #[test]
        fn every_flag_has_help() {
            use clap::CommandFactory;
            /// Adds `(path, has help)` for each argument of `command` and its subcommands
            /// that is not hidden.
            fn shown(command: &clap::Command, path: &str, found: &mut Vec<(String, bool)>) {
                for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
                    let name = format!("{path} {}", arg.get_id());
                    found.push((name, arg.get_help().is_some()));
                }
                for sub in command.get_subcommands() {
                    shown(sub, &format!("{path} {}", sub.get_name()), found);
                }
            }
            let mut command = Cli::command();
            // Adds clap's own --help and --version, as parsing does.
            command.build();
            let mut found = Vec::new();
            shown(&command, "kvd", &mut found);
            // The walk reaches the serving flags and the subcommands' flags.
            for name in [
                "kvd data_dir",
                "kvd auth_token_ttl",
                "kvd snapshot save endpoints",
            ] {
                assert!(found.iter().any(|(n, _)| n == name), "{name} not checked");
            }
            let missing: Vec<&String> = found.iter().filter(|(_, h)| !h).map(|(n, _)| n).collect();
            assert!(missing.is_empty(), "arguments without help: {missing:?}");
        }
    }
}

fn main() -> std::process::ExitCode {
    cli::main()
}
