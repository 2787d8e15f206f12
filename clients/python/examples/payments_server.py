#!/usr/bin/env python3
"""POST /v1/payments made safe to retry with idemd: a FastAPI app and one
middleware (``idemd.asgi.IdempotencyMiddleware``).

    pip install fastapi uvicorn
    IDEMD_ADDR=localhost:50051 IDEMD_TOKEN=... python examples/payments_server.py --port 8080
    curl -i -X POST localhost:8080/v1/payments -H 'Idempotency-Key: 4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90' \\
         -H 'Content-Type: application/json' -d '{"amount":4200,"currency":"usd","customer":"cus_8812"}'

The middleware answers what ``idemd proxy`` answers (docs/proxy.md): 400 for a
missing or malformed key, the stored response with ``Idempotent-Replayed: true``
on a retry, 409 ``request_in_progress`` with ``Retry-After``, 409
``outcome_pending``, 422 ``idempotency_key_reuse``. The handler only charges.
"""

from __future__ import annotations

import argparse
import os
import secrets
import threading
from typing import Dict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, PositiveInt

from idemd.aio import AsyncClient
from idemd.asgi import IdempotencyMiddleware


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


class Payment(BaseModel):
    amount: PositiveInt
    currency: str
    customer: str


def create_app(client: "AsyncClient | callable", provider: PaymentProvider, max_wait: str = "5s") -> FastAPI:
    """The payments API; ``client`` is an AsyncClient or a function making one."""
    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, client=client,
                       routes=[{"path": "/v1/payments", "max_wait": max_wait}])

    @app.post("/v1/payments", status_code=201)
    async def pay(payment: Payment, request: Request) -> JSONResponse:
        # The provider's key is derived from ours: the same on every retry.
        execution = request.scope["idemd.execution"]
        paid = provider.charge(execution.downstream_key("charge"), payment.amount, payment.currency, payment.customer)
        return JSONResponse(paid, status_code=201)

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Example payments API on idemd")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()

    def client() -> AsyncClient:
        return AsyncClient(
            os.environ.get("IDEMD_ADDR", "localhost:50051"),
            token=os.environ.get("IDEMD_TOKEN"),
            tenant=os.environ.get("IDEMD_TENANT"),
            insecure=os.environ.get("IDEMD_INSECURE", "1") == "1",
        )

    uvicorn.run(create_app(client, PaymentProvider()), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
