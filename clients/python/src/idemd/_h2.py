"""The SDK's own unary gRPC transport, on python-hyper's ``h2`` (opt-in: ``transport="h2"``).

The default transport is grpcio (grpc-core's HTTP/2; grpc.aio for ``AsyncClient``), chosen in
issue 51 by the proxy matrix (clients/conformance/proxy-matrix.md: nginx in front of idemd with
TLS, a GOAWAY every 10 requests, 4 streams per connection, a 1 s idle timeout, 300 calls in
flight) and the client CPU per Claim + Complete pair: both transports pass the matrix, and grpcio
costs less (sync about 1.0 against 1.4 ms of CPU per pair, asyncio about the same, 1.2-1.4 ms;
README.md, "Transports"). grpcio passes it only with one thing the SDK adds (the clients' ``_call``,
``grpcio_not_taken``): grpc-core (1.85) fails the streams above a GOAWAY's last stream id with
``UNAVAILABLE: Stream removed (GOAWAY received ...)`` instead of retrying them transparently, about
a third of the raw calls of the ``goaway`` profile (also with ``grpc.enable_retries``); the SDK
sends such a call again, as this transport moves it, without spending a retry of the executor.
The HTTP/2 stack written here before issue 51 cost half of grpcio's CPU, but it parsed frames and
HPACK by hand and broke behind a proxy (it ignored SETTINGS_MAX_CONCURRENT_STREAMS and turned a
GOAWAY into errors); rebuilt on ``h2`` it passes the matrix, and spends what grpcio's C core saves
in pure-Python framing and HPACK.

No frame or HPACK byte is parsed here: ``h2.connection.H2Connection`` does the framing, HPACK (the
``hpack`` package), flow control both ways, SETTINGS, PING, RST_STREAM and GOAWAY; this module adds
gRPC's unary mapping (doc/PROTOCOL-HTTP2.md in grpc/grpc: length-prefixed messages, ``te:
trailers``, ``grpc-timeout``, the status from the trailers or a trailers-only response, ``-bin``
metadata, grpcio's status codes for HTTP errors and resets) and what a proxy in the path needs:

* **The server's SETTINGS before any stream.** A connection opens streams only once the
  server's SETTINGS arrived, never more at once than its SETTINGS_MAX_CONCURRENT_STREAMS: the
  asyncio transport queues calls above it; the sync one runs one call per connection. Windows and
  frame sizes are ``h2``'s.
* **A call the server never took moves to a new connection**, without an error and without
  spending a retry of the executor: a stream above a GOAWAY's last stream id, a stream reset
  with REFUSED_STREAM, a request that could not be written because the connection had closed.
  Each call moves at most ``MAX_MOVES`` times within its deadline. A call the server may have
  taken (the connection dropped after the request was written) fails ``UNAVAILABLE``, as in
  grpcio: the executor retries it with the same attempt id or lease token.
* **HTTP CONNECT proxies** from ``grpc_proxy``, ``https_proxy`` or ``http_proxy`` (in that order;
  ``no_grpc_proxy``/``no_proxy`` exempt hosts), as grpcio reads them.
* **Keepalive PINGs**, off by default (as in grpcio): ``keepalive=(interval, timeout)`` seconds.
  asyncio pings its connection every ``interval`` while calls are in flight; the sync transport
  pings a pooled connection idle for ``interval`` before reusing it, and during a call that waits
  longer than ``interval``. A PING unanswered within ``timeout`` drops the connection.

``h2`` stops reading a connection at a GOAWAY (it moves the connection to CLOSED and refuses
every later frame), though RFC 9113 6.8 lets the server finish the streams up to the GOAWAY's
last stream id, and nginx does (``keepalive_requests``: the GOAWAY precedes the last answer).
``_H2Connection`` keeps reading them; it opens nothing more on such a connection.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import ipaddress
import math
import os
import select
import socket
import ssl
import struct
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote, urlsplit

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack

from ._grpc_util import USER_AGENT, status_error
from ._proto import pb
from .errors import RpcError

#: Each idemd RPC's :path and response message type.
METHODS = {
    m.name: (f"/{m.containing_service.full_name}/{m.name}".encode("ascii"), getattr(pb, m.output_type.name))
    for m in pb.DESCRIPTOR.services_by_name["Idempotency"].methods
}

#: The names ``transport=`` takes: grpcio and this module's ("http2" is the name this module's
#: transport had before issue 51).
TRANSPORTS = ("grpcio", "h2")
ALIASES = {"http2": "h2"}
#: What the clients use unless told otherwise (the module's doc says why).
DEFAULT_TRANSPORT = "grpcio"


def grpcio_not_taken(error: "grpc.RpcError") -> bool:
    """Whether grpcio failed a call that the server never took, so that it may move to a new
    connection without spending a retry: grpc-core fails the streams above a GOAWAY's last
    stream id (and those it had not started) with the GOAWAY's status, "GOAWAY received", and a
    stream refused with REFUSED_STREAM with "Stream refused"; a stream the server may have taken
    ends otherwise (its status, "Socket closed", "Connection reset", a deadline)."""
    code = error.code() if hasattr(error, "code") else None
    if code != grpc.StatusCode.UNAVAILABLE:
        return False
    details = (error.details() if hasattr(error, "details") else "") or ""
    return "GOAWAY received" in details or "Stream refused" in details

#: grpcio's default receive limit, kept so that a response it would refuse is refused here too.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
#: Our flow-control window, per stream and for the connection: a large replayed body arrives in
#: one round trip rather than one per 64 KiB (HTTP/2's default window).
WINDOW_BYTES = 4 * 1024 * 1024
DEFAULT_WINDOW = 65535
#: How often one call may move to another connection (GOAWAY, REFUSED_STREAM, a closed
#: connection before the request was written) before it fails UNAVAILABLE.
MAX_MOVES = 8
#: How long a new connection waits for the server's SETTINGS.
SETTINGS_TIMEOUT = 10.0

REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM, INADEQUATE_SECURITY = 0x7, 0x8, 0xB, 0xC
_u32 = struct.Struct(">I")

_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,  # bytes both ways; decoded below as grpcio does (latin-1)
    # The request headers are this module's own, lower-case, with the credentials never indexed
    # (Endpoint): validating and normalising them again cost ~20% of h2's time per call.
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)
#: Request headers HPACK must never index (RFC 7541 7.1.3), as h2's normalisation marks them.
_SECRET_HEADERS = (b"authorization", b"proxy-authorization", b"cookie")

def parse_target(target: str) -> Optional[Tuple[str, int]]:
    """(host, port) of a grpcio target this transport dials: ``host:port``, ``[v6]:port``,
    ``dns:///host:port`` (port 443 when absent); None for anything else (then grpcio does)."""
    rest = target
    if rest.startswith("dns:///"):
        rest = rest[len("dns:///"):]
    elif rest.startswith("dns:"):
        rest = rest[len("dns:"):]
    if not rest or "/" in rest:
        return None
    port = "443"
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            return None
        host, tail = rest[1:close], rest[close + 1:]
        if tail:
            if not tail.startswith(":"):
                return None
            port = tail[1:]
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    elif ":" not in rest:
        host = rest
    else:
        return None  # a scheme (unix:, ipv4:, ...) or a bare IPv6 address: grpcio knows them
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def grpc_timeout(seconds: float) -> bytes:
    """``grpc-timeout``: at most 8 digits, in the finest unit that fits."""
    ms = max(1, math.ceil(seconds * 1000))
    if ms < 10**8:
        return b"%dm" % ms
    s = math.ceil(ms / 1000)
    if s < 10**8:
        return b"%dS" % s
    return b"%dH" % min(99_999_999, math.ceil(s / 3600))


