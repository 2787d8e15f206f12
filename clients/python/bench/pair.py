"""Times the executor's Claim + Complete pair (a fresh key each), one at a time, per transport:
the SDK's own on h2 (transport="h2") and grpcio (the default), sync (`idemd.Client`) and asyncio
(`idemd.aio.AsyncClient`), in interleaved rounds so that both meet the same machine. Prints p50/p99
wall time and the process's CPU time per pair.

    python clients/python/bench/pair.py --idemd 127.0.0.1:50051 --pairs 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import idemd
from idemd.aio import AsyncClient

REQUEST = idemd.Request("POST", "/pay", b'{"amount":1}', "application/json")
RESPONSE = idemd.Response(201, [("Content-Type", "application/json")], b'{"ok":true}')


def sync_round(client: idemd.Client, pairs: int) -> tuple:
    times = []
    cpu = time.process_time()
    for _ in range(pairs):
        start = time.perf_counter()
        client.execute_once("POST /pay", str(uuid.uuid4()), REQUEST, lambda e: RESPONSE)
        times.append(time.perf_counter() - start)
    return times, time.process_time() - cpu


async def aio_round(client: AsyncClient, pairs: int) -> tuple:
    times = []
    cpu = time.process_time()
    for _ in range(pairs):
        start = time.perf_counter()
        await client.execute_once("POST /pay", str(uuid.uuid4()), REQUEST, lambda e: RESPONSE)
        times.append(time.perf_counter() - start)
    return times, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idemd", required=True)
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default="sync,aio")
    parser.add_argument("--transports", default="h2,grpcio")
    args = parser.parse_args()
    transports = tuple(args.transports.split(","))
    results = {}
    modes = args.modes.split(",")
    loop = asyncio.new_event_loop()
    sync_clients = {t: idemd.Client(args.idemd, insecure=True, tenant="bench", transport=t) for t in transports}

    async def make_aio():
        return {t: AsyncClient(args.idemd, insecure=True, tenant="bench", transport=t) for t in transports}

    aio_clients = loop.run_until_complete(make_aio())
    for r in range(args.rounds + 1):  # round 0 warms up
        for mode in modes:
            for t in transports if r % 2 else reversed(transports):
                if mode == "sync":
                    times, cpu = sync_round(sync_clients[t], args.pairs)
                else:
                    times, cpu = loop.run_until_complete(aio_round(aio_clients[t], args.pairs))
                if r:
                    entry = results.setdefault((mode, t), ([], []))
                    entry[0].extend(times)
                    entry[1].append(cpu / args.pairs)
    for (mode, t), (times, cpus) in sorted(results.items()):
        times.sort()
        p50 = times[len(times) // 2] * 1000
        p99 = times[len(times) * 99 // 100] * 1000
        print(f"{mode:5} {t:7} p50 {p50:.3f} ms  p99 {p99:.3f} ms  cpu/pair {statistics.median(cpus) * 1000:.3f} ms")


if __name__ == "__main__":
    main()
