#!/usr/bin/env bash
# Consumer throughput bench: examples/kafka-consumer with and without the
# helper (no-helper mode) on 10,000 messages, 4 partitions, one consumer, the
# client's default fetch, handler 0 ms, against a fresh one-node broker
# (scripts/kafka.sh run) and an idemd started from IDEMD_BIN (default the
# release build, <repo>/target/release/idemd). Prints messages/s per run.
#
#   IDEMD_BIN=/path/to/release/idemd clients/go/bench/consumer.sh
#
# IDEMD_CONSUMER_BENCH_RUNS sets the runs of each mode (default 3). Needs Go
# 1.26+, java and mvn (what clients/go/test.sh installs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$root/target/release/idemd}"
case "$IDEMD_BIN" in /*) ;; *) IDEMD_BIN="$PWD/$IDEMD_BIN" ;; esac
[ -x "$IDEMD_BIN" ] || { echo "consumer.sh: no idemd at $IDEMD_BIN (cargo build --release, or set IDEMD_BIN)" >&2; exit 1; }
cd "$here/examples/kafka-consumer"
IDEMD_CONSUMER_BENCH=1 IDEMD_TEST_KAFKA_REQUIRED=1 exec "$root/scripts/kafka.sh" run -- \
  go test -count=1 -run '^TestConsumerThroughput$' -v -timeout 30m .
