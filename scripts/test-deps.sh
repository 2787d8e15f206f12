#!/usr/bin/env bash
# Makes sure the command-line tools the integration tests run are installed
# (idempotent): curl (the front doors are tested with a client nobody here
# wrote: tests/it/web.rs, the README's curl example) and bash (the README and
# docs/operations.md examples run as written). Debian packages; needs root
# only when something is missing.
set -euo pipefail
missing=()
for tool in curl bash; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "test-deps.sh: installing Debian packages: ${missing[*]}" >&2
    if [[ $EUID -ne 0 ]]; then
        echo "test-deps.sh: need root for apt-get (or install ${missing[*]} yourself)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${missing[@]}" >&2
fi
