#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with a Rust toolchain: installs what the
# tests need, then formatting, lints, unit/integration/doc tests (the model, the simulation,
# the fuzz corpora), loom models, a short run of every fuzz target and a quick benchmark
# smoke run. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if [ -x .ci/install-deps.sh ] || [ -f .ci/install-deps.sh ]; then
  step "system packages the tests need (etcd, etcdctl)"
  bash .ci/install-deps.sh
fi

step "cargo fmt --check (the workspace, and the loom and fuzz crates outside it)"
cargo fmt --all -- --check
(cd loom-tests && cargo fmt -- --check)
(cd fuzz && cargo fmt -- --check)

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "the engine alone: its build has none of the server's crates (cargo tree -p kvd)"
server_crates='^(tokio|tonic|tonic-prost|prost|axum|hyper|clap|tracing|tracing-subscriber|serde_json|etcd-client|criterion|rustls|tokio-rustls|rcgen) '
if cargo tree -p kvd -e normal,build,dev --prefix none | grep -E "$server_crates"; then
  echo "the engine's build pulls in the server crates above" >&2
  exit 1
fi

step "engine tests (cargo test -p kvd: unit, integration, doc)"
cargo test -p kvd --all-targets
cargo test -p kvd --doc

step "server tests (cargo test -p kvd-server: unit, integration against kvd, etcd and etcdctl, doc)"
cargo test -p kvd-server --all-targets
cargo test -p kvd-server --doc

step "loom models (loom-tests/, built with --cfg loom)"
(cd loom-tests && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=../target/loom cargo test --release --lib --tests)

step "fuzz targets, briefly (scripts/fuzz.sh on nightly; their corpora replay in cargo test)"
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash scripts/fuzz.sh

step "benchmark smoke run (each bench once, reduced sizes, test profile; figures come from cargo bench)"
# criterion runs each benchmark once when the binary is not given --bench; the test profile
# reuses the build above instead of a release build of everything.
KVD_BENCH_QUICK=1 cargo test -p kvd-benches --benches

step "all tests passed"
