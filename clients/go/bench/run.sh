#!/usr/bin/env bash
# Starts the app prepare.sh built: run.sh --framework nethttp --middleware on|off --port PORT --idemd HOST:PORT
exec "$(dirname "${BASH_SOURCE[0]}")/../.bin/bench" "$@"
