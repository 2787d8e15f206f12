#!/usr/bin/env bash
# Checks and unit-tests the idemd Prometheus rules:
#   promtool check rules  idemd.rules.yml idemd.alerts.yml   (syntax, PromQL, lint)
#   promtool test rules   tests/*.yml                        (every rule and alert)
# Installs promtool from Debian's `prometheus` package when it is missing
# (needs root or sudo). Runnable from any directory, safe to run repeatedly.
# PROMTOOL=/path/to/promtool overrides the lookup.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf '[prometheus-rules] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    log "promtool is missing and installing it needs root: apt-get install prometheus"
    exit 1
  fi
}

# Installs Debian's prometheus package for its promtool, without starting the
# daemon the package ships: a policy-rc.d that refuses service starts is put
# in place for the install (invoke-rc.d and deb-systemd-invoke both obey it)
# unless one already exists, and removed afterwards. Recommends
# (prometheus-node-exporter, another daemon) are not installed.
install_promtool() {
  command -v apt-get >/dev/null 2>&1 || {
    log "promtool not found and no apt-get: install promtool (Prometheus >= 2.42) or set PROMTOOL"
    exit 1
  }
  local policy=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$policy" ]; then
    as_root sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    ours=1
    # shellcheck disable=SC2064
    trap "as_root rm -f $policy" EXIT
  fi
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)
  log "installing promtool: apt-get install prometheus"
  if ! as_root "${apt[@]}" >/dev/null; then
    # Package unknown or its version gone from the mirror: refresh the lists once.
    log "apt-get update, then retrying"
    as_root apt-get update -q >/dev/null
    as_root "${apt[@]}" >/dev/null
  fi
  if [ "$ours" -eq 1 ]; then
    as_root rm -f "$policy"
    trap - EXIT
  fi
}

promtool="${PROMTOOL:-}"
if [ -z "$promtool" ]; then
  if ! command -v promtool >/dev/null 2>&1; then
    install_promtool
  fi
  promtool="$(command -v promtool)"
fi
log "$("$promtool" --version 2>&1 | head -n 1)"

rule_files=("$here/idemd.rules.yml" "$here/idemd.alerts.yml")
shopt -s nullglob
test_files=("$here"/tests/*.yml)
shopt -u nullglob
if [ "${#test_files[@]}" -eq 0 ]; then
  log "no test files in $here/tests"
  exit 1
fi

failed=0
# Paths relative to this directory keep promtool's output short; the test
# files name their rule files relative to themselves.
cd "$here"
if "$promtool" check rules --lint=all --lint-fatal "${rule_files[@]#"$here"/}"; then
  check="OK"
else
  check="FAILED"
  failed=1
fi
if "$promtool" test rules "${test_files[@]#"$here"/}"; then
  unit="OK"
else
  unit="FAILED"
  failed=1
fi

count() { awk -v re="$1" '$0 ~ re { n++ } END { print n + 0 }' "${@:2}"; }
n_record="$(count '^[[:space:]]*- record:' "${rule_files[@]}")"
n_alert="$(count '^[[:space:]]*- alert:' "${rule_files[@]}")"
n_cases="$(count '^[[:space:]]*- (eval_time|expr):' "${test_files[@]}")"
log "check rules: $check ($n_record recording rules, $n_alert alerting rules)"
log "test rules:  $unit (${#test_files[@]} files, $n_cases checks)"
exit "$failed"
