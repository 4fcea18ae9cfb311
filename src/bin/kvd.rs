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
//!
//! Contact points: `kvd::server::run`; `docs/operations.md` documents the flags.

#[cfg(not(loom))]
mod cli {
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::ExitCode;

    use clap::Parser;

    /// Default of `--max-request-bytes` (etcd's 1.5 MiB).
    const MAX_REQUEST_BYTES_DEFAULT: usize = 1_572_864;
    /// Default of `--max-txn-ops` (etcd's).
    const MAX_TXN_OPS_DEFAULT: usize = 128;

    /// kvd: an etcd-compatible single-member key-value server on an embedded MVCC engine.
    ///
    /// Speaks etcd's v3 gRPC API (etcdctl and etcd client libraries work unchanged) and
    /// serves /health, /version and /metrics on the same port.
    #[derive(Debug, Parser)]
    #[command(name = "kvd", version, about, long_about = None)]
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
        /// Reported by `endpoint status` (dbSizeQuota); NOT ENFORCED YET.
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

        /// Automatic compaction mode, 'periodic' or 'revision'. Accepted for etcd
        /// compatibility; NOT IMPLEMENTED YET (compact with `etcdctl compaction`).
        #[arg(long, value_name = "MODE", default_value = "periodic")]
        auto_compaction_mode: String,

        /// Automatic compaction retention ('0' disables; e.g. '1h' or '1000'). Accepted for
        /// etcd compatibility; NOT IMPLEMENTED YET.
        #[arg(long, value_name = "RETENTION", default_value = "0")]
        auto_compaction_retention: String,

        /// Log level: debug, info, warn or error. Debug logs one line per gRPC request.
        #[arg(long, value_name = "LEVEL", default_value = "info")]
        log_level: tracing::Level,
    }

    /// Parses the flags, runs the server and returns the exit code (BIN-2).
    pub fn main() -> ExitCode {
        let flags = Flags::parse();
        tracing_subscriber::fmt()
            .with_max_level(flags.log_level)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        warn_unimplemented(&flags);
        let config = kvd::server::ServerConfig {
            data_dir: flags.data_dir,
            name: flags.name,
            listen_client_urls: flags.listen_client_urls,
            advertise_client_urls: flags.advertise_client_urls,
            quota_backend_bytes: flags.quota_backend_bytes,
            max_request_bytes: flags.max_request_bytes,
            max_txn_ops: flags.max_txn_ops,
        };
        match kvd::server::run(config, print_urls) {
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

    fn warn_unimplemented(flags: &Flags) {
        if flags.auto_compaction_retention.trim() != "0" {
            tracing::warn!(
                mode = %flags.auto_compaction_mode,
                retention = %flags.auto_compaction_retention,
                "auto-compaction is not implemented yet; the flags are ignored"
            );
        }
        if flags.quota_backend_bytes != 0 {
            tracing::warn!(
                quota_backend_bytes = flags.quota_backend_bytes,
                "the space quota is reported but not enforced yet"
            );
        }
    }
}

#[cfg(not(loom))]
fn main() -> std::process::ExitCode {
    cli::main()
}

/// Under `--cfg loom` only the engine's synchronisation is built; the server is not.
#[cfg(loom)]
fn main() {}
