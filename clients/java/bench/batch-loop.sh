#!/usr/bin/env bash
# processBatch without a broker (BatchLoopThroughput): ROUNDS rounds of N messages in 500-message
# batches against a fresh idemd of $IDEMD_BIN (default target/release/idemd); prints messages/s per
# round and idemd's CPU per message. Alternate two builds (A B B A) to compare servers:
#
#   IDEMD_BIN=/path/to/idemd clients/java/bench/batch-loop.sh [N [ROUNDS]]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdk="$(cd "$here/.." && pwd)"
root="$(cd "$sdk/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$root/target/release/idemd}"
if [ ! -x "$IDEMD_BIN" ]; then
  echo "batch-loop.sh: no idemd binary at $IDEMD_BIN (build the release, or set IDEMD_BIN)" >&2
  exit 1
fi
mvn -B -ntp -q -Dstyle.color=never -f "$sdk/pom.xml" -DskipTests test-compile \
  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:build-classpath \
  -Dmdep.includeScope=test -Dmdep.outputFile="$sdk/target/bench.classpath"
java -cp "$sdk/target/test-classes:$sdk/target/classes:$(cat "$sdk/target/bench.classpath")" \
  -Didemd.repo.root="$root" dev.idemd.client.bench.BatchLoopThroughput "$@"
