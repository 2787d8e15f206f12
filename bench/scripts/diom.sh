#!/usr/bin/env bash
# Builds svix/diom's server once, for `make bench`'s side-by-side (docs/benchmarks.md, "diom").
#
# IDEMD_DIOM names what to use: a built `diom-server` binary (used as is), a source directory
# (a checkout of github.com/svix/diom that builds from the registries), or a source tarball such as
# ../shared/reference/peers/diom-0.2.3-src.tar.gz. A source is built with
# `cargo build --release -p diom-server` under $IDEMD_TOOLS_CACHE/diom/<sha256 of the source>/, so
# it is built once per source (about 25 minutes on two cores) and never inside the tree.
#
# Prints the binary's path on the last line; prints nothing and exits 0 when IDEMD_DIOM is unset,
# so that the bench can say diom was skipped.
set -euo pipefail
src="${IDEMD_DIOM:-}"
[[ -n "$src" ]] || exit 0
cache="${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}/diom"
if [[ -f "$src" && -x "$src" && "$src" != *.tar.gz && "$src" != *.tgz ]]; then
    realpath "$src"
    exit 0
fi
if [[ -d "$src" ]]; then
    key="dir-$(realpath "$src" | sha256sum | cut -c1-16)"
elif [[ -f "$src" ]]; then
    key="$(sha256sum "$src" | cut -c1-16)"
else
    echo "diom.sh: IDEMD_DIOM=$src is neither a diom-server binary, a source directory nor a tarball" >&2
    exit 1
fi
dir="$cache/$key"
bin="$dir/target/release/diom-server"
if [[ ! -x "$bin" ]]; then
    mkdir -p "$dir"
    if [[ -f "$src" ]]; then
        if [[ ! -f "$dir/src/Cargo.toml" ]]; then
            rm -rf "$dir/src" && mkdir -p "$dir/src"
            tar -xzf "$src" -C "$dir/src"
            # A tarball of one top-level folder: build inside it.
            inner=$(find "$dir/src" -mindepth 1 -maxdepth 1)
            if [[ $(echo "$inner" | wc -l) -eq 1 && -d "$inner" ]]; then
                mv "$inner" "$dir/src.tmp" && rmdir "$dir/src" && mv "$dir/src.tmp" "$dir/src"
            fi
        fi
        srcdir="$dir/src"
    else
        srcdir="$(realpath "$src")"
    fi
    echo "diom.sh: building diom-server from $src into $dir (once; about 25 minutes on two cores)" >&2
    (cd "$srcdir" && CARGO_TARGET_DIR="$dir/target" cargo build --release -p diom-server >&2)
fi
echo "$bin"
