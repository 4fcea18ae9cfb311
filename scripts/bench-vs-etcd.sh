#!/usr/bin/env bash
# bench-vs-etcd.sh: compare kvd with etcd (3.4.x) end to end, using etcd's own load
# generator (etcd v3.4.23 `tools/benchmark`) as a neutral gRPC client.
#
# For every workload and every round, each server is started FRESH (new empty data
# dir, new free ports on 127.0.0.1), waited for until /health answers, loaded, and
# stopped (SIGTERM, SIGKILL after $STOP_TIMEOUT s); its data dir is then removed.
# Rounds are interleaved: odd rounds run etcd first, even rounds run kvd first.
# Per run it records throughput, p99 latency, the server's CPU time (utime+stime
# from /proc/PID/stat, read just before and just after the workload) per operation,
# the benchmark client's own CPU time per operation (bash's `times` for the reaped child),
# the load average (`uptime`) just before the run, and the host's speed just before the run
# (`speed_ms`, scripts/speed-probe.py: a guest whose host is busy or throttled runs slow
# with a low load average, which the load alone does not show). At the end it prints, per
# workload, the medians over the rounds for etcd and kvd and the ratios kvd/etcd.
#
# Usage (from anywhere; paths are relative to the repo root unless absolute):
#   ETCD_BENCHMARK=/path/to/benchmark scripts/bench-vs-etcd.sh
#   ETCD_BENCHMARK=/path/to/benchmark TOTAL_SCALE=50 ROUNDS=1 WORKLOADS="put1 watch" \
#       scripts/bench-vs-etcd.sh                                  # quick smoke run
#
# Environment:
#   ETCD_BENCHMARK  (required) etcd v3.4 tools/benchmark binary. It is not packaged by
#                   Debian; build it with Go from etcd's tools/benchmark sources at
#                   v3.4.23 (on Debian 12 it builds offline in GOPATH mode against
#                   golang-etcd-server-dev's sources).
#   ETCD            etcd server binary                    (default: `etcd` on PATH)
#   ETCDCTL         etcdctl, used only to preload range1k (default: `etcdctl` on PATH)
#   KVD             kvd binary (default: target/release/kvd of this repo, built with
#                   `cargo build --release --bin kvd` if missing)
#   Also needed: python3, curl, coreutils' timeout; etcdctl for range1k.
#   KVD_ARGS        extra flags for kvd  (word-split), e.g. KVD_ARGS="--log-level warn"
#   ETCD_ARGS       extra flags for etcd (word-split)
#   WORKLOADS       space-separated subset of: put64 put1 range1k watch put16c1 range64
#                   range64s txn64 lease64 stm64 watchlat (default: the first four, issue
#                   9's; the others only when named)
#   ROUNDS          rounds per workload (default 3)
#   TOTAL_SCALE     divide every workload's request total by this (default 1;
#                   e.g. 20 or 50 for a quick smoke run), but not below 100 requests
#                   (watch: 1 put), so that a p99 exists. The range1k preload stays
#                   1,000 keys.
#   OUT_DIR         where results and logs go (default: a new `mktemp -d` dir)
#   DATA_TMPDIR     parent of the servers' fresh data dirs (default: $TMPDIR or /tmp).
#                   Mind the file system: on tmpfs fsync is free.
#   START_TIMEOUT   seconds to wait for a server to become healthy (default 30)
#   STOP_TIMEOUT    seconds between SIGTERM and SIGKILL (default 15)
#   RUN_TIMEOUT     seconds one benchmark run may take before it is killed (default 1800)
#   FAIL_FAST=1     stop at the first failed run (default: record it, go on, exit 1 at end)
#   SETTLE_LOAD     before each run, wait until the 1-minute load average is at most this
#                   (default 0.5), for at most SETTLE_MAX_SECONDS (default 120; 0 = no wait)
#
# Workloads (etcd benchmark arguments; N/S means the total divided by TOTAL_SCALE):
#   put64   --clients=64 --conns=8 put --total=100000/S --val-size=256 --key-size=16
#           --key-space-size=1000000000
#   put1    --clients=1 --conns=1 put --total=5000/S --val-size=256 --key-size=16
#           --key-space-size=1000000000
#   put16c1 --clients=16 --conns=1 put --total=20000/S --val-size=256 --key-size=16
#           --key-space-size=1000000000   (many clients sharing one connection, as the
#           goroutines of one clientv3 process do; the benchmark's default --conns is 1)
#   range1k preload 1,000 keys r1k/000000000000 .. r1k/000000000999 (16 bytes each,
#           256-byte values) with `etcdctl txn` (8 txns of 125 puts), check the count,
#           then: --clients=1 range r1k/ r1k0 --total=2000/S   (linearizable, the
#           default; [r1k/, r1k0) is exactly the r1k/ prefix, 1,000 keys per request)
#           (The benchmark's own `put --sequential-keys` writes binary varint keys,
#           the first of which is all NUL bytes, which no argv can name; so its keys
#           cannot be covered by one range given on the command line.)
#   range64 preload one key `one` (256-byte value) with etcdctl, then: --clients=64 --conns=8
#           range one --total=100000/S   (linearizable); range64s the same with
#           --consistency=s (serializable)
#   txn64   --clients=64 --conns=8 txn-put --total=50000/S --txn-ops=4 --val-size=256
#           --key-size=16 --key-space-size=1000000000
#   lease64 --clients=64 --conns=8 lease-keepalive --total=100000/S
#   stm64   --clients=64 --conns=8 stm --total=20000/S --keys=100000 --keys-per-txn=4
#           --val-size=256   (repeatable-read STM: a read of 4 keys, then a Txn whose
#           compares check their mod revisions and writes half of them)
#   watchlat watch-latency --total=2000/S --put-rate=1000 --key-size=16 --val-size=256:
#           throughput is the put rate the client reached (its limiter lets a burst
#           of --put-rate puts go at once, so 2,000 puts take about a second); p99 is
#           the time from a put's answer to its event at the one watcher (near zero
#           when the event came before the answer)
#   watch   watch --streams 10 --watch-per-stream 100 --put-total 2000/S --put-rate 100000
#           All 1,000 watchers watch the same key, so each put produces 1,000 events;
#           throughput = "Requests/sec" of the "Watch events received summary" (events
#           delivered per second), and CPU/op is per delivered event. The benchmark's
#           per-event "latency" there only measures the client's own loop, so p99 is NA.
# Every benchmark run also gets the global flag --precise (full-precision numbers in
# the report; the default 4 decimals of a second cannot resolve sub-0.1 ms p99s).
#
# Output: $OUT_DIR/runs.tsv (one line per run), $OUT_DIR/summary.txt (the table),
# $OUT_DIR/env.txt (versions, machine), $OUT_DIR/logs/ (benchmark and server output).
# Exit status: 0 if every run succeeded, 1 otherwise (with a message naming the runs).
set -euo pipefail

