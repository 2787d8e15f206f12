#!/usr/bin/env bash
# What idemd sends to the CQL store, table by table, counted by Cassandra
# itself (issue 38; docs/benchmarks.md, "What a pair costs the store"):
#
#   scripts/with-cassandra.sh -- bench/scripts/cql-statements.sh IDEMD_BIN
#
# On a fresh keyspace of the running test cluster (IDEMD_TEST_CQL_NODES), one
# idemd replica (release build), three phases, each between two snapshots of
# the node's virtual tables (bench/cql/counters.py):
#   1. idle: one tenant that claimed once, then IDLE_SECONDS of nothing: the
#      background statements per second (sealer, gauges, clock probe);
#   2. idle tenants: TENANTS more tenants that claimed once each, then
#      IDLE_SECONDS: what each idle tenant adds;
#   3. load: fresh Claim+Complete pairs from peer-load (bench/go/peerload, 16
#      in flight, LOAD_SECONDS): statements per pair, background included.
# Prints three markdown tables. Needs Go (bench/scripts/tools.sh builds
# peer-load and installs ghz) and python3 (cassandra-driver, pinned, into a
# venv under the tools cache).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
idemd=${1:?usage: cql-statements.sh IDEMD_BIN}
IDLE_SECONDS=${IDLE_SECONDS:-60}
LOAD_SECONDS=${LOAD_SECONDS:-30}
TENANTS=${TENANTS:-100}
nodes=${IDEMD_TEST_CQL_NODES:?run under scripts/with-cassandra.sh}
host=${nodes%%,*}
host=${host%:*}
cache=${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}
tools="$("$here/tools.sh" | tail -n 1)"
venv=$cache/venv-cql
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c 'import cassandra' 2>/dev/null; then
    echo "cql-statements.sh: installing cassandra-driver into $venv..." >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q cassandra-driver==3.29.2 >&2
fi
counters() { "$venv/bin/python" "$root/bench/cql/counters.py" "$@"; }

keyspace=idemd_statements_$$
work=$(mktemp -d /tmp/idemd-cql-statements.XXXXXX)
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
mport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$idemd" migrate --cql-nodes "$nodes" --keyspace "$keyspace" >/dev/null 2>&1
"$idemd" --store cql --cql-nodes "$nodes" --keyspace "$keyspace" --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$mport" --http-listen off --data-dir "$work/data" \
    --claim-rate 0 --max-in-flight 0 2>"$work/idemd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$mport/health" >/dev/null 2>&1 && break
    sleep 0.1
done
load() {  # load TENANT IN_FLIGHT SECONDS -> peer-load's JSON line
    "$tools/peer-load" -system idemd -addr "127.0.0.1:$port" -mode pair -tenant "$1" \
        -in-flight "$2" -duration "${3}s" -warmup 0s
}
snap() { counters snapshot "$host" "$keyspace" >"$work/$1.json"; }

echo "## idle: one tenant, ${IDLE_SECONDS} s"
load first 1 1 >/dev/null
sleep 2
snap idle-before
sleep "$IDLE_SECONDS"
snap idle-after
counters table "$work/idle-before.json" "$work/idle-after.json" 0 "$IDLE_SECONDS"

echo
echo "## idle: $TENANTS more tenants that claimed once each, ${IDLE_SECONDS} s"
sha=$(python3 -c 'import base64;print(base64.b64encode(bytes([7]*32)).decode())')
"$tools/ghz" --insecure --call idemd.v1.Idempotency/Claim -c 1 -n "$TENANTS" \
    --data "{\"endpoint\":\"POST /v1/payments\",\"key\":\"{{.UUID}}\",\"sha256\":\"$sha\"}" \
    --metadata '{"x-tenant-id":"idle-{{.RequestNumber}}"}' "127.0.0.1:$port" >/dev/null
sleep 2
snap tenants-before
sleep "$IDLE_SECONDS"
snap tenants-after
counters table "$work/tenants-before.json" "$work/tenants-after.json" 0 "$IDLE_SECONDS"

echo
echo "## load: fresh pairs, 16 in flight, ${LOAD_SECONDS} s (the idle tenants above still there)"
snap load-before
result=$(load bench 16 "$LOAD_SECONDS")
snap load-after
echo "peer-load: $result"
pairs=$(python3 -c 'import json,sys;r=json.loads(sys.argv[1]);print(int(r["ops_per_s"]*float(sys.argv[2])))' "$result" "$LOAD_SECONDS")
counters table "$work/load-before.json" "$work/load-after.json" "$pairs" "$LOAD_SECONDS"
