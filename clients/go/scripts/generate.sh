#!/usr/bin/env bash
# Generates the Go stubs of proto/idemd/v1/idempotency.proto into gen/ (ignored
# by git). Run through `go generate .` from clients/go (test.sh does), or
# directly from any directory.
#
# protoc comes from scripts/protoc.sh at the repository root (Maven Central);
# protoc-gen-go and protoc-gen-go-grpc are installed with `go install` into
# clients/go/.bin, at the versions pinned below.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12     # keep equal to google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$here/.bin"
mkdir -p "$bin"

install_plugin() { # name package version
  local stamp="$bin/.$1.version"
  if [ ! -x "$bin/$1" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$3" ]; then
    GOBIN="$bin" go install "$2@$3"
    echo "$3" >"$stamp"
  fi
}
install_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"

if ! PROTOC="$("$root/scripts/protoc.sh")"; then
  echo "generate.sh: scripts/protoc.sh failed (it needs mvn and unzip)" >&2
  exit 1
fi

rm -rf "$here/gen"
mkdir -p "$here/gen"
PATH="$bin:$PATH" "$PROTOC" \
  -I "$root/proto" -I "$(dirname "$PROTOC")/include" \
  --go_out="$here" --go_opt=module=github.com/idemd/idemd/clients/go \
  --go-grpc_out="$here" --go-grpc_opt=module=github.com/idemd/idemd/clients/go \
  "$root/proto/idemd/v1/idempotency.proto"
