#!/usr/bin/env bash
# Prints the path of an `idemd` binary built from the previous release (the
# commit in tests/previous-release), for the tests where the previous
# release and this one run side by side on the same data
# (tests/it/upgrade_embedded.rs; `make cargo-test` passes the path as
# IDEMD_PREVIOUS_BIN).
#
# Built once per commit into
#   ${IDEMD_TOOLS_CACHE:-~/.cache/idemd/tools}/previous/<sha>/idemd
# and reused from there. The source comes from `git archive`, extracted into
# a temporary directory (no `git worktree` entry left in the caller's
# repository), and builds into a target directory of its own beside the
# binary: in the caller's CARGO_TARGET_DIR the old tree's `idemd` would
# overwrite this tree's.
#
# Needs the commit in the local repository (a full clone, not a shallow
# one). Progress goes to stderr; stdout carries only the path.
set -euo pipefail

log() { echo "previous-release.sh: $*" >&2; }

root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
pin_file=$root/tests/previous-release
sha=$(grep -v -e '^#' -e '^[[:space:]]*$' "$pin_file" | head -n 1 | tr -d '[:space:]')
if [[ ! $sha =~ ^[0-9a-f]{40}$ ]]; then
    log "$pin_file must name a commit as 40 hex digits (found '$sha')"
    exit 1
fi
if ! git -C "$root" cat-file -e "$sha^{commit}" 2>/dev/null; then
    log "commit $sha (the previous release, $pin_file) is not in this repository;"
    log "fetch full history first (e.g. \`git fetch --unshallow\` or \`git fetch origin\`)"
    exit 1
fi

cache=${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}/previous/$sha
bin=$cache/idemd
# Prints the binary's path and exits, if it was built.
reuse_if_built() {
    if [[ -x $bin ]]; then
        log "reusing $bin"
        echo "$bin"
        exit 0
    fi
}
reuse_if_built

mkdir -p "$cache"
# One build at a time per commit (two `make test` on one machine): the
# second waits, then finds the binary.
exec 9>"$cache/.lock"
flock 9
reuse_if_built
src=$(mktemp -d "${TMPDIR:-/tmp}/idemd-previous.XXXXXX")
trap 'rm -rf "$src"' EXIT
log "building idemd ${sha:0:12} (the previous release) into $cache; takes minutes the first time"
git -C "$root" archive "$sha" | tar -x -C "$src"
# The source path changes at every build, so incremental artefacts would
# never be reused: leave them out (the target directory stays smaller).
(cd "$src" && CARGO_INCREMENTAL=0 cargo build --locked -p idemd --target-dir "$cache/target" >&2)
# Copied then renamed: a concurrent caller sees either no binary or a
# whole one. Only the binary is reused, so its target directory (2 GB) goes;
# a build that failed keeps it, and its retry reuses the dependencies.
cp "$cache/target/debug/idemd" "$bin.tmp.$$"
mv -f "$bin.tmp.$$" "$bin"
rm -rf "$cache/target"
log "built $bin"
echo "$bin"
