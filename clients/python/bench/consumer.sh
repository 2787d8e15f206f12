#!/usr/bin/env bash
# Consumer throughput (issues 39, 52): examples/kafka_consumer.py without the helper and with it
# in each --mode ($IDEMD_CONSUMER_BENCH_MODES, default "parallel pipelined sequential"),
# 10,000 messages, 4 partitions, one consumer, against a release idemd and a fresh broker from
# scripts/kafka.sh. Prints one JSON line per run (messages/s from the first side effect to the last).
# $IDEMD_CONSUMER_BENCH_RUNS rounds (default 1), $IDEMD_CONSUMER_BENCH_PARALLELISM the --parallelism.
#
#   IDEMD_BIN=target/release/idemd clients/python/bench/consumer.sh [--messages N] [--partitions P] [--rounds R]
set -euo pipefail
sdk="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$sdk/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$repo/target/release/idemd}"
case "$IDEMD_BIN" in /*) ;; *) IDEMD_BIN="$PWD/$IDEMD_BIN" ;; esac
"$sdk/test.sh" --collect-only -q >/dev/null # the pinned venv, with confluent-kafka
if [ -n "${IDEMD_TEST_KAFKA_BROKERS:-}" ]; then
  exec "$sdk/.venv/bin/python" "$sdk/bench/consumer.py" "$@"
fi
exec "$repo/scripts/kafka.sh" run -- "$sdk/.venv/bin/python" "$sdk/bench/consumer.py" "$@"
