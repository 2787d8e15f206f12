#!/usr/bin/env bash
# ghz's view of idemd's tail (issue 30): fresh Claims against a release
# `idemd serve` on the embedded store (new temp data dir), at 1 and at 64
# in flight, p50/p99/p999 computed from every call's latency (ghz's own
# summary stops at p99). The per-stage breakdown of the store's writes
# during each phase is printed from /metrics (idemd-bench growth has the
# same, per window).
#
#   bench/scripts/ghz-tail.sh IDEMD_BIN GHZ_BIN [CALLS_AT_1] [DURATION_AT_64]
set -euo pipefail
idemd=${1:?idemd binary}; ghz=${2:?ghz binary}
calls1=${3:-3000}; duration64=${4:-20s}
dir=$(mktemp -d /tmp/idemd-ghz-tail.XXXXXX)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
mport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$idemd" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" --data-dir "$dir/data" \
  --claim-rate 0 2>"$dir/idemd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 200); do
  curl -sf "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break; sleep 0.1
done
sleep 1
sha=$(python3 -c 'import base64;print(base64.b64encode(bytes([7]*32)).decode())')
data="{\"endpoint\":\"POST /v1/payments\",\"key\":\"{{.UUID}}\",\"sha256\":\"$sha\"}"
summary() {  # ghz JSON report on stdin -> one line
  python3 -c '
import json,sys
r=json.load(sys.stdin); d=sorted(x["latency"] for x in r.get("details",[]) if x.get("status")=="OK")
n=len(d); q=lambda p: d[min(n-1,int(p*n))]/1e6
rps=r["rps"]
errors=sum(v for k,v in r["statusCodeDistribution"].items() if k!="OK")
print(f"{sys.argv[1]}: {n} ok, {errors} errors, {rps:.0f} claims/s, p50 {q(.5):.3f} ms, p99 {q(.99):.3f} ms, p999 {q(.999):.3f} ms, max {d[-1]/1e6:.3f} ms")
' "$1"
}
stages() {
  curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^idemd_embedded_(write_duration_seconds|checkpoint_duration_seconds)_(count|sum)' || true
}
common=(--insecure --call idemd.v1.Idempotency/Claim --data "$data" \
  --metadata '{"x-tenant-id":"bench"}' --format json)
"$ghz" "${common[@]}" -c 1 -n 200 "127.0.0.1:$port" >/dev/null   # warm-up
"$ghz" "${common[@]}" -c 1 -n "$calls1" "127.0.0.1:$port" | summary "1 in flight"
"$ghz" "${common[@]}" -c 64 --connections 4 -z "$duration64" "127.0.0.1:$port" | summary "64 in flight"
stages
