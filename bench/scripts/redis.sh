#!/usr/bin/env bash
# Makes sure Debian's redis-server is installed (idempotent) and prints its
# path on the last line. The bench runs its own instance on a free port in a
# scratch directory; a system instance (if the package started one) is left
# alone.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
    echo "redis.sh: installing Debian's redis-server package..." >&2
    if [[ $EUID -ne 0 ]]; then
        echo "redis.sh: need root for apt-get (or install redis-server yourself)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq redis-server >&2
fi
command -v redis-server