def _http_status_error(status: int) -> RpcError:
    """grpcio's mapping of an HTTP status without a gRPC status."""
    code = {
        400: grpc.StatusCode.INTERNAL,
        401: grpc.StatusCode.UNAUTHENTICATED,
        403: grpc.StatusCode.PERMISSION_DENIED,
        404: grpc.StatusCode.UNIMPLEMENTED,
        429: grpc.StatusCode.UNAVAILABLE,
        502: grpc.StatusCode.UNAVAILABLE,
        503: grpc.StatusCode.UNAVAILABLE,
        504: grpc.StatusCode.UNAVAILABLE,
    }.get(status, grpc.StatusCode.UNKNOWN)
    return RpcError(code, f"Received http2 header with status: {status}")


def _reset_error(code: int) -> RpcError:
    """grpcio's mapping of a RST_STREAM without a gRPC status."""
    if code == REFUSED_STREAM:
        return RpcError(grpc.StatusCode.UNAVAILABLE, "Stream refused by server")
    if code == CANCEL:
        return RpcError(grpc.StatusCode.CANCELLED, "Received RST_STREAM with error code 8")
    if code == ENHANCE_YOUR_CALM:
        return RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Bandwidth exhausted")
    if code == INADEQUATE_SECURITY:
        return RpcError(grpc.StatusCode.PERMISSION_DENIED, "Protocol not secure enough")
    return RpcError(grpc.StatusCode.INTERNAL, f"Received RST_STREAM with error code {code}")


def unavailable(message: str) -> RpcError:
    return RpcError(grpc.StatusCode.UNAVAILABLE, message)


def deadline_exceeded() -> RpcError:
    return RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def _metadata(fields: Sequence[Tuple[str, str]]) -> List[Tuple[str, object]]:
    """Fields other than the reserved ones, ``-bin`` values base64-decoded, as grpcio gives them."""
    out: List[Tuple[str, object]] = []
    for name, value in fields:
        if name.startswith(":") or name in ("grpc-status", "grpc-message", "content-type"):
            continue
        if name.endswith("-bin"):
            try:
                out.append((name, base64.b64decode(value + "=" * (-len(value) % 4))))
            except ValueError:
                continue
        else:
            out.append((name, value))
    return out


