#!/usr/bin/env bash
# Makes sure the command-line tools the integration tests run are installed
# (idempotent): curl (the front doors are tested with a client nobody here
# wrote: tests/it/web.rs, the README's curl example), bash (the README and
# docs/operations.md examples run as written), and unshare, nsenter and ip
# (util-linux, iproute2: tests/it/protected_mode.rs and the fault suite's
# full-disk scenario create network and mount namespaces of their own), and
# faketime (libfaketime: the fault suite's cql-clock-skew moves one
# replica's wall clock), and nft (nftables: the partition scenarios cut
# links inside a network namespace of their own), and mkfs.ext4 (e2fsprogs:
# the disk-image scenario puts the data directory on ext4 on a loop device),
# and nginx (the SDK suites' proxy matrix: scripts/nginx.sh).
# Debian packages; needs root only when something is missing.
set -euo pipefail
missing=()
# tool:package
for pair in curl:curl bash:bash unshare:util-linux nsenter:util-linux ip:iproute2 faketime:faketime nft:nftables mkfs.ext4:e2fsprogs nginx:nginx; do
    tool=${pair%%:*}
    package=${pair#*:}
    if ! command -v "$tool" >/dev/null 2>&1; then
        [[ " ${missing[*]} " == *" $package "* ]] || missing+=("$package")
    fi
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
