#!/usr/bin/env python3
"""POST /v1/payments made safe to retry with idemd (standard library http.server).

    IDEMD_ADDR=localhost:50051 IDEMD_TOKEN=... python examples/payments_server.py --port 8080
    curl -i -X POST localhost:8080/v1/payments -H 'Idempotency-Key: 4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90' \\
         -H 'Content-Type: application/json' -d '{"amount":4200,"currency":"usd","customer":"cus_8812"}'

- ``Idempotency-Key`` (any case) is required: missing → 400 ``idempotency_key_missing``,
  not 1-255 characters of [A-Za-z0-9_-] → 400 ``idempotency_key_invalid``.
- The charge runs through ``execute_once``: once per key, whatever the retries.
- A retry gets the stored response with ``Idempotent-Replayed: true``.
- In flight elsewhere → 409 ``request_in_progress`` with ``Retry-After``; undecided earlier
  outcome → 409 ``outcome_pending``; same key with another payment → 422 ``idempotency_key_reuse``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import threading
from decimal import Decimal
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple

import idemd

ENDPOINT = "POST /v1/payments"
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,255}")
MAX_BODY = 1024 * 1024

log = logging.getLogger("payments")


class PaymentProvider:
    """Stands in for a payment provider that, like Stripe, deduplicates
    charges by an idempotency key of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.charges: Dict[str, dict] = {}

    def charge(self, idempotency_key: str, amount: int, currency: str, customer: str) -> dict:
        with self._lock:
            if idempotency_key not in self.charges:
                self.charges[idempotency_key] = {
                    "id": "pay_" + secrets.token_hex(6),
                    "status": "succeeded",
                    "amount": amount,
                    "currency": currency,
                    "customer": customer,
                }
            return self.charges[idempotency_key]


class PaymentsHandler(BaseHTTPRequestHandler):
    server: "PaymentsServer"
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/v1/payments":
            return self.send_json(404, {"error": "not_found"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self.send_json(413, {"error": "body_too_large"})
        body = self.rfile.read(length)

        key = self.headers.get("Idempotency-Key")  # header lookup is case-insensitive
        if key is None:
            return self.send_json(400, {"error": "idempotency_key_missing"})
        if not KEY_PATTERN.fullmatch(key):
            return self.send_json(400, {"error": "idempotency_key_invalid"})
        try:
            payment = json.loads(body, parse_float=Decimal)
            amount, currency, customer = payment["amount"], str(payment["currency"]), str(payment["customer"])
            if isinstance(amount, bool) or not isinstance(amount, (int, Decimal)):
                raise ValueError("amount must be a number")
            if amount != int(amount) or amount <= 0:
                raise ValueError("amount must be a positive whole number of minor units")
            amount = int(amount)  # 4200 and 4200.0 are the same payment (and the same fingerprint)
        except (ValueError, KeyError, TypeError, ArithmeticError):
            return self.send_json(400, {"error": "invalid_payment"})

        def charge(execution: idemd.Execution) -> idemd.Response:
            # The provider's key is derived from ours: the same on every retry.
            paid = self.server.provider.charge(execution.downstream_key("charge"), amount, currency, customer)
            return idemd.Response(201, [("Content-Type", "application/json")], json.dumps(paid).encode())

        request = idemd.Request("POST", "/v1/payments", body, self.headers.get("Content-Type", ""))
        try:
            result = self.server.idemd.execute_once(
                ENDPOINT, key, request, charge, max_wait=self.server.max_wait
            )
        except idemd.IdempotencyError as e:  # 409 in progress / pending, 422 key reuse
            return self.send_raw(*e.to_http())
        except idemd.RpcError as e:
            log.warning("idemd unavailable: %s", e.code.name)
            return self.send_json(503, {"error": "idempotency_unavailable"})
        headers = list(result.response.headers)
        if result.replayed:
            headers.append(("Idempotent-Replayed", "true"))
        self.send_raw(result.response.status, headers, result.response.body)

    def send_json(self, status: int, payload: dict) -> None:
        self.send_raw(status, [("Content-Type", "application/json")], json.dumps(payload).encode())

    def send_raw(self, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        self.send_response(status, phrase)
        for name, value in headers:
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # never log keys or bodies
        log.debug("%s %s", self.command, self.path)


class PaymentsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: Tuple[str, int],
        client: idemd.Client,
        provider: Optional[PaymentProvider] = None,
        max_wait: float = 5.0,
    ) -> None:
        super().__init__(address, PaymentsHandler)
        self.idemd = client
        self.provider = provider or PaymentProvider()
        self.max_wait = max_wait


def main() -> None:
    parser = argparse.ArgumentParser(description="Example payments API on idemd")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    client = idemd.Client(
        os.environ.get("IDEMD_ADDR", "localhost:50051"),
        token=os.environ.get("IDEMD_TOKEN"),
        tenant=os.environ.get("IDEMD_TENANT"),
        insecure=os.environ.get("IDEMD_INSECURE", "1") == "1",
    )
    with client, PaymentsServer((args.host, args.port), client) as server:
        log.info("payments example on http://%s:%d/v1/payments", *server.server_address[:2])
        server.serve_forever()


if __name__ == "__main__":
    main()
