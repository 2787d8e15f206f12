#!/usr/bin/env bash
# Installs the gRPC tools users run against idemd, at pinned versions, with
# `go install` into $IDEMD_TOOLS_CACHE/bin (default ~/.cache/idemd/tools/bin),
# and builds the Go SDK loop of the one-in-flight phase and peer-load, the
# client of `idemd-bench peers` (bench/go), there.
# Idempotent: a tool already at its version is kept. Prints the bin directory
# on the last line.
#
# Pinned so that figures compare across runs; and `go install …@latest` of
# ghz resolved to v0.93.0 on the module proxy here, far older than v0.120.0.
set -euo pipefail
GHZ_VERSION=v0.120.0
GRPCURL_VERSION=v1.9.3

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}/bin"
mkdir -p "$bin"
if ! command -v go >/dev/null 2>&1; then
    echo "tools.sh: installing Debian's golang-go package..." >&2
    [[ $EUID -eq 0 ]] || { echo "tools.sh: need root for apt-get (or install Go)" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >&2
fi

# The version a Go binary was built from (`go version -m`), empty if none.
built_version() {
    [[ -x "$1" ]] || return 0
    go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'
}

install_tool() { # name module version
    if [[ "$(built_version "$bin/$1")" != "$3" ]]; then
        echo "tools.sh: go install $2@$3" >&2
        GOBIN="$bin" go install "$2@$3" >&2
    fi
}
install_tool ghz github.com/bojand/ghz/cmd/ghz "$GHZ_VERSION"
install_tool grpcurl github.com/fullstorydev/grpcurl/cmd/grpcurl "$GRPCURL_VERSION"

# Rebuilt every time (cheap with a warm cache): they measure the code in the tree.
echo "tools.sh: building bench/go (the Go SDK loop, peer-load)" >&2
(cd "$root/bench/go" && go build -o "$bin/bench-go-loop" . && go build -o "$bin/peer-load" ./peerload)
echo "$bin"