log() { printf '[bench-vs-etcd] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

ROUNDS=${ROUNDS:-3}
TOTAL_SCALE=${TOTAL_SCALE:-1}
WORKLOADS=${WORKLOADS:-put64 put1 range1k watch}
START_TIMEOUT=${START_TIMEOUT:-30}
STOP_TIMEOUT=${STOP_TIMEOUT:-15}
RUN_TIMEOUT=${RUN_TIMEOUT:-1800}
FAIL_FAST=${FAIL_FAST:-0}
SETTLE_LOAD=${SETTLE_LOAD:-0.5}
SETTLE_MAX_SECONDS=${SETTLE_MAX_SECONDS:-120}
DATA_TMPDIR=${DATA_TMPDIR:-${TMPDIR:-/tmp}}
read -r -a KVD_EXTRA <<<"${KVD_ARGS:-}"
read -r -a ETCD_EXTRA <<<"${ETCD_ARGS:-}"

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$ROUNDS'"
[[ $TOTAL_SCALE =~ ^[1-9][0-9]*$ ]] || die "TOTAL_SCALE must be a positive integer, got '$TOTAL_SCALE'"
for w in $WORKLOADS; do
  case $w in put64|put1|range1k|watch|put16c1|range64|range64s|txn64|lease64|stm64|watchlat) ;;
    *) die "unknown workload '$w' (known: put64 put1 range1k watch put16c1 range64 range64s txn64 lease64 stm64 watchlat)" ;; esac
