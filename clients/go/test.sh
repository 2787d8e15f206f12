#!/usr/bin/env bash
# Builds and tests the Go SDK: checks that the committed stubs in gen/ are what
# scripts/generate.sh produces from proto/idemd/v1/idempotency.proto, vets,
# and runs every test (fingerprint and downstream-key vectors, the shared
# conformance scenarios against a live idemd, the TLS options against an idemd
# serving mTLS, the README program, a consumer module outside the repository,
# the middleware in ServeMux and chi against the shared HTTP scenarios, the
# HTTP example, the consumer helper), the proxy matrix through nginx
# (clients/conformance/proxy-matrix.md), the consumer scenarios and the README's
# consumer block against a Kafka broker (examples/kafka-consumer, its own
# module, under scripts/kafka.sh run), then the latency checks on their own.
# Runnable from any directory; idempotent.
#
#   IDEMD_BIN=/path/to/idemd IDEMD_TEST_CERTS=/path/to/test-certs clients/go/test.sh
#
# IDEMD_BIN defaults to <repo>/target/debug/idemd. IDEMD_TEST_CERTS is the
# directory `make test-certs` writes ($CARGO_TARGET_DIR/test-certs); it has no
# default: without it the TLS test fails and says so (`make sdk-go` sets both).
#
# Installs what is missing: Go (apt; a toolchain recent enough for go.mod from
# the Go module proxy), mvn + unzip for scripts/protoc.sh (apt), the protoc
# plugins (go install, into clients/go/.bin), the Go modules (module proxy);
# scripts/kafka.sh fetches the broker's jars (Maven Central) and needs java.
# GO_TEST_FLAGS adds flags to go test (e.g. -v).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$root/target/debug/idemd}"
case "$IDEMD_BIN" in /*) ;; *) IDEMD_BIN="$PWD/$IDEMD_BIN" ;; esac # the tests run elsewhere
if [ -n "${IDEMD_TEST_CERTS:-}" ]; then
  case "$IDEMD_TEST_CERTS" in /*) ;; *) IDEMD_TEST_CERTS="$PWD/$IDEMD_TEST_CERTS" ;; esac
  export IDEMD_TEST_CERTS
fi

apt_install() {
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
  else
    echo "test.sh: please install: $*" >&2
    exit 1
  fi
}

# Go: the one on PATH if it is recent enough for go.mod; otherwise the
# toolchain go.mod names, fetched as the Go module golang.org/toolchain from
# the Go module proxy (what GOTOOLCHAIN=auto does, also for Go < 1.21).
if ! command -v go >/dev/null 2>&1; then
  apt_install golang-go
fi
go_need="$(sed -n 's/^go \([0-9][0-9.]*\)$/\1/p' "$here/go.mod")"
go_have="$(cd /tmp && go env GOVERSION | sed 's/^go//')"
if [ "$(printf '%s\n%s\n' "$go_need" "$go_have" | sort -V | head -n1)" != "$go_need" ]; then
  case "$(uname -m)" in
    x86_64) goarch=amd64 ;;
    aarch64) goarch=arm64 ;;
    *) echo "test.sh: unsupported architecture $(uname -m)" >&2; exit 1 ;;
  esac
  toolchain="golang.org/toolchain@v0.0.1-go$go_need.linux-$goarch"
  echo "== Go $go_have is older than $go_need: fetching $toolchain"
  goroot="$(cd /tmp && GO111MODULE=on GOFLAGS= go mod download -json "$toolchain" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -n "$goroot" ] || { echo "test.sh: could not fetch $toolchain" >&2; exit 1; }
  find "$goroot/bin" "$goroot/pkg/tool" -type f -exec chmod +x {} +
  export PATH="$goroot/bin:$PATH"
fi

# scripts/protoc.sh fetches protoc from Maven Central on first use, at the
# version scripts/generate.sh pins.
protoc_version="$(sed -n 's/^PROTOC_VERSION=\([^ ]*\).*/\1/p' "$here/scripts/generate.sh")"
[ -n "$protoc_version" ] || { echo "test.sh: no PROTOC_VERSION in scripts/generate.sh" >&2; exit 1; }
if [ ! -x "$root/.cache/protoc/$protoc_version/protoc" ]; then
  missing=()
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  command -v unzip >/dev/null 2>&1 || missing+=(unzip)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
fi

# scripts/kafka.sh runs the broker on java and fetches its jars with mvn.
missing=()
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"

cd "$here"
# The stubs are committed (a module is compiled as published), so the build
# below uses gen/ as it is; this only proves gen/ matches the proto.
echo "== gen/ is up to date (scripts/generate.sh into a temporary directory)"
fresh="$(mktemp -d)"
trap 'rm -rf "$fresh"' EXIT
bash "$here/scripts/generate.sh" "$fresh"
if ! diff -r -q "$fresh/gen" "$here/gen" >/dev/null 2>&1; then
  diff -r -u "$fresh/gen" "$here/gen" 2>&1 | head -n 40 >&2 || true
  echo "clients/go/gen is stale: run clients/go/scripts/generate.sh" >&2
  exit 1
fi
echo "== go vet"
go vet ./...
# The previous release (no ClaimBatch): ProcessBatch's fallback test runs
# against it (built once per pinned commit and cached by the script).
export IDEMD_PREVIOUS_BIN="${IDEMD_PREVIOUS_BIN:-$("$root/scripts/previous-release.sh")}"
echo "== go test (idemd: $IDEMD_BIN, certificates: ${IDEMD_TEST_CERTS:-unset})"
# -count=1: results depend on the idemd binary, so never reuse cached ones.
go test -count=1 ${GO_TEST_FLAGS:-} -skip '^(TestReplayLatency|TestMiddlewareLatency|TestProxyMatrix)$' ./...
# The proxy matrix (clients/conformance/proxy-matrix.md): grpc-go through a
# real nginx (scripts/nginx.sh, installed by scripts/test-deps.sh when
# missing) in every profile; -v prints its "proxy-matrix:" lines.
echo "== proxy matrix (idemd: $IDEMD_BIN, nginx: scripts/nginx.sh)"
go test -count=1 ${GO_TEST_FLAGS:-} -run '^TestProxyMatrix$' -v . | grep -v '^=== RUN'
echo "== consumer scenarios against a Kafka broker (examples/kafka-consumer, scripts/kafka.sh run)"
# Its own module (franz-go stays out of the SDK's), so ./... above skips it.
# IDEMD_TEST_KAFKA_REQUIRED: without a broker address the tests fail rather
# than skip.
(
  cd "$here/examples/kafka-consumer"
  go vet ./...
  IDEMD_TEST_KAFKA_REQUIRED=1 "$root/scripts/kafka.sh" run -- \
    go test -count=1 ${GO_TEST_FLAGS:-} ./...
)
# Alone, so that the parallel tests above do not skew the timings; -v shows
# the p50/p99 line.
echo "== latency checks (idemd: $IDEMD_BIN)"
go test -count=1 ${GO_TEST_FLAGS:-} -run '^(TestReplayLatency|TestMiddlewareLatency)$' -v .
