"""Replay latency through the executor (clients/conformance/README.md, "Replay
latency check"): guards against transport regressions such as issue 12, where a
missing TCP_NODELAY on the server's sockets made each two-segment reply wait
~44 ms for the client's delayed ACK. Runs after every other test (conftest)."""

from __future__ import annotations

import time
import uuid

import pytest

import idemd
from idemd import Request, Response

ENDPOINT = "POST /v1/latency"
BODY = bytes(range(256)) * 4  # 1 KiB, not all text, so every byte is compared
WARMUP = 5
SAMPLES = 100
P50_LIMIT_MS = 10.0


@pytest.mark.latency
def test_replay_p50_of_a_1_kib_body_is_under_10_ms(alice: idemd.Client, capsys: pytest.CaptureFixture) -> None:
    key = str(uuid.uuid4())
    request = Request("POST", "/v1/latency", b'{"n":1}', "application/json")
    calls = []
    stored = Response(201, [("X-Latency", "1")], BODY)

    def handler(execution):
        calls.append(execution.key)
        return stored

    first = alice.execute_once(ENDPOINT, key, request, handler)
    assert (first.replayed, len(calls), first.response.body) == (False, 1, BODY)

    for _ in range(WARMUP):
        alice.execute_once(ENDPOINT, key, request, handler)
    timings = []
    for _ in range(SAMPLES):
        start = time.perf_counter()
        result = alice.execute_once(ENDPOINT, key, request, handler)
        timings.append((time.perf_counter() - start) * 1000.0)
        assert result.replayed and result.response.status == 201 and result.response.body == BODY
    assert len(calls) == 1

    timings.sort()
    p50 = timings[SAMPLES // 2 - 1]
    p99 = timings[SAMPLES * 99 // 100 - 1]
    with capsys.disabled():  # the figures belong in every run's output, not only a failing one's
        print(f"\nlatency: {SAMPLES} replays of a 1 KiB body: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    assert p50 < P50_LIMIT_MS, f"replay p50 {p50:.2f} ms is over {P50_LIMIT_MS} ms (p99 {p99:.2f} ms)"
