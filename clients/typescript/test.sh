#!/usr/bin/env bash
# Builds the TypeScript SDK from scratch and runs all of its tests against a real idemd:
# fingerprint + downstream-key vectors, the shared conformance scenarios, executor tests,
# the TLS/mTLS test, the README examples, the Express/Fastify/Web middleware against the shared
# HTTP scenarios and mounted after a body reader, the HTTP example, the consumer project (the
# README's Install commands on a copy of the files git ships, then a fresh project outside the
# repository installs the packed tarball and runs a program, and the README's Kafka consumer block)
# and the message-consumer helper against the shared consumer scenarios (in each of the example's
# --mode values; IDEMD_CONSUMER_MODES narrows them), its processBatch (also
# against the previous release, IDEMD_PREVIOUS_BIN, for the fallback), and the proxy matrix
# (test/proxy-matrix.test.ts: both transports through nginx, clients/conformance/proxy-matrix.md,
# nginx from Debian's packages via scripts/nginx.sh); all of them under
# scripts/kafka.sh run, which starts a throwaway one-node Kafka broker (jars from Maven Central,
# cached; needs Java 17+ and mvn) and sets IDEMD_TEST_KAFKA_BROKERS; then, on their own, the replay
# latency check (100 replays of a 1 KiB body, fails when the p50 is over 10 ms) and the middleware
# latency test (fails when a fresh key adds more than 2 ms, p50, over the executor's own pair) and
# the transport cost test (fails when the default transport's, node:http2's, CPU per pair is over
# 0.8 of grpc-js's).
#
#   IDEMD_BIN=/path/to/idemd IDEMD_TEST_CERTS=/path/to/test-certs clients/typescript/test.sh
#
# IDEMD_BIN defaults to <repo>/target/debug/idemd. IDEMD_TEST_CERTS is the directory written by
# `make test-certs` (make sdk-typescript sets both); without it the TLS test fails rather than
# skips, so a CI run can never pass without exercising mTLS. Needs Node.js >= 20 with npm (installed
# from Debian's packages if absent) and git; the proto compiler, buf, is an npm devDependency.
# Dependencies come from the npm registry (npm ci against the committed package-lock.json, cached in ~/.npm; the
# consumer test installs the same packages again, preferring that cache).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$repo/target/debug/idemd}"
# The previous release (no ClaimBatch): processBatch's fallback test (test/message-batch.test.ts)
# runs against it (built once and cached by the script).
export IDEMD_PREVIOUS_BIN="${IDEMD_PREVIOUS_BIN:-$("$repo/scripts/previous-release.sh")}"
cd "$here"

need_node() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'
}
if ! need_node; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing Node.js and npm from Debian's packages" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
  fi
  if ! need_node; then
    echo "test.sh: Node.js >= 20 with npm is required (found: $(node --version 2>/dev/null || echo none))" >&2
    exit 1
  fi
fi
if [ ! -x "$IDEMD_BIN" ]; then
  echo "test.sh: idemd binary not found at $IDEMD_BIN (cargo build, or set IDEMD_BIN)" >&2
  exit 1
fi

# npm ci only when the lockfile changed since the last install (it wipes node_modules).
lock_sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp="node_modules/.idemd-lock-sha256"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
  npm ci --ignore-scripts --no-audit --no-fund --prefer-offline
  echo "$lock_sum" > "$stamp"
fi

# Stubs (protoc + ts-proto into src/gen/), then tsc into dist/.
npm run --silent build
# node --test prints its summary (# tests / # pass / # fail) and exits non-zero on a failure.
# First every test but the latency check (dist/test/*.test.js, one file at a time), next to a
# broker; IDEMD_TEST_KAFKA_REQUIRED turns a missing broker into a failure instead of a skip...
IDEMD_TEST_KAFKA_REQUIRED=1 "$repo/scripts/kafka.sh" run -- npm run --silent test:suite
# ...then the latency checks (dist/test/latency/), alone, so that nothing competes with them for
# the CPU. They print "latency: 100 replays of a 1 KiB body: p50 X ms, p99 Y ms" and one
# "latency: <framework> middleware, ..." line per middleware.
npm run --silent test:latency
