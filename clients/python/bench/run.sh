#!/usr/bin/env bash
# Starts app.py in the venv prepare.sh made: run.sh --framework fastapi|flask --middleware on|off --port PORT --idemd HOST:PORT
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../.venv/bin/python" "$here/app.py" "$@"
