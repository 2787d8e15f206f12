#!/usr/bin/env bash
# Python SDK: installs what it needs into .venv (pinned in requirements-dev.txt),
# generates the gRPC stubs from proto/idemd/v1/idempotency.proto, and runs every
# test (vectors, conformance scenarios, README, the ASGI/WSGI middleware in FastAPI and Flask
# against the shared HTTP scenarios, @idempotent, HTTP example, executor, TLS/mTLS,
# packaging, the README's install into a fresh venv, the message-consumer helper and its
# process_batch (its fallback against $IDEMD_PREVIOUS_BIN, default from scripts/previous-release.sh),
# the consumer scenarios in each --mode ($IDEMD_CONSUMER_MODES narrows them) against a Kafka
# broker from scripts/kafka.sh, replay latency) against a real idemd
# started from $IDEMD_BIN (default: <repo>/target/debug/idemd). The TLS test takes its certificates from
# $IDEMD_TEST_CERTS (written by `make test-certs`) and fails when it is unset.
#
#   IDEMD_BIN=target/release/idemd IDEMD_TEST_CERTS=target/test-certs clients/python/test.sh [pytest args...]
set -euo pipefail

sdk="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$sdk/../.." && pwd)"
export IDEMD_BIN="${IDEMD_BIN:-$repo/target/debug/idemd}"
case "$IDEMD_BIN" in /*) ;; *) IDEMD_BIN="$PWD/$IDEMD_BIN" ;; esac
venv="$sdk/.venv"

# A Python >= 3.10 with venv: $PYTHON, else python3.11 (the tested one), else another.
find_python() {
  local candidate
  for candidate in ${PYTHON:-} python3.11 python3.12 python3.13 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

if ! python="$(find_python)"; then
  # Debian's python3 lacks venv/ensurepip until python3-venv is installed.
  if command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing python3 and python3-venv with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq python3 python3-venv >&2
  fi
  python="$(find_python)" || { echo "test.sh: needs Python >= 3.10 with venv" >&2; exit 1; }
fi

# (Re)create the venv when it is missing or broken; reinstall when the pins change.
if ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$sdk/requirements-dev.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$sdk/requirements-dev.txt"
  echo "$want" >"$stamp"
fi

# The previous release (no ClaimBatch): process_batch's fallback test runs against it. Built once
# and cached by the script; it prints the path fast afterwards.
if [ -z "${IDEMD_PREVIOUS_BIN:-}" ] && [ -x "$repo/scripts/previous-release.sh" ]; then
  case " $* " in
    *" --collect-only "*) ;;
    *) IDEMD_PREVIOUS_BIN="$("$repo/scripts/previous-release.sh")" && export IDEMD_PREVIOUS_BIN ;;
  esac
fi

# Stubs from the proto, every run (fast; never committed).
"$venv/bin/python" "$sdk/build_protos.py" >/dev/null

# The consumer scenarios (tests/test_kafka_consumer.py) need a Kafka broker: a fresh one from
# scripts/kafka.sh for this run, unless $IDEMD_TEST_KAFKA_BROKERS already names one. Run from
# here, the scenarios fail without a broker rather than skip (a skipped suite hides a broken setup).
export IDEMD_TEST_KAFKA_REQUIRED=1
with_kafka=()
if [ -z "${IDEMD_TEST_KAFKA_BROKERS:-}" ] && [ -x "$repo/scripts/kafka.sh" ]; then
  case " $* " in
    *" --collect-only "*) ;; # bench/prepare.sh only wants the venv
    *) with_kafka=("$repo/scripts/kafka.sh" run --) ;;
  esac
fi

cd "$sdk"
set +e
# -X faulthandler: a fatal signal prints every thread's Python stack, also before pytest's own
# faulthandler is on and after it is off (start-up, collection, interpreter shutdown).
"${with_kafka[@]}" "$venv/bin/python" -X faulthandler -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
elif [ "$status" -gt 128 ]; then
  # No "Fatal Python error" above means the signal hit a thread that blocks signals, so that no
  # handler ran: librdkafka's threads do (see tests/kafka_clients.py).
  echo "test.sh: pytest was killed by signal $((status - 128)) ($(kill -l "$status" 2>/dev/null || echo '?'))" >&2
fi
exit "$status"
