"""What the middleware costs at one request in flight (docs/sdk.md records the
numbers): the same app with and without it, over real HTTP, against the live
idemd. Prints them, with a bare Claim+Complete pair's (raw RPCs, no executor)
against the same idemd; fails if a replay is slower than 10 ms at p50 (the
transport regression of issue 12 would show as ~44 ms), or if what a fresh key
adds to the app, less the pair itself, is over 2.5 ms (or 0.6 of the pair, when
that is more) at p50, in each of 3 rounds. That difference
is the SDK's own cost (executor and middleware), which issue 37's bench
(bench/README.md) holds to ~0.5 ms on an idle machine; measured against the
pair, the bound holds on a slow debug idemd and a loaded machine alike, and
still catches a per-request channel or connection, or a delayed ACK (tens of
ms)."""

from __future__ import annotations

import http.client
import secrets
import statistics
import time
from typing import List, Optional

import pytest

import idemd
from conftest import Server
from http_scenarios import AppState
from test_middleware import alice_async, django_app, fastapi_app, flask_app, serve_asgi, serve_wsgi

SAMPLES = 200
#: What the SDK may add to a fresh key's p50 beyond the pair (see the module's doc):
#: 2.5 ms, or 0.6 of the pair when the pair is slower than about 4.2 ms. The SDK's own
#: cost moves with the machine's speed as the pair does: on a day every figure of a CI
#: run was about twice its usual (the app without the middleware 2.21 ms, the pair
#: 6.06 ms), FastAPI's fresh key added 2.74 ms over the pair and failed a fixed 2.5 ms.
SDK_P50_LIMIT_MS = 2.5
SDK_P50_LIMIT_RATIO = 0.6
#: How many rounds a test measures at most before it fails.
ROUNDS = 3
BODY = b'{"amount":4200,"currency":"usd","customer":"cus_8812"}'


def post(port: int, key: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    started = time.perf_counter()
    conn.request("POST", "/v1/payments/p1", body=BODY, headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    response = conn.getresponse()
    response.read()
    elapsed = (time.perf_counter() - started) * 1000
    conn.close()
    assert response.status == 201
    return elapsed


def pair(client: idemd.Client, key: str) -> float:
    """Claim+Complete of a fresh key through the raw RPCs: the floor a fresh key costs."""
    endpoint = "POST /v1/latency-pair"
    http = idemd.pb.HttpRequest(method="POST", path="/v1/payments/p1", body=BODY, content_type="application/json")
    started = time.perf_counter()
    claimed = client.claim(idemd.pb.ClaimRequest(endpoint=endpoint, key=key, attempt_id=key, request=http)).claimed
    client.complete(idemd.pb.CompleteRequest(endpoint=endpoint, key=key, lease_token=claimed.lease_token,
                                             response=idemd.pb.StoredResponse(status=201, body=BODY)))
    return (time.perf_counter() - started) * 1000


def p50(samples: List[float]) -> float:
    return statistics.median(samples)


@pytest.mark.latency
@pytest.mark.parametrize("framework", ["fastapi", "flask", "django"])
def test_middleware_latency(framework: str, server: Server) -> None:
    prefix = secrets.token_hex(6)
    bare_state, state = AppState(), AppState()
    client = server.client("alice")
    if framework == "fastapi":
        bare_ctx, app_ctx = serve_asgi(fastapi_app(bare_state)), serve_asgi(fastapi_app(state, alice_async(server)))
    else:
        make = flask_app if framework == "flask" else django_app
        # Django's URLconf is global: the bare app's view is replaced by the
        # second's, so both servers count into `state`; only timings matter here.
        bare_ctx, app_ctx = serve_wsgi(make(bare_state)), serve_wsgi(make(state, client))
    why = None
    try:
        with bare_ctx as bare_port, app_ctx as port:
            for i in range(20):
                post(bare_port, f"{prefix}-warm-{i}")
                post(port, f"{prefix}-warm-{i}")
            # A round over the bounds is measured again, up to ROUNDS in all: a burst of
            # load on the shared machine passes in the next round, a constant cost fails
            # every round.
            for round_ in range(1, ROUNDS + 1):
                why = measure(framework, f"{prefix}-r{round_}", bare_port, port, client)
                if why is None:
                    break
                if round_ < ROUNDS:
                    print(f"latency: {framework} round {round_} of {ROUNDS} over the bounds ({why}); measuring again")
    finally:
        client.close()
    assert why is None, why


def measure(framework: str, prefix: str, bare_port: int, port: int, client: idemd.Client) -> Optional[str]:
    """One round, printed; why it is over the bounds, or None."""
    # Interleaved, so that a change in the machine's load moves all three alike.
    bare, fresh, floor = [], [], []
    for i in range(SAMPLES):
        bare.append(post(bare_port, f"{prefix}-bare-{i}"))
        fresh.append(post(port, f"{prefix}-fresh-{i}"))
        floor.append(pair(client, f"{prefix}-pair-{i}"))
    replay = [post(port, f"{prefix}-fresh-{i}") for i in range(SAMPLES)]
    added = p50(fresh) - p50(bare)
    print(f"\nlatency: {framework} middleware, one in flight, {SAMPLES} requests each: "
          f"without p50 {p50(bare):.2f} ms; fresh p50 {p50(fresh):.2f} ms (+{added:.2f}); "
          f"replay p50 {p50(replay):.2f} ms; raw Claim+Complete p50 {p50(floor):.2f} ms")
    limit = max(SDK_P50_LIMIT_MS, SDK_P50_LIMIT_RATIO * p50(floor))
    if p50(replay) >= 10:
        return f"replay p50 {p50(replay):.2f} ms"
    if added - p50(floor) >= limit:
        return (f"a fresh key adds {added:.2f} ms at p50, {added - p50(floor):.2f} ms more than the pair itself "
                f"({p50(floor):.2f} ms; limit {limit:.2f} ms)")
    return None
