"""ASGI middleware (Starlette, FastAPI, any ASGI app): ``idemd proxy``'s
``Idempotency-Key`` contract in process, on an :class:`idemd.aio.AsyncClient`.

::

    app.add_middleware(IdempotencyMiddleware, client=AsyncClient(ADDR, token=TOKEN),
                       routes=[{"path": "/v1/payments/{id}", "ignore_fields": ["/request_time"]}])

For a request whose method its route marks (default ``POST`` and ``PATCH``)
the body is read once (up to ``max_request_bytes``, else 413), the key is
claimed, and the app runs once per key, its lease extended while it runs. The
app gets the same body; its answer is buffered, stored (status, the route's
``store_headers``, body) and sent. Retries get the stored answer with
``Idempotent-Replayed: true``; a duplicate in flight gets 409 with
``Retry-After`` (or waits ``max_wait``), another body under the key 422, an
undecided outcome 409 ``outcome_pending``. An exception from the app leaves the
key UNKNOWN (or released, for :class:`idemd.NoSideEffect`) and propagates to
the framework; a 5xx answer releases the key unless ``on_5xx="store"``. A
body that something mounted before the middleware already read gets a 500
problem ``middleware_order`` at once, and nothing is claimed.

The app can read its :class:`idemd.Execution` (for downstream keys) from
``scope["idemd.execution"]`` (Starlette: ``request.scope["idemd.execution"]``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, MutableMapping, Optional, Union

from . import _http
from ._http import Answer, Route, Routes
from .aio import AsyncClient
from .errors import IdempotencyError, RpcError
from .types import Execution, Request

__all__ = ["IdempotencyMiddleware", "Route", "Routes"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class IdempotencyMiddleware:
    """Makes the routes' marked methods idempotent by ``Idempotency-Key``.

    ``client`` is an :class:`AsyncClient` or a function that makes one (called
    on the first request, in the server's event loop). ``routes``
    (:class:`Route` or routes-file tables as dicts) and
    ``defaults`` are ``idemd proxy``'s routes file; the endpoint of a request
    is its method and route template (``POST /v1/payments/{id}``).
    """

    def __init__(
        self,
        app: ASGIApp,
        client: Union[AsyncClient, Callable[[], AsyncClient]],
        *,
        routes: Iterable[Union[Route, Mapping[str, Any]]] = (),
        defaults: Union[None, Route, Mapping[str, Any]] = None,
        body_start_timeout: float = _http.BODY_START_TIMEOUT,
    ) -> None:
        self.app = app
        # A factory is called on the first request, inside the server's event
        # loop: a grpc.aio channel belongs to the loop it was made in.
        self._client = client
        self.routes = routes if isinstance(routes, Routes) else Routes(routes, defaults)
        self.body_start_timeout = body_start_timeout
        self._order = _http.OrderCheck(
            "with Starlette or FastAPI, call app.add_middleware(IdempotencyMiddleware, ...) after adding any "
            "middleware that awaits request.body(), .json() or .form() or reads receive, so it runs first")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method = scope["method"].upper()
        path = scope["path"]
        endpoint, settings = self.routes.find(method, path)
        if method not in settings.methods:
            return await self.app(scope, receive, send)
        value = _header(scope, b"idempotency-key")
        if value is None:
            if not settings.key_required:
                return await self.app(scope, receive, send)
            return await _send(send, _http.missing_key(method, path))
        try:
            key = _http.parse_key(value)
        except ValueError as e:
            return await _send(send, _http.malformed_key(str(e)))
        body = await _read_body(receive, settings.max_request_bytes, _declared_length(scope), self.body_start_timeout)
        if body is _GONE:
            return  # the client left before its body arrived: nothing was claimed, nobody to answer
        if body is _READ_BEFORE:
            return await _send(send, self._order.answer())
        if body is None:
            return await _send(send, _http.too_large(settings.max_request_bytes))

        raw_path = scope.get("raw_path") or path.encode("utf-8")
        query = scope.get("query_string") or b""
        target = raw_path.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
        request = Request(method, target, body, _header(scope, b"content-type") or "", settings.ignore_fields)
        fresh: Dict[str, Answer] = {}

        async def handler(execution: Execution) -> Any:
            answer = await self._run_app(dict(scope, **{"idemd.execution": execution}), body, receive)
            fresh["answer"] = answer
            return _http.to_store(answer, settings)

        if not isinstance(self._client, AsyncClient):
            self._client = self._client()
        try:
            result = await self._client.execute_once(
                endpoint, key, request, handler, max_wait=settings.max_wait,
                fingerprint=settings.fingerprint, lease=settings.lease, ttl=settings.ttl,
            )
        except (_http.Released, _http.Unstorable) as e:
            return await _send(send, e.answer)
        except (IdempotencyError, RpcError) as e:
            if "answer" in fresh:
                # The app ran (its side effect happened) but recording the
                # answer failed: the caller still gets it; the executor has
                # left the key to its lease or marked it UNKNOWN.
                return await _send(send, fresh["answer"])
            return await _send(send, _http.refused(e, settings))
        if result.replayed:
            return await _send(send, _http.replay(result.response))
        return await _send(send, fresh["answer"])

    async def _run_app(self, scope: Scope, body: bytes, receive: Receive) -> Answer:
        """Runs the app on the buffered body and buffers its answer."""
        delivered = False

        async def replay_body() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # http.disconnect, when the client goes

        status = 500
        headers: List[tuple] = []
        chunks: List[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        await self.app(scope, replay_body, capture)
        return Answer(status, headers, b"".join(chunks))


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


#: What _read_body returns when the client disconnects mid-body.
_GONE = b"\x00idemd-gone"
#: What _read_body returns when something before the middleware read the body.
_READ_BEFORE = b"\x00idemd-read-before"


def _declared_length(scope: Scope) -> Optional[int]:
    """The body the request declares: its Content-Length; None for a body of
    unknown length (``Transfer-Encoding``, or HTTP/2 and later, where a body
    needs no header); 0 when an HTTP/1 request declares none (it has none)."""
    length = _header(scope, b"content-length")
    if length is not None:
        try:
            return max(0, int(length))
        except ValueError:
            return None
    if _header(scope, b"transfer-encoding") is not None or not str(scope.get("http_version", "1.1")).startswith("1"):
        return None
    return 0


async def _read_body(receive: Receive, limit: int, declared: Optional[int], start_timeout: float) -> Optional[bytes]:
    """The whole body; None when it is over ``limit`` bytes; _GONE when the
    client disconnected first (a partial body must never be claimed);
    _READ_BEFORE when a declared body's first message does not come within
    ``start_timeout`` (a drained ``receive`` blocks until the client leaves)
    or the stream ends short of its Content-Length."""
    if declared == 0:
        # Nothing to receive; and asking would block for good when a reader
        # before us took the empty message.
        return b""
    chunks: List[bytes] = []
    size = 0
    while True:
        if not chunks:
            try:
                message = await _within(receive(), start_timeout)
            except asyncio.TimeoutError:
                return _READ_BEFORE
        else:
            message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if declared and size < declared:
        return _READ_BEFORE
    return b"".join(chunks)


async def _within(awaitable: Awaitable[Message], seconds: float) -> Message:
    """``await awaitable``, or asyncio.TimeoutError after ``seconds``. On
    Python 3.11+ a timer on the current task: wait_for's task of its own per
    request was a measurable part of the middleware's cost (issue 37)."""
    if _timeout is None:
        return await asyncio.wait_for(awaitable, seconds)
    async with _timeout(seconds):
        return await awaitable


_timeout = getattr(asyncio, "timeout", None)


async def _send(send: Send, answer: Answer) -> None:
    await send({
        "type": "http.response.start",
        "status": answer.status,
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers],
    })
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})
