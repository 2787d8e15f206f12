#!/usr/bin/env bash
# Messages/s of the Kafka consumer example (examples/kafka-consumer, KafkaConsumerExample: one
# consumer JVM, kafka-clients' default fetch, handler 0 ms, a commit per poll) on MESSAGES messages
# (default 10000) in 4 partitions, without MessageProcessor (--no-helper) and with it in each mode of
# IDEMD_CONSUMER_BENCH_MODES (default "parallel pipelined sequential": the example's --mode;
# parallel and pipelined hand each poll to processBatch, sequential calls process per message),
# IDEMD_CONSUMER_BENCH_RUNS runs of each (default 2), in turn (IDEMD_CONSUMER_BENCH_PARALLELISM sets
# --parallelism), against a throwaway broker (scripts/kafka.sh) and the idemd of $IDEMD_BIN
# (default: the release build, target/release/idemd). Each consumer first takes
# IDEMD_CONSUMER_BENCH_WARMUP messages (default MESSAGES) from the same topic and is timed on the
# MESSAGES after them (the cold figure is printed beside); IDEMD_CONSUMER_BENCH_JVM_OPTIONS go to
# the consumer's JVM. Prints one line per run (ConsumerThroughput).
#
#   IDEMD_BIN=/path/to/release/idemd [IDEMD_CONSUMER_BENCH_RUNS=2] \
#     [IDEMD_CONSUMER_BENCH_MODES="parallel pipelined"] clients/java/bench/consumer.sh [MESSAGES]
#
# Installs the core (and its test harness jar) into ~/.m2 as test.sh does, then builds the example.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdk="$(cd "$here/.." && pwd)"
root="$(cd "$sdk/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$root/target/release/idemd}"
if [ ! -x "$IDEMD_BIN" ]; then
  echo "consumer.sh: no idemd binary at $IDEMD_BIN (build the release, or set IDEMD_BIN)" >&2
  exit 1
fi
example="$sdk/examples/kafka-consumer"
mvn -B -ntp -q -Dstyle.color=never -f "$sdk/pom.xml" -DskipTests install
mvn -B -ntp -q -Dstyle.color=never -f "$example/pom.xml" test-compile \
  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:build-classpath \
  -Dmdep.includeScope=test -Dmdep.outputFile="$example/target/bench.classpath"
classpath="$example/target/test-classes:$example/target/classes:$(cat "$example/target/bench.classpath")"
IDEMD_KAFKA_REQUIRED=1 "$root/scripts/kafka.sh" run -- \
  java -cp "$classpath" -Didemd.repo.root="$root" dev.idemd.examples.kafka.ConsumerThroughput "${1:-10000}"
