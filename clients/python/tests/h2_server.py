"""A scripted HTTP/2 server for the transport tests (tests/test_transport.py): raw frames over a
socket, so that a test can send what a real gRPC server rarely does (trailers-only errors, HTTP
errors, resets, GOAWAY, CONTINUATION, PING, small flow-control windows) and check what the client
sent (headers, window violations)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import hpack

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream_id) + payload


def grpc_message(data: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(data)) + data


class Call:
    """One request the server received; the script answers through it."""

    def __init__(self, conn: "_Conn", stream_id: int, headers: List[Tuple[str, str]], body: bytes) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.headers = headers
        self.body = body

    def header(self, name: str) -> Optional[str]:
        return next((v for k, v in self.headers if k == name), None)

    def send_headers(self, fields: Sequence[Tuple[str, str]], end_stream: bool = False, split: int = 0) -> None:
        self.conn.send_headers(self.stream_id, fields, end_stream, split)

    def send_data(self, data: bytes, end_stream: bool = False, padded: bool = False) -> None:
        self.conn.send_data(self.stream_id, data, end_stream, padded)

    def reply(self, message: bytes, status: int = 0, trailers: Sequence[Tuple[str, str]] = ()) -> None:
        self.send_headers([(":status", "200"), ("content-type", "application/grpc")])
        self.send_data(grpc_message(message))
        self.send_headers([("grpc-status", str(status)), *trailers], end_stream=True)

    def reset(self, code: int) -> None:
        self.conn.send(frame(RST_STREAM, 0, self.stream_id, struct.pack(">I", code)))

    def goaway(self, last_stream_id: int, close: bool = True) -> None:
        self.conn.send(frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, 0)))
        if close:
            self.conn.close()

    def ping(self, timeout: float = 5.0) -> bool:
        """Sends a PING and waits for its ACK."""
        self.conn.pong.clear()
        self.conn.send(frame(PING, 0, 0, b"12345678"))
        return self.conn.pong.wait(timeout)


class _Conn:
    def __init__(self, server: "H2Server", sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.lock = threading.Lock()
        self.window_cond = threading.Condition()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.pong = threading.Event()
        self.settings_acked = threading.Event()
        self.unreturned: Dict[int, int] = {}  # DATA bytes read and not yet given back, per stream (0: connection)
        # What the client lets this side send (its SETTINGS and WINDOW_UPDATEs).
        self.send_conn_window = 65535
        self.client_initial = 65535
        self.send_windows: Dict[int, int] = {}
        # What this side lets the client send.
        self.recv_conn_window = 65535
        self.recv_windows: Dict[int, int] = {}
        self.streams: Dict[int, dict] = {}
        self.closed = False

    def send(self, data: bytes) -> None:
        with self.lock:
            if not self.closed:
                try:
                    self.sock.sendall(data)
                except OSError:
                    pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()

    def send_headers(self, stream_id: int, fields, end_stream: bool, split: int) -> None:
        with self.lock:  # the encoder's table follows the order blocks are sent in
            block = self.encoder.encode(list(fields))
            flags = END_STREAM if end_stream else 0
            if split and len(block) > split:
                out = frame(HEADERS, flags, stream_id, block[:split])
                rest = block[split:]
                while rest:
                    part, rest = rest[:split], rest[split:]
                    out += frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, part)
            else:
                out = frame(HEADERS, flags | END_HEADERS, stream_id, block)
            if not self.closed:
                self.sock.sendall(out)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool, padded: bool) -> None:
        """DATA within the client's windows, waiting for its WINDOW_UPDATEs."""
        view = memoryview(data)
        while True:
            with self.window_cond:
                while True:
                    window = min(self.send_conn_window, self.send_windows.get(stream_id, self.client_initial))
                    if window > 0 or not view:
                        break
                    if not self.window_cond.wait(10):
                        raise AssertionError("the client gave no flow-control window for 10 s")
                n = min(len(view), window, 16384 - (2 if padded else 0))
                self.send_conn_window -= n
                self.send_windows[stream_id] = self.send_windows.get(stream_id, self.client_initial) - n
            chunk, view = view[:n].tobytes(), view[n:]
            last = not view
            if padded:
                payload, flags = bytes((1,)) + chunk + b"\x00", PADDED
            else:
                payload, flags = chunk, 0
            self.send(frame(DATA, flags | (END_STREAM if last and end_stream else 0), stream_id, payload))
            if last:
                return

    def serve(self) -> None:
        server = self.server
        try:
            preface = self._read(24)
            assert preface == b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", preface
            self.send(frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in server.settings)))
            block = bytearray()
            while True:
                head = self._read(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream_id = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
                payload = self._read(length)
                if kind == SETTINGS and flags & ACK:
                    self.settings_acked.set()
                elif kind == SETTINGS:
                    for i in range(0, len(payload), 6):
                        ident, value = struct.unpack_from(">HI", payload, i)
                        if ident == 4:
                            with self.window_cond:
                                for sid in self.send_windows:
                                    self.send_windows[sid] += value - self.client_initial
                                self.client_initial = value
                                self.window_cond.notify_all()
                    self.send(frame(SETTINGS, ACK, 0))
                elif kind == PING:
                    if flags & ACK:
                        self.pong.set()
                    else:
                        server.pings += 1
                        self.send(frame(PING, ACK, 0, payload))
                elif kind == WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload)[0]
                    with self.window_cond:
                        if stream_id == 0:
                            self.send_conn_window += increment
                        else:
                            self.send_windows[stream_id] = self.send_windows.get(
                                stream_id, self.client_initial) + increment
                        self.window_cond.notify_all()
                elif kind in (HEADERS, CONTINUATION):
                    block += payload
                    if kind == HEADERS:
                        self.streams[stream_id] = {"body": bytearray(), "end": bool(flags & END_STREAM)}
                        self.recv_windows[stream_id] = server.window
                    if flags & END_HEADERS:
                        self.streams[stream_id]["headers"] = self.decoder.decode(bytes(block))
                        block = bytearray()
                elif kind == DATA:
                    self.recv_conn_window -= length
                    self.recv_windows[stream_id] -= length
                    if self.recv_conn_window < 0 or self.recv_windows[stream_id] < 0:
                        server.violations.append(f"DATA on stream {stream_id} beyond the advertised window")
                    self.streams[stream_id]["body"] += payload
                    if server.give_window and length:
                        # Given back only once a whole window was read: a client that sends
                        # more than the window before this update overruns it.
                        for sid in (0, stream_id):
                            self.unreturned[sid] = self.unreturned.get(sid, 0) + length
                            if self.unreturned[sid] >= server.window:
                                if sid:
                                    self.recv_windows[sid] += self.unreturned[sid]
                                else:
                                    self.recv_conn_window += self.unreturned[sid]
                                self.send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", self.unreturned[sid])))
                                self.unreturned[sid] = 0
                    if flags & END_STREAM:
                        state = self.streams.pop(stream_id)
                        body = bytes(state["body"])
                        call = Call(self, stream_id, state["headers"], body[5:])
                        server.calls.append(call)
                        threading.Thread(target=self._run, args=(call,), daemon=True).start()
                elif kind == RST_STREAM:
                    server.resets.append((stream_id, struct.unpack(">I", payload)[0]))
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            self.close()

    def _run(self, call: Call) -> None:
        try:
            self.server.script(call)
        except Exception as e:  # noqa: BLE001 - surfaced to the test through errors
            self.server.errors.append(e)

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)


class H2Server:
    """Answers every call with ``script(call)`` (run on a thread of its own)."""

    def __init__(
        self,
        script: Callable[[Call], None],
        settings: Sequence[Tuple[int, int]] = (),
        window: int = 65535,
        give_window: bool = True,
    ) -> None:
        self.script = script
        self.settings = list(settings)
        self.window = window
        self.give_window = give_window
        self.calls: List[Call] = []
        self.resets: List[Tuple[int, int]] = []
        self.pings = 0  # PINGs the clients sent
        self.violations: List[str] = []
        self.errors: List[BaseException] = []
        self.connections: List[_Conn] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            conn = _Conn(self, sock)
            self.connections.append(conn)
            threading.Thread(target=conn.serve, daemon=True).start()

    def close(self) -> None:
        self._listener.close()
        for conn in self.connections:
            conn.close()

    def __enter__(self) -> "H2Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
