"""The Kafka work of the consumer tests (topics, producing, a group's committed offsets), done in
a child process, never in pytest's.

Why a group's offsets are read by a Consumer and not AdminClient.list_consumer_group_offsets:
given a NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE answer, librdkafka (2.16, confluent-kafka
2.16.1) asks the client's own consumer-group handle for a new coordinator, and an admin client has
none: a NULL dereference in librdkafka's main thread (rd_kafka_cgrp_op from
rd_kafka_handle_OffsetFetch; librdkafka issue 5040). A broker answers so while the group
coordinator loads, as right after the first group on a fresh broker creates __consumer_offsets,
which is when tests/test_consumer.py's Kafka test, the suite's first group, polls.

Why a child process: a crash in a librdkafka thread is silent. librdkafka blocks every signal in
its threads, so faulthandler never runs; pytest died mid-suite with exit 139, no stack, and no
results for the tests after it. (Also, an AdminClient's futures are completed by Python code run
in librdkafka's background thread, which can then run the cyclic GC there and free whatever the
suite left behind in a thread Python did not start: confluent-kafka-python issue 1761.) Here the
clients live in a small process that serves one JSON request per line; a crash fails the one test
that used it, naming the child's exit status.

    with KafkaClients(brokers) as kafka:
        kafka.create_topic("orders", 1)
        assert kafka.produce("orders", [Record(b'{"amount": 1}', [("idempotency-key", b"k1")])]) == 0
        kafka.committed("billing", "orders", 1)  # {0: -1001} until the group commits

Run as a script (``python kafka_clients.py BROKERS``) it is the child.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

# How long one request may take in the child before the parent gives up on it: above every
# timeout the child itself applies (30 s for a topic or a flush, 10 s plus ``wait`` for offsets).
REPLY_TIMEOUT = 90.0


@dataclass
class Record:
    value: bytes
    headers: List[Tuple[str, bytes]] = field(default_factory=list)
    partition: Optional[int] = None  # None: the producer's partitioner picks


def _text(data: bytes) -> str:  # bytes through JSON unchanged
    return data.decode("latin-1")


def _bytes(text: str) -> bytes:
    return text.encode("latin-1")


class KafkaClients:
    """One child process for ``brokers``: an AdminClient for topics, a Producer per ``produce`` and,
    per group asked about, a Consumer that never subscribes for its committed offsets. Every method
    blocks until the child answers and raises RuntimeError with its error."""

    def __init__(self, brokers: str) -> None:
        self.brokers = brokers
        # stderr is inherited: librdkafka's log lines land in the test's captured output.
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), brokers],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, encoding="utf-8",
        )

    def __enter__(self) -> "KafkaClients":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the child: EOF on its stdin, it closes its clients and exits; killed after 30 s."""
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
            except OSError:
                pass
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def _call(self, op: str, **args: object) -> object:
        assert self.process.stdin is not None and self.process.stdout is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"kafka_clients: the child exited with {self.process.returncode} before {op}")
        try:
            self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # reported below with the exit status
        # One reply line per request, so nothing is ever left in stdout's buffer between calls.
        ready, _, _ = select.select([self.process.stdout], [], [], REPLY_TIMEOUT)
        line = self.process.stdout.readline() if ready else None
        if not line:
            if line is None:
                self.process.kill()
            status = self.process.wait()
            why = f"within {REPLY_TIMEOUT:.0f} s (killed)" if line is None else f"(exit status {status})"
            raise RuntimeError(f"kafka_clients: no answer to {op} {why}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"kafka_clients: {op}: {reply['error']}")
        return reply["result"]

    def create_topic(self, topic: str, partitions: int) -> None:
        """Creates ``topic`` (replication factor 1), waiting up to 30 s."""
        self._call("create_topic", topic=topic, partitions=partitions)

    def delete_topic(self, topic: str) -> None:
        """Deletes ``topic``, waiting up to 30 s."""
        self._call("delete_topic", topic=topic)

    def produce(self, topic: str, records: Sequence[Record], config: Optional[Dict[str, object]] = None) -> int:
        """Produces ``records`` in order through a fresh Producer (``bootstrap.servers`` plus
        ``config``), then flushes for up to 30 s; returns flush()'s count of undelivered records."""
        wire = [{"value": _text(r.value), "headers": [[k, _text(v)] for k, v in r.headers], "partition": r.partition}
                for r in records]
        return int(self._call("produce", topic=topic, records=wire, config=config or {}))  # type: ignore[arg-type]

    def committed(self, group: str, topic: str, partitions: int, wait: float = 10.0) -> Dict[int, int]:
        """``group``'s committed offset of each partition of ``topic`` (negative: none yet); asks
        again for up to ``wait`` seconds while the broker says the group's coordinator is busy."""
        offsets = self._call("committed", group=group, topic=topic, partitions=partitions, wait=wait)
        return {int(p): o for p, o in offsets.items()}  # type: ignore[union-attr]


# -- the child ---------------------------------------------------------------------------------


def _serve(brokers: str) -> int:
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    # A broker's answers while the group's coordinator moves or loads (right after the first
    # group on a fresh broker creates __consumer_offsets, for one): ask again.
    coordinator_busy = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                        KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
    readers: Dict[str, Consumer] = {}

    def produce(topic: str, records: list, config: dict) -> int:
        producer = Producer({"bootstrap.servers": brokers, **config})
        for r in records:
            extra = {} if r["partition"] is None else {"partition": r["partition"]}
            producer.produce(topic, value=_bytes(r["value"]),
                             headers=[(k, _bytes(v)) for k, v in r["headers"]], **extra)
        remaining = producer.flush(30)
        if remaining == 0:
            producer.close()  # destroyed here and now (close() would wait for undelivered ones forever)
        else:
            producer.purge()  # the caller fails on the count; the last reference drops it on return
        return remaining

    def committed(group: str, topic: str, partitions: int, wait: float) -> Dict[int, int]:
        # A Consumer of the group that never subscribes (so never joins it) reads its offsets;
        # not the AdminClient (the module docs say why).
        if group not in readers:
            readers[group] = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
        deadline = time.monotonic() + wait
        while True:
            try:
                found = readers[group].committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                return {tp.partition: tp.offset for tp in found}
            except KafkaException as error:
                if error.args[0].code() not in coordinator_busy or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    # The with block destroys the admin client in this thread when stdin closes; the readers are
    # closed before it.
    with AdminClient({"bootstrap.servers": brokers}) as admin:

        def create_topic(topic: str, partitions: int) -> None:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)

        def delete_topic(topic: str) -> None:
            admin.delete_topics([topic])[topic].result(30)

        ops = {
            "create_topic": create_topic,
            "delete_topic": delete_topic,
            "produce": produce,
            "committed": committed,
        }
        for line in sys.stdin:
            request = json.loads(line)
            op = request.pop("op")
            try:
                reply = {"result": ops[op](**request)}
            except Exception as error:  # noqa: BLE001 - every failure goes back to the test
                reply = {"error": f"{type(error).__name__}: {error}"}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        for reader in readers.values():
            reader.close()
    return 0


if __name__ == "__main__":
    sys.exit(_serve(sys.argv[1]))