done
[[ -n ${WORKLOADS// /} ]] || die "WORKLOADS is empty"

# --- tools --------------------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is required (port picking, parsing, medians)"
command -v curl >/dev/null || die "curl is required (health checks)"
command -v timeout >/dev/null || die "timeout (coreutils) is required"

[[ -n ${ETCD_BENCHMARK:-} ]] || die "ETCD_BENCHMARK is not set: point it at etcd v3.4's tools/benchmark binary (build it from etcd v3.4.23's tools/benchmark with Go)"
[[ -f $ETCD_BENCHMARK && -x $ETCD_BENCHMARK ]] || die "ETCD_BENCHMARK=$ETCD_BENCHMARK is not an executable file"
"$ETCD_BENCHMARK" --help 2>&1 | grep -q 'Benchmark put' || die "ETCD_BENCHMARK=$ETCD_BENCHMARK does not look like etcd's benchmark tool (no 'put' command in --help)"

ETCD=${ETCD:-etcd}
ETCD_BIN=$(command -v "$ETCD" 2>/dev/null) || die "etcd not found (ETCD=$ETCD); install it (Debian: apt-get install etcd-server) or set ETCD"
[[ -x $ETCD_BIN ]] || die "ETCD=$ETCD_BIN is not executable"

if [[ " $WORKLOADS " == *" range1k "* || " $WORKLOADS " == *" range64"* ]]; then
  ETCDCTL=${ETCDCTL:-etcdctl}
  ETCDCTL_BIN=$(command -v "$ETCDCTL" 2>/dev/null) || die "etcdctl not found (ETCDCTL=$ETCDCTL); needed to preload range1k (Debian: apt-get install etcd-client) or set ETCDCTL"
fi

# Default: target/release/kvd of this repo. A KVD given by the caller is taken as usual:
# a relative path from the current directory, a bare name from PATH.
if [[ -z ${KVD:-} ]]; then
  KVD=$REPO_ROOT/target/release/kvd
elif [[ $KVD != */* ]]; then
  KVD=$(command -v "$KVD" 2>/dev/null) || die "kvd not found on PATH (KVD=${KVD})"
elif [[ $KVD != /* ]]; then
  KVD=$PWD/$KVD
fi
if [[ ! -x $KVD ]]; then
  if [[ $KVD == "$REPO_ROOT/target/release/kvd" ]]; then
    log "$KVD is missing: cargo build --release --bin kvd"
    (cd "$REPO_ROOT" && cargo build --release --bin kvd) || die "cargo build --release --bin kvd failed"
  fi
  [[ -x $KVD ]] || die "KVD=$KVD is not an executable file"
fi

CLK_TCK=$(getconf CLK_TCK)
[[ $CLK_TCK =~ ^[0-9]+$ && $CLK_TCK -gt 0 ]] || die "getconf CLK_TCK gave '$CLK_TCK'"

if [[ -z ${OUT_DIR:-} ]]; then
  OUT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/bench-vs-etcd.XXXXXX")
fi
mkdir -p "$OUT_DIR/logs"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RAW=$OUT_DIR/runs.tsv
SUMMARY=$OUT_DIR/summary.txt
HELPER=$OUT_DIR/helper.py
TIMES_FILE=$OUT_DIR/times.txt

# --- python helper: free ports, parsing, summary --------------------------------------
cat >"$HELPER" <<'PY'
import re, socket, statistics, sys

def ports(n):
    socks, out = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        out.append(str(s.getsockname()[1]))
    for s in socks:
        s.close()
    print(" ".join(out))

def parse(path, workload):
    """Print '<throughput> <p99_ms|NA>' from a benchmark report, or exit 1 with why."""
    text = open(path, errors="replace").read().replace("\r", "\n")
    if workload == "watch":
        marker = "Watch events received summary:"
        if marker not in text:
            sys.exit("no '%s' in the benchmark output" % marker)
        text = text.split(marker, 1)[1]
    if "Error distribution:" in text:
        errs = text.split("Error distribution:", 1)[1].strip().splitlines()[:5]
        sys.exit("the benchmark reported errors: " + " | ".join(e.strip() for e in errs))
    m = re.findall(r"Requests/sec:\s*([0-9.eE+-]+)", text)
    if not m:
        sys.exit("no 'Requests/sec:' in the benchmark output")
    rps = float(m[-1])
    if workload == "watch":
        p99 = "NA"
    else:
        p = re.findall(r"99% in ([0-9.eE+-]+) secs", text)
        if not p:
            sys.exit("no '99% in X secs' in the benchmark output (it prints one only with >= 100 samples)")
        p99 = "%.4f" % (float(p[-1]) * 1000.0)
    print("%.2f %s" % (rps, p99))

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def fmt(x, nd=2):
    return "-" if x is None else ("%.*f" % (nd, x))

def ratio(k, e):
    return "-" if k is None or e is None or e == 0 else "%.3f" % (k / e)

def summary(raw, workloads):
    rows = []
    with open(raw) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            rows.append(dict(zip(header, line.rstrip("\n").split("\t"))))
    num = lambda v: None if v in ("", "NA", "-") else float(v)
    out = []
    out.append("Medians over rounds (ok runs only). throughput: req/s (watch: events delivered/s);")
    out.append("p99: ms; cpu/op: server CPU (user+sys) in microseconds per request (watch: per event);")
    out.append("client cpu/op: the benchmark process's CPU (user+sys) per request, against each server.")
    out.append("")
    hdr = "%-8s %-4s | %12s %12s %8s | %9s %9s %8s | %9s %9s %8s | %10s %10s | %s" % (
        "workload", "ok", "etcd req/s", "kvd req/s", "kvd/etcd",
        "etcd p99", "kvd p99", "kvd/etcd", "etcd cpu", "kvd cpu", "kvd/etcd",
        "client(e)", "client(k)", "load1 min..max")
    out.append(hdr)
    out.append("-" * len(hdr))
    loads_all, speeds_all = [], []
    for w in workloads:
        rs = [r for r in rows if r["workload"] == w]
        if not rs:
            continue
        ok = {s: [r for r in rs if r["server"] == s and r["status"] == "ok"] for s in ("etcd", "kvd")}
        n = {s: len([r for r in rs if r["server"] == s]) for s in ("etcd", "kvd")}
        m = {}
        for s in ("etcd", "kvd"):
            m[s] = {k: med([num(r[k]) for r in ok[s]])
                    for k in ("throughput", "p99_ms", "cpu_us_per_op", "client_cpu_us_per_op")}
        loads = [num(r["load1"]) for r in rs if num(r["load1"]) is not None]
        loads_all += loads
        speeds = [num(r.get("speed_ms", "")) for r in rs]
        speeds_all += [v for v in speeds if v is not None]
        okstr = "%d/%d" % (len(ok["etcd"]) + len(ok["kvd"]), n["etcd"] + n["kvd"])
        out.append("%-8s %-4s | %12s %12s %8s | %9s %9s %8s | %9s %9s %8s | %10s %10s | %s" % (
            w, okstr,
            fmt(m["etcd"]["throughput"], 1), fmt(m["kvd"]["throughput"], 1),
            ratio(m["kvd"]["throughput"], m["etcd"]["throughput"]),
            fmt(m["etcd"]["p99_ms"], 3), fmt(m["kvd"]["p99_ms"], 3),
            ratio(m["kvd"]["p99_ms"], m["etcd"]["p99_ms"]),
            fmt(m["etcd"]["cpu_us_per_op"], 1), fmt(m["kvd"]["cpu_us_per_op"], 1),
            ratio(m["kvd"]["cpu_us_per_op"], m["etcd"]["cpu_us_per_op"]),
            fmt(m["etcd"]["client_cpu_us_per_op"], 1), fmt(m["kvd"]["client_cpu_us_per_op"], 1),
            ("%.2f..%.2f" % (min(loads), max(loads))) if loads else "-"))
    out.append("")
    if loads_all:
        out.append("1-minute load average before the runs: min %.2f, max %.2f (over %d runs)"
                   % (min(loads_all), max(loads_all), len(loads_all)))
    if speeds_all:
        out.append("speed probe before the runs (a fixed loop, lower is faster): min %.1f ms, max %.1f ms"
                   % (min(speeds_all), max(speeds_all)))
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        out.append("FAILED runs: " + ", ".join("%s/%s/round%s (%s)" % (r["workload"], r["server"], r["round"], r["status"]) for r in failed))
    print("\n".join(out))

cmd = sys.argv[1]
if cmd == "ports":
    ports(int(sys.argv[2]))
elif cmd == "parse":
    parse(sys.argv[2], sys.argv[3])
elif cmd == "summary":
    summary(sys.argv[2], sys.argv[3].split())
else:
    sys.exit("unknown helper command " + cmd)
PY

# --- server lifecycle ---------------------------------------------------------------
SERVER_PID=
SERVER_DIR=
SERVER_PORT=
BENCH_PID=

# alive PID: the process exists and is not a zombie (our child stays a zombie until waited).
alive() {
  local st
  { read -r st <"/proc/$1/stat"; } 2>/dev/null || return 1
  st=${st##*) }
  [[ ${st%% *} != Z ]]
}

# cpu_ticks PID: utime+stime (fields 14 and 15 of /proc/PID/stat), in clock ticks.
cpu_ticks() {
  local st f
  read -r st <"/proc/$1/stat" || return 1
  st=${st##*) }                 # drop "pid (comm) "; field 3 (state) comes first
  read -r -a f <<<"$st"
  echo $((f[11] + f[12]))
}

# children_cpu_us: sets CHILDREN_CPU_US to the user+sys CPU of this shell's reaped children
# so far, in microseconds, from bash's `times`, which must run in this shell (in a command
# substitution it would report the subshell's children). It starts no process itself, so
# read just before the benchmark starts and just after it is waited for, the difference is
# the benchmark's own CPU: nothing else is reaped in between (the watch loop waits with
# `nap`, not `sleep`).
children_cpu_us() {
  local _line user sys
  times >"$TIMES_FILE"
  { read -r _line; read -r user sys; } <"$TIMES_FILE"
  times_us user "$user"
  times_us sys "$sys"
  CHILDREN_CPU_US=$((user + sys))
}

# times_us VAR T: sets VAR to bash's `times` figure T (`1m2.345s`) in microseconds.
times_us() {
  local -n into=$1
  local t=$2 minutes seconds whole fraction
  minutes=${t%%m*}
  seconds=${t#*m}
  seconds=${seconds%s}
  whole=${seconds%%.*}
  fraction=
  [[ $seconds != *.* ]] || fraction=${seconds#*.}
  fraction=${fraction}000000
  into=$(((10#$minutes * 60 + 10#$whole) * 1000000 + 10#${fraction:0:6}))
}

# nap SECONDS: waits without starting a process (a read with a timeout on a pipe nothing
# writes to), so the wait is not counted among the children's CPU.
exec {NAP_FD}<> <(:)
nap() { read -r -t "$1" -u "$NAP_FD" _ || true; }

stop_server() {
  [[ -n $SERVER_PID ]] || return 0
  local pid=$SERVER_PID i
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "server pid $pid did not exit within ${STOP_TIMEOUT}s of SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  SERVER_PID=
  if [[ -n $SERVER_DIR ]]; then
    rm -rf -- "$SERVER_DIR"
    SERVER_DIR=
  fi
}

# stop_bench: end a running benchmark (SIGTERM, then SIGKILL after 3 s: its progress bar
# swallows the first SIGTERM when it has a terminal).
stop_bench() {
  [[ -n $BENCH_PID ]] || return 0
  local i
  kill -TERM "$BENCH_PID" 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    alive "$BENCH_PID" || break
    sleep 0.1
  done
  kill -KILL "$BENCH_PID" 2>/dev/null || true
  wait "$BENCH_PID" 2>/dev/null || true
  BENCH_PID=
}

cleanup() {
  local rc=$?
  stop_bench
  if [[ -n $SERVER_PID ]]; then
    log "cleanup: stopping server pid $SERVER_PID"
    STOP_TIMEOUT=5 stop_server
  fi
  [[ -z $SERVER_DIR ]] || rm -rf -- "$SERVER_DIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_server SERVER LOGFILE: start it fresh; sets SERVER_PID/PORT/DIR. Returns 1 on failure.
start_server() {
  local server=$1 logf=$2 cport pport i
  SERVER_DIR=$(mktemp -d "$DATA_TMPDIR/bench-$server.XXXXXX")
  read -r cport pport < <(python3 "$HELPER" ports 2)
  SERVER_PORT=$cport
  local -a cmd
  case $server in
    etcd)
      cmd=("$ETCD_BIN" --name=default --data-dir="$SERVER_DIR/data"
        --listen-client-urls="http://127.0.0.1:$cport" --advertise-client-urls="http://127.0.0.1:$cport"
        --listen-peer-urls="http://127.0.0.1:$pport" --initial-advertise-peer-urls="http://127.0.0.1:$pport"
        --initial-cluster="default=http://127.0.0.1:$pport" --initial-cluster-state=new
        "${ETCD_EXTRA[@]}")
      ;;
    kvd)
      cmd=("$KVD" --data-dir="$SERVER_DIR/data" --listen-client-urls="http://127.0.0.1:$cport"
        "${KVD_EXTRA[@]}")
      ;;
  esac
  printf '%q ' "${cmd[@]}" >"$logf"; echo >>"$logf"
  "${cmd[@]}" >>"$logf" 2>&1 </dev/null &
  SERVER_PID=$!
  for ((i = 0; i < START_TIMEOUT * 10; i++)); do
    if ! alive "$SERVER_PID"; then
      log "ERROR: $server exited during startup; last lines of $logf:"
      tail -n 20 "$logf" >&2
      stop_server
      return 1
    fi
    if curl -s -m 2 "http://127.0.0.1:$cport/health" 2>/dev/null | grep -q '"health": *"true"'; then
      return 0
    fi
    sleep 0.1
  done
  log "ERROR: $server did not report healthy on http://127.0.0.1:$cport/health within ${START_TIMEOUT}s; last lines of $logf:"
  tail -n 20 "$logf" >&2
  stop_server
  return 1
}

# --- workloads ------------------------------------------------------------------------
# scaled TOTAL [MIN]: TOTAL/TOTAL_SCALE, at least MIN (default 100: the benchmark prints
# a "99% in" line only when it has at least 100 samples).
scaled() { local t=$(($1 / TOTAL_SCALE)) min=${2:-100}; ((t >= min)) || t=$min; echo "$t"; }

# bench_args WORKLOAD PORT: the benchmark argv (without the binary); sets OPS.
bench_args() {
  local w=$1 port=$2 t
  BENCH=(--endpoints="127.0.0.1:$port" --precise)
  case $w in
    put64)
      t=$(scaled 100000); OPS=$t
      BENCH+=(--clients=64 --conns=8 put --total="$t" --val-size=256 --key-size=16 --key-space-size=1000000000) ;;
    put16c1)
      t=$(scaled 20000); OPS=$t
      BENCH+=(--clients=16 --conns=1 put --total="$t" --val-size=256 --key-size=16 --key-space-size=1000000000) ;;
    put1)
      t=$(scaled 5000); OPS=$t
      BENCH+=(--clients=1 --conns=1 put --total="$t" --val-size=256 --key-size=16 --key-space-size=1000000000) ;;
    range1k)
      t=$(scaled 2000); OPS=$t
      BENCH+=(--clients=1 range r1k/ r1k0 --total="$t") ;;
    watch)
      t=$(scaled 2000 1); OPS=$((t * 10 * 100))   # every put reaches all 10*100 watchers of the one key
      BENCH+=(watch --streams 10 --watch-per-stream 100 --put-total "$t" --put-rate 100000) ;;
    range64)
      t=$(scaled 100000); OPS=$t
      BENCH+=(--clients=64 --conns=8 range one --total="$t") ;;
    range64s)
      t=$(scaled 100000); OPS=$t
      BENCH+=(--clients=64 --conns=8 range one --consistency=s --total="$t") ;;
    txn64)
      t=$(scaled 50000); OPS=$t
      BENCH+=(--clients=64 --conns=8 txn-put --total="$t" --txn-ops=4 --val-size=256 --key-size=16 --key-space-size=1000000000) ;;
    lease64)
      t=$(scaled 100000); OPS=$t
      BENCH+=(--clients=64 --conns=8 lease-keepalive --total="$t") ;;
    stm64)
      t=$(scaled 20000); OPS=$t
      BENCH+=(--clients=64 --conns=8 stm --total="$t" --keys=100000 --keys-per-txn=4 --val-size=256) ;;
    watchlat)
      t=$(scaled 2000); OPS=$t
      BENCH+=(watch-latency --total="$t" --put-rate=1000 --key-size=16 --val-size=256) ;;
  esac
}

# preload WORKLOAD PORT LOGFILE
preload() {
  local w=$1 port=$2 logf=$3
  if [[ $w == range64 || $w == range64s ]]; then
    printf 'v%.0s' {1..256} | ETCDCTL_API=3 timeout 60 "$ETCDCTL_BIN" --endpoints="127.0.0.1:$port" put one >>"$logf" 2>&1 ||
      { log "ERROR: preload of 'one' failed (see $logf)"; return 1; }
    return 0
  fi
  [[ $w == range1k ]] || return 0
  local val txn b i count
  val=$(printf 'v%.0s' {1..256})
  for ((b = 0; b < 8; b++)); do
    txn=$'\n'
    for ((i = b * 125; i < (b + 1) * 125; i++)); do
      txn+=$(printf 'put r1k/%012d %s' "$i" "$val")$'\n'
    done
    txn+=$'\n\n'
    if ! printf '%s' "$txn" | ETCDCTL_API=3 timeout 60 "$ETCDCTL_BIN" --endpoints="127.0.0.1:$port" txn >>"$logf" 2>&1; then
      log "ERROR: preload txn $b failed (see $logf)"; return 1
    fi
  done
  count=$(ETCDCTL_API=3 timeout 60 "$ETCDCTL_BIN" --endpoints="127.0.0.1:$port" get r1k/ r1k0 --keys-only --limit=1 -w json 2>>"$logf" |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))') || count='?'
  if [[ $count != 1000 ]]; then
    log "ERROR: range1k preload: expected 1000 keys in [r1k/, r1k0), found $count"; return 1
  fi
  echo "preload: 1000 keys r1k/000000000000..r1k/000000000999, 256-byte values" >>"$logf"
}

# --- header ---------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) cpus, CLK_TCK=$CLK_TCK"
  echo "data dirs under: $DATA_TMPDIR ($(df -PT "$DATA_TMPDIR" 2>/dev/null | awk 'NR==2{print $2}'))"
  echo "etcd: $ETCD_BIN: $("$ETCD_BIN" --version 2>&1 | head -n 1)"
  echo "kvd: $KVD: $("$KVD" --version 2>&1 | head -n 1) (this checkout: $(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$REPO_ROOT" status --porcelain 2>/dev/null | grep -q . && echo ', dirty'))"
  echo "benchmark: $ETCD_BENCHMARK (sha256 $(sha256sum "$ETCD_BENCHMARK" | cut -d' ' -f1))"
  [[ -z ${ETCDCTL_BIN:-} ]] || echo "etcdctl: $ETCDCTL_BIN: $("$ETCDCTL_BIN" version 2>&1 | head -n 1)"
  echo "WORKLOADS=$WORKLOADS ROUNDS=$ROUNDS TOTAL_SCALE=$TOTAL_SCALE KVD_ARGS=${KVD_ARGS:-} ETCD_ARGS=${ETCD_ARGS:-}"
} >"$OUT_DIR/env.txt"
cat "$OUT_DIR/env.txt" >&2
if ! "$ETCD_BIN" --version 2>&1 | grep -q '3\.4\.23'; then
  log "WARNING: etcd is not 3.4.23 (see above)"
fi
log "results in $OUT_DIR"

printf 'time\tserver\tworkload\tround\torder\tops\tthroughput\tp99_ms\tcpu_ticks\tcpu_us_per_op\tclient_cpu_us_per_op\tload1\tload5\tload15\tspeed_ms\tstatus\n' >"$RAW"

# --- main loop --------------------------------------------------------------------------
FAILED=()

# settle_load: waits (at most SETTLE_MAX_SECONDS) until the 1-minute load average is at
# or below SETTLE_LOAD, so that a run does not start on the tail of the previous one. A run
# that starts above 1.0 on 2 cores is a draft figure; the load is recorded either way.
settle_load() {
  local waited=0 load1
  ((SETTLE_MAX_SECONDS > 0)) || return 0
  while :; do
    read -r load1 _ </proc/loadavg
    if awk -v l="$load1" -v t="$SETTLE_LOAD" 'BEGIN { exit !(l <= t) }'; then
      return 0
    fi
    if ((waited >= SETTLE_MAX_SECONDS)); then
      log "  load average still $load1 after ${waited}s (SETTLE_LOAD=$SETTLE_LOAD); going on"
      return 0
    fi
    sleep 5
    waited=$((waited + 5))
  done
}

# run_one SERVER WORKLOAD ROUND ORDER
run_one() {
  local server=$1 w=$2 round=$3 order=$4
  local tag="$w-r$round-$server" slog blog up load1 load5 load15 c0 c1 res rc died timed_out t0
  local status=ok tput=NA p99=NA ticks=NA cpu=NA client_cpu=NA k0 k1 speed
  slog=$OUT_DIR/logs/$tag.server.log
  blog=$OUT_DIR/logs/$tag.bench.log
  settle_load
  up=$(uptime 2>/dev/null || true)
  if [[ $up =~ load\ averages?:\ *([0-9.]+),\ *([0-9.]+),\ *([0-9.]+) ]]; then
    load1=${BASH_REMATCH[1]} load5=${BASH_REMATCH[2]} load15=${BASH_REMATCH[3]}
  else
    read -r load1 load5 load15 _ </proc/loadavg
  fi
  speed=$(python3 "$REPO_ROOT/scripts/speed-probe.py")
  log "[$w round $round/$ROUNDS] $server (load average $load1 $load5 $load15, speed probe ${speed} ms)"
  OPS=0
  if ! start_server "$server" "$slog"; then
    status=start-failed
  else
    bench_args "$w" "$SERVER_PORT"
    if ! preload "$w" "$SERVER_PORT" "$blog"; then
      status=preload-failed
    else
      printf '%q ' "$ETCD_BENCHMARK" "${BENCH[@]}" >>"$blog"; echo >>"$blog"
      log "  $(basename "$ETCD_BENCHMARK") ${BENCH[*]}"
      c0=$(cpu_ticks "$SERVER_PID") || c0=0
      children_cpu_us
      k0=$CHILDREN_CPU_US
      rc=0
      # In the background, watched: a signal to this script is acted on at once, and a
      # server that dies mid-run ends the run (the benchmark's clients would retry forever).
      "$ETCD_BENCHMARK" "${BENCH[@]}" >>"$blog" 2>&1 </dev/null &
      BENCH_PID=$!
      died=0 timed_out=0 t0=$SECONDS
      while alive "$BENCH_PID"; do
        if ! alive "$SERVER_PID"; then
          died=1; break
        fi
        if ((SECONDS - t0 >= RUN_TIMEOUT)); then
          timed_out=1; break
        fi
        nap 0.2
      done
      if ((died || timed_out)); then
        stop_bench
        rc=1
      else
        wait "$BENCH_PID" || rc=$?
        children_cpu_us
        k1=$CHILDREN_CPU_US
        client_cpu=$(python3 -c "print('%.2f' % (($k1 - $k0) / $OPS))")
      fi
      BENCH_PID=
      c1=
      if ((died == 0)) && alive "$SERVER_PID"; then
        c1=$(cpu_ticks "$SERVER_PID") || c1=
      fi
      if [[ -z $c1 ]]; then
        status="server-died"
        log "ERROR: $server died during the workload; last lines of $slog:"; tail -n 20 "$slog" >&2
      elif ((timed_out)); then
        status=timeout
        log "ERROR: the benchmark did not finish within ${RUN_TIMEOUT}s (RUN_TIMEOUT); see $blog"
      elif ((rc != 0)); then
        status=bench-exit-$rc
        log "ERROR: the benchmark exited with status $rc; last lines of $blog:"; tail -n 20 "$blog" | tr '\r' '\n' | tail -n 20 >&2
      elif ! res=$(python3 "$HELPER" parse "$blog" "$w" 2>&1); then
        status=parse-failed
        log "ERROR: $res (see $blog)"
      else
        read -r tput p99 <<<"$res"
        ticks=$((c1 - c0))
        cpu=$(python3 -c "print('%.2f' % ($ticks * 1e6 / $CLK_TCK / $OPS))")
        log "  -> $tput/s, p99 ${p99} ms, server CPU $ticks ticks = $cpu us/op, client CPU $client_cpu us/op over $OPS ops"
      fi
    fi
    stop_server
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$(date -u +%H:%M:%S)" "$server" "$w" "$round" "$order" "$OPS" "$tput" "$p99" "$ticks" "$cpu" \
    "$client_cpu" "$load1" "$load5" "$load15" "$speed" "$status" >>"$RAW"
  if [[ $status != ok ]]; then
    FAILED+=("$w/$server/round$round: $status")
    if [[ $FAIL_FAST == 1 ]]; then
      die "run $w/$server/round$round failed ($status); logs in $OUT_DIR/logs (FAIL_FAST=1)"
    fi
  fi
}

for w in $WORKLOADS; do
  for ((round = 1; round <= ROUNDS; round++)); do
    if ((round % 2 == 1)); then order=(etcd kvd); else order=(kvd etcd); fi
    run_one "${order[0]}" "$w" "$round" 1
    run_one "${order[1]}" "$w" "$round" 2
  done
done

{
  cat "$OUT_DIR/env.txt"
  echo
  python3 "$HELPER" summary "$RAW" "$WORKLOADS"
  echo
  echo "Per run (runs.tsv):"
  column -t -s $'\t' "$RAW" 2>/dev/null || cat "$RAW"
} >"$SUMMARY"
echo
cat "$SUMMARY"
echo
echo "results: $OUT_DIR (runs.tsv, summary.txt, env.txt, logs/)"
if ((${#FAILED[@]})); then
  log "ERROR: ${#FAILED[@]} run(s) failed:"
  for f in "${FAILED[@]}"; do log "  $f"; done
  exit 1
fi
