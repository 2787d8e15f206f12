#!/usr/bin/env python3
"""Writes clients/conformance/downstream-key-v1.json: shared vectors for the
SDKs' downstream idempotency-key helper (docs/sdk.md, "Downstream keys").

    downstream_key(key, step) = base64url_nopad(SHA-256(
        frame("idemd-downstream-v1") || frame(utf8(key)) || frame(utf8(step))))
    frame(x) = 8-byte big-endian length of x || x

The result is 43 characters of [A-Za-z0-9_-]: a valid idempotency key for
idemd itself and for payment providers (Stripe accepts up to 255).

    python3 scripts/downstream_key_vectors.py > clients/conformance/downstream-key-v1.json
"""
import base64
import hashlib
import json
import sys

TAG = b"idemd-downstream-v1"


def frame(b):
    return len(b).to_bytes(8, "big") + b


def downstream_key(key, step):
    digest = hashlib.sha256(frame(TAG) + frame(key.encode()) + frame(step.encode())).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


CASES = [
    ("4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90", "charge"),
    ("4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90", "refund"),
    ("4f8c2a1e-6b0d-4c7e-9a51-2f3d8c7b1e90", "send-receipt-email"),
    ("01ARZ3NDEKTSV4RRFFQ69G5FAV", "charge"),
    ("q8Vv4y1ZCk6m2ddH_bn-Ug", "stripe.payment_intents.create"),
    ("a", ""),
    ("", "a"),
    ("ab", "c"),
    ("a", "bc"),
    ("k", "étape-ünïcode-步骤"),
    ("x" * 255, "charge"),
]


def main():
    vectors = [{"key": k, "step": s, "downstream_key": downstream_key(k, s)} for k, s in CASES]
    assert vectors[7]["downstream_key"] != vectors[8]["downstream_key"], "framing keeps fields apart"
    doc = {"description": "idemd downstream key v1 vectors; see docs/sdk.md", "version": "v1",
           "vectors": vectors}
    json.dump(doc, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
