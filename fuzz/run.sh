#!/usr/bin/env bash
# Builds and runs idemd's fuzz targets (cargo-fuzz + libFuzzer on the stable
# toolchain, see fuzz/README.md), each for SECONDS, and fails on any crash,
# timeout or out-of-memory.
#
#   fuzz/run.sh SECONDS [TARGET...]     default: every target, one after another
#
# Installs cargo-fuzz from crates.io into ${IDEMD_TOOLS_CACHE:-~/.cache/idemd/tools}/cargo
# (once). Builds into ${IDEMD_FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}}
# (default fuzz/target); the corpus each run grows, the logs and any crash
# artifact go under that directory's work/ (never into the committed seeds in
# fuzz/corpus/). Limits per input: IDEMD_FUZZ_TIMEOUT seconds (10),
# IDEMD_FUZZ_RSS_MB resident memory (2048), IDEMD_FUZZ_MALLOC_MB for one
# allocation (512), IDEMD_FUZZ_MAX_LEN bytes of input (8192).
set -euo pipefail

FUZZ_DIR="$(cd "$(dirname "$0")" && pwd)"
ALL_TARGETS=(fingerprint validate request_decode record_codec)
CARGO_FUZZ_VERSION=0.13.2

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS [TARGET...]  (targets: ${ALL_TARGETS[*]})" >&2
  exit 2
fi
SECONDS_PER_TARGET="$1"
shift
TARGETS=("$@")
TARGET_ARGS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")

if ! command -v cargo >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

TOOLS="${IDEMD_TOOLS_CACHE:-$HOME/.cache/idemd/tools}"
CARGO_ROOT="$TOOLS/cargo"
export PATH="$CARGO_ROOT/bin:$PATH"
if ! "$CARGO_ROOT/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
  echo "==> installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_ROOT"
  cargo install --locked --root "$CARGO_ROOT" --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi

# cargo-fuzz passes -Zsanitizer=address and other unstable flags; the stable
# compiler accepts them with RUSTC_BOOTSTRAP (see README.md).
export RUSTC_BOOTSTRAP=1
TARGET_DIR="${IDEMD_FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:+$CARGO_TARGET_DIR/fuzz}}"
TARGET_DIR="${TARGET_DIR:-$FUZZ_DIR/target}"
WORK="$TARGET_DIR/work"
mkdir -p "$WORK"

cd "$FUZZ_DIR"
# Release with debug assertions (integer overflow panics), AddressSanitizer.
BUILD_FLAGS=(--release --debug-assertions --sanitizer address --target-dir "$TARGET_DIR")
BIN_DIR="$TARGET_DIR/x86_64-unknown-linux-gnu/release"
if [ "${IDEMD_FUZZ_NO_BUILD:-0}" = 1 ]; then
  echo "==> IDEMD_FUZZ_NO_BUILD=1: running the binaries already in $BIN_DIR"
else
  BUILD_LOG="$WORK/logs/build.log"
  mkdir -p "$WORK/logs"
  build_targets() {
    if [ ${#TARGET_ARGS[@]} -eq 0 ]; then
      cargo fuzz build "${BUILD_FLAGS[@]}" 2>&1 | tee -a "$BUILD_LOG" || return $?
    else
      for target in "${TARGET_ARGS[@]}"; do
        cargo fuzz build "${BUILD_FLAGS[@]}" "$target" 2>&1 | tee -a "$BUILD_LOG" || return $?
      done
    fi
  }
  report_build_failure() {
    # A failed link prints a command line of several kilobytes before the
    # linker's own message; show the messages, not the command.
    echo "fuzz build failed (exit $1); errors from $BUILD_LOG:" >&2
    grep -v '^ *= note: *"cc"' "$BUILD_LOG" | grep -E -i 'error|warning: build failed|lld|collect2|no space|killed|memory' | cut -c1-400 | tail -n 40 >&2 || true
    df -h "$TARGET_DIR" >&2 || true
    free -m >&2 || true
  }
  echo "==> building fuzz targets: ${TARGETS[*]} (log: $BUILD_LOG)"
  : >"$BUILD_LOG"
  build_status=0
  build_targets || build_status=$?
  if [ "$build_status" -ne 0 ]; then
    report_build_failure "$build_status"
    # Four sanitized binaries of ~100 MB link in parallel; a machine short of
    # memory fails there. One retry with one job tells that apart from a real
    # build error, which fails again and stops the run.
    echo "==> retrying the fuzz build with one job" >&2
    build_status=0
    CARGO_BUILD_JOBS=1 build_targets || build_status=$?
    if [ "$build_status" -ne 0 ]; then
      report_build_failure "$build_status"
      exit "$build_status"
    fi
  fi
fi

failed=()
summary=()
for target in "${TARGETS[@]}"; do
  corpus="$WORK/corpus/$target"
  artifacts="$WORK/artifacts/$target"
  log="$WORK/logs/$target.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  echo "==> fuzzing $target for ${SECONDS_PER_TARGET}s (log: $log)"
  status=0
  # The binary cargo-fuzz built, run directly (as `cargo fuzz run` does,
  # without its rebuild). New inputs go to the first corpus directory
  # (work/), seeds are read from fuzz/corpus/<target>.
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}" \
    "$BIN_DIR/$target" "$corpus" "$FUZZ_DIR/corpus/$target" \
    -max_total_time="$SECONDS_PER_TARGET" \
    -timeout="${IDEMD_FUZZ_TIMEOUT:-10}" \
    -rss_limit_mb="${IDEMD_FUZZ_RSS_MB:-2048}" \
    -malloc_limit_mb="${IDEMD_FUZZ_MALLOC_MB:-512}" \
    -max_len="${IDEMD_FUZZ_MAX_LEN:-8192}" \
    -artifact_prefix="$artifacts/" \
    -print_final_stats=1 \
    >"$log" 2>&1 || status=$?
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  if [ "$status" -ne 0 ]; then
    failed+=("$target")
    summary+=("$target: FAILED (exit $status) after ${execs:-?} executions; artifacts in $artifacts")
    echo "---- last lines of $log ----" >&2
    tail -n 60 "$log" >&2
  else
    summary+=("$target: ok, ${execs:-?} executions in ${SECONDS_PER_TARGET}s")
  fi
done

echo "==> fuzz summary"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found problems in: ${failed[*]}" >&2
  exit 1
fi
