#!/usr/bin/env bash
# Generates the Go stubs of proto/idemd/v1/idempotency.proto into gen/, which
# is committed: a Go module is built from its source as published, so code
# that `go get` fetches cannot be generated on the user's machine. Run it
# after changing the proto (`go generate .` from clients/go does, or run it
# directly from any directory); test.sh fails while gen/ is stale.
#
#   clients/go/scripts/generate.sh          # rewrites clients/go/gen
#   clients/go/scripts/generate.sh OUTDIR   # writes OUTDIR/gen instead (test.sh's check)
#
# The output must be byte-for-byte reproducible, because test.sh diffs it
# against the committed copy. The generated files name the versions of
# protoc and of both plugins in their headers, so all three are pinned here
# and IDEMD_PROTOC_VERSION from the environment is deliberately overridden.
# protoc comes from scripts/protoc.sh at the repository root (Maven Central);
# protoc-gen-go and protoc-gen-go-grpc are installed with `go install`
# (module proxy, checked against sum.golang.org) into clients/go/.bin.
set -euo pipefail

PROTOC_VERSION=4.33.1               # com.google.protobuf:protoc on Maven Central
PROTOC_GEN_GO_VERSION=v1.36.12      # keep equal to google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2   # google.golang.org/grpc/cmd/protoc-gen-go-grpc

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$here/.bin"
mkdir -p "$bin"

install_plugin() { # name package version
  local stamp="$bin/.$1.version"
  if [ ! -x "$bin/$1" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$3" ]; then
    # Outside any module (GOFLAGS cleared, cd /), so that go.mod of the
    # caller's directory cannot change which plugin version gets built.
    (cd / && GOBIN="$bin" GOFLAGS= GOWORK=off go install "$2@$3")
    echo "$3" >"$stamp"
  fi
}
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

if ! PROTOC="$(IDEMD_PROTOC_VERSION="$PROTOC_VERSION" "$root/scripts/protoc.sh")"; then
  echo "generate.sh: scripts/protoc.sh failed (it needs mvn and unzip)" >&2
  exit 1
fi

rm -rf "$out/gen"
mkdir -p "$out/gen"
# Run from the repository root with relative -I paths: protoc records the
# proto's path relative to its include directory, never the checkout's
# absolute location, so every checkout generates the same bytes.
cd "$root"
PATH="$bin:$PATH" "$PROTOC" \
  -I proto -I "$(dirname "$PROTOC")/include" \
  --go_out="$out" --go_opt=module=github.com/idemd/idemd/clients/go \
  --go-grpc_out="$out" --go-grpc_opt=module=github.com/idemd/idemd/clients/go \
  proto/idemd/v1/idempotency.proto
