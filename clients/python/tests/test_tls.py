"""The SDK's own TLS options (ca_file, cert_file, key_file) against an idemd
that serves TLS and requires client certificates: clients/conformance/README.md,
"TLS and mTLS"."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Iterator, List

import grpc
import pytest

import idemd
from idemd import pb

from conftest import start_server

ENDPOINT = "POST /v1/payments"
PAYMENT = idemd.Request("POST", "/v1/payments", b'{"amount":4200,"currency":"usd"}', "application/json")
CREATED = idemd.Response(201, [("Content-Type", "application/json")], b'{"id":"pay_1"}')
CERT_FILES = ("ca.pem", "server.crt", "server.key", "alice.crt", "alice.key", "bob.crt", "bob.key", "client-tenants.txt")
# Bounds the refused handshakes: a client that hangs instead of failing must
# fail the test, not stall the suite.
DEADLINE = 5.0


class TlsServer:
    def __init__(self, target: str, certs: Path) -> None:
        self.target = target
        self.certs = certs

    def client(self, who: str) -> idemd.Client:
        """A client with the CA file and ``who``'s certificate and key."""
        return idemd.Client(
            self.target,
            ca_file=str(self.certs / "ca.pem"),
            cert_file=str(self.certs / f"{who}.crt"),
            key_file=str(self.certs / f"{who}.key"),
            timeout=DEADLINE,
        )


def _test_certs() -> Path:
    configured = os.environ.get("IDEMD_TEST_CERTS")
    if not configured:
        pytest.fail(
            "IDEMD_TEST_CERTS is not set: run `make test-certs` and point IDEMD_TEST_CERTS at the directory "
            "it writes (or run the suite with `make sdk-python`)",
            pytrace=False,
        )
    certs = Path(configured)
    missing = [name for name in CERT_FILES if not (certs / name).is_file()]
    if missing:
        pytest.fail(f"IDEMD_TEST_CERTS={certs} lacks {', '.join(missing)}: run `make test-certs`", pytrace=False)
    return certs


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    certs = _test_certs()
    # No tokens file: the tenant comes from the client certificate.
    tls_args = [
        "--tls-cert", str(certs / "server.crt"),
        "--tls-key", str(certs / "server.key"),
        "--tls-client-ca", str(certs / "ca.pem"),
        "--tls-client-tenants", str(certs / "client-tenants.txt"),
    ]
    with start_server(auth=False, extra_args=tls_args) as running:
        # The server certificate names localhost, so verification only passes
        # through that name (the log reports 127.0.0.1).
        port = running.address.rsplit(":", 1)[1]
        yield TlsServer(f"localhost:{port}", certs)


def new_key() -> str:
    return "py-tls-" + secrets.token_hex(12)


def lookup_code(client: idemd.Client, key: str) -> grpc.StatusCode:
    with pytest.raises(idemd.RpcError) as raised:
        client.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=key))
    return raised.value.code


def test_client_certificate_executes_and_replays(tls_server: TlsServer) -> None:
    key = new_key()
    calls: List[idemd.Execution] = []
    with tls_server.client("alice") as alice:
        first = alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: calls.append(ex) or CREATED)
        assert (first.replayed, first.attempt, len(calls)) == (False, 1, 1)
        assert first.response == CREATED
        again = alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: calls.append(ex) or CREATED)
    assert again.replayed and again.response == CREATED
    assert len(calls) == 1


def test_tenant_comes_from_the_client_certificate(tls_server: TlsServer) -> None:
    key = new_key()
    with tls_server.client("alice") as alice, tls_server.client("bob") as bob:
        assert not alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED).replayed
        record = alice.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=key)).record
        assert record.state == pb.STATE_COMPLETED
        assert lookup_code(bob, key) == grpc.StatusCode.NOT_FOUND


def test_client_without_certificate_gets_no_answer(tls_server: TlsServer) -> None:
    # TLS 1.3 finishes the client's side of the handshake before the server
    # checks for a certificate, so the refusal surfaces on the first call.
    with idemd.Client(tls_server.target, ca_file=str(tls_server.certs / "ca.pem"), timeout=DEADLINE) as anonymous:
        assert lookup_code(anonymous, new_key()) == grpc.StatusCode.UNAVAILABLE


def test_plaintext_client_gets_no_answer(tls_server: TlsServer) -> None:
    with idemd.Client(tls_server.target, insecure=True, timeout=DEADLINE) as plaintext:
        assert lookup_code(plaintext, new_key()) == grpc.StatusCode.UNAVAILABLE
