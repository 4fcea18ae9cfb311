#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with a Rust toolchain: installs what the
# tests need, then formatting, lints, unit/integration/doc tests, loom models and a quick
# benchmark smoke run. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if [ -x .ci/install-deps.sh ] || [ -f .ci/install-deps.sh ]; then
  step "system packages the tests need (etcd, etcdctl)"
  bash .ci/install-deps.sh
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test (unit, integration, doc)"
cargo test --all-targets
cargo test --doc

step "loom models (loom-tests/, built with --cfg loom)"
(cd loom-tests && RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=../target/loom cargo test --release)

step "benchmark smoke run (each bench once, reduced sizes; figures come from cargo bench)"
KVD_BENCH_QUICK=1 cargo bench --bench engine -- --test
KVD_BENCH_QUICK=1 cargo bench --bench features -- --test

step "all tests passed"
