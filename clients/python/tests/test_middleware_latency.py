"""What the middleware costs at one request in flight (docs/sdk.md records the
numbers): the same app with and without it, over real HTTP, against the live
idemd. Prints them; fails only if a replay is slower than 10 ms at p50 (the
transport regression of issue 12 would show as ~44 ms)."""

from __future__ import annotations

import http.client
import secrets
import statistics
import time
from typing import Callable, List

import pytest

from conftest import Server
from http_scenarios import AppState
from test_middleware import alice_async, django_app, fastapi_app, flask_app, serve_asgi, serve_wsgi

SAMPLES = 200
BODY = b'{"amount":4200,"currency":"usd","customer":"cus_8812"}'


def timed(port: int, key: Callable[[int], str], count: int) -> List[float]:
    samples = []
    for i in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        started = time.perf_counter()
        conn.request("POST", "/v1/payments/p1", body=BODY,
                     headers={"Idempotency-Key": key(i), "Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        samples.append((time.perf_counter() - started) * 1000)
        conn.close()
        assert response.status == 201
    return samples


def p50(samples: List[float]) -> float:
    return statistics.median(samples)


@pytest.mark.latency
@pytest.mark.parametrize("framework", ["fastapi", "flask", "django"])
def test_middleware_latency(framework: str, server: Server) -> None:
    prefix = secrets.token_hex(6)
    bare_state, state = AppState(), AppState()
    if framework == "fastapi":
        bare_ctx, app_ctx = serve_asgi(fastapi_app(bare_state)), serve_asgi(fastapi_app(state, alice_async(server)))
        client = None
    else:
        client = server.client("alice")
        make = flask_app if framework == "flask" else django_app
        # Django's URLconf is global: the bare app's view is replaced by the
        # second's, so both servers count into `state`; only timings matter here.
        bare_ctx, app_ctx = serve_wsgi(make(bare_state)), serve_wsgi(make(state, client))
    try:
        with bare_ctx as bare_port, app_ctx as port:
            timed(bare_port, lambda i: f"{prefix}-warm-{i}", 20)
            timed(port, lambda i: f"{prefix}-warm-{i}", 20)
            bare = timed(bare_port, lambda i: f"{prefix}-bare-{i}", SAMPLES)
            fresh = timed(port, lambda i: f"{prefix}-fresh-{i}", SAMPLES)
            replay = timed(port, lambda i: f"{prefix}-fresh-{i}", SAMPLES)
    finally:
        if client is not None:
            client.close()
    print(f"\nlatency: {framework} middleware, one in flight, {SAMPLES} requests each: "
          f"without p50 {p50(bare):.2f} ms; fresh p50 {p50(fresh):.2f} ms; replay p50 {p50(replay):.2f} ms")
    assert p50(replay) < 10, f"replay p50 {p50(replay):.2f} ms"
