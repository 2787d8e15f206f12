#!/usr/bin/env bash
# Builds the Java SDK (stubs generated from proto/ at build time) and runs all of its tests:
# fingerprint and downstream-key vectors, the conformance scenarios and the README example,
# against a live idemd started from $IDEMD_BIN (default: <repo>/target/debug/idemd),
# the mTLS test (MutualTlsTest) against a TLS idemd using the certificates in $IDEMD_TEST_CERTS
# (written by `make test-certs`; without it that test fails), and the consumer project
# (ConsumerProjectTest: README "Install" run as written on a copy of the files git ships for
# clients/java and proto/, then a fresh Maven project outside the repository; it needs git, and
# Maven Central for the plugins missing from ~/.m2, and writes nothing to ~/.m2). Surefire's
# forked JVM inherits the environment, so both variables reach the tests.
#
# One `mvn test` runs two Surefire executions in this order (pom.xml): `default-test`, every test
# except the replay latency check (JUnit tag "latency"), then `replay-latency`, ReplayLatencyTest
# alone in a JVM and idemd of its own, so that nothing else competes for the CPU; it prints
# `latency: 100 replays of a 1 KiB body: p50 X ms, p99 Y ms` and fails when the p50 is over 10 ms
# (clients/conformance/README.md, "Replay latency check"). A failure in the first execution stops
# the build before the second.
#
# Then the servlet filter (servlet/) against the shared HTTP scenarios inside Jetty, and the Spring
# Boot payments example (spring-example/) that registers it: these build against the core, which
# is installed into the local Maven repository (~/.m2) for them, then the filter is too. The
# filter's live tests skip themselves without IDEMD_BIN (README "Install" on a fresh clone); here
# it is always set, and a skipped one fails the run.
#
# Last, the Kafka consumer example (examples/kafka-consumer/, a module of its own: the core keeps no
# Kafka dependency) under scripts/kafka.sh, which starts a throwaway one-node broker and passes its
# address in IDEMD_TEST_KAFKA_BROKERS: ConsumerScenariosTest plays
# clients/conformance/consumer-scenarios.json with the consumer program in separate JVMs, in each of
# its --mode values (sequential, pipelined, parallel; IDEMD_CONSUMER_MODES narrows them), and the
# negative controls; ReadmeConsumerTest runs the README's consumer block. IDEMD_KAFKA_REQUIRED makes
# them fail, not skip, without a broker.
#
#   IDEMD_BIN=/path/to/idemd IDEMD_TEST_CERTS=/path/to/test-certs clients/java/test.sh
#
# Installs a JDK (17+) and Maven with apt when missing; Maven dependencies, protoc and the gRPC
# plugin come from Maven Central into the standard ~/.m2 cache. Maven's own output is kept to
# warnings, errors, Surefire's test summary and the latency line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
IDEMD_BIN="${IDEMD_BIN:-$root/target/debug/idemd}"
case "$IDEMD_BIN" in
  /*) ;;
  *) IDEMD_BIN="$PWD/$IDEMD_BIN" ;;
esac
export IDEMD_BIN
# The previous release (no ClaimBatch): ProcessBatchTest's fallback test runs processBatch against
# it (built once and cached by the script; it skips itself without the variable).
export IDEMD_PREVIOUS_BIN="${IDEMD_PREVIOUS_BIN:-$("$root/scripts/previous-release.sh")}"

have_jdk() {
  command -v javac >/dev/null 2>&1 || return 1
  local major
  major="$(javac -version 2>&1 | sed -n 's/^javac \([0-9]*\).*/\1/p')"
  [ -n "$major" ] && [ "$major" -ge 17 ]
}

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
apt_updated=""
install_packages() {
  if [ -z "$apt_updated" ]; then
    $sudo apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! have_jdk; then
  $sudo apt-get update -qq
  apt_updated=1
  jdk=""
  for candidate in openjdk-17-jdk-headless openjdk-21-jdk-headless default-jdk-headless; do
    if apt-cache show "$candidate" >/dev/null 2>&1; then
      jdk="$candidate"
      break
    fi
  done
  if [ -z "$jdk" ]; then
    echo "test.sh: no JDK package found in apt" >&2
    exit 1
  fi
  install_packages "$jdk"
fi
if ! command -v mvn >/dev/null 2>&1; then
  install_packages maven
fi

if [ ! -x "$IDEMD_BIN" ]; then
  echo "test.sh: no idemd binary at $IDEMD_BIN (build it, or set IDEMD_BIN)" >&2
  exit 1
fi

cd "$here"
# -q would hide Surefire's summary too: log at WARN except the Surefire plugin. The sed drops the
# colour codes Debian's Maven prints even in batch mode.
mvn -B -ntp -Dstyle.color=never \
  -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
  -Dorg.slf4j.simpleLogger.log.org.apache.maven.plugin.surefire=info \
  test 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g'

# The servlet filter (a module of its own: the core keeps no servlet dependency) and the Spring
# Boot payments example that registers it, each built against the core above: install the core
# (tests already ran), then build, test and install the filter (the shared HTTP scenarios inside
# Jetty), then test the example.
mvn_quiet() {
  mvn -B -ntp -Dstyle.color=never \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -Dorg.slf4j.simpleLogger.log.org.apache.maven.plugin.surefire=info \
    "$@" 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g'
}
mvn_quiet -q -DskipTests install
mvn_quiet -f servlet/pom.xml install
# The filter's live tests are @NeedsIdemd (skipped without IDEMD_BIN, so that the README's install
# works on a fresh clone). IDEMD_BIN is exported above, so here a skip means a test did not run:
# fail rather than pass with less.
reports=(servlet/target/surefire-reports/TEST-*.xml)
if [ ! -e "${reports[0]}" ]; then
  echo "test.sh: the servlet module ran no tests" >&2
  exit 1
fi
if grep -l 'skipped="[1-9]' "${reports[@]}" >&2; then
  echo "test.sh: the servlet tests above were skipped although IDEMD_BIN is set" >&2
  exit 1
fi
mvn_quiet -f spring-example/pom.xml test

# The consumer scenarios against a real broker; their `consumer scenario N (...), MODE mode: pass in X s` lines
# go to the console.
IDEMD_KAFKA_REQUIRED=1 "$root/scripts/kafka.sh" run -- \
  mvn -B -ntp -Dstyle.color=never \
    -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
    -Dorg.slf4j.simpleLogger.log.org.apache.maven.plugin.surefire=info \
    -f examples/kafka-consumer/pom.xml test 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g'
