#!/usr/bin/env bash
# Runs a command against a fresh local Cassandra cluster and stops the
# cluster afterwards, whatever the command's outcome:
#
#   scripts/with-cassandra.sh [--nodes N] -- cargo test --features cql-tests ...
#
# The command sees IDEMD_TEST_CQL_NODES (comma-separated contact points).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nodes=1
if [ "${1:-}" = "--nodes" ]; then
  nodes="$2"
  shift 2
fi
[ "${1:-}" = "--" ] && shift
[ "$#" -gt 0 ] || { echo "usage: $0 [--nodes N] -- command..." >&2; exit 2; }

"$here/cassandra.sh" stop >/dev/null 2>&1 || true
trap '"$here/cassandra.sh" stop >/dev/null 2>&1 || true' EXIT
"$here/cassandra.sh" start --nodes "$nodes"
contact=""
for i in $(seq 1 "$nodes"); do
  contact="${contact:+$contact,}127.0.0.$i:9042"
done
IDEMD_TEST_CQL_NODES="$contact" "$@"
