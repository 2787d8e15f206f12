#!/usr/bin/env bash
# What each SDK's HTTP middleware costs (issue 37): per framework, the same
# app (`POST /pay` answering 201 with a small JSON body) without and with
# the middleware, against a release idemd on the embedded store, driven by
# wrk (a load generator nobody here wrote; Debian's package) with a fresh
# Idempotency-Key per request, and with replays of 64 completed keys; at 1
# and at 64 requests in flight. Prints and writes a markdown table with
# requests/s, p50, p99 and p999 (wrk's own summary stops at p99: the
# figures come from bench/middleware/keys.lua).
#
#   bench/scripts/middleware.sh                       # every framework
#   FRAMEWORKS="nethttp express" DURATION=5s bench/scripts/middleware.sh
#
# Placement: idemd and the app on one core, the one that services the
# interrupts of the disk idemd's data directory is on (a latency-tuned
# deployment keeps its store there; bench/scripts/disk-irq-cpu.py), wrk on
# another (2 cores here). Each app is started once per variant, both
# variants side by side, and warmed up (WARMUP at 64 in flight) before its
# measured windows: a user's server is long-running, and the JVM compiles
# its hot paths in the first seconds. At 1 in flight the variants take
# turns (ROUNDS, below).
# The apps and how each is built are in clients/<sdk>/bench/README.md; this
# script builds them the same way.
#
# idemd runs with `--claim-rate 0 --max-in-flight 0`: the per-tenant rate
# limit and load shedding would otherwise answer part of the 64-in-flight
# runs with 429/503 (the bench measures the middleware, not the limits).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
DURATION=${DURATION:-10s}
# At 1 in flight the two variants are measured in ROUNDS pairs of
# ROUND_DURATION windows, alternating which goes first: cells of the two
# minutes apart differed by up to 0.2 ms between runs with no code change
# (the disk, the growing store), as much as the differences measured. The
# paired rounds see the same drift; the median of their differences is what
# a fresh key adds.
ROUNDS=${ROUNDS:-3}
ROUND_DURATION=${ROUND_DURATION:-5s}
WARMUP=${WARMUP:-3s}
# The JVM compiles its hot paths over the first ~30,000 requests
# (clients/java/bench/README.md): a Java app gets a longer warm-up, then
# more until its JIT is quiet (settle_jit).
JAVA_WARMUP=${JAVA_WARMUP:-30s}
FRAMEWORKS=${FRAMEWORKS:-"fastapi flask express fastify web nethttp spring jetty"}
out_dir=${OUT_DIR:-$root/bench/results}
# Cores: idemd on the one that takes its disk's interrupts (disk-irq-cpu.py:
# a sync woken across cores cost ~0.08 ms more here), the app beside it,
# wrk on another.
irq_cpu=$("$here/disk-irq-cpu.py" /tmp 2>/dev/null || true)
IDEMD_CPU=${IDEMD_CPU:-${irq_cpu:-0}}
APP_CPU=${APP_CPU:-$IDEMD_CPU}
WRK_CPU=${WRK_CPU:-$((IDEMD_CPU == 0 ? 1 : 0))}

if ! command -v wrk >/dev/null 2>&1; then
    echo "middleware.sh: installing Debian's wrk package..." >&2
    [[ $EUID -eq 0 ]] || { echo "middleware.sh: need root for apt-get (or install wrk)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
fi

if [[ -z "${IDEMD_BIN:-}" ]]; then
    echo "middleware.sh: building a release idemd..." >&2
    (cd "$root" && cargo build --release -q -p idemd)
    IDEMD_BIN="$(cd "$root" && cargo metadata --format-version 1 --no-deps |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/idemd"
fi

work="$(mktemp -d /tmp/idemd-middleware-bench.XXXXXX)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}

# The SDK a framework belongs to, and the command that starts its app
# (clients/<sdk>/bench/README.md).
sdk_of() {
    case "$1" in
        fastapi | flask) echo python ;;
        express | fastify | web) echo typescript ;;
        nethttp) echo go ;;
        spring | jetty) echo java ;;
        *) echo "middleware.sh: unknown framework $1" >&2; exit 2 ;;
    esac
}

# Builds (or installs) an SDK's bench apps once.
declare -A prepared=()
prepare() {
    local sdk=$1
    [[ -n "${prepared[$sdk]:-}" ]] && return 0
    echo "middleware.sh: preparing the $sdk apps..." >&2
    case "$sdk" in
        python) "$root/clients/python/bench/prepare.sh" >&2 ;;
        typescript) "$root/clients/typescript/bench/prepare.sh" >&2 ;;
        go) "$root/clients/go/bench/prepare.sh" >&2 ;;
        java) "$root/clients/java/bench/prepare.sh" >&2 ;;
    esac
    prepared[$sdk]=1
}

