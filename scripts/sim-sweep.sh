#!/usr/bin/env bash
# A long sweep of the engine simulation (tests/sim.rs) in release mode: many more seeds and
# steps than the CI sweep `cargo test -p kvd --test sim` runs. A failing seed prints its
# replay command; replay it in a debug build for a backtrace.
#
# Settings (environment), with their defaults here:
#   KVD_SIM_SEEDS=5000       seeds to run
#   KVD_SIM_FIRST_SEED=1     the first seed (the sweep runs FIRST .. FIRST + SEEDS - 1)
#   KVD_SIM_STEPS=200        steps per seed
#   KVD_SIM_WORKERS=8        seeds run at once
#   KVD_SIM_VERBOSE=0        1: one line per seed
# Any further arguments go to cargo test (e.g. --target-dir).
set -euo pipefail
cd "$(dirname "$0")/.."

export KVD_SIM_SEEDS="${KVD_SIM_SEEDS:-5000}"
export KVD_SIM_FIRST_SEED="${KVD_SIM_FIRST_SEED:-1}"
export KVD_SIM_STEPS="${KVD_SIM_STEPS:-200}"
export KVD_SIM_WORKERS="${KVD_SIM_WORKERS:-8}"
export KVD_SIM_VERBOSE="${KVD_SIM_VERBOSE:-0}"

echo "simulation sweep: ${KVD_SIM_SEEDS} seeds from ${KVD_SIM_FIRST_SEED}," \
  "${KVD_SIM_STEPS} steps each, ${KVD_SIM_WORKERS} at once (release build)"
exec cargo test --release -p kvd --test sim "$@" -- --nocapture \
  simulation_sweep_loses_nothing_and_never_diverges
