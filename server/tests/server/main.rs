//! The server's integration tests, as one test binary (`cargo test -p kvd-server --test
//! server`), so that tonic, tokio and etcd-client are linked once instead of once per file.
//! Each module was a test binary of its own; a test's name is `<module>::<test>`, so
//! `cargo test -p kvd-server --test server etcdctl::` runs one module.
//!
//! Modules:
//! - `common`: the helpers every module uses (start kvd or etcd on a free loopback port with
//!   a temporary data directory, run etcdctl bounded in time, plain HTTP requests).
//! - `client_crate`: the `etcd-client` crate (0.21) against kvd.
//! - `differential`: seeded random sequences of KV, lease and watch calls, and of KV calls
//!   under auth with permission changes, over gRPC (and the KV and lease calls as JSON
//!   through the gateways) to kvd and to etcd 3.4.23, every answer compared.
//! - `etcdctl`: etcdctl 3.4 scenarios against kvd and against etcd 3.4.23, the transcripts
//!   compared.
//! - `gateway`: the JSON gateway (`/v3/...`) over plain HTTP, differential against etcd
//!   3.4.23 (unary endpoints, errors, a watch and a keep-alive stream).
//! - `metrics`: `/metrics` parsed by `prometheus-parse`: etcd's series with etcd 3.4.23's
//!   names, types, labels and buckets, and values that follow the store.
//! - `server_auth`: authentication and authorization over the wire: a restart keeps the
//!   auth store, the etcd 3.4 holes closed, bad credentials and tokens, token expiry, the
//!   `etcd-client` crate logging in, the tenant story with the operator API.
//! - `offline_tools`: `kvd check`, `kvd defrag --data-dir` and `kvd snapshot save
//!   --data-dir` on a stopped data directory, and their refusal of one a kvd holds.
//! - `server_bench`: smoke test of the `kvd bench` load generator.
//! - `server_full_disk`: a full disk on a tmpfs the test mounts (root): recovery without a
//!   restart, the scaled filesystem reserve, the NOSPACE log line.
//! - `server_hardening`: hostile clients (issue 16): protocol errors, many streams on one
//!   connection, oversized header blocks, slow connections.
//! - `server_lease_watch`: the Lease and Watch services over the wire.
//! - `server_lock`: the Lock and Election services over the wire (waiting, cancelling,
//!   leases, Observe, errors, the gateway, auth).
//! - `server_maintenance`: alarms, Hash, Status's raft indexes and the Txn key check,
//!   against etcd 3.4.23 where it is the reference.
//! - `server_nospace`: the NOSPACE story through etcdctl, and `snapshot save`.
//! - `server_operations`: operation ids (exactly-once writes, a dropped response retried,
//!   across a restart), agents that fail over and reconciliation, over gRPC and HTTP; the
//!   flags and `kvd reconcile`.
//! - `server_operator`: the quota operator API over HTTP and its enforcement on the etcd API.
//! - `server_prepare_queue`: the allocation prepare queue over HTTP (ALLOCATE with
//!   `prepare`, START, UPDATE_PREPARE_QUEUE, 429 with `Retry-After`, the flag).
//! - `server_process`: the kvd process (signals, restart, a shared data directory, flag
//!   errors, the HTTP routes).
//! - `server_tls`: TLS on `https://` URLs (etcdctl over TLS, client certificates,
//!   `--auto-tls`, bad configurations, curl on `/health`), differential against etcd 3.4.23.
//! - `server_wire`: bad and unusual input over the wire, and the shape of the answers.
//! - `snapshot_etcd`: snapshots between kvd and etcd 3.4.23 in both directions, with
//!   history, and `kvd snapshot save|restore|status`.
//!
//! Invariant: the tests share this process and run on parallel threads, so none of them
//! changes process-wide state (environment variables, the working directory, signal
//! handlers); each server they start is a child process with its own data directory and
//! ports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

mod client_crate;
mod differential;
mod etcdctl;
mod gateway;
mod metrics;
mod offline_tools;
mod server_auth;
mod server_bench;
mod server_full_disk;
mod server_hardening;
mod server_lease_watch;
mod server_lock;
mod server_maintenance;
mod server_nospace;
mod server_operations;
mod server_operator;
mod server_prepare_queue;
mod server_process;
mod server_tls;
mod server_wire;
mod snapshot_etcd;
