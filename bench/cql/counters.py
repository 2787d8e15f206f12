"""Cassandra's own per-table statement counters, for `bench/scripts/cql-statements.sh`.

    counters.py snapshot HOST KEYSPACE > FILE     every counter of KEYSPACE (and system.paxos)
    counters.py table BEFORE AFTER PAIRS SECONDS  markdown: per pair, and per second

The counters are the node's virtual tables (`system_views.coordinator_read_latency`,
`coordinator_write_latency`, `coordinator_scan_latency`: statements this node coordinated per
table; `local_write_latency` of `system.paxos`: the Paxos state writes an LWT costs). They count
what the server did, whoever sent it, so they check idemd's own accounting rather than repeat it.
"""

import json
import sys

from cassandra.cluster import Cluster

KINDS = {
    "coordinator_read_latency": "read",
    "coordinator_write_latency": "write",
    "coordinator_scan_latency": "scan",
}


def snapshot(host, keyspace):
    session = Cluster([host]).connect()
    counts = {}
    for view, kind in KINDS.items():
        for row in session.execute(f"SELECT keyspace_name, table_name, count FROM system_views.{view}"):
            if row.keyspace_name == keyspace and row.count:
                counts[f"{row.table_name} {kind}"] = row.count
    for row in session.execute("SELECT keyspace_name, table_name, count FROM system_views.local_write_latency"):
        if row.keyspace_name == "system" and row.table_name == "paxos":
            counts["system.paxos local write"] = row.count
    json.dump(counts, sys.stdout)


def table(before_path, after_path, pairs, seconds):
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    pairs, seconds = float(pairs), float(seconds)
    rows = sorted(set(before) | set(after))
    print("| table, statement | count | per pair | per second |")
    print("|---|---:|---:|---:|")
    total = 0
    for name in rows:
        delta = after.get(name, 0) - before.get(name, 0)
        if delta <= 0:
            continue
        if not name.startswith("system.paxos"):
            total += delta
        per_pair = f"{delta / pairs:.3f}" if pairs else "–"
        print(f"| {name} | {delta:,} | {per_pair} | {delta / seconds:.2f} |")
    per_pair = f"{total / pairs:.3f}" if pairs else "–"
    print(f"| **all idemd statements** | {total:,} | {per_pair} | {total / seconds:.2f} |")


if __name__ == "__main__":
    if sys.argv[1] == "snapshot":
        snapshot(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "table":
        table(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
