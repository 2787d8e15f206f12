"""The SDK's own HTTP/2 transport on ``h2`` (src/idemd/_h2.py, ``transport="h2"``): what it must do
that grpcio does for it.
Protocol edge cases against a scripted HTTP/2 server (tests/h2_server.py), each for the sync client
and the asyncio one: trailers-only errors with a percent-encoded message and binary details, HTTP
errors, resets, GOAWAY and a new connection, deadlines, PING, CONTINUATION, padding, large
messages both ways within the peer's flow-control windows. Against the real idemd: the same
answers and errors as grpcio, a restart, TLS through test_tls.py, and which calls take which
transport."""

from __future__ import annotations

import asyncio
import base64
import secrets
import struct
import time
from typing import Callable

import grpc
import pytest

import idemd
from idemd import pb
from idemd.aio import AsyncClient
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from conftest import CREDENTIALS, Server, start_server
from h2_server import Call, H2Server

KINDS = ("sync", "aio")
LOOKUP = pb.LookupRequest(endpoint="POST /v1/payments", key="k1")
FOUND = pb.LookupResponse(record=pb.Record(endpoint="POST /v1/payments", key="k1")).SerializeToString()


def lookup(kind: str, address: str, request: "pb.LookupRequest" = LOOKUP, **options) -> "pb.LookupResponse":
    """One Lookup through a fresh client of ``kind`` (plaintext, token and tenant set)."""
    return calls(kind, address, [request], **options)[0]


def calls(kind: str, address: str, requests, **options) -> list:
    """Lookups one after another on one client; an RpcError ends them (raised)."""
    options.setdefault("timeout", 5)
    options.setdefault("transport", "h2")
    if kind == "sync":
        with idemd.Client(address, insecure=True, token="t0k", tenant="acme", **options) as client:
            assert client._lean is not None
            return [client.lookup(r) for r in requests]

    async def main() -> list:
        async with AsyncClient(address, insecure=True, token="t0k", tenant="acme", **options) as client:
            assert client._lean is not None
            return [await client.lookup(r) for r in requests]

    return asyncio.run(main())


def each(kind: str, address: str, n: int) -> list:
    """``n`` Lookups one after another on one client: each one's response or RpcError."""

    if kind == "sync":
        out = []
        with idemd.Client(address, insecure=True, timeout=5, transport="h2") as client:
            for _ in range(n):
                try:
                    out.append(client.lookup(LOOKUP))
                except idemd.RpcError as e:
                    out.append(e)
        return out

    async def main() -> list:
        out = []
        async with AsyncClient(address, insecure=True, timeout=5, transport="h2") as client:
            for _ in range(n):
                try:
                    out.append(await client.lookup(LOOKUP))
                except idemd.RpcError as e:
                    out.append(e)
        return out

    return asyncio.run(main())


def details(reason: str) -> str:
    info = error_details_pb2.ErrorInfo(reason=reason, domain="idemd")
    packed = any_pb2.Any()
    packed.Pack(info)
    status = status_pb2.Status(code=9, message="lease lost", details=[packed])
    return base64.b64encode(status.SerializeToString()).decode("ascii").rstrip("=")


@pytest.mark.parametrize("kind", KINDS)
def test_request_headers_and_a_reply(kind: str) -> None:
    with H2Server(lambda call: call.reply(FOUND)) as server:
        response = lookup(kind, server.address)
    assert response.record.key == "k1"
    call = server.calls[0]
    assert call.header(":method") == "POST"
    assert call.header(":scheme") == "http"
    assert call.header(":path") == "/idemd.v1.Idempotency/Lookup"
    assert call.header(":authority") == server.address
    assert call.header("content-type") == "application/grpc"
    assert call.header("te") == "trailers"
    assert call.header("authorization") == "Bearer t0k"
    assert call.header("x-tenant-id") == "acme"
    timeout = call.header("grpc-timeout")
    assert timeout is not None and timeout.endswith("m") and 4000 < int(timeout[:-1]) <= 5000
    assert pb.LookupRequest.FromString(call.body) == LOOKUP
    assert server.connections[0].settings_acked.wait(2), "the client did not acknowledge the server's SETTINGS"


