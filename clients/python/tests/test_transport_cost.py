"""What the client's own HTTP/2 transport costs per Claim + Complete pair against grpcio on the
same idemd (src/idemd/_h2.py says why it exists), sync and asyncio: the process's CPU time per
pair (all threads: grpcio's own count) and the p50 wall time, the two transports interleaved in
rounds so that load on the machine lands on both alike. CPU time is the tight bound, since a pair's
wall time is mostly idemd's durable write, which moves with the build and the load; the p50 bound
is generous. Fails when the lean transport costs more than CPU_RATIO_LIMIT of grpcio's CPU per
pair (it measures about 0.55), or is slower at p50 than WALL_RATIO_LIMIT of grpcio."""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Dict, List

import pytest

import idemd
from idemd.aio import AsyncClient

from conftest import CREDENTIALS, Server

ROUNDS = 6
PAIRS_PER_ROUND = 100
CPU_RATIO_LIMIT = 0.85
WALL_RATIO_LIMIT = 1.1
TRANSPORTS = ("http2", "grpcio")
ENDPOINT = "POST /v1/payments"
PAYMENT = idemd.Request("POST", "/v1/payments/p1", b'{"amount":4200,"currency":"usd","customer":"cus_8812"}',
                        "application/json")
CREATED = idemd.Response(201, [("Content-Type", "application/json")], b'{"id":"pay_1"}')


def _report(kind: str, cpu: Dict[str, float], walls: Dict[str, List[float]], capsys) -> tuple:
    pairs = ROUNDS * PAIRS_PER_ROUND
    per_pair = {t: cpu[t] / pairs * 1000 for t in TRANSPORTS}
    p50 = {t: sorted(walls[t])[len(walls[t]) // 2] * 1000 for t in TRANSPORTS}
    cpu_ratio = per_pair["http2"] / per_pair["grpcio"]
    wall_ratio = p50["http2"] / p50["grpcio"]
    with capsys.disabled():
        print(f"\nlatency: {kind} client per Claim+Complete pair: http2 CPU {per_pair['http2']:.3f} ms p50 "
              f"{p50['http2']:.3f} ms; grpcio CPU {per_pair['grpcio']:.3f} ms p50 {p50['grpcio']:.3f} ms "
              f"(CPU ratio {cpu_ratio:.2f}, p50 ratio {wall_ratio:.2f})")
    return cpu_ratio, wall_ratio


def _check(cpu_ratio: float, wall_ratio: float) -> None:
    assert cpu_ratio < CPU_RATIO_LIMIT, (
        f"the http2 transport takes {cpu_ratio:.2f} of grpcio's CPU per pair (limit {CPU_RATIO_LIMIT})")
    assert wall_ratio < WALL_RATIO_LIMIT, (
        f"the http2 transport's pair p50 is {wall_ratio:.2f} of grpcio's (limit {WALL_RATIO_LIMIT})")


@pytest.mark.latency
def test_sync_transport_costs_well_under_grpcio(server: Server, capsys: pytest.CaptureFixture) -> None:
    clients = {t: server.client("alice", transport=t) for t in TRANSPORTS}
    prefix = secrets.token_hex(6)
    cpu = dict.fromkeys(TRANSPORTS, 0.0)
    walls: Dict[str, List[float]] = {t: [] for t in TRANSPORTS}
    try:
        for t in TRANSPORTS:  # warm-up: connections, caches
            for i in range(30):
                clients[t].execute_once(ENDPOINT, f"{prefix}-warm-{t}-{i}", PAYMENT, lambda e: CREATED)
        for round_ in range(ROUNDS):
            for t in TRANSPORTS if round_ % 2 else TRANSPORTS[::-1]:
                start = time.process_time()
                for i in range(PAIRS_PER_ROUND):
                    began = time.perf_counter()
                    clients[t].execute_once(ENDPOINT, f"{prefix}-{t}-{round_}-{i}", PAYMENT, lambda e: CREATED)
                    walls[t].append(time.perf_counter() - began)
                cpu[t] += time.process_time() - start
    finally:
        for client in clients.values():
            client.close()
    _check(*_report("sync", cpu, walls, capsys))


@pytest.mark.latency
def test_async_transport_costs_well_under_grpc_aio(server: Server, capsys: pytest.CaptureFixture) -> None:
    prefix = secrets.token_hex(6)
    cpu = dict.fromkeys(TRANSPORTS, 0.0)
    walls: Dict[str, List[float]] = {t: [] for t in TRANSPORTS}

    async def main() -> None:
        clients = {t: AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True, transport=t)
                   for t in TRANSPORTS}
        try:
            for t in TRANSPORTS:
                for i in range(30):
                    await clients[t].execute_once(ENDPOINT, f"{prefix}-warm-{t}-{i}", PAYMENT, lambda e: CREATED)
            for round_ in range(ROUNDS):
                for t in TRANSPORTS if round_ % 2 else TRANSPORTS[::-1]:
                    start = time.process_time()
                    for i in range(PAIRS_PER_ROUND):
                        began = time.perf_counter()
                        await clients[t].execute_once(
                            ENDPOINT, f"{prefix}-{t}-{round_}-{i}", PAYMENT, lambda e: CREATED)
                        walls[t].append(time.perf_counter() - began)
                    cpu[t] += time.process_time() - start
        finally:
            for client in clients.values():
                await client.close()

    asyncio.run(main())
    _check(*_report("aio", cpu, walls, capsys))
