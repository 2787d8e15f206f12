"""Downstream idempotency keys (docs/sdk.md, "Downstream keys").

A handler that calls a third party taking its own idempotency key (a payment
provider) must send the same key on every retry of the operation and a
different key for every step::

    downstream_key(key, step) = base64url_nopad(SHA-256(
        frame("idemd-downstream-v1") || frame(utf8(key)) || frame(utf8(step))))
    frame(x) = 8-byte big-endian length of x || x

The result is 43 characters of ``[A-Za-z0-9_-]``.
"""

from __future__ import annotations

import base64
import hashlib

__all__ = ["downstream_key"]

_TAG = b"idemd-downstream-v1"


def _frame(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def downstream_key(key: str, step: str) -> str:
    """The idempotency key to send to a third party for ``step`` of operation ``key``."""
    digest = hashlib.sha256(
        _frame(_TAG) + _frame(key.encode("utf-8")) + _frame(step.encode("utf-8"))
    ).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