# Starts the app of framework $1 with the middleware $2 (on|off); sets
# app_pid and app_port.
start_app() {
    local framework=$1 middleware=$2 sdk
    sdk=$(sdk_of "$framework")
    local log="$work/$framework-$middleware.log"
    taskset -c "$APP_CPU" "$root/clients/$sdk/bench/run.sh" --framework "$framework" \
        --middleware "$middleware" --port 0 --idemd "127.0.0.1:$idemd_port" >"$log" 2>&1 &
    app_pid=$!
    pids+=("$app_pid")
    app_port=""
    for _ in $(seq 1 600); do
        app_port=$(sed -n 's/^listening on \([0-9][0-9]*\)$/\1/p' "$log" | head -n 1)
        [[ -n "$app_port" ]] && return 0
        kill -0 "$app_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "middleware.sh: the $framework app (middleware $middleware) did not start:" >&2
    tail -n 30 "$log" >&2
    exit 1
}

# CPU time, in clock ticks, that JVM $1's JIT compiler threads have used
# (utime + stime of its "C1 CompilerThre" and "C2 CompilerThre" tasks, the
# names as Linux truncates them).
jit_ticks() {
    local task comm total=0
    for task in /proc/"$1"/task/*; do
        comm=$(cat "$task/comm" 2>/dev/null) || continue
        [[ $comm == C[12]\ CompilerThre* ]] || continue
        total=$((total + $(sed 's/^.*) //' "$task/stat" | awk '{print $12 + $13}')))
    done
    echo "$total"
}
jit_ms() {  # $1: ticks before
    echo $(( ($(jit_ticks "$app_pid") - $1) * 1000 / $(getconf CLK_TCK) ))
}

# JAVA_WARMUP does not by itself leave a JVM app compiled: its compiler
# threads share the app's core, and Spring Boot with the filter needs ~17 s
# of their CPU (Jetty ~11 s; clients/java/bench/README.md), so after 30 s
# they were still compiling 2.2-2.4 s per 5 s, into the first measured cell.
# Warm on in 5 s steps until a step compiles for under 250 ms (at most
# JAVA_SETTLE_STEPS), at 64 in flight, then at 1: one request at a time takes
# paths (idle pool threads, one connection) that 64 do not, and Spring
# without the filter, quiet at 64, compiled for 1.7 s of a 5 s 1-in-flight
# cell.
settle_jit() {
    local run=$1 conns step before ms
    for conns in 64 1; do
        for step in $(seq 1 "${JAVA_SETTLE_STEPS:-12}"); do
            before=$(jit_ticks "$app_pid")
            load "$conns" 5s fresh "$run-settle$conns-$step" >/dev/null
            ms=$(jit_ms "$before")
            echo "middleware.sh: $framework JIT settling at $conns in flight, step $step: $ms ms compiling in 5 s" >&2
            (( ms < 250 )) && break
        done
    done
}
jit_cells=()

stop_app() {
    kill "$app_pid" 2>/dev/null || true
    wait "$app_pid" 2>/dev/null || true
}

# Makes variant $1 (off|on) of the running framework the app that load,
# settle_jit and stop_app act on.
use_app() {
    if [[ $1 == off ]]; then app_pid=$off_pid app_port=$off_port; else app_pid=$on_pid app_port=$on_port; fi
}

# wrk against the app: $1 connections (= requests in flight), $2 duration,
# $3 fresh|replay, $4 run id. Prints the RESULT JSON.
load() {
    taskset -c "$WRK_CPU" wrk -t 1 -c "$1" -d "$2" --timeout 10s -s "$root/bench/middleware/keys.lua" \
        "http://127.0.0.1:$app_port" -- "$3" "$4" | sed -n 's/^RESULT //p'
}

rows=()
row() {  # framework variant in_flight json
    local line
    line=$(python3 -c '
import json,sys
r=json.loads(sys.argv[4])
print("| {} | {} | {} | ".format(*sys.argv[1:4])
      + "{per_s:,.0f} | {p50_ms:.2f} | {p99_ms:.2f} | {p999_ms:.2f} | {socket_errors} / {non_2xx} |".format(**r))
' "$@")
    rows+=("$line")
    echo "$line"
}
added=()

idemd_port=$(free_port)
taskset -c "$IDEMD_CPU" "$IDEMD_BIN" --listen "127.0.0.1:$idemd_port" --data-dir "$work/idemd" \
    --http-listen off --metrics-listen off --claim-rate 0 --max-in-flight 0 \
    >"$work/idemd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$idemd_port") 2>/dev/null && break
    sleep 0.1
done

echo "| framework | variant | in flight | requests/s | p50 ms | p99 ms | p999 ms | socket errors / non-2xx |"
echo "|---|---|---|---|---|---|---|---|"
for framework in $FRAMEWORKS; do
    prepare "$(sdk_of "$framework")"
    run="$framework-$RANDOM$RANDOM"
    warmup=$WARMUP
    [[ $(sdk_of "$framework") == java ]] && warmup=$JAVA_WARMUP

    # Both variants run side by side (the idle one costs nothing): the
    # 1-in-flight windows alternate between them (see ROUNDS above).
    start_app "$framework" off
    off_pid=$app_pid off_port=$app_port
    start_app "$framework" on
    on_pid=$app_pid on_port=$app_port
    for variant in off on; do
        use_app "$variant"
        load 64 "$warmup" fresh "$run-warm-$variant" >/dev/null
        [[ $(sdk_of "$framework") == java ]] && settle_jit "$run-warm-$variant"
    done
    declare -A jit_ms_of=([off]=0 [on]=0)
    paired=()
    for round in $(seq 1 "$ROUNDS"); do
        order="off on"
        (( round % 2 == 0 )) && order="on off"
        for variant in $order; do
            use_app "$variant"
            jit_before=$(jit_ticks "$app_pid")
            paired+=("$variant $(load 1 "$ROUND_DURATION" fresh "$run-$variant-1-$round")")
            jit_ms_of[$variant]=$(( ${jit_ms_of[$variant]} + $(jit_ms "$jit_before") ))
        done
    done
    if [[ $(sdk_of "$framework") == java ]]; then
        jit_cells+=("$framework without ${jit_ms_of[off]} ms" "$framework fresh ${jit_ms_of[on]} ms")
    fi
    # The round of median p50 of each variant stands for it in the table;
    # what a fresh key adds is the median of the rounds' differences.
    summary=$(printf '%s\n' "${paired[@]}" | python3 -c '
import json, statistics, sys
runs = {"off": [], "on": []}
for line in sys.stdin:
    variant, result = line.split(" ", 1)
    runs[variant].append(json.loads(result))
def median_run(rs):
    return sorted(rs, key=lambda r: r["p50_ms"])[len(rs) // 2]
adds = [on["p50_ms"] - off["p50_ms"] for off, on in zip(runs["off"], runs["on"])]
print(json.dumps(median_run(runs["off"])))
print(json.dumps(median_run(runs["on"])))
print("{:+.2f} ms (rounds: {})".format(statistics.median(adds), ", ".join("{:+.2f}".format(a) for a in adds)))
')
    row "$framework" "without" 1 "$(sed -n 1p <<<"$summary")"
    use_app off
    row "$framework" "without" 64 "$(load 64 "$DURATION" fresh "$run-w64")"
    row "$framework" "fresh key" 1 "$(sed -n 2p <<<"$summary")"
    use_app on
    row "$framework" "fresh key" 64 "$(load 64 "$DURATION" fresh "$run-f64")"
    # One request at a time completes the 64 keys the replays use.
    load 1 1s replay "$run-r" >/dev/null
    row "$framework" "replay" 1 "$(load 1 "$DURATION" replay "$run-r")"
    row "$framework" "replay" 64 "$(load 64 "$DURATION" replay "$run-r")"
    use_app off
    stop_app
    use_app on
    stop_app

    added+=("$framework $(sed -n 3p <<<"$summary")")
done

echo
echo "p50 a fresh key adds at 1 in flight: ${added[*]}"
if [[ ${#jit_cells[@]} -gt 0 ]]; then
    echo "JIT compiling during the 1-in-flight cells: ${jit_cells[*]}"
fi

mkdir -p "$out_dir"
stamp=$(date -u +%Y-%m-%dT%H-%M-%SZ)
{
    echo "# Middleware load bench $stamp"
    echo
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), Linux $(uname -r)."
    echo "idemd: $("$IDEMD_BIN" --version) (release, embedded store, \`--claim-rate 0 --max-in-flight 0\`); wrk $(wrk -v 2>&1 | head -n 1 | awk '{print $2}'), one thread; at 1 in flight ${ROUNDS} alternating rounds of ${ROUND_DURATION} per variant (the round of median p50 shown; what a fresh key adds: the median of the rounds' differences), ${DURATION} per cell otherwise, after ${WARMUP} of warm-up at 64 in flight (Java: ${JAVA_WARMUP}, then on in 5 s steps, at 64 and then at 1 in flight, until a step compiles for under 250 ms); idemd on core $IDEMD_CPU (the disk's interrupts: core ${irq_cpu:-unknown}), the app on core $APP_CPU, wrk on core $WRK_CPU."
    echo
    echo "| framework | variant | in flight | requests/s | p50 ms | p99 ms | p999 ms | socket errors / non-2xx |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "p50 a fresh key adds at 1 in flight: ${added[*]}"
    if [[ ${#jit_cells[@]} -gt 0 ]]; then
        echo "JIT compiling during the 1-in-flight cells: ${jit_cells[*]}"
    fi
} >"$out_dir/$stamp-middleware.md"
echo "middleware.sh: wrote $out_dir/$stamp-middleware.md"
