#!/usr/bin/env bash
# bench/scripts/proxy.sh: the overhead of `idemd proxy` (issue 16), measured
# with wrk, an HTTP load generator nobody here wrote, against calling the
# upstream directly, in one run:
#   - 1 in flight: p50 of fresh POSTs (direct vs through the proxy), and of
#     replays (through the proxy) against a direct call to an upstream doing
#     no work (what a replay adds beyond one HTTP round trip);
#   - 64 in flight: fresh POSTs per second, direct vs through the proxy.
# The upstream (`idemd-bench upstream`) spends --work of CPU per request; it
# shares core 0 with the proxy, as an application shares its pod with a
# sidecar; wrk runs on core 1. idemd runs with its defaults (embedded store).
#
# Usage: bench/scripts/proxy.sh [DURATION]   (default 10s per phase)
# Environment: CARGO_TARGET_DIR (where the release binaries are), WORK (1ms).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/release"
DURATION="${1:-10s}"
WORK="${WORK:-1ms}"

if ! command -v wrk >/dev/null; then
  [[ $EUID -eq 0 ]] || { echo "proxy.sh: need root for apt-get (or install wrk)" >&2; exit 1; }
  echo "installing wrk (Debian package, first run only)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >&2
fi
for bin in idemd idemd-bench; do
  [ -x "$TARGET/$bin" ] || { echo "proxy.sh: build first: cargo build --release -p idemd -p idemd-bench" >&2; exit 1; }
done

WORKDIR="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORKDIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_upstream VAR WORK: starts an upstream, sets VAR to its address.
start_upstream() {
  local out="$WORKDIR/upstream-$1"
  taskset -c 0 "$TARGET/idemd-bench" upstream --work "$2" >"$out" &
  PIDS+=($!)
  for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.05; done
  printf -v "$1" '%s' "$(head -1 "$out")"
}

start_upstream UPSTREAM "$WORK"
start_upstream UPSTREAM_IDLE 0s
PROXY="127.0.0.1:$(free_port)"
taskset -c 0 "$TARGET/idemd" proxy --upstream "http://$UPSTREAM" --listen "$PROXY" \
  --data-dir "$WORKDIR/data" --metrics-listen 127.0.0.1:0 2>"$WORKDIR/idemd.log" &
PIDS+=($!)
for _ in $(seq 100); do curl -s -o /dev/null "http://$PROXY/" && break; sleep 0.1; done

cat >"$WORKDIR/fresh.lua" <<'LUA'
local counter = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function request()
  counter = counter + 1
  local key = string.format("k-%d-%d-%d", os.time(), tid or 0, counter)
  return wrk.format("POST", "/v1/payments",
    {["Idempotency-Key"] = key, ["Content-Type"] = "application/json"},
    '{"amount": 100, "currency": "usd"}')
end
LUA
cat >"$WORKDIR/replay.lua" <<'LUA'
function request()
  return wrk.format("POST", "/v1/payments",
    {["Idempotency-Key"] = "replay-1", ["Content-Type"] = "application/json"},
    '{"amount": 100, "currency": "usd"}')
end
LUA
# One claim to replay afterwards.
curl -s -o /dev/null -H 'Idempotency-Key: replay-1' -H 'Content-Type: application/json' \
  -d '{"amount": 100, "currency": "usd"}' "http://$PROXY/v1/payments"

# run NAME ADDR SCRIPT CONNECTIONS: prints "NAME p50_ms rps".
run() {
  local name="$1" addr="$2" script="$3" connections="$4" out
  out="$(taskset -c 1 wrk -t1 -c"$connections" -d"$DURATION" --latency -s "$WORKDIR/$script" "http://$addr")"
  if grep -q "Non-2xx" <<<"$out"; then
    echo "proxy.sh: $name got non-2xx answers:" >&2; echo "$out" >&2; exit 1
  fi
  local p50 rps
  p50="$(awk '$1 == "50%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }; printf "%.3f", v }' <<<"$out")"
  rps="$(awk '/^Requests\/sec:/ { printf "%.0f", $2 }' <<<"$out")"
  printf '%s %s %s\n' "$name" "$p50" "$rps"
  printf '%-28s p50 %8s ms  %8s req/s\n' "$name" "$p50" "$rps" >&2
}

echo "wrk $(wrk -v 2>&1 | head -1 | awk '{print $2}'), $DURATION per phase, upstream work $WORK" >&2
direct1="$(run "direct fresh, 1 in flight" "$UPSTREAM" fresh.lua 1)"
proxy1="$(run "proxy fresh, 1 in flight" "$PROXY" fresh.lua 1)"
idle1="$(run "direct, no work, 1 in flight" "$UPSTREAM_IDLE" fresh.lua 1)"
replay1="$(run "proxy replay, 1 in flight" "$PROXY" replay.lua 1)"
direct64="$(run "direct fresh, 64 in flight" "$UPSTREAM" fresh.lua 64)"
proxy64="$(run "proxy fresh, 64 in flight" "$PROXY" fresh.lua 64)"

field() { awk -v n="$2" '{ print $(NF - 2 + n) }' <<<"$1"; }
awk -v d1="$(field "$direct1" 1)" -v p1="$(field "$proxy1" 1)" \
    -v i1="$(field "$idle1" 1)" -v r1="$(field "$replay1" 1)" \
    -v d64="$(field "$direct64" 2)" -v p64="$(field "$proxy64" 2)" 'BEGIN {
  printf "\n| measure | direct | proxy | result | target |\n|---|---:|---:|---:|---|\n"
  printf "| fresh POST p50, 1 in flight (ms) | %.3f | %.3f | +%.3f ms | - |\n", d1, p1, p1 - d1
  printf "| replay p50, 1 in flight (ms; direct = upstream doing no work) | %.3f | %.3f | +%.3f ms | <= +0.5 ms |\n", i1, r1, r1 - i1
  printf "| fresh POSTs/s, 64 in flight | %d | %d | %.2fx | >= 0.7x |\n", d64, p64, p64 / d64
}'
