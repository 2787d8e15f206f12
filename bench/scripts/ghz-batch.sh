#!/usr/bin/env bash
# ClaimBatch as a client nobody here wrote sees it: ghz sends batches of ITEMS fresh claims
# (default 250, a consumer's half poll) at 1 call in flight and at 8 in flight, to each idemd
# binary given, in turn and twice over (A B B A), each on a fresh embedded store. Prints per binary
# and load: calls/s, claims/s, p50/p99/p999 of the call (docs/sdk.md, "Batched consumers"). The
# server runs with --claim-rate 0: the default limit would shed most of these claims.
#
#   bench/scripts/ghz-batch.sh GHZ ITEMS BIN [BIN...]    (GHZ: bench/scripts/tools.sh installs it)
#   e.g. bench/scripts/ghz-batch.sh ~/.cache/idemd/tools/bin/ghz 250 /tmp/idemd-old target/release/idemd
set -euo pipefail
ghz=${1:?ghz binary}; items=${2:-250}; shift 2
[ $# -ge 1 ] || { echo "ghz-batch.sh: give at least one idemd binary" >&2; exit 2; }
calls1=${IDEMD_GHZ_BATCH_CALLS:-400}; duration=${IDEMD_GHZ_BATCH_DURATION:-10s}
sha=$(python3 -c 'import base64;print(base64.b64encode(bytes([7]*32)).decode())')
data=$(python3 -c '
import json,sys
n=int(sys.argv[1]); sha=sys.argv[2]
print(json.dumps({"endpoint":"POST /v1/payments","claims":[{"key":"{{.UUID}}-%d"%i,"sha256":sha} for i in range(n)]}))
' "$items" "$sha")
summary() {  # ghz JSON report on stdin -> one line
  python3 -c '
import json,sys
r=json.load(sys.stdin); d=sorted(x["latency"] for x in r.get("details",[]) if x.get("status")=="OK")
n=len(d); q=lambda p: d[min(n-1,int(p*n))]/1e6
errors=", ".join(f"{v} {k}" for k,v in r["statusCodeDistribution"].items() if k!="OK") or "0"
items=int(sys.argv[2]); rps=r["rps"]
print(f"{sys.argv[1]}: {n} ok, errors: {errors} (-z cancels the calls in flight at its end), {rps:.0f} calls/s = {rps*items:.0f} claims/s, p50 {q(.5):.2f} ms, p99 {q(.99):.2f} ms, p999 {q(.999):.2f} ms")
' "$1" "$items"
}
play() {  # play BIN
  local bin=$1 dir port mport pid
  dir=$(mktemp -d /tmp/idemd-ghz-batch.XXXXXX)
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  mport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  "$bin" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --data-dir "$dir/data" \
    --claim-rate 0 2>"$dir/idemd.log" &
  pid=$!
  trap "kill $pid 2>/dev/null" EXIT
  for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break; sleep 0.1
  done
  local common=(--insecure --call idemd.v1.Idempotency/ClaimBatch --data "$data"
    --metadata '{"x-tenant-id":"bench"}' --format json)
  "$ghz" "${common[@]}" -c 1 -n 50 "127.0.0.1:$port" >/dev/null   # warm-up
  "$ghz" "${common[@]}" -c 1 -n "$calls1" "127.0.0.1:$port" | summary "$bin, $items items, 1 in flight"
  "$ghz" "${common[@]}" -c 8 -z "$duration" "127.0.0.1:$port" | summary "$bin, $items items, 8 in flight"
  kill "$pid"; wait "$pid" 2>/dev/null || true; rm -rf "$dir"
}
for round in 1 2; do
  if [ "$round" = 1 ]; then order=("$@"); else order=(); for ((i=$#; i>=1; i--)); do order+=("${!i}"); done; fi
  for bin in "${order[@]}"; do play "$bin"; done
done
