#!/usr/bin/env bash
# What duplicates polling a held key cost on the CQL store (docs/scylla.md,
# "A duplicate costs a read, not an LWT"), measured with clients nobody here
# wrote: per key, grpcurl claims it, ghz polls it with Claims (no wait) at
# RATE/s from N connections for 4 s, and after 1.5 s grpcurl completes it.
# Prints the Complete's wall time (grpcurl's own start-up included) and the
# polls' rate, p50 and p99, per key.
#
#   scripts/with-cassandra.sh -- bench/scripts/cql-pollers.sh IDEMD_BIN [N] [KEYS]
#
# Run it for two binaries in one cluster to compare them (the keyspace is
# created by `idemd migrate` on first use and reused).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:?usage: cql-pollers.sh IDEMD_BIN [POLLERS] [KEYS]}"
pollers=${2:-16}
keys=${3:-12}
rate=${RATE:-400}
port=${PORT:-50091}
tools="$("$here/tools.sh" | tail -n 1)"
work="$(mktemp -d /tmp/idemd-cql-pollers.XXXXXX)"
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" migrate --keyspace pollers >"$work/migrate.log" 2>&1
"$bin" --store cql --keyspace pollers --data-dir "$work/data" --listen "127.0.0.1:$port" \
    --http-listen off --metrics-listen off --claim-rate 0 --max-in-flight 0 >"$work/idemd.log" 2>&1 &
pid=$!

tenant='x-tenant-id: pollers'
sha="$(printf 'a%.0s' {1..32} | base64 -w0)"
claim() { printf '{"endpoint":"e","key":"%s","sha256":"%s"}' "$1" "$sha"; }
call() { "$tools/grpcurl" -plaintext -H "$tenant" -d "$2" "127.0.0.1:$port" "idemd.v1.Idempotency/$1"; }

# Ready once a Claim is granted (the store opens after the port does).
for i in $(seq 1 120); do
    call Claim "$(claim "ready-$$-$i")" 2>/dev/null | grep -q claimed && break
    sleep 0.5
done

echo "# $bin: $pollers pollers at $rate Claims/s"
for i in $(seq 1 "$keys"); do
    key="held-$$-$i"
    token="$(call Claim "$(claim "$key")" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["claimed"]["leaseToken"])')"
    "$tools/ghz" --insecure --call idemd.v1.Idempotency/Claim -m '{"x-tenant-id":"pollers"}' \
        -d "$(claim "$key")" -c "$pollers" -r "$rate" -z 4s "127.0.0.1:$port" >"$work/ghz.txt" 2>&1 &
    ghz=$!
    sleep 1.5
    started=$(date +%s%N)
    call Complete "$(printf '{"endpoint":"e","key":"%s","leaseToken":"%s","response":{"status":200,"body":"b2s="}}' \
        "$key" "$token")" >/dev/null
    ended=$(date +%s%N)
    wait "$ghz"
    polls="$(grep -E 'Requests/sec|50 % in|99 % in' "$work/ghz.txt" | tr -s ' \t' ' ' | tr '\n' ' ')"
    echo "key $i: complete $(((ended - started) / 1000000)) ms; polls:$polls"
done
