#!/usr/bin/env bash
# bench-fairness.sh: a greedy and a polite tenant against one kvd, to measure what the fair
# write prepare queue (docs/design/load-soothing.md) gives the polite one. A benchmark, not a
# test: it prints figures and asserts nothing.
#
# One fresh kvd (release build, its own data directory and free port on 127.0.0.1) with a
# small prepare queue; roles `greedy` and `polite` get registry entries, so keys under
# /greedy/ and /polite/ belong to them. Then, with `kvd bench put` (256-byte values):
#   1. drain: 64 clients of the greedy role, unpaced, measure the queue's drain rate D;
#   2. polite alone: the polite role paced at POLITE_SHARE of D, for DURATION;
#   3. both: the same polite run while GREEDY_CLIENTS greedy clients ask for GREEDY_FACTOR
#      times D (paced; a refused request is not retried, the next one is sent on schedule).
# Printed: D; the polite role's throughput, p50 and p99 alone and beside the greedy one, and
# its refusals; the same p50 and p99 inside the server (admission to answer, estimated from
# the buckets of kvd_write_duration_seconds{role="polite"} as Prometheus's
# histogram_quantile does); the greedy role's requests, successes and refusals; the server's
# CPU per successful write and its peak memory (VmHWM); and a speed probe of the host (a
# fixed loop).
#
# Environment: QUEUE (prepare queue length, default 256), DURATION (default 20s),
# POLITE_SHARE (default 0.05), POLITE_CLIENTS (default 8), GREEDY_CLIENTS (default 1024),
# GREEDY_FACTOR (default 10), SERVER_CPUS and CLIENT_CPUS (taskset CPU lists for kvd and for
# the load generators; unset, both float over every CPU), POLITE_NICE (the polite
# generator's nice value, default 0; a negative value needs root), GREEDY_HONOURS_HINT (1: a
# refused greedy client waits for the refusal's retry-after-ms before its next request;
# default 0, it does not), KVD (the binary; built with cargo build --release --bin kvd if
# missing), KVD_FLAGS (more flags for the server, e.g. "--pipeline-priority 10"),
# METRICS_OUT (a file to save the server's /metrics in after the third phase). Needs curl
# and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

QUEUE=${QUEUE:-256}
DURATION=${DURATION:-20s}
POLITE_SHARE=${POLITE_SHARE:-0.05}
POLITE_CLIENTS=${POLITE_CLIENTS:-8}
GREEDY_CLIENTS=${GREEDY_CLIENTS:-1024}
GREEDY_FACTOR=${GREEDY_FACTOR:-10}
KVD=${KVD:-target/release/kvd}
SERVER_CPUS=${SERVER_CPUS:-}
CLIENT_CPUS=${CLIENT_CPUS:-}
POLITE_NICE=${POLITE_NICE:-0}
GREEDY_HONOURS_HINT=${GREEDY_HONOURS_HINT:-0}
greedy_flags=()
[ "$GREEDY_HONOURS_HINT" = 1 ] && greedy_flags=(--honour-retry-after)

log() { printf '[bench-fairness] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
command -v curl >/dev/null || die "curl is required"
command -v python3 >/dev/null || die "python3 is required"
[ -x "$KVD" ] || cargo build --release --bin kvd
log "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
speed=$(python3 scripts/speed-probe.py)
log "speed probe: $speed ms"
pin() { # pin CPUS COMMAND...: runs COMMAND on CPUS, or anywhere if CPUS is empty
  local cpus=$1; shift
  if [ -n "$cpus" ]; then taskset -c "$cpus" "$@"; else "$@"; fi
}

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
endpoint="http://127.0.0.1:$port"
${SERVER_CPUS:+taskset -c "$SERVER_CPUS"} "$KVD" --data-dir "$work/data" --listen-client-urls "$endpoint" \
  --prepare-queue-length "$QUEUE" --log-level warn ${KVD_FLAGS:-} >"$work/kvd.log" 2>&1 &
kvd_pid=$!
cleanup() { kill "$kvd_pid" 2>/dev/null || true; wait "$kvd_pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 1 150); do
  curl -s -m 1 "$endpoint/health" 2>/dev/null | grep -q '"health": *"true"' && break
  sleep 0.2
done
curl -s -m 1 "$endpoint/health" | grep -q '"health": *"true"' || die "kvd did not become healthy: $(tail -5 "$work/kvd.log")"

curl -sf -m 10 -H 'Content-Type: application/json' -d '{"type":"UPDATE_QUOTA","update_quota":{"quota_configs":[
  {"role":"greedy","limits":{"kv_keys":{"value":1000000000}}},
  {"role":"polite","limits":{"kv_keys":{"value":1000000000}}}]}}' "$endpoint/api/v1" >/dev/null \
  || die "UPDATE_QUOTA failed"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$kvd_pid/stat"; }
# bench NICE ARGS...: one kvd bench put run on the client CPUs at nice value NICE.
bench() { local niceness=$1; shift
  pin "$CLIENT_CPUS" nice -n "$niceness" "$KVD" bench put --endpoints "$endpoint" --json --quiet --max-errors 1000000000000 "$@"; }