@pytest.mark.parametrize("kind", KINDS)
def test_trailers_only_error_with_percent_encoded_message_and_details(kind: str) -> None:
    def script(call: Call) -> None:
        call.send_headers([
            (":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "9"),
            ("grpc-message", "lease%20lost%3A%20caf%C3%A9%25"),
            ("grpc-status-details-bin", details("LEASE_LOST")),
        ], end_stream=True)

    with H2Server(script) as server, pytest.raises(idemd.RpcError) as raised:
        lookup(kind, server.address)
    error = raised.value
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.message == "lease lost: café%"
    assert (error.reason, error.domain) == ("LEASE_LOST", "idemd")


@pytest.mark.parametrize("kind", KINDS)
def test_error_in_trailers_after_headers(kind: str) -> None:
    def script(call: Call) -> None:
        call.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        call.send_headers([("grpc-status", "5"), ("grpc-message", "no%20record")], end_stream=True)

    with H2Server(script) as server, pytest.raises(idemd.RpcError) as raised:
        lookup(kind, server.address)
    assert (raised.value.code, raised.value.message) == (grpc.StatusCode.NOT_FOUND, "no record")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status,code", [
    (503, grpc.StatusCode.UNAVAILABLE), (429, grpc.StatusCode.UNAVAILABLE), (401, grpc.StatusCode.UNAUTHENTICATED),
    (404, grpc.StatusCode.UNIMPLEMENTED), (500, grpc.StatusCode.UNKNOWN),
])
def test_http_error_without_grpc_status(kind: str, status: int, code: grpc.StatusCode) -> None:
    def script(call: Call) -> None:
        call.send_headers([(":status", str(status)), ("content-type", "text/plain")])
        call.send_data(b"upstream down", end_stream=True)

    with H2Server(script) as server, pytest.raises(idemd.RpcError) as raised:
        lookup(kind, server.address)
    assert raised.value.code == code
    assert raised.value.retryable == (code == grpc.StatusCode.UNAVAILABLE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rst,code", [
    (0x7, grpc.StatusCode.UNAVAILABLE),  # REFUSED_STREAM: never processed, safe to retry
    (0x2, grpc.StatusCode.INTERNAL),
    (0xB, grpc.StatusCode.RESOURCE_EXHAUSTED),
])
def test_rst_stream(kind: str, rst: int, code: grpc.StatusCode) -> None:
    with H2Server(lambda call: call.reset(rst)) as server, pytest.raises(idemd.RpcError) as raised:
        lookup(kind, server.address)
    assert raised.value.code == code


def assert_first_call_unavailable_then_reconnects(kind: str, end_first: Callable[[Call], None]) -> None:
    """`end_first` ends the first call's connection; the call fails UNAVAILABLE and the next one
    succeeds over a new connection."""

    def script(call: Call) -> None:
        if len(call.conn.server.calls) == 1:
            end_first(call)
        else:
            call.reply(FOUND)

    with H2Server(script) as server:
        first, second = each(kind, server.address, 2)
    assert isinstance(first, idemd.RpcError) and first.code == grpc.StatusCode.UNAVAILABLE
    assert second.record.key == "k1"
    assert len(server.connections) == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["goaway", "refused"])
def test_a_call_the_server_never_took_moves_to_a_new_connection_without_an_error(kind: str, how: str) -> None:
    # The first call was not processed: a GOAWAY below its stream (the connection stays open, as
    # a server draining its other streams keeps it), or REFUSED_STREAM.
    def script(call: Call) -> None:
        if len(call.conn.server.calls) == 1:
            if how == "goaway":
                call.goaway(last_stream_id=0, close=False)
            else:
                call.reset(0x7)
        else:
            call.reply(FOUND)

    with H2Server(script) as server:
        results = each(kind, server.address, 2)
    assert [r.record.key for r in results] == ["k1", "k1"]
    assert len(server.calls) == 3
    assert len(server.connections) == (2 if how == "goaway" else 1)


@pytest.mark.parametrize("kind", KINDS)
def test_answers_to_streams_below_a_goaway_still_arrive(kind: str) -> None:
    """nginx's keepalive_requests: the GOAWAY naming the call's stream comes before its answer."""
    def script(call: Call) -> None:
        if len(call.conn.server.calls) == 1:
            call.goaway(last_stream_id=call.stream_id, close=False)
        call.reply(FOUND)

    with H2Server(script) as server:
        results = each(kind, server.address, 2)
    assert [r.record.key for r in results] == ["k1", "k1"]
    assert len(server.calls) == 2 and len(server.connections) == 2


