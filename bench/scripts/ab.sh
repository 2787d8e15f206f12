#!/usr/bin/env bash
# Before/after figures of a hot-path change (docs/benchmarks.md, "Hot paths"):
# the no-op server and each given idemd build, interleaved round-robin so that
# a shared machine's drift spreads over all of them; fresh pairs, pinned.
# Prints pairs/s and the server's CPU per pair for every run, then the
# throughputs of each system on one line (take the medians).
#
#   bench/scripts/ab.sh ROUNDS DURATION IDEMD_BIN...
#   bench/scripts/ab.sh 6 6s /tmp/idemd-before target/release/idemd
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 ROUNDS DURATION IDEMD_BIN..." >&2
  exit 2
fi
rounds=$1 duration=$2
shift 2
bench="${CARGO_TARGET_DIR:-target}/release/idemd-bench"
[ -x "$bench" ] || { echo "$bench missing: cargo build --release -p idemd-bench" >&2; exit 2; }
for round in $(seq 1 "$rounds"); do
  echo "round $round/$rounds" >&2
  line=$("$bench" run --system noop --workload fresh --pin --duration "$duration" 2>&1 | grep pairs/s | tail -1)
  echo "noop $(echo "$line" | awk '{print $5, $NF}')"
  for bin in "$@"; do
    line=$("$bench" run --system idemd-embedded --workload fresh --pin --duration "$duration" \
      --idemd-bin "$bin" 2>&1 | grep pairs/s | tail -1)
    echo "$bin $(echo "$line" | awk '{print $5, $NF}')"
  done
done | awk '{
  printf "%-40s %8d pairs/s  server cpu %.2f  %6.1f us/pair\n", $1, $2, $3, $3 * 1e6 / $2
  runs[$1] = runs[$1] " " $2
} END { for (name in runs) print "all", name, runs[name] }'
