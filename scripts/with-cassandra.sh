#!/usr/bin/env bash
# Runs a command against a fresh local Cassandra cluster and stops the
# cluster afterwards, whatever the command's outcome:
#
#   scripts/with-cassandra.sh [--nodes N] [--dcs D] -- cargo test --features cql-tests ...
#
# The command sees IDEMD_TEST_CQL_NODES (comma-separated contact points, node 1 first) and, with
# --dcs, IDEMD_TEST_CQL_DCS (the number of datacenters; node placement: scripts/cassandra.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nodes=1
dcs=1
while [ "${1:-}" = "--nodes" ] || [ "${1:-}" = "--dcs" ]; do
  if [ "$1" = "--nodes" ]; then nodes="$2"; else dcs="$2"; fi
  shift 2
done
[ "${1:-}" = "--" ] && shift
[ "$#" -gt 0 ] || { echo "usage: $0 [--nodes N] [--dcs D] -- command..." >&2; exit 2; }

"$here/cassandra.sh" stop >/dev/null 2>&1 || true
trap '"$here/cassandra.sh" stop >/dev/null 2>&1 || true' EXIT
"$here/cassandra.sh" start --nodes "$nodes" --dcs "$dcs"
contact=""
for i in $(seq 1 "$nodes"); do
  contact="${contact:+$contact,}127.0.0.$i:9042"
done
status=0
IDEMD_TEST_CQL_NODES="$contact" IDEMD_TEST_CQL_DCS="$dcs" "$@" || status=$?
if [ "$status" -ne 0 ]; then
  "$here/cassandra.sh" errors --nodes "$nodes" || true
fi
exit "$status"
