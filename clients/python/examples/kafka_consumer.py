"""A Kafka consumer whose side effect runs once per message key, with idemd.MessageProcessor
(confluent-kafka). It is the consumer program of clients/conformance/consumer-scenarios.md.

    python examples/kafka_consumer.py --brokers 127.0.0.1:9092 --topic orders --group billing \\
        --idemd localhost:50051 --token "$IDEMD_TOKEN" --ledger ledger.txt --dead-letters dead.jsonl

Every setting is a flag (``--help``). The loop commits offsets by hand, each only once the
helper says it may be (EXECUTED, DUPLICATE, DEAD_LETTERED), in order per partition; a message
the helper says to RETRY is processed again before anything later of its partition. SIGTERM:
finish the message in hand, commit, leave the group, exit 0. On exit it prints
``{"executed": .., "duplicate": .., "dead_lettered": .., "retry": ..}``.

``--mode``: ``sequential`` (default; ``MessageProcessor.process``, one message in hand),
``pipelined`` (``process_batch`` with ``Ordering.PER_PARTITION``: each partition in offset order,
partitions side by side) or ``parallel`` (``process_batch`` with ``Ordering.PER_KEY``: keys side by
side), up to ``--parallelism`` handlers at once. The batch modes hand each poll (what the client
has fetched, up to POLL_MAX messages) to ``process_batch``, process the RETRY ones again in place
after a pause, and commit each partition up to its first undecided message.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Dict, Tuple

from confluent_kafka import Consumer, KafkaException, TopicPartition

import idemd
from idemd import Message, MessageProcessor, Ordering, Outcome

#: Commit every this many messages or seconds, whichever comes first (and when idle,
#: on a revocation and on exit): one commit per message would be a broker round trip each.
COMMIT_EVERY = 100
COMMIT_SECONDS = 0.2
RETRY_PAUSE = 0.2
#: The batch modes: at most this many fetched messages per poll (confluent-kafka hands out a fetch
#: partition by partition: a small poll would often hold one partition, which PER_PARTITION runs serially).
POLL_MAX = 10_000


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--idemd", required=True, help="idemd address (plaintext)")
    p.add_argument("--token", default=os.environ.get("IDEMD_TOKEN"), help="tenant token (default $IDEMD_TOKEN)")
    p.add_argument("--endpoint", help="idemd endpoint (default kafka:<topic>)")
    p.add_argument("--key-header", default="idempotency-key")
    p.add_argument("--lease", type=float, default=idemd.DEFAULT_LEASE, help="seconds (default: the SDK's)")
    p.add_argument("--handler-ms", type=int, default=0, help="the handler sleeps this long before its side effect")
    p.add_argument("--ledger", required=True, help="the side effect appends '<n>\\n' here")
    p.add_argument("--dead-letters", required=True, help="the dead-letter hook appends a JSON line here")
    p.add_argument("--kill-in-handler-after-side-effect-of", type=int, metavar="N")
    p.add_argument("--kill-after-side-effect-of", type=int, metavar="N")
    p.add_argument("--no-helper", action="store_true", help="the negative control: no idemd, every delivery runs")
    p.add_argument("--mode", choices=("sequential", "pipelined", "parallel"), default="sequential",
                   help="sequential (process, one message in hand), pipelined (process_batch, each partition in "
                        "offset order) or parallel (process_batch, keys side by side)")
    p.add_argument("--parallelism", type=int, default=idemd.DEFAULT_PARALLELISM,
                   help="handlers at once in the pipelined and parallel modes")
    return p.parse_args(argv)


def append(path: str, line: str) -> None:
    # One write(2) on an O_APPEND descriptor: lines of concurrent consumers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def main(argv=None) -> int:
    args = parse(argv)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    def handle(message: Message) -> None:
        body = json.loads(message.value)
        if body.get("poison"):
            raise RuntimeError(f"poison message {body['n']}")
        time.sleep(args.handler_ms / 1000)
        append(args.ledger, f"{body['n']}\n")
        if body["n"] == args.kill_in_handler_after_side_effect_of:
            os.kill(os.getpid(), signal.SIGKILL)

    def dead_letter(message: Message, reason: str) -> None:
        append(args.dead_letters, json.dumps({"message": json.loads(message.value)["n"], "reason": reason}) + "\n")

    client = None if args.no_helper else idemd.Client(args.idemd, token=args.token, insecure=True)
    helper = None if client is None else MessageProcessor(
        client, args.endpoint or f"kafka:{args.topic}", key_header=args.key_header,
        lease=args.lease, dead_letter=dead_letter,
    )

    def no_helper(message: Message, handler) -> Outcome:
        try:
            handler(message)
            return Outcome.EXECUTED
        except Exception as error:
            dead_letter(message, f"{type(error).__name__}: {error}")
            return Outcome.DEAD_LETTERED

    # Next offset to commit per partition: advanced only past messages the helper let go.
    done: Dict[Tuple[str, int], int] = {}
    last_commit = [time.monotonic(), 0]

    def commit(asynchronous: bool) -> None:
        if not done:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in done.items()]
        done.clear()
        last_commit[:] = [time.monotonic(), 0]
        try:
            consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as error:
            # A partition revoked meanwhile: its new owner redelivers, the helper replays.
            print(f"commit failed: {error}", file=sys.stderr, flush=True)

    consumer = Consumer({
        "bootstrap.servers": args.brokers,
        "group.id": args.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # A consumer killed with SIGKILL leaves the group only when its session
        # times out: 6 s, not the default 45 s, before its partitions move.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
    })
    consumer.subscribe([args.topic], on_revoke=lambda c, partitions: commit(False))
    counts = {outcome: 0 for outcome in Outcome}
    batch = args.mode != "sequential"
    ordering = Ordering.PER_PARTITION if args.mode == "pipelined" else Ordering.PER_KEY

    def process_poll(records) -> None:
        """A whole poll through process_batch (or the no-helper handler), the RETRY ones again in
        place after a pause until decided or SIGTERM; then each partition may be committed up to
        its first undecided message."""
        messages = [Message(r.value() or b"", r.headers() or [], r.topic(), r.partition(), r.offset())
                    for r in records]
        undecided = list(range(len(records)))
        decided = [False] * len(records)
        pause = RETRY_PAUSE
        while undecided:
            group = [messages[i] for i in undecided]
            if helper is None:
                outcomes = [no_helper(m, handle) for m in group]
            else:
                outcomes = [p.outcome for p in helper.process_batch(group, handle, ordering=ordering,
                                                                    parallelism=args.parallelism)]
            again = []
            for i, outcome in zip(undecided, outcomes):
                counts[outcome] += 1
                if not outcome.may_commit:
                    again.append(i)
                    continue
                decided[i] = True
                n = json.loads(messages[i].value)["n"]
                print(json.dumps({"message": n, "outcome": outcome.value}), flush=False)
                if n == args.kill_after_side_effect_of:
                    sys.stdout.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
            undecided = again
            if undecided and not stopping:
                time.sleep(pause)
                pause = min(2 * pause, 2.0)
            elif undecided:
                for i in undecided:  # SIGTERM: leave them uncommitted, for the next owner
                    n = json.loads(messages[i].value)["n"]
                    print(json.dumps({"message": n, "outcome": Outcome.RETRY.value}), flush=False)
                break
        sys.stdout.flush()
        blocked = set()
        for i, record in enumerate(records):
            where = (record.topic(), record.partition())
            if not decided[i]:
                blocked.add(where)
            if where not in blocked:
                done[where] = record.offset() + 1
                last_commit[1] += 1

    try:
        while batch and not stopping:
            record = consumer.poll(0.2)
            if record is None:
                commit(True)
                continue
            records = [record] + consumer.consume(num_messages=POLL_MAX - 1, timeout=0)  # what is fetched
            for bad in [r for r in records if r.error()]:
                print(f"consume error: {bad.error()}", file=sys.stderr, flush=True)
            records = [r for r in records if not r.error()]
            if records:
                process_poll(records)
            if last_commit[1] >= COMMIT_EVERY or time.monotonic() - last_commit[0] >= COMMIT_SECONDS:
                commit(True)
        while not batch and not stopping:
            record = consumer.poll(0.2)
            if record is None:
                commit(True)
                continue
            if record.error():
                print(f"consume error: {record.error()}", file=sys.stderr, flush=True)
                continue
            message = Message(record.value() or b"", record.headers() or [], record.topic(),
                              record.partition(), record.offset())
            n = json.loads(message.value)["n"]
            while True:
                outcome = no_helper(message, handle) if helper is None else helper.process(message, handle).outcome
                counts[outcome] += 1
                if outcome.may_commit or stopping:
                    break
                time.sleep(RETRY_PAUSE)  # retry in place: nothing later of this partition runs first
            print(json.dumps({"message": n, "outcome": outcome.value}), flush=True)
            if not outcome.may_commit:
                break  # SIGTERM during a retry: leave it uncommitted
            if n == args.kill_after_side_effect_of:
                os.kill(os.getpid(), signal.SIGKILL)
            done[(record.topic(), record.partition())] = record.offset() + 1
            last_commit[1] += 1
            if last_commit[1] >= COMMIT_EVERY or time.monotonic() - last_commit[0] >= COMMIT_SECONDS:
                commit(True)
    finally:
        # Stopping already: a second SIGTERM must not kill the commit, nor the interpreter's
        # shutdown (which puts a Python handler back to the default, exit by the signal).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        commit(False)
        consumer.close()  # leaves the group: its partitions move at once
        if client is not None:
            client.close()
        print(json.dumps({o.value: n for o, n in counts.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
