#!/usr/bin/env bash
# The two set-up steps of README.md: the pinned venv (test.sh, no test run)
# and the SDK installed into it as its README installs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
clients/python/test.sh --collect-only -q >/dev/null
clients/python/.venv/bin/pip install -q --no-build-isolation ./clients/python
