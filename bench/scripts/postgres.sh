#!/usr/bin/env bash
# Makes sure Debian's PostgreSQL server is installed (idempotent) and prints
# the directory of its binaries (initdb, postgres) on the last line.
# The bench starts its own throw-away cluster from there; it never touches
# a system cluster.
set -euo pipefail
find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$d/postgres" && -x "$d/initdb" ]]; then
            printf '%s\n' "$d"
            return 0
        fi
    done
    return 1
}
if ! find_bindir >/dev/null; then
    echo "postgres.sh: installing Debian's postgresql package..." >&2
    if [[ $EUID -ne 0 ]]; then
        echo "postgres.sh: need root for apt-get (or install postgresql yourself)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
fi
# The Debian package creates the `postgres` user; when running as root the
# bench drops to it (Postgres refuses to run as root).
if [[ $EUID -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
    echo "postgres.sh: no 'postgres' user to run the server as" >&2
    exit 1
fi
find_bindir
