#!/usr/bin/env bash
# The build step of README.md: the SDK's own build compiles the app too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
npm ci --silent >/dev/null
npm run --silent build >/dev/null
