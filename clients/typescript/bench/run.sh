#!/usr/bin/env bash
# Starts the app prepare.sh built: run.sh --framework express|fastify|web --middleware on|off --port PORT --idemd HOST:PORT
exec node "$(dirname "${BASH_SOURCE[0]}")/../dist/bench/app.js" "$@"