def test_async_calls_wait_for_the_servers_stream_limit() -> None:
    in_flight, most = [0], [0]

    def script(call: Call) -> None:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        time.sleep(0.05)
        in_flight[0] -= 1
        call.reply(FOUND)

    async def main(address: str) -> None:
        async with AsyncClient(address, insecure=True, timeout=5, transport="h2") as client:
            results = await asyncio.gather(*(client.lookup(LOOKUP) for _ in range(12)))
        assert all(r.record.key == "k1" for r in results)

    with H2Server(script, settings=[(0x3, 3)]) as server:  # SETTINGS_MAX_CONCURRENT_STREAMS 3
        asyncio.run(main(server.address))
    assert server.resets == [] and len(server.calls) == 12
    assert most[0] == 3
    assert len(server.connections) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_closed_socket_is_unavailable_then_reconnects(kind: str) -> None:
    assert_first_call_unavailable_then_reconnects(kind, lambda call: call.conn.close())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["close", "goaway"])
def test_a_connection_the_server_ends_while_idle_is_replaced_without_an_error(kind: str, how: str) -> None:
    def script(call: Call) -> None:
        call.reply(FOUND)
        if len(call.conn.server.calls) == 1:
            time.sleep(0.05)  # after the client has the answer
            if how == "close":
                call.conn.close()
            else:
                call.goaway(last_stream_id=call.stream_id, close=False)

    def slow_lookups(client):
        first = client.lookup(LOOKUP)
        time.sleep(0.2)
        return first, client.lookup(LOOKUP)

    async def slow_async_lookups(client):
        first = await client.lookup(LOOKUP)
        await asyncio.sleep(0.2)
        return first, await client.lookup(LOOKUP)

    with H2Server(script) as server:
        if kind == "sync":
            with idemd.Client(server.address, insecure=True, timeout=5, transport="h2") as client:
                results = slow_lookups(client)
        else:
            async def main():
                async with AsyncClient(server.address, insecure=True, timeout=5, transport="h2") as client:
                    return await slow_async_lookups(client)
            results = asyncio.run(main())
    assert [r.record.key for r in results] == ["k1", "k1"]
    assert len(server.connections) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_deadline_of_a_server_that_never_answers(kind: str) -> None:
    with H2Server(lambda call: None) as server:
        start = time.monotonic()
        with pytest.raises(idemd.RpcError) as raised:
            lookup(kind, server.address, timeout=0.3)
        elapsed = time.monotonic() - start
        assert raised.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.25 < elapsed < 2.0
        time.sleep(0.1)
        assert server.resets and server.resets[0][1] == 0x8  # CANCEL: the server may stop


@pytest.mark.parametrize("kind", KINDS)
def test_ping_is_acknowledged_mid_call(kind: str) -> None:
    acked = []

    def script(call: Call) -> None:
        acked.append(call.ping(timeout=3))
        call.reply(FOUND)

    with H2Server(script) as server:
        assert lookup(kind, server.address).record.key == "k1"
    assert acked == [True]


@pytest.mark.parametrize("kind", KINDS)
def test_headers_in_continuation_frames_padded_data_and_the_dynamic_table(kind: str) -> None:
    big = "x" * 300

    def script(call: Call) -> None:
        # hpack's encoder indexes fields and Huffman-codes strings: the second call's headers
        # refer to the table the first one filled.
        call.send_headers([(":status", "200"), ("content-type", "application/grpc"), ("x-big", big)], split=40)
        call.send_data(b"\x00" + struct.pack(">I", len(FOUND)) + FOUND, padded=True)
        call.send_headers([("grpc-status", "0"), ("x-trailer", big)], end_stream=True, split=40)

    with H2Server(script) as server:
        responses = calls(kind, server.address, [LOOKUP, LOOKUP, LOOKUP])
    assert [r.record.key for r in responses] == ["k1", "k1", "k1"]


@pytest.mark.parametrize("kind", KINDS)
def test_large_request_waits_for_the_servers_window(kind: str) -> None:
    request = pb.LookupRequest(endpoint="POST /v1/payments", key=secrets.token_hex(1 << 19))  # 1 MiB
    with H2Server(lambda call: call.reply(FOUND), window=65535) as server:
        assert lookup(kind, server.address, request).record.key == "k1"
    assert server.violations == []
    assert pb.LookupRequest.FromString(server.calls[0].body) == request


