"""The clients' own unary gRPC transport: HTTP/2 written here, over the ssl and socket modules.

Why not grpcio for these calls: every idemd RPC is unary, and grpcio spends ~0.3 ms per call of
the process's time in its channel, completion queue and thread hand-offs (a Claim + Complete pair
took ~1.4 ms sync and ~1.8 ms with grpc.aio against ~0.8 ms inside idemd). The middleware makes
that pair on every fresh key, so it is what a request pays. The same bytes written and read by the
calling thread itself (sync: a small pool of blocking connections, one call at a time on each; no
thread hop) or by an asyncio Protocol (aio: one connection, calls multiplexed) cost a fraction of
that. grpcio stays for everything else: ``Client.stub``/``channel``, a caller's own channel or
channel options, targets this module does not dial (``unix:``, ``ipv4:``...), and
``transport="grpcio"``.

What this keeps of gRPC over HTTP/2 (doc/PROTOCOL-HTTP2.md in grpc/grpc): length-prefixed
messages, ``content-type: application/grpc``, ``te: trailers``, ``grpc-timeout`` from the
deadline, the status from the trailers or a trailers-only response, the percent-encoded
``grpc-message``, ``-bin`` metadata (the status details), and the status codes grpcio reports for
HTTP errors, stream resets, GOAWAY and dropped connections. Of HTTP/2 (RFC 9113): the preface and
SETTINGS both ways, PING acks, flow control both ways, HEADERS + CONTINUATION, padding, and HPACK
decoding (RFC 7541, the ``hpack`` package: Huffman and the dynamic table); requests are encoded
without the dynamic table, which the peer's table size then never concerns.
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import select
import socket
import ssl
import struct
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import unquote

import grpc
import hpack

from ._grpc_util import USER_AGENT, status_error
from ._proto import pb
from .errors import RpcError

#: Each idemd RPC's :path and response message type.
METHODS = {
    m.name: (f"/{m.containing_service.full_name}/{m.name}".encode("ascii"), getattr(pb, m.output_type.name))
    for m in pb.DESCRIPTOR.services_by_name["Idempotency"].methods
}

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM, INADEQUATE_SECURITY = 0xB, 0xC

#: grpcio's default receive limit, kept so that a response it would refuse is refused here too.
MAX_RECEIVE_BYTES = 4 * 1024 * 1024
#: Our flow-control window, per stream and for the connection: a large replayed body arrives in
#: one round trip rather than one per 64 KiB (HTTP/2's default window). Half of it consumed is
#: given back with a WINDOW_UPDATE.
WINDOW_BYTES = 4 * 1024 * 1024
DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1

_frame_header = struct.Struct(">IBI")  # length << 8 | type, flags, stream id: packed as 9 bytes below
_u32 = struct.Struct(">I")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags)) + _u32.pack(stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(data: bytes) -> bytes:
    return _hpack_int(len(data), 7) + data


def literal(name: bytes, value: bytes) -> bytes:
    """A header field literal without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    return b"\x00" + _hpack_str(name) + _hpack_str(value)


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A literal without indexing whose name is static table entry ``index``."""
    return _hpack_int(index, 4) + _hpack_str(value)


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


class _Stream:
    __slots__ = (
        "id", "send_window", "pending", "headers", "block", "block_end", "chunks", "received",
        "unacked", "done", "result", "error", "on_done", "future",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.send_window = send_window
        self.pending = memoryview(b"")  # request DATA not yet sent for want of window
        self.headers: Optional[List[Tuple[str, str]]] = None
        self.block: Optional[bytearray] = None  # a header block awaiting CONTINUATION
        self.block_end = False  # END_STREAM of the HEADERS that began it
        self.chunks: List[bytes] = []
        self.received = 0
        self.unacked = 0  # DATA bytes not yet given back with a WINDOW_UPDATE
        self.done = False
        self.result: Optional[bytes] = None
        self.error: Optional[RpcError] = None
        self.on_done: Optional[Callable[["_Stream"], None]] = None
        self.future: Optional["asyncio.Future[None]"] = None


class ConnectionError_(Exception):
    """The connection broke the protocol: every call on it ends UNAVAILABLE/INTERNAL."""


class H2Connection:
    """HTTP/2 framing and state of one client connection, without I/O: ``feed`` takes what the
    socket read, ``write`` (set by the owner) sends bytes. Not thread-safe: the sync transport
    lends a connection to one thread at a time; the asyncio one runs it on its loop."""

    def __init__(self, write: Callable[[bytes], None], header_prefix: Callable[[bytes], bytes]) -> None:
        self.write = write
        self._header_prefix = header_prefix
        self.buffer = bytearray()
        self.streams: Dict[int, _Stream] = {}
        self.next_id = 1
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16384
        self.unacked = 0  # connection-level DATA bytes not yet given back
        self.decoder = hpack.Decoder()
        self._decoded: Dict[bytes, List[Tuple[str, str]]] = {}
        self.goaway: Optional[int] = None  # the peer's last stream id once it sent GOAWAY
        self.error: Optional[RpcError] = None  # set once the connection is unusable
        self._continuation: Optional[_Stream] = None
        self._discard_block: Optional[bytearray] = None  # a block for a stream no longer here

    def preface(self) -> bytes:
        settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_BYTES)
        return (
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, _u32.pack(WINDOW_BYTES - DEFAULT_WINDOW))
        )

    @property
    def usable(self) -> bool:
        return self.error is None and self.goaway is None and self.next_id < 2**31 - 1

    # -- sending -------------------------------------------------------------

    def start(self, path: bytes, message: bytes, timeout: Optional[float]) -> _Stream:
        """Opens a stream and writes the request (what the windows allow of it)."""
        stream = _Stream(self.next_id, self.peer_initial_window)
        self.next_id += 2
        self.streams[stream.id] = stream
        block = self._header_prefix(path)
        if timeout is not None:
            block += b"\x00\x0cgrpc-timeout" + _hpack_str(grpc_timeout(timeout))
        out = self._header_frames(stream.id, block)
        body = bytes((0,)) + _u32.pack(len(message)) + message
        stream.pending = memoryview(body)
        out += self._data_frames(stream)
        self.write(out)
        return stream

    def _header_frames(self, stream_id: int, block: bytes) -> bytes:
        limit = self.peer_max_frame
        if len(block) <= limit:
            return frame(HEADERS, END_HEADERS, stream_id, block)
        parts = [block[i:i + limit] for i in range(0, len(block), limit)]
        out = frame(HEADERS, 0, stream_id, parts[0])
        for i, part in enumerate(parts[1:], 1):
            out += frame(CONTINUATION, END_HEADERS if i == len(parts) - 1 else 0, stream_id, part)
        return out

    def _data_frames(self, stream: _Stream) -> bytes:
        """DATA frames for as much of the stream's pending body as both windows allow."""
        out = b""
        pending = stream.pending
        while pending:
            n = min(len(pending), self.send_window, stream.send_window, self.peer_max_frame)
            if n <= 0:
                break
            last = n == len(pending)
            out += frame(DATA, END_STREAM if last else 0, stream.id, pending[:n].tobytes())
            pending = pending[n:]
            self.send_window -= n
            stream.send_window -= n
        stream.pending = pending
        return out

    def _flush(self) -> None:
        out = b""
        for stream in list(self.streams.values()):
            if stream.pending and not stream.done:
                out += self._data_frames(stream)
        if out:
            self.write(out)

    def cancel(self, stream: _Stream) -> None:
        """Tells the server to stop a call that ends here (deadline, cancellation)."""
        if self.streams.pop(stream.id, None) is not None and self.error is None:
            try:
                self.write(frame(RST_STREAM, 0, stream.id, _u32.pack(CANCEL)))
            except OSError:
                pass

    # -- receiving -----------------------------------------------------------

    def feed(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        offset = 0
        out: List[bytes] = []
        try:
            while len(buf) - offset >= 9:
                length = buf[offset] << 16 | buf[offset + 1] << 8 | buf[offset + 2]
                if len(buf) - offset < 9 + length:
                    break
                kind, flags = buf[offset + 3], buf[offset + 4]
                stream_id = _u32.unpack_from(buf, offset + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[offset + 9:offset + 9 + length])
                offset += 9 + length
                self._frame(kind, flags, stream_id, payload, out)
        except ConnectionError_ as e:
            self.fail(RpcError(grpc.StatusCode.INTERNAL, str(e)))
            out.append(frame(GOAWAY, 0, 0, _u32.pack(0) + _u32.pack(PROTOCOL_ERROR)))
        finally:
            del buf[:offset]
            if out:
                try:
                    self.write(b"".join(out))
                except OSError:
                    pass

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes, out: List[bytes]) -> None:
        if self._continuation is not None or self._discard_block is not None:
            if kind != CONTINUATION:
                raise ConnectionError_("expected a CONTINUATION frame")
        if kind == DATA:
            self._data(flags, stream_id, payload, out)
        elif kind == HEADERS:
            if flags & PADDED:
                payload = _unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            stream = self.streams.get(stream_id)
            self._begin_block(stream, payload, bool(flags & END_STREAM), bool(flags & END_HEADERS))
        elif kind == CONTINUATION:
            stream = self._continuation
            if stream is None and self._discard_block is None:
                raise ConnectionError_("unexpected CONTINUATION frame")
            target = stream.block if stream is not None else self._discard_block
            target += payload
            if flags & END_HEADERS:
                self._continuation = None
                block, self._discard_block = bytes(target), None
                self._end_block(stream, block, stream.block_end if stream is not None else False)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
                out.append(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if not flags & ACK:
                out.append(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = _u32.unpack_from(payload)[0] & 0x7FFFFFFF
            if stream_id == 0:
                self.send_window += increment
                if self.send_window > MAX_WINDOW:
                    raise ConnectionError_("connection flow-control window overflow")
            else:
                stream = self.streams.get(stream_id)
                if stream is not None:
                    stream.send_window += increment
            self._flush()
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                code = _u32.unpack_from(payload)[0]
                # A reset after a status arrived changes nothing; before it, the call ends.
                self._finish(stream, error=_reset_error(code))
        elif kind == GOAWAY:
            last = _u32.unpack_from(payload)[0] & 0x7FFFFFFF
            self.goaway = last
            # Streams above the last one the server processed never ran: UNAVAILABLE, which the
            # executor retries (on a new connection).
            for stream in [s for s in self.streams.values() if s.id > last]:
                self._finish(stream, error=unavailable("Received a GOAWAY from the server"))
        elif kind == PUSH_PROMISE:
            raise ConnectionError_("PUSH_PROMISE though push is disabled")
        # PRIORITY and unknown frame types are ignored (RFC 9113 4.1, 5.5).

    def _settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - len(payload) % 6, 6):
            ident, value = struct.unpack_from(">HI", payload, i)
            if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_("SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif ident == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise ConnectionError_("SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
        self._flush()

    def _data(self, flags: int, stream_id: int, payload: bytes, out: List[bytes]) -> None:
        # Flow control counts the whole payload, padding included, of every DATA frame, also one
        # for a stream this side has already given up on.
        size = len(payload)
        self.unacked += size
        if self.unacked >= WINDOW_BYTES // 2:
            out.append(frame(WINDOW_UPDATE, 0, 0, _u32.pack(self.unacked)))
            self.unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if flags & PADDED:
            payload = _unpad(payload)
        stream.received += len(payload)
        if stream.received > MAX_RECEIVE_BYTES + 5:
            self._finish(stream, error=RpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({stream.received - 5} vs. {MAX_RECEIVE_BYTES})"))
            out.append(frame(RST_STREAM, 0, stream_id, _u32.pack(CANCEL)))
            return
        stream.chunks.append(payload)
        if flags & END_STREAM:
            # Ended without trailers: grpcio reports that as a missing status.
            self._end(stream, [])
            return
        stream.unacked += size
        if stream.unacked >= WINDOW_BYTES // 2:
            out.append(frame(WINDOW_UPDATE, 0, stream_id, _u32.pack(stream.unacked)))
            stream.unacked = 0

    def _begin_block(self, stream: Optional[_Stream], payload: bytes, end_stream: bool, end_headers: bool) -> None:
        if end_headers:
            self._end_block(stream, payload, end_stream)
        elif stream is not None:
            stream.block = bytearray(payload)
            stream.block_end = end_stream
            self._continuation = stream
        else:
            self._discard_block = bytearray(payload)

    def _end_block(self, stream: Optional[_Stream], block: bytes, end_stream: bool) -> None:
        fields = self._decoded.get(block)
        if fields is None:
            # Every block is decoded, a stream's or not: it may change the dynamic table.
            try:
                fields = self.decoder.decode(block)
            except hpack.HPACKError as e:
                raise ConnectionError_(f"HPACK decoding failed: {e}") from e
            if block and min(block) >= 0x80:
                # Only one-byte indexed fields: they leave the table as it is, and mean the same
                # until a block that may change it. idemd's answers are such blocks from the
                # second call on (the same 3 + 1 bytes); decoding them cost ~70 us a call.
                self._decoded[block] = fields
            else:
                self._decoded.clear()
        if stream is None:
            return
        stream.block = None
        if stream.headers is None:
            stream.headers = fields
            if end_stream:
                self._end(stream, fields)  # trailers-only
        else:
            self._end(stream, fields)  # trailers (END_STREAM or not, nothing may follow them)

    def _end(self, stream: _Stream, trailers: List[Tuple[str, str]]) -> None:
        """The response is complete: its status, else its one message."""
        headers = stream.headers or []
        http_status = next((v for k, v in headers if k == ":status"), None)
        if http_status != "200":
            has_status = any(k == "grpc-status" for k, _ in trailers)
            if not has_status:
                try:
                    self._finish(stream, error=_http_status_error(int(http_status or 0)))
                except ValueError:
                    self._finish(stream, error=_http_status_error(0))
                return
        error = _status(trailers)
        if error is not None:
            self._finish(stream, error=error)
            return
        data = stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks)
        if not data:
            self._finish(stream, error=RpcError(grpc.StatusCode.INTERNAL, "No message received"))
        elif len(data) < 5 or len(data) != 5 + _u32.unpack_from(data, 1)[0]:
            self._finish(stream, error=RpcError(grpc.StatusCode.INTERNAL, "Malformed response message framing"))
        elif data[0] != 0:
            # No grpc-accept-encoding is sent, so a compressed message breaks the protocol.
            self._finish(stream, error=RpcError(grpc.StatusCode.INTERNAL, "Received a compressed message"))
        else:
            self._finish(stream, result=data[5:])

    def _finish(self, stream: _Stream, *, result: Optional[bytes] = None, error: Optional[RpcError] = None) -> None:
        if stream.done:
            return
        stream.done = True
        stream.result = result
        stream.error = error
        stream.chunks = []
        self.streams.pop(stream.id, None)
        if stream.on_done is not None:
            stream.on_done(stream)

    def fail(self, error: RpcError) -> None:
        """The connection is gone: every call on it ends with ``error``."""
        if self.error is None:
            self.error = error
        for stream in list(self.streams.values()):
            self._finish(stream, error=error)


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise ConnectionError_("padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_("padding longer than the frame")
    return payload[1:len(payload) - pad]


class Endpoint:
    """What every connection of one client shares: address, TLS, the constant request headers."""

    def __init__(
        self,
        host: str,
        port: int,
        metadata: Sequence[Tuple[str, str]],
        tls: Optional[ssl.SSLContext],
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.server_hostname = host
        # The constant part of every request's header block, after :path (which differs per
        # method): literals without indexing, so the peer's HPACK table never holds them.
        self._tail = (
            (b"\x87" if tls else b"\x86")  # :scheme https / http (static table)
            + literal_indexed_name(1, authority.encode("ascii"))  # :authority
            + literal_indexed_name(31, b"application/grpc")  # content-type
            + literal(b"te", b"trailers")
            + literal_indexed_name(58, USER_AGENT.encode("ascii"))  # user-agent
            + b"".join(literal(k.lower().encode("ascii"), v.encode("latin-1")) for k, v in metadata)
        )
        self._blocks: Dict[bytes, bytes] = {}

    def header_prefix(self, path: bytes) -> bytes:
        block = self._blocks.get(path)
        if block is None:
            block = self._blocks[path] = b"\x83" + literal_indexed_name(4, path) + self._tail  # :method POST, :path
        return block


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
) -> Optional[Endpoint]:
    """Where the lean transport connects, or None when grpcio makes the calls: asked for
    (``transport="grpcio"``), a channel or channel options of the caller's (they configure
    grpcio), or a target it does not dial."""
    if transport not in ("http2", "grpcio"):
        raise ValueError(f'transport must be "http2" or "grpcio", not {transport!r}')
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
    return Endpoint(address[0], address[1], metadata, tls)


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


# -- sync -------------------------------------------------------------------


class _SyncConnection:
    def __init__(self, endpoint: Endpoint, timeout: Optional[float]) -> None:
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.tls is not None:
                self.sock = endpoint.tls.wrap_socket(self.sock, server_hostname=endpoint.server_hostname)
                if self.sock.selected_alpn_protocol() != "h2":
                    raise OSError("the server did not agree to HTTP/2 (ALPN h2)")
            self.h2 = H2Connection(self.sock.sendall, endpoint.header_prefix)
            self.sock.sendall(self.h2.preface())
        except BaseException:
            self.sock.close()
            raise

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def poll(self) -> bool:
        """Reads what arrived while the connection was idle (SETTINGS, PING, GOAWAY, the close);
        True when it can take a call."""
        h2 = self.h2
        try:
            while h2.usable and select.select([self.sock], [], [], 0)[0]:
                self.sock.settimeout(0)
                data = self.sock.recv(65536)
                if not data:
                    h2.fail(unavailable("Socket closed"))
                    break
                h2.feed(data)
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except OSError as e:
            h2.fail(unavailable(f"Connection lost: {e}"))
        return h2.usable

    def call(self, path: bytes, message: bytes, deadline: Optional[float]) -> bytes:
        h2 = self.h2
        sock = self.sock
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise deadline_exceeded()
        stream = None
        try:
            sock.settimeout(remaining)
            stream = h2.start(path, message, remaining)
            while not stream.done:
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise socket.timeout()
                    sock.settimeout(remaining)
                data = sock.recv(262144)
                if not data:
                    h2.fail(unavailable("Socket closed"))
                    break
                h2.feed(data)
        except socket.timeout:
            if stream is not None:
                h2.cancel(stream)
            # What the server still sends for the stream would have to be read past; a new
            # connection is simpler, and a deadline is rare.
            h2.fail(deadline_exceeded())
            raise deadline_exceeded() from None
        except OSError as e:
            h2.fail(unavailable(f"Connection lost: {e}"))
            raise unavailable(f"Connection lost: {e}") from e
        if stream.error is not None:
            raise stream.error
        return stream.result  # type: ignore[return-value]


class SyncTransport:
    """Blocking unary calls: the calling thread writes the request and reads the answer itself
    on a connection it holds for the call. Idle connections wait in a pool; a call with none idle
    opens one, so there are as many as calls were at once in flight (at most ``max_idle`` stay)."""

    def __init__(self, endpoint: Endpoint, max_idle: int = 16) -> None:
        self.endpoint = endpoint
        self.max_idle = max_idle
        self._idle: List[_SyncConnection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def unary(self, path: bytes, message: bytes, timeout: Optional[float]) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        conn = self._take(timeout)
        try:
            return conn.call(path, message, deadline)
        finally:
            self._give(conn)

    def _take(self, timeout: Optional[float]) -> _SyncConnection:
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
        try:
            return _SyncConnection(self.endpoint, timeout)
        except ssl.SSLError as e:
            raise unavailable(f"TLS handshake failed: {e}") from e
        except socket.timeout:
            raise deadline_exceeded() from None
        except OSError as e:
            raise unavailable(f"failed to connect to {self.endpoint.host}:{self.endpoint.port}: {e}") from e

    def _give(self, conn: _SyncConnection) -> None:
        if conn.h2.usable and not conn.h2.streams and not self._closed:
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


# -- asyncio ----------------------------------------------------------------


class _Protocol(asyncio.Protocol):
    def __init__(self, endpoint: Endpoint) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.h2 = H2Connection(self._write, endpoint.header_prefix)

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise OSError("connection closed")
        self.transport.write(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.h2.preface())  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.h2.feed(data)
        if self.h2.error is not None and self.transport is not None:
            self.transport.close()

    def eof_received(self) -> Optional[bool]:
        self.h2.fail(unavailable("Socket closed"))
        return None

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.h2.fail(unavailable(f"Connection lost: {exc}" if exc else "Socket closed"))


def _resolve(stream: _Stream) -> None:
    future = stream.future
    if future is not None and not future.done():
        future.set_result(None)


class AsyncTransport:
    """Unary calls multiplexed on one connection, answers resolved in ``data_received``. A
    connection that went away (GOAWAY, closed, broken) is replaced on the next call."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._protocol: Optional[_Protocol] = None
        self._connecting: Optional["asyncio.Future[_Protocol]"] = None
        self._closed = False

    async def _connection(self, timeout: Optional[float]) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.h2.usable:
            return protocol
        if self._closed:
            raise unavailable("the client was closed")
        if protocol is not None:
            self._protocol = None
            if protocol.transport is not None and not protocol.h2.streams:
                protocol.transport.close()
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.wait_for(asyncio.shield(connecting), timeout)
        except asyncio.TimeoutError:
            raise deadline_exceeded() from None

    async def _connect(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        e = self.endpoint
        try:
            _, protocol = await loop.create_connection(
                lambda: _Protocol(e), e.host, e.port,
                ssl=e.tls, server_hostname=e.server_hostname if e.tls else None,
            )
            if e.tls is not None:
                sslobj = protocol.transport.get_extra_info("ssl_object")
                if sslobj is None or sslobj.selected_alpn_protocol() != "h2":
                    protocol.transport.close()
                    raise unavailable("the server did not agree to HTTP/2 (ALPN h2)")
            sock = protocol.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._protocol = protocol
            return protocol
        except ssl.SSLError as err:
            raise unavailable(f"TLS handshake failed: {err}") from err
        except OSError as err:
            raise unavailable(f"failed to connect to {e.host}:{e.port}: {err}") from err
        finally:
            self._connecting = None

    async def unary(self, path: bytes, message: bytes, timeout: Optional[float]) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        protocol = await self._connection(timeout)
        h2 = protocol.h2
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            raise deadline_exceeded()
        future = loop.create_future()
        try:
            stream = h2.start(path, message, remaining)
        except OSError as e:
            h2.fail(unavailable(f"Connection lost: {e}"))
            raise unavailable(f"Connection lost: {e}") from e
        if not stream.done:
            stream.future = future
            stream.on_done = _resolve
            timer = None if deadline is None else loop.call_at(deadline, _expire, future)
            try:
                await future
            except asyncio.CancelledError:
                h2.cancel(stream)
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if not stream.done:  # the deadline passed first
                h2.cancel(stream)
                raise deadline_exceeded()
            if protocol is not self._protocol and not h2.streams and protocol.transport is not None:
                protocol.transport.close()  # replaced after a GOAWAY: its last call is over
        if stream.error is not None:
            raise stream.error
        return stream.result  # type: ignore[return-value]

    def close(self) -> None:
        self._closed = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()


def _expire(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)
