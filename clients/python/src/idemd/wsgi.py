"""WSGI middleware (Flask, Django through its WSGI application, any WSGI
app): ``idemd proxy``'s ``Idempotency-Key`` contract in process, on an
:class:`idemd.Client`.

::

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, Client(ADDR, token=TOKEN),
                                         routes=[{"path": "/v1/payments/{id}"}])

Flask and Django turn a view's exception into their own 500 page before a
WSGI middleware sees it; :func:`flask` and :func:`django` hook their
``got_request_exception`` signal to record the exception in the WSGI environ,
so the key is left UNKNOWN (or released, for :class:`idemd.NoSideEffect`)
rather than treated as a plain 5xx answer.

Mount it outside anything that reads ``wsgi.input``: a body read before it
gets a 500 problem ``middleware_order`` at once, and nothing is claimed.

The app can read its :class:`idemd.Execution` (for downstream keys) from
``environ["idemd.execution"]``.
"""

from __future__ import annotations

import io
import os
import select
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union
from urllib.parse import quote

from . import _http
from ._executor import failure_reason
from ._http import Answer, Route, Routes
from .client import Client
from .errors import IdempotencyError, NoSideEffect, RpcError
from .types import Execution, Request

__all__ = ["IdempotencyMiddleware", "Route", "Routes", "django", "flask", "mark_exception"]

#: Where a framework's exception hook leaves the view's exception.
EXCEPTION_KEY = "idemd.exception"

