"""Drives examples/payments_server.py (FastAPI + the ASGI middleware) over real
HTTP against the live idemd."""

from __future__ import annotations

import http.client
import json
import secrets
from typing import Dict, Iterator, Optional, Tuple

import pytest

from idemd import pb
from idemd.aio import AsyncClient
from payments_server import PaymentProvider, create_app

from conftest import CREDENTIALS, Server
from test_middleware import serve_asgi

PAYMENT = b'{"amount":4200,"currency":"usd","customer":"cus_8812"}'


class Api:
    def __init__(self, port: int, provider: PaymentProvider) -> None:
        self.port = port
        self.provider = provider


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    provider = PaymentProvider()
    client = lambda: AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True)  # noqa: E731
    with serve_asgi(create_app(client, provider, max_wait="500ms")) as port:
        yield Api(port, provider)


def post(api: Api, body: bytes, headers: Dict[str, str]) -> Tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=15)
    try:
        conn.request("POST", "/v1/payments", body=body, headers={"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def error_of(body: bytes) -> Optional[str]:
    """The problem's name (the last segment of its ``type``)."""
    return json.loads(body).get("type", "").rsplit("/", 1)[-1]


def test_missing_and_malformed_keys_are_400(api: Api) -> None:
    status, _, body = post(api, PAYMENT, {})
    assert (status, error_of(body)) == (400, "idempotency_key_missing")
    status, _, body = post(api, PAYMENT, {"Idempotency-Key": "not a valid key!"})
    assert (status, error_of(body)) == (400, "idempotency_key_malformed")
    status, _, body = post(api, PAYMENT, {"Idempotency-Key": "x" * 256})
    assert (status, error_of(body)) == (400, "idempotency_key_malformed")
    assert api.provider.charges == {}


def test_payment_retry_and_key_reuse(api: Api) -> None:
    key = secrets.token_hex(16)
    status, headers, first = post(api, PAYMENT, {"Idempotency-Key": key})
    assert status == 201, first
    assert headers.get("Idempotent-Replayed") is None
    assert json.loads(first)["status"] == "succeeded"

    # The retry (header name in another case, same payment in another key order
    # and number spelling) gets the stored response, marked as replayed.
    retry = b'{"customer":"cus_8812","currency":"usd","amount":4200.0}'
    status, headers, again = post(api, retry, {"idempotency-key": key})
    assert status == 201
    assert again == first
    assert headers.get("Idempotent-Replayed") == "true"
    assert headers.get("Content-Type") == "application/json"

    # The same key with a different amount is a client bug.
    status, _, body = post(api, PAYMENT.replace(b"4200", b"42000"), {"Idempotency-Key": key})
    assert (status, error_of(body)) == (422, "idempotency_key_reuse")

    assert len(api.provider.charges) == 1, "the card was charged exactly once"


def test_in_flight_duplicate_is_409_with_retry_after(api: Api, server: Server) -> None:
    key = secrets.token_hex(16)
    with server.client("alice") as holder:
        held = holder.claim(
            pb.ClaimRequest(
                endpoint="POST /v1/payments",
                key=key,
                request=pb.HttpRequest(
                    method="POST", path="/v1/payments", body=PAYMENT, content_type="application/json"
                ),
            )
        )
        assert held.WhichOneof("outcome") == "claimed"
        status, headers, body = post(api, PAYMENT, {"Idempotency-Key": key})
        assert (status, error_of(body)) == (409, "request_in_progress")
        assert int(headers["Retry-After"]) >= 1

        # The holder's outcome becomes unknown: retries get 409 outcome_pending.
        holder.fail(
            pb.FailRequest(
                endpoint="POST /v1/payments", key=key, lease_token=held.claimed.lease_token,
                disposition=pb.DISPOSITION_UNKNOWN, reason="provider timed out",
            )
        )
        status, _, body = post(api, PAYMENT, {"Idempotency-Key": key})
        assert (status, error_of(body)) == (409, "outcome_pending")
    assert api.provider.charges == {}
