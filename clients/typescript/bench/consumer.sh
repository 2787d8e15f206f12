#!/usr/bin/env bash
# Consumer throughput (issue 39): the Kafka consumer program with and without the helper, one
# consumer, 10,000 messages on 4 partitions, against a throwaway broker (scripts/kafka.sh run) and
# the idemd of IDEMD_BIN (default: the release build). Builds the SDK first (npm ci + build).
#
#   IDEMD_BIN=target/release/idemd clients/typescript/bench/consumer.sh [--messages N] [--partitions P]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$repo/target/release/idemd}"
"$here/bench/prepare.sh"
exec "$repo/scripts/kafka.sh" run -- node "$here/dist/bench/consumer-throughput.js" "$@"