WSGIApp = Callable[[Dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class IdempotencyMiddleware:
    """Makes the routes' marked methods idempotent by ``Idempotency-Key``;
    ``routes`` and ``defaults`` as in :class:`idemd.asgi.IdempotencyMiddleware`."""

    def __init__(
        self,
        app: WSGIApp,
        client: Client,
        *,
        routes: Iterable[Union[Route, Mapping[str, Any]]] = (),
        defaults: Union[None, Route, Mapping[str, Any]] = None,
        body_start_timeout: float = _http.BODY_START_TIMEOUT,
    ) -> None:
        self.app = app
        self.client = client
        self.routes = routes if isinstance(routes, Routes) else Routes(routes, defaults)
        self.body_start_timeout = body_start_timeout
        self._order = _http.OrderCheck(
            "wrap the app in IdempotencyMiddleware outside any WSGI middleware that reads wsgi.input, "
            "e.g. a Werkzeug/Flask Request's get_data(), .json or .form")

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        endpoint, settings = self.routes.find(method, path)
        if method not in settings.methods:
            return self.app(environ, start_response)
        value = environ.get("HTTP_IDEMPOTENCY_KEY")
        if value is None:
            if not settings.key_required:
                return self.app(environ, start_response)
            return _respond(start_response, _http.missing_key(method, path))
        try:
            key = _http.parse_key(value)
        except ValueError as e:
            return _respond(start_response, _http.malformed_key(str(e)))
        body = _read_body(environ, settings.max_request_bytes, self.body_start_timeout)
        if body is _READ_BEFORE:
            return _respond(start_response, self._order.answer())
        if body is None:
            return _respond(start_response, _http.too_large(settings.max_request_bytes))

        query = environ.get("QUERY_STRING", "")
        # PATH_INFO is decoded; quoting it back gives the same bytes on every retry.
        target = quote(path.encode("latin-1"), safe="/;:@&=+$,!~*'()%") + ("?" + query if query else "")
        request = Request(method, target, body, environ.get("CONTENT_TYPE", ""), settings.ignore_fields)
        fresh: Dict[str, Answer] = {}

        def handler(execution: Execution) -> Any:
            inner = dict(environ)
            inner["wsgi.input"] = io.BytesIO(body)
            inner["CONTENT_LENGTH"] = str(len(body))
            inner["idemd.execution"] = execution
            answer = _run_app(self.app, inner)
            raised = inner.get(EXCEPTION_KEY)
            if raised is not None:
                # The framework answered its error page for a view's exception.
                if isinstance(raised, NoSideEffect):
                    raise _http.Released(answer) from raised
                raise _http.Unstorable(answer, failure_reason(raised)) from raised
            fresh["answer"] = answer
            return _http.to_store(answer, settings)

        try:
            result = self.client.execute_once(
                endpoint, key, request, handler, max_wait=settings.max_wait,
                fingerprint=settings.fingerprint, lease=settings.lease, ttl=settings.ttl,
            )
        except (_http.Released, _http.Unstorable) as e:
            return _respond(start_response, e.answer)
        except (IdempotencyError, RpcError) as e:
            if "answer" in fresh:
                return _respond(start_response, fresh["answer"])  # it ran; see asgi.py
            return _respond(start_response, _http.refused(e, settings))
        if result.replayed:
            return _respond(start_response, _http.replay(result.response))
        return _respond(start_response, fresh["answer"])


#: What _read_body returns when something before the middleware read the body.
_READ_BEFORE = b"\x00idemd-read-before"


def _read_body(environ: Dict[str, Any], limit: int, start_timeout: float) -> Optional[bytes]:
    """The whole body; None when it is over ``limit`` bytes; _READ_BEFORE
    when it is shorter than its Content-Length, or its first bytes do not
    come within ``start_timeout`` from a socket (a server that hands the
    connection itself as ``wsgi.input`` blocks a drained read until the client
    leaves; one that wraps it ends the read at the body's end)."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    length = environ.get("CONTENT_LENGTH") or ""
    if length.strip():
        try:
            size = int(length)
        except ValueError:
            size = -1
        if size < 0 or size > limit:
            return None
        if not size:
            return b""
        if not _readable(stream, start_timeout):
            return _READ_BEFORE
        data = stream.read(size)
        return data if len(data) == size else _READ_BEFORE
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and no terminated stream: PEP 3333 says there is no body
    data = stream.read(limit + 1)
    return None if len(data) > limit else data


def _readable(stream: Any, timeout: float) -> bool:
    """Whether a read of ``stream`` returns data within ``timeout`` seconds;
    True for a stream that is no socket's (nothing to wait for there)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return True
    peek = getattr(stream, "peek", None)
    if peek is not None:
        # Bytes the server's buffered reader already holds (read with the
        # headers) are invisible to select(); a non-blocking peek sees them
        # without waiting on the socket.
        try:
            blocking = os.get_blocking(fd)
            os.set_blocking(fd, False)
        except OSError:
            return True
        try:
            if peek(1):
                return True
        except OSError:
            pass
        finally:
            os.set_blocking(fd, blocking)
    try:
        if hasattr(select, "poll"):  # any descriptor number, unlike select()
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(timeout * 1000))
        return bool(select.select([fd], [], [], timeout)[0])
    except (OSError, ValueError):
        return True


def _run_app(app: WSGIApp, environ: Dict[str, Any]) -> Answer:
    """Runs the app and buffers its answer (an exception propagates)."""
    started: Dict[str, Any] = {}
    chunks: List[bytes] = []

    def start_response(status: str, headers: List[tuple], exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started["status"], started["headers"] = status, headers
        return chunks.append

    result = app(environ, start_response)
    try:
        for chunk in result:
            chunks.append(bytes(chunk))
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    status = int(str(started.get("status", "500")).split(" ", 1)[0])
    return Answer(status, [(str(k), str(v)) for k, v in started.get("headers", [])], b"".join(chunks))


def _respond(start_response: Callable[..., Any], answer: Answer) -> Iterable[bytes]:
    from http import HTTPStatus

    try:
        phrase = HTTPStatus(answer.status).phrase
    except ValueError:
        phrase = "Unknown"
    headers = [(k, v) for k, v in answer.headers if k.lower() not in _HOP_BY_HOP]
    if not any(k.lower() == "content-length" for k, _ in headers):
        headers.append(("Content-Length", str(len(answer.body))))
    start_response(f"{answer.status} {phrase}", headers)
    return [answer.body]


#: PEP 3333 forbids an app to send these; the server manages the connection.
_HOP_BY_HOP = frozenset(
    ["connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade"]
)


def mark_exception(environ: Dict[str, Any], exception: BaseException) -> None:
    """Records a view's exception for the middleware (call it from the
    framework's exception hook, e.g. Django's ``got_request_exception`` with
    ``request.META``, which is the WSGI environ)."""
    environ[EXCEPTION_KEY] = exception


def flask(app: Any, client: Client, **options: Any) -> IdempotencyMiddleware:
    """Installs the middleware on a Flask app (``app.wsgi_app``) and hooks
    Flask's ``got_request_exception``, so a view's exception leaves the key
    UNKNOWN (or released for :class:`idemd.NoSideEffect`) while Flask still
    answers its own error page."""
    from flask import got_request_exception, request

    def on_exception(sender: Any, exception: BaseException, **_: Any) -> None:
        mark_exception(request.environ, exception)

    got_request_exception.connect(on_exception, app, weak=False)
    middleware = IdempotencyMiddleware(app.wsgi_app, client, **options)
    app.wsgi_app = middleware
    return middleware


def django(application: WSGIApp, client: Client, **options: Any) -> IdempotencyMiddleware:
    """Wraps a Django WSGI application (``get_wsgi_application()``) and hooks
    Django's ``got_request_exception`` (``request.META`` is the WSGI environ),
    so a view's exception leaves the key UNKNOWN (or released for
    :class:`idemd.NoSideEffect`) while Django still answers its error page::

        application = idemd.wsgi.django(get_wsgi_application(), client, routes=[...])
    """
    import sys

    from django.core.signals import got_request_exception

    def on_exception(sender: Any, request: Any = None, **_: Any) -> None:
        raised = sys.exc_info()[1]
        if request is not None and raised is not None:
            mark_exception(request.META, raised)

    got_request_exception.connect(on_exception, weak=False, dispatch_uid="idemd.wsgi.django")
    return IdempotencyMiddleware(application, client, **options)
