#!/usr/bin/env bash
# Prints the path of a protoc binary, fetching it from Maven Central on first
# use (com.google.protobuf:protoc, a native executable shipped as a Maven
# artifact) into .cache/protoc/. For SDK builds that need protoc (Go;
# TypeScript generates with buf from npm); the Rust build uses its own vendored protoc, Python uses
# grpcio-tools and Java the protobuf Maven plugin.
#
#   PROTOC=$(scripts/protoc.sh)
#   "$PROTOC" --version
#
# The well-known types (google/protobuf/*.proto) are in "$(dirname "$PROTOC")/include".
set -euo pipefail
version="${IDEMD_PROTOC_VERSION:-4.33.1}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/.cache/protoc/$version"
bin="$dir/protoc"
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  case "$(uname -m)" in
    x86_64) classifier=linux-x86_64 ;;
    aarch64) classifier=linux-aarch_64 ;;
    *) echo "protoc.sh: unsupported architecture $(uname -m)" >&2; exit 1 ;;
  esac
  mvn -q dependency:copy \
    -Dartifact="com.google.protobuf:protoc:$version:exe:$classifier" \
    -DoutputDirectory="$dir" -Dmdep.stripVersion=true -Dmdep.stripClassifier=true >&2
  mv "$dir/protoc.exe" "$bin"
  chmod +x "$bin"
  # The well-known types ship inside the protobuf-java jar of the same version.
  mkdir -p "$dir/include"
  mvn -q dependency:copy -Dartifact="com.google.protobuf:protobuf-java:$version" \
    -DoutputDirectory="$dir/jar" >&2
  (cd "$dir/include" && unzip -q -o "$dir"/jar/protobuf-java-*.jar 'google/protobuf/*.proto')
  rm -rf "$dir/jar"
fi
echo "$bin"