@pytest.mark.parametrize("kind", KINDS)
def test_large_responses_get_window_updates(kind: str) -> None:
    record = pb.LookupResponse(record=pb.Record(key="k1", response=pb.StoredResponse(body=b"r" * (3 << 20))))
    payload = record.SerializeToString()
    # Two 3 MiB answers on one connection: more than the 4 MiB the client's connection window
    # starts with, so the second arrives only if the client gave the first back.
    with H2Server(lambda call: call.reply(payload)) as server:
        responses = calls(kind, server.address, [LOOKUP, LOOKUP], timeout=10)
    assert [len(r.record.response.body) for r in responses] == [3 << 20, 3 << 20]
    assert len(server.connections) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_many_calls_share_connections(kind: str) -> None:
    with H2Server(lambda call: call.reply(FOUND)) as server:
        calls(kind, server.address, [LOOKUP] * 20)
    assert len(server.connections) == 1
    assert [c.stream_id for c in server.calls] == list(range(1, 41, 2))


def test_concurrent_async_calls_are_multiplexed_on_one_connection() -> None:
    def script(call: Call) -> None:
        time.sleep(0.05)
        call.reply(FOUND)

    async def main(address: str) -> None:
        async with AsyncClient(address, insecure=True, timeout=5, transport="h2") as client:
            results = await asyncio.gather(*(client.lookup(LOOKUP) for _ in range(10)))
        assert all(r.record.key == "k1" for r in results)

    with H2Server(script) as server:
        start = time.monotonic()
        asyncio.run(main(server.address))
        assert time.monotonic() - start < 0.4  # 10 calls of 50 ms each, at once
    assert len(server.connections) == 1


# -- which transport makes the calls ---------------------------------------------------------


@pytest.mark.parametrize("target,lean", [
    ("127.0.0.1:50051", True), ("localhost:50051", True), ("dns:///localhost:50051", True),
    ("[::1]:50051", True), ("unix:/tmp/idemd.sock", False), ("ipv4:127.0.0.1:50051", False),
])
def test_targets_the_lean_transport_dials(target: str, lean: bool) -> None:
    with idemd.Client(target, insecure=True, transport="h2") as client:
        assert (client._lean is not None) == lean


def test_grpcio_by_default_on_request_or_with_channel_options() -> None:
    for kwargs in ({}, {"transport": "grpcio"},
                   {"transport": "h2", "options": [("grpc.max_receive_message_length", 1 << 20)]}):
        with idemd.Client("127.0.0.1:50051", insecure=True, **kwargs) as client:
            assert client._lean is None
    with idemd.Client("127.0.0.1:50051", insecure=True, transport="http2") as client:  # the old name
        assert client._lean is not None
    with pytest.raises(ValueError):
        idemd.Client("127.0.0.1:50051", insecure=True, transport="h3")


# -- against the real idemd ------------------------------------------------------------------


def _both(server: Server, fn: Callable[[idemd.Client], object]) -> list:
    out = []
    for transport in ("h2", "grpcio"):
        with server.client("alice", transport=transport) as client:
            try:
                out.append(fn(client))
            except idemd.RpcError as e:
                out.append((e.code, e.message, e.reason, e.field_violations))
    return out


def test_same_answers_and_errors_as_grpcio(server: Server) -> None:
    key = "py-" + secrets.token_hex(8)
    request = idemd.Request("POST", "/v1/payments", b'{"amount":1}', "application/json")
    with server.client("alice") as client:
        client.execute_once("POST /v1/payments", key, request, lambda e: idemd.Response(201, [], b"ok"))
    found = _both(server, lambda c: c.lookup(pb.LookupRequest(endpoint="POST /v1/payments", key=key,
                                                               include_response=True)).record.response.body)
    assert found == [b"ok", b"ok"]
    missing = _both(server, lambda c: c.lookup(pb.LookupRequest(endpoint="POST /v1/payments", key="nope")))
    assert missing[0] == missing[1] and missing[0][0] == grpc.StatusCode.NOT_FOUND
    invalid = _both(server, lambda c: c.claim(pb.ClaimRequest(endpoint="", key="")))
    assert invalid[0] == invalid[1] and invalid[0][0] == grpc.StatusCode.INVALID_ARGUMENT and invalid[0][3]
    lost = _both(server, lambda c: c.complete(pb.CompleteRequest(
        endpoint="POST /v1/payments", key=key, lease_token="bogus", response=pb.StoredResponse(status=201))))
    assert lost[0] == lost[1] and lost[0][2]  # a reason from the status details