field() { python3 -c 'import json,sys; r=json.loads(sys.argv[1]); v=r
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }

log "1/3 drain rate: 64 greedy clients, 20,000 puts"
drain=$(bench 0 --clients 64 --conns 8 --key-prefix /greedy/ --total 20000 --duration 60s)
rate=$(field "$drain" throughput_rps)
polite_rate=$(python3 -c "print(max(1, int($rate * $POLITE_SHARE)))")
greedy_rate=$(python3 -c "print(max(1, int($rate * $GREEDY_FACTOR)))")
log "drain rate D = $rate/s; polite rate = $polite_rate/s; greedy rate = $greedy_rate/s"

log "2/3 polite alone for $DURATION"
alone=$(bench "$POLITE_NICE" --clients "$POLITE_CLIENTS" --conns 2 --key-prefix /polite/ --rate "$polite_rate" --total 100000000 --duration "$DURATION")
curl -s -m 10 "$endpoint/metrics" >"$work/metrics-alone"

log "3/3 polite beside $GREEDY_CLIENTS greedy clients for $DURATION"
ticks_before=$(cpu_ticks)
bench 0 --clients "$GREEDY_CLIENTS" --conns 16 --key-prefix /greedy/ --rate "$greedy_rate" "${greedy_flags[@]}" \
  --total 100000000000 --duration "$DURATION" >"$work/greedy.json" &
greedy_pid=$!
sleep 1
both=$(bench "$POLITE_NICE" --clients "$POLITE_CLIENTS" --conns 2 --key-prefix /polite/ --rate "$polite_rate" --total 100000000 --duration "$DURATION")
# The greedy run exits non-zero: its refusals count as errors.
wait "$greedy_pid" || true
ticks_after=$(cpu_ticks)
greedy=$(cat "$work/greedy.json")
curl -s -m 10 "$endpoint/metrics" >"$work/metrics-both"
[ -z "${METRICS_OUT:-}" ] || cp "$work/metrics-both" "$METRICS_OUT"
hwm=$(awk '/VmHWM/ {print $2, $3}' "/proc/$kvd_pid/status")
hz=$(getconf CLK_TCK)

python3 - "$rate" "$alone" "$both" "$greedy" "$((ticks_after - ticks_before))" "$hz" "$hwm" "$QUEUE" "$speed" \
  "$work/metrics-alone" "$work/metrics-both" <<'EOF'
import json, re, sys
rate, alone, both, greedy = float(sys.argv[1]), *(json.loads(a) for a in sys.argv[2:5])
ticks, hz, hwm, queue, speed = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], sys.argv[8], sys.argv[9]
def polite_buckets(path):
    """The polite role's kvd_write_duration_seconds buckets: {upper bound in ms: cumulative count}."""
    pattern = re.compile(r'^kvd_write_duration_seconds_bucket\{role="polite",le="([^"]+)"\} (\d+)$')
    found = {}
    for text in open(path):
        m = pattern.match(text.strip())
        if m:
            found[float(m.group(1)) * 1000] = int(m.group(2))
    return found
def quantile(q, buckets):
    """Prometheus's histogram_quantile: linear within the bucket that holds the quantile."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if total == 0:
        return None
    rank, lower, below = q * total, 0.0, 0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            inside = buckets[bound] - below
            return lower + (bound - lower) * (rank - below) / max(inside, 1)
        lower, below = bound, buckets[bound]
    return lower
def line(name, r):
    l = r["latency_ms"]
    return (f"{name:<22} {r['throughput_rps']:>9.0f}/s  p50 {l['p50']:>7.2f} ms  p99 {l['p99']:>7.2f} ms"
            f"  requests {r['requests']}  succeeded {r['succeeded']}  refused/errors {r['errors']}")
print(f"prepare queue {queue}; drain rate {rate:.0f}/s; speed probe {speed} ms")
print(line("polite alone", alone))
print(line("polite beside greedy", both))
print(line("greedy", greedy))
asked = greedy["requests"] / max(greedy["elapsed_s"], 1e-9)
print(f"greedy asked {asked:.0f} requests/s = {asked / rate:.1f}x the drain rate")
ratio = both["latency_ms"]["p99"] / max(alone["latency_ms"]["p99"], 1e-9)
print(f"polite p99 beside greedy / alone: {ratio:.2f}x; polite refusals: {both['errors']}")
first = polite_buckets(sys.argv[10])
second = polite_buckets(sys.argv[11])
beside = {bound: count - first.get(bound, 0) for bound, count in second.items()}
def server_line(name, buckets):
    p50, p99 = quantile(0.5, buckets), quantile(0.99, buckets)
    if p50 is None:
        return f"{name:<22} no polite writes counted"
    return f"{name:<22} p50 {p50:>7.2f} ms  p99 {p99:>7.2f} ms  (from the buckets of kvd_write_duration_seconds)"
print("polite writes inside the server, admission to answer:")
print(server_line("  alone", first))
print(server_line("  beside greedy", beside))
writes = both["succeeded"] + greedy["succeeded"]
print(f"server CPU during phase 3: {ticks / hz:.1f} s, {ticks / hz / max(writes, 1) * 1e6:.1f} us per successful write; peak memory (VmHWM) {hwm}")
EOF
