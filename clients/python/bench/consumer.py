"""Messages/s of examples/kafka_consumer.py with and without MessageProcessor (issues 39, 52).

Modes: "no helper" (``--no-helper``), then each of $IDEMD_CONSUMER_BENCH_MODES (default
"parallel pipelined sequential": the program's ``--mode``; $IDEMD_CONSUMER_BENCH_PARALLELISM sets
its ``--parallelism``), in turn, $IDEMD_CONSUMER_BENCH_RUNS rounds (default ``--rounds``, 1).

One consumer, a fresh topic per run (``--partitions``, default 4) holding ``--messages`` (default
10,000) distinct messages, the client's default fetch (confluent-kafka's prefetch, one ``poll`` per
message), handler ms 0, against an idemd started here from ``--idemd-bin`` (the release build).
The rate counts from the first side effect to the last (group join and start-up excluded); the
total from the consumer's start is printed beside it. bench/consumer.sh runs it under
scripts/kafka.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "src")]

from conftest import CREDENTIALS, start_server  # noqa: E402
from kafka_clients import KafkaClients  # noqa: E402
from test_kafka_consumer import PROGRAM, lines, produce  # noqa: E402


def one_run(kafka: KafkaClients, idemd: str, messages: int, partitions: int, mode: str, tmp: Path) -> dict:
    topic = f"bench-{secrets.token_hex(4)}"
    brokers = kafka.brokers
    kafka.create_topic(topic, partitions)
    ends = produce(kafka, topic, secrets.token_hex(6), {"produce": {"messages": messages}}, partitions, "idempotency-key")
    ledger = tmp / f"{topic}.ledger"
    env = dict(os.environ, PYTHONPATH=str(HERE.parent / "src"), IDEMD_TOKEN=CREDENTIALS["alice"])
    args = [sys.executable, str(PROGRAM), "--brokers", brokers, "--topic", topic, "--group", f"g-{topic}",
            "--idemd", idemd, "--ledger", str(ledger), "--dead-letters", str(tmp / f"{topic}.dead")]
    started = time.monotonic()
    if mode == "no helper":
        args.append("--no-helper")
    else:
        args += ["--mode", mode]
        if os.environ.get("IDEMD_CONSUMER_BENCH_PARALLELISM"):
            args += ["--parallelism", os.environ["IDEMD_CONSUMER_BENCH_PARALLELISM"]]
    consumer = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)
    first = None
    try:
        while True:
            count = len(lines(ledger))
            now = time.monotonic()
            if count and first is None:
                first = (now, count)
            if count >= messages:
                break
            if consumer.poll() is not None or now - started > 600:
                raise SystemExit(f"consumer stopped at {count} of {messages} messages")
            time.sleep(0.01)
        while kafka.committed(f"g-{topic}", topic, partitions) != ends:
            time.sleep(0.05)
    finally:
        consumer.send_signal(signal.SIGTERM)
        consumer.wait(30)
        kafka.delete_topic(topic)
    return {
        "mode": mode,
        "messages_per_s": round((count - first[1]) / (now - first[0])),
        "total_s_from_start": round(now - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default=os.environ.get("IDEMD_TEST_KAFKA_BROKERS"))
    parser.add_argument("--idemd-bin", default=os.environ.get("IDEMD_BIN"), required="IDEMD_BIN" not in os.environ)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("IDEMD_CONSUMER_BENCH_RUNS") or 1))
    args = parser.parse_args()
    if not args.brokers:
        raise SystemExit("no broker: pass --brokers or run under scripts/kafka.sh run --")
    os.environ["IDEMD_BIN"] = args.idemd_bin
    with start_server() as server, tempfile.TemporaryDirectory(prefix="idemd-consumer-bench-") as tmp, \
            KafkaClients(args.brokers) as kafka:
        modes = (os.environ.get("IDEMD_CONSUMER_BENCH_MODES") or "parallel pipelined sequential").split()
        for _ in range(args.rounds):
            for mode in ["no helper", *modes]:
                print(json.dumps(one_run(kafka, server.address, args.messages, args.partitions, mode, Path(tmp))),
                      flush=True)


if __name__ == "__main__":
    main()
