#!/usr/bin/env bash
# Generates the TypeScript stubs for proto/idemd/v1/idempotency.proto into src/gen/
# with protoc and the ts-proto plugin (grpc-js services). src/gen/ is not committed.
#
# protoc: $PROTOC if set, else the repository's scripts/protoc.sh (Maven Central).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
protoc="${PROTOC:-$("$repo/scripts/protoc.sh")}"
include="$(dirname "$protoc")/include"
plugin="$here/node_modules/.bin/protoc-gen-ts_proto"
if [ ! -x "$plugin" ]; then
  echo "generate.sh: $plugin missing; run npm ci first" >&2
  exit 1
fi
out="$here/src/gen"
rm -rf "$out"
mkdir -p "$out"
"$protoc" \
  --proto_path="$repo/proto" \
  --proto_path="$include" \
  --plugin=protoc-gen-ts_proto="$plugin" \
  --ts_proto_out="$out" \
  --ts_proto_opt=outputServices=grpc-js \
  --ts_proto_opt=env=node \
  --ts_proto_opt=esModuleInterop=true \
  --ts_proto_opt=useDate=true \
  --ts_proto_opt=forceLong=number \
  --ts_proto_opt=outputJsonMethods=true \
  "$repo/proto/idemd/v1/idempotency.proto"
