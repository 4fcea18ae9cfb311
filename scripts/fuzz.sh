#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ for a bounded time each, on the nightly toolchain, and prints
# how many executions each ran. Exits non-zero if any target crashed (the input is saved under
# fuzz/artifacts/<target>/) or did not run.
#
#   scripts/fuzz.sh                       every target, FUZZ_SECONDS (default 60) each
#   FUZZ_SECONDS=10 scripts/fuzz.sh       the short run CI does
#   scripts/fuzz.sh record wal_log        only these targets
#
# Each target starts from its committed corpus, fuzz/corpus/<target>/. New inputs that reach
# new code go to fuzz/target/grown/<target>/ (ignored by git, kept between runs), so a run
# leaves the committed corpus as it is; FUZZ_GROW=1 adds them to fuzz/corpus/<target>/
# instead, to be minimized before committing (docs/fuzzing.md).
# Environment: FUZZ_SECONDS (per target), FUZZ_GROW, FUZZ_ARGS (extra libFuzzer flags). A
# target with a dictionary (fuzz/<target>.dict) runs with it.
# Targets build without a sanitizer (`-s none`): the crates deny unsafe code, so
# AddressSanitizer would find nothing the Rust checks do not, and the build is much faster.
# Overflow checks and debug assertions stay on (cargo-fuzz's default).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "FUZZ_SECONDS must be a positive number of seconds, got '$seconds'" >&2
  exit 2
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "==> installing the nightly toolchain (cargo-fuzz needs it)"
  if ! rustup toolchain install nightly --profile minimal; then
    echo "the nightly toolchain is missing and could not be installed" >&2
    exit 2
  fi
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz"
  cargo install cargo-fuzz
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi

echo "==> building ${#targets[@]} fuzz targets (nightly, no sanitizer)"
# One cargo invocation builds every target at once.
nice -n 10 cargo +nightly fuzz build -s none

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
failed=()
summary=()
for target in "${targets[@]}"; do
  echo "==> fuzzing $target for ${seconds}s"
  mkdir -p "fuzz/corpus/$target"
  # libFuzzer writes new inputs into the first corpus directory it is given.
  if [ "${FUZZ_GROW:-0}" = 1 ]; then
    corpora=("fuzz/corpus/$target")
  else
    corpora=("fuzz/target/grown/$target" "fuzz/corpus/$target")
    mkdir -p "${corpora[0]}"
  fi
  log="$logs/$target.log"
  flags=(-max_total_time="$seconds" -print_final_stats=1)
  # A target whose input is text gets the words its decoder looks for.
  if [ -f "fuzz/$target.dict" ]; then
    flags+=(-dict="$PWD/fuzz/$target.dict")
  fi
  status=0
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags.
  nice -n 10 cargo +nightly fuzz run -s none -j 1 "$target" "${corpora[@]}" -- \
    "${flags[@]}" ${FUZZ_ARGS:-} >"$log" 2>&1 || status=$?
  # libFuzzer ends with "Done <runs> runs in <seconds> second(s)"; a crash ends it early
  # with the last "#<runs> ..." status line instead.
  runs="$(sed -n 's/^Done \([0-9]*\) runs in .*/\1/p' "$log" | tail -n 1)"
  if [ -z "$runs" ]; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)"
  fi
  runs="${runs:-0}"
  rate="$(sed -n 's/^stat::average_exec_per_sec: *\([0-9]*\).*/\1/p' "$log" | tail -n 1)"
  corpus="$(find "${corpora[@]}" -type f ! -name '.*' | wc -l)"
  if [ "$status" -ne 0 ] || [ "$runs" -eq 0 ]; then
    failed+=("$target")
    echo "--- $target FAILED (exit $status); the end of its log:" >&2
    tail -n 40 "$log" >&2
    summary+=("$(printf '%-15s %12s runs  %8s exec/s  corpus %5s  FAILED' "$target" "$runs" "${rate:-?}" "$corpus")")
  else
    summary+=("$(printf '%-15s %12s runs  %8s exec/s  corpus %5s  ok' "$target" "$runs" "${rate:-?}" "$corpus")")
  fi
done

echo
echo "==> executions per target (${seconds}s each)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "crashed or did not run: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