def _status(fields: Sequence[Tuple[str, str]]) -> Optional[RpcError]:
    """The error of the gRPC status in ``fields`` (trailers, or a trailers-only response), None
    for OK. A missing status is grpcio's UNKNOWN."""
    code_text = message = None
    for name, value in fields:
        if name == "grpc-status":
            code_text = value
        elif name == "grpc-message":
            message = value
    if code_text == "0":
        return None
    try:
        code = _CODES[int(code_text)] if code_text is not None else grpc.StatusCode.UNKNOWN
    except (ValueError, KeyError):
        code = grpc.StatusCode.UNKNOWN
    if code_text is None:
        message = "missing grpc-status"
    return status_error(code, unquote(message or ""), _metadata(fields))


_CODES = {c.value[0]: c for c in grpc.StatusCode}




#: Test-only (tests/test_proxy_matrix.py): the behaviour before issue 51, to show that the proxy
#: matrix catches it: streams opened before the server's SETTINGS and above its stream limit,
#: and a call the server never took (GOAWAY, REFUSED_STREAM) failed UNAVAILABLE, not moved.
_PRE_ISSUE_51 = False
#: What this module's connections met, for the proxy matrix's report: GOAWAYs received, streams
#: refused, calls moved to another connection.
SEEN: Dict[str, int] = {"goaway": 0, "refused": 0, "moved": 0}


class _H2Connection(h2.connection.H2Connection):
    """``h2``'s connection, reading on after a GOAWAY (see the module's doc)."""

    @property
    def open_outbound_streams(self) -> int:
        return 0 if _PRE_ISSUE_51 else super().open_outbound_streams

    def _receive_goaway_frame(self, frame):  # type: ignore[no-untyped-def]
        state = self.state_machine.state
        frames, events = super()._receive_goaway_frame(frame)
        if state != h2.connection.ConnectionState.CLOSED:
            self.state_machine.state = state
        return frames, events


class _Call:
    """One unary call; it may move from connection to connection until one takes it."""

    __slots__ = (
        "path", "message", "stream_id", "pending", "headers", "trailers", "chunks", "received",
        "done", "result", "error", "retry", "on_done", "future", "conn",
    )

    def __init__(self, path: bytes, message: bytes) -> None:
        self.path = path
        self.message = b"\x00" + _u32.pack(len(message)) + message
        self.on_done: Optional[Callable[["_Call"], None]] = None
        self.future: Optional["asyncio.Future[None]"] = None
        self.reset()

    def reset(self) -> None:
        self.stream_id = 0
        self.pending = memoryview(b"")
        self.headers: Optional[List[Tuple[str, str]]] = None
        self.trailers: Optional[List[Tuple[str, str]]] = None
        self.chunks: List[bytes] = []
        self.received = 0
        self.done = False
        self.result: Optional[bytes] = None
        self.error: Optional[RpcError] = None
        self.retry: Optional[str] = None  # why the call moves to another connection
        self.conn: Optional["Conn"] = None


def _fields(headers: Sequence[Tuple[bytes, bytes]]) -> List[Tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]