def test_unauthenticated_like_grpcio() -> None:
    with start_server() as server:
        errors = []
        for transport in ("h2", "grpcio"):
            with idemd.Client(server.address, insecure=True, token="wrong", transport=transport) as client:
                with pytest.raises(idemd.RpcError) as raised:
                    client.lookup(LOOKUP)
                errors.append(raised.value.code)
    assert errors == [grpc.StatusCode.UNAUTHENTICATED] * 2


def test_a_stopped_idemd_is_unavailable_on_the_pooled_connection() -> None:
    """The pooled connection dies with the server: the next call fails UNAVAILABLE (retryable),
    it does not hang or raise anything else."""
    request = pb.LookupRequest(endpoint="POST /v1/payments", key="nope")
    with start_server() as server:
        sync_client = idemd.Client(server.address, insecure=True, token=CREDENTIALS["alice"], timeout=5, transport="h2")
        with pytest.raises(idemd.RpcError) as raised:
            sync_client.lookup(request)
        assert raised.value.code == grpc.StatusCode.NOT_FOUND
    with sync_client, pytest.raises(idemd.RpcError) as raised:
        sync_client.lookup(request)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE

    async def main() -> grpc.StatusCode:
        with start_server() as server:
            client = AsyncClient(server.address, insecure=True, token=CREDENTIALS["alice"], timeout=5, transport="h2")
            with pytest.raises(idemd.RpcError):
                await client.lookup(request)
        async with client:
            with pytest.raises(idemd.RpcError) as raised:
                await client.lookup(request)
        return raised.value.code

    assert asyncio.run(main()) == grpc.StatusCode.UNAVAILABLE


# -- through an HTTP CONNECT proxy -------------------------------------------------------------


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on loopback: it counts the tunnels it opened."""

    def __init__(self) -> None:
        import socket
        import threading

        self.tunnels: list = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = client.recv(1)
                if not chunk:
                    break
                head += chunk
            target = head.split(b" ")[1].decode()
            self.tunnels.append(target)
            host, port = target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)))
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("kind", KINDS)
def test_h2_transport_goes_through_the_https_proxy_of_the_environment(kind: str, monkeypatch) -> None:
    proxy = ConnectProxy()
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_grpc_proxy", raising=False)
    monkeypatch.setenv("https_proxy", proxy.url)
    try:
        with H2Server(lambda call: call.reply(FOUND)) as server:
            assert lookup(kind, server.address).record.key == "k1"
            assert proxy.tunnels == [server.address]
            monkeypatch.setenv("no_proxy", "localhost,127.0.0.0/8")  # exempt: straight to the server
            assert lookup(kind, server.address).record.key == "k1"
            assert proxy.tunnels == [server.address]
    finally:
        proxy.close()


def test_proxy_variables_as_grpcio_reads_them(monkeypatch) -> None:
    from idemd import _h2

    for name in ("grpc_proxy", "https_proxy", "http_proxy", "no_proxy", "no_grpc_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert _h2.proxy_for("idemd.internal") is None
    monkeypatch.setenv("http_proxy", "http://low:1")
    monkeypatch.setenv("https_proxy", "http://user:p%40ss@egress.internal:3128")
    found = _h2.proxy_for("idemd.internal")
    assert (found.host, found.port) == ("egress.internal", 3128)
    assert found.authorization == "Basic " + base64.b64encode(b"user:p@ss").decode()
    monkeypatch.setenv("grpc_proxy", "egress2:8080")
    assert (_h2.proxy_for("idemd.internal").host, _h2.proxy_for("idemd.internal").port) == ("egress2", 8080)
    monkeypatch.setenv("no_proxy", ".internal,10.0.0.0/8")
    assert _h2.proxy_for("idemd.internal") is None and _h2.proxy_for("10.1.2.3") is None
    assert _h2.proxy_for("example.com") is not None


@pytest.mark.parametrize("kind", KINDS)
def test_keepalive_pings_a_connection_that_waits(kind: str) -> None:
    def script(call: Call) -> None:
        time.sleep(0.5)  # the client pings while it waits
        call.reply(FOUND)

    with H2Server(script) as server:
        assert lookup(kind, server.address, keepalive=(0.1, 2.0)).record.key == "k1"
    assert server.pings >= 2
    with H2Server(script) as server:
        assert lookup(kind, server.address).record.key == "k1"  # off by default
    assert server.pings == 0
