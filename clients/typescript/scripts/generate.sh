#!/usr/bin/env bash
# Generates the TypeScript stubs for proto/idemd/v1/idempotency.proto into src/gen/
# with the ts-proto plugin (grpc-js services). src/gen/ is not committed.
#
# The compiler is the buf CLI, a devDependency: its binary ships inside the npm package (as do
# the well-known types google/protobuf/*.proto), so packing from a fresh clone needs Node.js and
# npm only, not protoc and the Maven that scripts/protoc.sh fetches it with.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
buf="$here/node_modules/.bin/buf"
plugin="$here/node_modules/.bin/protoc-gen-ts_proto"
for tool in "$buf" "$plugin"; do
  if [ ! -x "$tool" ]; then
    echo "generate.sh: $tool missing; run npm ci first" >&2
    exit 1
  fi
done
out="$here/src/gen"
rm -rf "$out"
mkdir -p "$out"
# proto/ holds no buf.yaml: buf takes the directory as the module, --path picks the one file.
template="$(cat <<JSON
{"version": "v2", "plugins": [{"local": "$plugin", "out": "$out", "opt": [
  "outputServices=grpc-js", "env=node", "esModuleInterop=true", "useDate=true",
  "forceLong=number", "outputJsonMethods=true"]}]}
JSON
)"
cd "$repo"
"$buf" generate proto --template "$template" --path proto/idemd/v1/idempotency.proto
