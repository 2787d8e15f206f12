#!/usr/bin/env bash
# Starts BenchApp as README.md does: run.sh --framework spring|jetty --middleware on|off --port PORT --idemd HOST:PORT
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec java -cp "$here/target/classes:$here/target/lib/*" dev.idemd.bench.BenchApp "$@"
