"""tests/kafka_clients.py reads a group's committed offsets without crashing when the broker
answers NOT_COORDINATOR, as a broker does while the group coordinator loads. Read through
AdminClient.list_consumer_group_offsets, that answer is a NULL dereference in librdkafka (issue
5040): the segfault that killed pytest in tests/test_consumer.py's Kafka test. No real broker: a
stand-in that speaks just enough of the protocol for the lookup and always answers so."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import struct
import threading
from typing import Iterator

import pytest

from kafka_clients import KafkaClients

if importlib.util.find_spec("confluent_kafka") is None:
    pytest.skip("could not import 'confluent_kafka'", allow_module_level=True)

NOT_COORDINATOR = 16
UNSUPPORTED_VERSION = 35


def _i16(v: int) -> bytes:
    return struct.pack(">h", v)


def _i32(v: int) -> bytes:
    return struct.pack(">i", v)


def _str(text: str) -> bytes:
    return _i16(len(text)) + text.encode()


def _answer(conn: socket.socket, port: int) -> None:
    """Answers one client connection until it closes: ApiVersions, Metadata v0, FindCoordinator v0
    (this node for every group) and OffsetFetch v2 (no offsets, NOT_COORDINATOR)."""
    with conn, contextlib.suppress(OSError):  # OSError: the client went away
        while True:
            head = conn.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return
            request = conn.recv(struct.unpack(">i", head)[0], socket.MSG_WAITALL)
            api, version, correlation = struct.unpack(">hhi", request[:8])
            if api == 18:  # ApiVersions, in v0 form; a newer version asked is refused with the list
                apis = [(18, 0, 0), (3, 0, 0), (10, 0, 0), (9, 2, 2)]
                body = (_i16(UNSUPPORTED_VERSION if version else 0) + _i32(len(apis))
                        + b"".join(_i16(a) + _i16(lo) + _i16(hi) for a, lo, hi in apis))
            elif api == 3:  # Metadata: this node, no topics
                body = _i32(1) + _i32(1) + _str("127.0.0.1") + _i32(port) + _i32(0)
            elif api == 10:  # FindCoordinator: this node
                body = _i16(0) + _i32(1) + _str("127.0.0.1") + _i32(port)
            elif api == 9:  # OffsetFetch
                body = _i32(0) + _i16(NOT_COORDINATOR)
            else:
                return
            reply = _i32(correlation) + body
            conn.sendall(_i32(len(reply)) + reply)


@pytest.fixture
def busy_coordinator() -> Iterator[str]:
    """The stand-in broker's bootstrap address."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:  # closed at teardown
                    return
                threading.Thread(target=_answer, args=(conn, port), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        yield f"127.0.0.1:{port}"


def test_committed_survives_a_not_coordinator_answer(busy_coordinator: str) -> None:
    with KafkaClients(busy_coordinator) as kafka:
        for _ in range(2):  # the child is still there to answer again
            with pytest.raises(RuntimeError, match="NOT_COORDINATOR"):
                kafka.committed("billing", "orders", 1, wait=1.0)
        assert kafka.process.poll() is None
    assert kafka.process.returncode == 0