class Conn:
    """One HTTP/2 client connection without I/O: ``h2`` plus the calls on it. ``feed`` takes
    what the socket read; ``write`` (the owner's) sends bytes. Not thread-safe: the sync
    transport lends a connection to one thread at a time; the asyncio one runs it on its loop."""

    def __init__(self, endpoint: "Endpoint", write: Callable[[bytes], None]) -> None:
        self.endpoint = endpoint
        self.write = write
        self.h2 = _H2Connection(config=_CONFIG)
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.h2.DEFAULT_MAX_HEADER_LIST_SIZE,
        })
        self.calls: Dict[int, _Call] = {}
        self.settled = False  # the server's first SETTINGS arrived
        self.goaway: Optional[int] = None  # the last stream id of the server's GOAWAY
        self.error: Optional[RpcError] = None  # set once the connection is unusable
        self.ping_sent: Optional[float] = None  # when the unanswered keepalive PING went out
        self.on_change: Optional[Callable[[], None]] = None  # a slot freed, settings, the end

    def preface(self) -> bytes:
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW_BYTES - DEFAULT_WINDOW)
        return self.h2.data_to_send()

    @property
    def usable(self) -> bool:
        return self.error is None and self.goaway is None and self.h2.highest_outbound_stream_id < 2**31 - 3

    @property
    def idle(self) -> bool:
        return not self.calls

    def can_start(self) -> bool:
        """The connection may open a stream now: the server's SETTINGS are in, its stream limit
        not reached."""
        if _PRE_ISSUE_51:
            return self.usable
        return (self.settled and self.usable
                and self.h2.open_outbound_streams < self.h2.remote_settings.max_concurrent_streams)

    # -- sending -------------------------------------------------------------

    def start(self, call: _Call, timeout: Optional[float]) -> None:
        """Opens a stream for ``call`` and writes its request (what the windows allow). A write
        that fails leaves the call marked to move: the server cannot have taken it."""
        h2c = self.h2
        stream_id = h2c.get_next_available_stream_id()
        call.stream_id = stream_id
        call.conn = self
        self.calls[stream_id] = call
        headers = self.endpoint.headers(call.path)
        if timeout is not None:
            headers = headers + [(b"grpc-timeout", grpc_timeout(timeout))]
        h2c.send_headers(stream_id, headers)
        call.pending = memoryview(call.message)
        self._send_body(call)
        try:
            self.write(h2c.data_to_send())
        except OSError as e:
            self.fail(unavailable(f"Connection lost: {e}"), retry=True)

    def _send_body(self, call: _Call) -> None:
        h2c = self.h2
        pending = call.pending
        while pending:
            n = min(len(pending), h2c.local_flow_control_window(call.stream_id), h2c.max_outbound_frame_size)
            if n <= 0:
                break
            h2c.send_data(call.stream_id, pending[:n].tobytes(), end_stream=n == len(pending))
            pending = pending[n:]
        call.pending = pending

    def _flush_bodies(self) -> None:
        for call in list(self.calls.values()):
            if call.pending and not call.done:
                try:
                    self._send_body(call)
                except h2.exceptions.StreamClosedError:
                    pass

    def cancel(self, call: _Call) -> None:
        """Tells the server to stop a call that ends here (deadline, cancellation)."""
        if self.calls.pop(call.stream_id, None) is None:
            return
        self._reset(call.stream_id, CANCEL)
        self._send()
        self._changed()

    def _reset(self, stream_id: int, code: int) -> None:
        try:
            self.h2.reset_stream(stream_id, code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass

    def ping(self) -> None:
        """A keepalive PING; ``ping_sent`` until its ACK."""
        if self.ping_sent is None and self.error is None:
            self.ping_sent = time.monotonic()
            self.h2.ping(b"idemdkap")
            self._send()

    def _send(self) -> None:
        data = self.h2.data_to_send()
        if data and self.error is None:
            try:
                self.write(data)
            except OSError as e:
                self.fail(unavailable(f"Connection lost: {e}"))

    # -- receiving -----------------------------------------------------------

    def feed(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._send()  # h2's GOAWAY
            self.fail(RpcError(grpc.StatusCode.INTERNAL, f"HTTP/2 protocol error: {e}"))
            return
        changed = False
        for event in events:
            kind = type(event)
            if kind is h2.events.ResponseReceived:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.headers = _fields(event.headers)
                    if event.stream_ended is not None:
                        call.trailers = call.headers  # trailers-only
            elif kind is h2.events.DataReceived:
                if event.flow_controlled_length:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.received += len(event.data)
                    if call.received > MAX_RECEIVE_BYTES + 5:
                        self._finish(call, error=RpcError(
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({call.received - 5} vs. {MAX_RECEIVE_BYTES})"))
                        self._reset(event.stream_id, CANCEL)
                    else:
                        call.chunks.append(event.data)
            elif kind is h2.events.TrailersReceived:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    call.trailers = _fields(event.headers)
            elif kind is h2.events.StreamEnded:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    self._end(call, call.trailers or [])
                changed = True
            elif kind is h2.events.StreamReset:
                call = self.calls.get(event.stream_id)
                if call is not None:
                    if event.error_code == REFUSED_STREAM:
                        SEEN["refused"] += 1
                        # The server did not process it (RFC 9113 8.7): another try is safe.
                        self._finish(call, retry="Stream refused by server")
                    else:
                        self._finish(call, error=_reset_error(event.error_code))
                changed = True
            elif kind is h2.events.ConnectionTerminated:
                SEEN["goaway"] += 1
                self.goaway = event.last_stream_id
                # Streams above the last one the server processed never ran: they move.
                for call in [c for c in self.calls.values() if c.stream_id > event.last_stream_id]:
                    self._finish(call, retry="Received a GOAWAY from the server")
                changed = True
            elif kind is h2.events.RemoteSettingsChanged:
                self.settled = True
                self._flush_bodies()
                changed = True
            elif kind is h2.events.WindowUpdated:
                self._flush_bodies()
            elif kind is h2.events.PingAckReceived:
                self.ping_sent = None
        self._send()
        if changed:
            self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _end(self, call: _Call, trailers: List[Tuple[str, str]]) -> None:
        """The response is complete: its status, else its one message."""
        headers = call.headers or []
        http_status = next((v for k, v in headers if k == ":status"), None)
        if http_status != "200" and not any(k == "grpc-status" for k, _ in trailers):
            try:
                self._finish(call, error=_http_status_error(int(http_status or 0)))
            except ValueError:
                self._finish(call, error=_http_status_error(0))
            return
        error = _status(trailers)
        if error is not None:
            self._finish(call, error=error)
            return
        data = call.chunks[0] if len(call.chunks) == 1 else b"".join(call.chunks)
        if not data:
            self._finish(call, error=RpcError(grpc.StatusCode.INTERNAL, "No message received"))
        elif len(data) < 5 or len(data) != 5 + _u32.unpack_from(data, 1)[0]:
            self._finish(call, error=RpcError(grpc.StatusCode.INTERNAL, "Malformed response message framing"))
        elif data[0] != 0:
            # No grpc-accept-encoding is sent, so a compressed message breaks the protocol.
            self._finish(call, error=RpcError(grpc.StatusCode.INTERNAL, "Received a compressed message"))
        else:
            self._finish(call, result=data[5:])

    def _finish(
        self, call: _Call, *, result: Optional[bytes] = None, error: Optional[RpcError] = None,
        retry: Optional[str] = None,
    ) -> None:
        if call.done:
            return
        if retry is not None and _PRE_ISSUE_51:
            error, retry = unavailable(retry), None
        call.done = True
        call.result = result
        call.error = error
        call.retry = retry
        call.chunks = []
        if self.calls.pop(call.stream_id, None) is not None and call.pending and self.error is None:
            self._reset(call.stream_id, CANCEL)  # answered before its request was all sent
        if call.on_done is not None:
            call.on_done(call)

    def fail(self, error: RpcError, retry: bool = False) -> None:
        """The connection is gone: every call on it ends with ``error``; with ``retry`` (the
        requests could not be written) they move instead."""
        if self.error is None:
            self.error = error
        for call in list(self.calls.values()):
            if retry:
                self._finish(call, retry=error.message)
            else:
                self._finish(call, error=error)
        self._changed()


# -- where and how to connect ------------------------------------------------------------------


class Proxy:
    """An HTTP CONNECT proxy: ``host:port`` and the Proxy-Authorization of its URL's user info."""

    def __init__(self, host: str, port: int, authorization: Optional[str]) -> None:
        self.host = host
        self.port = port
        self.authorization = authorization

    def request(self, authority: str) -> bytes:
        lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", f"User-Agent: {USER_AGENT}"]
        if self.authorization:
            lines.append(f"Proxy-Authorization: {self.authorization}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    @staticmethod
    def check_reply(head: bytes) -> None:
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].startswith("2"):
            raise OSError(f"the proxy refused CONNECT: {status_line!r}")


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    if value is None:
        value = os.environ.get(name.upper())
    return value or None


def _exempt(host: str, patterns: str) -> bool:
    """``host`` matches an entry of a no_proxy list: ``*``, a name or a domain suffix
    (``.example.com`` or ``example.com``), an IP address or a CIDR block."""
    host = host.strip("[]").lower()
    try:
        address: Optional[object] = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in patterns.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry.strip("[]"), strict=False):  # type: ignore[operator]
                    return True
            except ValueError:
                pass
            continue
        entry = entry.lstrip(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(host: str) -> Optional[Proxy]:
    """The HTTP CONNECT proxy grpcio would use for ``host``: ``grpc_proxy``, else
    ``https_proxy``, else ``http_proxy`` (an ``http://[user:password@]host[:port]`` URL),
    unless ``no_grpc_proxy`` or ``no_proxy`` exempt the host."""
    url = _env("grpc_proxy") or _env("https_proxy") or _env("http_proxy")
    if url is None:
        return None
    exempt = _env("no_grpc_proxy") or _env("no_proxy")
    if exempt and _exempt(host, exempt):
        return None
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"proxy URL {url!r}: only http:// CONNECT proxies are supported (as in grpcio)")
    authorization = None
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode("utf-8")).decode("ascii")
    return Proxy(parts.hostname, parts.port or 80, authorization)


def _header(name: bytes, value: bytes) -> Tuple[bytes, bytes]:
    if name in _SECRET_HEADERS:
        return hpack.NeverIndexedHeaderTuple(name, value)
    return (name, value)


class Endpoint:
    """What every connection of one client shares: address, proxy, TLS, the request headers,
    keepalive."""

    def __init__(
        self,
        host: str,
        port: int,
        metadata: Sequence[Tuple[str, str]],
        tls: Optional[ssl.SSLContext],
        keepalive: Optional[Tuple[float, float]] = None,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.server_hostname = host
        self.proxy = proxy_for(host)
        self.keepalive = keepalive
        self._common = [
            (b":scheme", b"https" if tls else b"http"),
            (b":authority", self.authority.encode("ascii")),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"user-agent", USER_AGENT.encode("ascii")),
            *(_header(k.lower().encode("ascii"), v.encode("latin-1")) for k, v in metadata),
        ]
        self._headers: Dict[bytes, List[Tuple[bytes, bytes]]] = {}

    def headers(self, path: bytes) -> List[Tuple[bytes, bytes]]:
        found = self._headers.get(path)
        if found is None:
            found = self._headers[path] = [(b":method", b"POST"), (b":path", path), *self._common]
        return found

    def describe(self) -> str:
        via = f" through the proxy {self.proxy.host}:{self.proxy.port}" if self.proxy else ""
        return f"{self.host}:{self.port}{via}"


def _keepalive(value: Optional[object]) -> Optional[Tuple[float, float]]:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        interval, timeout = float(value), 20.0
    else:
        interval, timeout = (float(v) for v in value)  # type: ignore[union-attr]
    if interval <= 0 or timeout <= 0:
        raise ValueError("keepalive takes (interval, timeout) in seconds, both above 0")
    return interval, timeout


def endpoint(
    target: str,
    transport: str,
    custom_channel: bool,
    metadata: Sequence[Tuple[str, str]],
    insecure: bool,
    ca_file: Optional[str],
    root_certificates: Optional[bytes],
    cert_file: Optional[str],
    key_file: Optional[str],
    keepalive: Optional[object] = None,
) -> Optional[Endpoint]:
    """Where this module's transport connects, or None when grpcio makes the calls: the
    default, a channel or channel options of the caller's (they configure grpcio), or a target
    this module does not dial."""
    transport = ALIASES.get(transport, transport)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(map(repr, TRANSPORTS))}, not {transport!r}")
    alive = _keepalive(keepalive)
    address = parse_target(target)
    if transport == "grpcio" or custom_channel or address is None:
        return None
    tls = None
    if not insecure:
        roots = root_certificates
        if roots is None and ca_file is not None:
            with open(ca_file, "rb") as f:
                roots = f.read()
        if (cert_file is None) != (key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate)")
        tls = tls_context(roots, cert_file, key_file)
    return Endpoint(address[0], address[1], metadata, tls, alive)


def grpcio_keepalive_options(keepalive: Optional[object]) -> List[Tuple[str, object]]:
    """grpcio's channel arguments for ``keepalive=(interval, timeout)``."""
    alive = _keepalive(keepalive)
    if alive is None:
        return []
    return [("grpc.keepalive_time_ms", int(alive[0] * 1000)), ("grpc.keepalive_timeout_ms", int(alive[1] * 1000))]


def tls_context(
    root_certificates: Optional[bytes],
    cert_file: Optional[str],
    key_file: Optional[str],
) -> ssl.SSLContext:
    """The verifying client context grpcio's ssl_channel_credentials amount to, with ALPN h2."""
    if root_certificates is not None:
        context = ssl.create_default_context(cadata=root_certificates.decode("ascii"))
    else:
        context = ssl.create_default_context()
    if cert_file is not None and key_file is not None:
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(["h2"])
    return context


def _read_head(recv: Callable[[int], bytes]) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = recv(1)  # byte by byte: nothing of the tunnel after the reply may be consumed
        if not chunk:
            raise OSError("the proxy closed the connection during CONNECT")
        head += chunk
        if len(head) > 16384:
            raise OSError("the proxy's CONNECT reply is too long")
    return head


# -- sync -------------------------------------------------------------------------------------


def _open_socket(endpoint: Endpoint, timeout: Optional[float]) -> socket.socket:
    proxy = endpoint.proxy
    if proxy is None:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    else:
        sock = socket.create_connection((proxy.host, proxy.port), timeout=timeout)
        try:
            sock.sendall(proxy.request(endpoint.authority))
            Proxy.check_reply(_read_head(sock.recv))
        except BaseException:
            sock.close()
            raise
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls is not None:
            sock = endpoint.tls.wrap_socket(sock, server_hostname=endpoint.server_hostname)
            if sock.selected_alpn_protocol() != "h2":
                raise OSError("the server did not agree to HTTP/2 (ALPN h2)")
    except BaseException:
        sock.close()
        raise
    return sock


class _SyncConnection:
    def __init__(self, endpoint: Endpoint, deadline: Optional[float]) -> None:
        self.sock = _open_socket(endpoint, None if deadline is None else max(0.001, deadline - time.monotonic()))
        self.keepalive = endpoint.keepalive
        self.heard_at = time.monotonic()
        try:
            self.conn = Conn(endpoint, self.sock.sendall)
            self.sock.sendall(self.conn.preface())
            # The server's SETTINGS (its limits) come before the first stream.
            settled_by = time.monotonic() + SETTINGS_TIMEOUT
            if deadline is not None:
                settled_by = min(settled_by, deadline)
            while not self.conn.settled and not _PRE_ISSUE_51:
                if not self._read(settled_by):
                    raise OSError(self.conn.error.message if self.conn.error else "no SETTINGS from the server")
        except BaseException:
            self.sock.close()
            raise
        self.used_at = time.monotonic()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _read(self, until: Optional[float]) -> bool:
        """Reads once (up to ``until``); False when the connection ended or the time passed."""
        conn = self.conn
        remaining = None if until is None else until - time.monotonic()
        if remaining is not None and remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(262144)
        except socket.timeout:
            return False
        except OSError as e:
            conn.fail(unavailable(f"Connection lost: {e}"))
            return False
        if not data:
            conn.fail(unavailable("Socket closed"))
            return False
        self.heard_at = time.monotonic()
        conn.feed(data)
        return conn.error is None

    def poll(self) -> bool:
        """Reads what arrived while the connection was idle (SETTINGS, PING, GOAWAY, the close);
        with keepalive, pings it when it was idle that long. True when it can take a call."""
        conn = self.conn
        try:
            while conn.usable and select.select([self.sock], [], [], 0)[0]:
                self.sock.settimeout(0)
                data = self.sock.recv(65536)
                if not data:
                    conn.fail(unavailable("Socket closed"))
                    break
                conn.feed(data)
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except OSError as e:
            conn.fail(unavailable(f"Connection lost: {e}"))
        if conn.usable and self.keepalive is not None and time.monotonic() - self.used_at >= self.keepalive[0]:
            conn.ping()
            until = time.monotonic() + self.keepalive[1]
            while conn.usable and conn.ping_sent is not None and self._read(until):
                pass
            if conn.ping_sent is not None:
                conn.fail(unavailable("keepalive PING unanswered"))
        return conn.can_start()

    def call(self, call: _Call, deadline: Optional[float]) -> None:
        conn = self.conn
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise deadline_exceeded()
        conn.start(call, remaining)
        while not call.done:
            now = time.monotonic()
            until = deadline
            if self.keepalive is not None:
                if conn.ping_sent is None:
                    ping_at = self.heard_at + self.keepalive[0]
                    if now >= ping_at:
                        conn.ping()
                        continue
                    until = ping_at if until is None else min(until, ping_at)
                else:
                    lost_at = conn.ping_sent + self.keepalive[1]
                    if now >= lost_at:
                        conn.fail(unavailable("keepalive PING unanswered"))
                        break
                    until = lost_at if until is None else min(until, lost_at)
            if not self._read(until) and not call.done:
                if conn.error is not None:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    conn.cancel(call)
                    # What the server still sends for the stream would have to be read past; a
                    # new connection is simpler, and a deadline is rare.
                    conn.fail(deadline_exceeded())
                    raise deadline_exceeded()
        self.used_at = time.monotonic()


class SyncTransport:
    """Blocking unary calls: the calling thread writes the request and reads the answer itself
    on a connection it holds for the call (one stream at a time per connection, so the
    server's stream limit is never met). Idle connections wait in a pool; a call with none idle
    opens one, so there are as many as calls were at once in flight (at most ``max_idle``
    stay)."""

    def __init__(self, endpoint: Endpoint, max_idle: int = 16) -> None:
        self.endpoint = endpoint
        self.max_idle = max_idle
        self._idle: List[_SyncConnection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def unary(self, path: bytes, message: bytes, timeout: Optional[float]) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        call = _Call(path, message)
        moves = 0
        while True:
            conn = self._take(deadline)
            try:
                conn.call(call, deadline)
            finally:
                self._give(conn)
            if call.retry is None:
                break
            moves += 1
            SEEN["moved"] += 1
            if moves > MAX_MOVES:
                raise unavailable(call.retry)
            call.reset()
        if not call.done:
            raise call.conn.error if call.conn is not None and call.conn.error else unavailable("Socket closed")
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _take(self, deadline: Optional[float]) -> _SyncConnection:
        if self._closed:
            raise unavailable("the client was closed")
        if self._pid != os.getpid():
            # A forked child (a preloading server's worker) must not read its parent's
            # connections: the answers would go to whichever process reads first.
            with self._lock:
                inherited, self._idle, self._pid = self._idle, [], os.getpid()
            for conn in inherited:
                conn.close()
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if conn.poll():
                return conn
            conn.close()
        if deadline is not None and deadline <= time.monotonic():
            raise deadline_exceeded()
        try:
            return _SyncConnection(self.endpoint, deadline)
        except ssl.SSLError as e:
            raise unavailable(f"TLS handshake failed: {e}") from e
        except socket.timeout:
            raise deadline_exceeded() from None
        except OSError as e:
            raise unavailable(f"failed to connect to {self.endpoint.describe()}: {e}") from e

    def _give(self, conn: _SyncConnection) -> None:
        if conn.conn.usable and conn.conn.idle and not self._closed:
            with self._lock:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


# -- asyncio ----------------------------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    def __init__(self, endpoint: Endpoint) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.conn = Conn(endpoint, self._write)
        self.conn.on_change = self._changed
        self.waiters: Deque["asyncio.Future[None]"] = collections.deque()
        self.settled: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._pinger: Optional[asyncio.TimerHandle] = None
        self.keepalive = endpoint.keepalive

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise OSError("connection closed")
        self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.conn.preface())  # type: ignore[attr-defined]
        if self.keepalive is not None:
            self._pinger = asyncio.get_running_loop().call_later(self.keepalive[0], self._keepalive)

    def _keepalive(self) -> None:
        conn = self.conn
        if conn.error is not None:
            return
        interval, timeout = self.keepalive  # type: ignore[misc]
        if conn.ping_sent is not None:
            if time.monotonic() - conn.ping_sent >= timeout:
                conn.fail(unavailable("keepalive PING unanswered"))
                if self.transport is not None:
                    self.transport.close()
                return
            delay = conn.ping_sent + timeout - time.monotonic()
        else:
            if conn.calls:
                conn.ping()
                delay = min(interval, timeout)
            else:
                delay = interval
        self._pinger = asyncio.get_running_loop().call_later(max(0.01, delay), self._keepalive)

    def data_received(self, data: bytes) -> None:
        self.conn.feed(data)
        if self.conn.error is not None and self.transport is not None:
            self.transport.close()

    def eof_received(self) -> Optional[bool]:
        self.conn.fail(unavailable("Socket closed"))
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self._pinger is not None:
            self._pinger.cancel()
        self.conn.fail(unavailable(f"Connection lost: {exc}" if exc else "Socket closed"))

    def _changed(self) -> None:
        conn = self.conn
        if conn.settled and not self.settled.done():
            self.settled.set_result(None)
        if not conn.usable:
            if not self.settled.done():
                self.settled.set_result(None)
            free = len(self.waiters)
        else:
            free = conn.h2.remote_settings.max_concurrent_streams - conn.h2.open_outbound_streams
        while free > 0 and self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1
        if conn.goaway is not None and not conn.calls and self.transport is not None:
            self.transport.close()  # drained after a GOAWAY


def _resolve(call: _Call) -> None:
    future = call.future
    if future is not None and not future.done():
        future.set_result(None)


def _expire(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


class AsyncTransport:
    """Unary calls multiplexed on one connection, answers resolved in ``data_received``; calls
    above the server's stream limit wait for a slot. A connection that went away (GOAWAY,
    closed, broken) is replaced on the next call."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._protocol: Optional[_Protocol] = None
        self._connecting: Optional["asyncio.Future[_Protocol]"] = None
        self._closed = False

    async def _connection(self, deadline: Optional[float]) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.conn.usable:
            return protocol
        if self._closed:
            raise unavailable("the client was closed")
        if protocol is not None:
            self._protocol = None
            if protocol.transport is not None and protocol.conn.idle:
                protocol.transport.close()
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                asyncio.shield(connecting), None if deadline is None else max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise deadline_exceeded() from None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        e = self.endpoint
        protocol: Optional[_Protocol] = None
        try:
            if e.proxy is None:
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(e), e.host, e.port,
                    ssl=e.tls, server_hostname=e.server_hostname if e.tls else None,
                )
            else:
                sock = await _tunnel(loop, e)
                _, protocol = await loop.create_connection(
                    lambda: _Protocol(e), sock=sock,
                    ssl=e.tls, server_hostname=e.server_hostname if e.tls else None,
                )
            assert protocol is not None and protocol.transport is not None
            if e.tls is not None:
                sslobj = protocol.transport.get_extra_info("ssl_object")
                if sslobj is None or sslobj.selected_alpn_protocol() != "h2":
                    protocol.transport.close()
                    raise unavailable("the server did not agree to HTTP/2 (ALPN h2)")
            sock = protocol.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # The server's SETTINGS (its limits) come before the first stream.
            try:
                if not _PRE_ISSUE_51:
                    await asyncio.wait_for(asyncio.shield(protocol.settled), SETTINGS_TIMEOUT)
            except asyncio.TimeoutError:
                protocol.transport.close()
                raise unavailable("no SETTINGS from the server") from None
            if protocol.conn.error is not None:
                raise protocol.conn.error
            self._protocol = protocol
            return protocol
        except ssl.SSLError as err:
            raise unavailable(f"TLS handshake failed: {err}") from err
        except OSError as err:
            raise unavailable(f"failed to connect to {e.describe()}: {err}") from err
        finally:
            self._connecting = None

    async def unary(self, path: bytes, message: bytes, timeout: Optional[float]) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        call = _Call(path, message)
        call.on_done = _resolve
        moves = 0
        while True:
            protocol = await self._connection(deadline)
            conn = protocol.conn
            if not conn.can_start():
                if conn.usable:  # the stream limit: wait for a slot (or the connection's end)
                    await self._wait(protocol, loop, deadline)
                continue
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise deadline_exceeded()
            future = call.future = loop.create_future()
            conn.start(call, remaining)
            if not call.done:
                timer = None if deadline is None else loop.call_at(deadline, _expire, future)
                try:
                    await future
                except asyncio.CancelledError:
                    conn.cancel(call)
                    raise
                finally:
                    if timer is not None:
                        timer.cancel()
                if not call.done:  # the deadline passed first
                    conn.cancel(call)
                    raise deadline_exceeded()
            if call.retry is None:
                break
            moves += 1
            SEEN["moved"] += 1
            if moves > MAX_MOVES:
                raise unavailable(call.retry)
            call.reset()
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    @staticmethod
    async def _wait(protocol: _Protocol, loop: asyncio.AbstractEventLoop, deadline: Optional[float]) -> None:
        waiter = loop.create_future()
        protocol.waiters.append(waiter)
        timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            # A slot this waiter was given goes to the next one.
            if waiter.done() and not waiter.cancelled():
                protocol._changed()
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if deadline is not None and loop.time() >= deadline:
            raise deadline_exceeded()

    def close(self) -> None:
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()


async def _tunnel(loop: asyncio.AbstractEventLoop, endpoint: Endpoint) -> socket.socket:
    """A socket connected through the endpoint's HTTP CONNECT proxy."""
    proxy = endpoint.proxy
    assert proxy is not None
    infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    error: Optional[OSError] = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
            await loop.sock_sendall(sock, proxy.request(endpoint.authority))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await loop.sock_recv(sock, 1)
                if not chunk:
                    raise OSError("the proxy closed the connection during CONNECT")
                head += chunk
                if len(head) > 16384:
                    raise OSError("the proxy's CONNECT reply is too long")
            Proxy.check_reply(head)
            return sock
        except OSError as e:
            sock.close()
            error = e
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"cannot resolve the proxy {proxy.host}")
