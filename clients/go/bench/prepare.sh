#!/usr/bin/env bash
# Builds the Go bench app (README.md) into clients/go/.bin/bench.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
go build -o .bin/bench ./bench
