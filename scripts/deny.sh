#!/usr/bin/env bash
# Supply-chain check (issue 8): `cargo deny check licenses bans sources`
# against deny.toml, for the root workspace (idemd and bench/) and for the
# separate fuzz/ workspace. No advisory database is needed, so it runs
# offline once the crates are fetched.
#
# Installs cargo-deny from crates.io into
# ${IDEMD_TOOLS_CACHE:-~/.cache/idemd/tools}/cargo (once).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CARGO_DENY_VERSION=0.20.2

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

TOOLS="${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}"
CARGO_ROOT="$TOOLS/cargo"
DENY="$CARGO_ROOT/bin/cargo-deny"
if ! "$DENY" --version 2>/dev/null | grep -q " $CARGO_DENY_VERSION\$"; then
  echo "==> installing cargo-deny $CARGO_DENY_VERSION into $CARGO_ROOT"
  cargo install --locked --root "$CARGO_ROOT" --version "$CARGO_DENY_VERSION" cargo-deny
fi

cd "$ROOT"
status=0
# The root workspace is checked against its committed Cargo.lock (--locked:
# never a re-resolved one). fuzz/ is a tool workspace whose lock is not
# committed (it would go stale with every dependency change of idemd): it is
# resolved here, offline-first, the same way `cargo fuzz build` resolves it.
echo "==> cargo deny check licenses bans sources (Cargo.toml)"
"$DENY" --manifest-path Cargo.toml --config deny.toml --workspace --locked \
  check licenses bans sources || status=$?
echo "==> cargo deny check licenses bans sources (fuzz/Cargo.toml)"
cargo generate-lockfile --manifest-path fuzz/Cargo.toml --offline >/dev/null 2>&1 ||
  cargo generate-lockfile --manifest-path fuzz/Cargo.toml
"$DENY" --manifest-path fuzz/Cargo.toml --config deny.toml --workspace \
  check licenses bans sources || status=$?
exit "$status"
