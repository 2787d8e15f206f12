"""The ASGI (FastAPI/Starlette under uvicorn) and WSGI (Flask, and Django
through its WSGI application, under Werkzeug's server) middleware, each inside a real app of its framework over
real HTTP against the live idemd: the shared HTTP scenarios
(clients/conformance/http-scenarios.json, which ``idemd proxy``'s suite runs
too), and what the middleware does with the body and the execution."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import logging
import secrets
import threading
import time
from typing import Any, Callable, Iterator, Tuple

import grpc
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.requests import Request as StarletteRequest

import idemd
from idemd.aio import AsyncClient
from idemd.asgi import IdempotencyMiddleware as AsgiMiddleware
from idemd import wsgi as idemd_wsgi

from conftest import CREDENTIALS, Server
from http_scenarios import CRASH_MESSAGE, CRASH_PATHS, ROUTES, SLOW, AppState, answer_of, run_scenarios

METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def fastapi_app(state: AppState, make_client: Callable[[], AsyncClient] = None):  # type: ignore[assignment]
    """The scenarios' app in FastAPI; with the middleware when ``make_client`` is given."""
    app = FastAPI()
    if make_client is not None:
        app.add_middleware(AsgiMiddleware, client=make_client, routes=ROUTES)

    @app.api_route("/{rest:path}", methods=METHODS)
    async def handle(request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        execution = state.count(path)
        if "/slow/" in path:
            await asyncio.sleep(SLOW)
        if path.startswith(CRASH_PATHS):
            raise RuntimeError(CRASH_MESSAGE)
        if path.startswith("/norun/"):
            raise idemd.NoSideEffect("card rejected before charging")
        status, headers, payload = answer_of(path, execution, body)
        response = Response(payload, status_code=status)
        for name, value in headers:
            response.headers.append(name, value)
        response.headers["x-body-sha256"] = hashlib.sha256(body).hexdigest()
        if "idemd.execution" in request.scope:
            response.headers["x-downstream-key"] = request.scope["idemd.execution"].downstream_key("charge")
        return response

    return app


def flask_app(state: AppState, client: idemd.Client = None):  # type: ignore[assignment]
    """The scenarios' app in Flask; with the middleware when ``client`` is given."""
    import flask

    app = flask.Flask(__name__)

    @app.route("/<path:rest>", methods=METHODS)
    def handle(rest: str) -> Any:
        body = flask.request.get_data()
        path = flask.request.path
        execution = state.count(path)
        if "/slow/" in path:
            time.sleep(SLOW)
        if path.startswith(CRASH_PATHS):
            raise RuntimeError(CRASH_MESSAGE)
        if path.startswith("/norun/"):
            raise idemd.NoSideEffect("card rejected before charging")
        status, headers, payload = answer_of(path, execution, body)
        response = flask.Response(payload, status=status, headers=headers)
        response.headers["x-body-sha256"] = hashlib.sha256(body).hexdigest()
        if "idemd.execution" in flask.request.environ:
            response.headers["x-downstream-key"] = flask.request.environ["idemd.execution"].downstream_key("charge")
        return response

    if client is not None:
        idemd_wsgi.flask(app, client, routes=ROUTES)
    return app


def django_app(state: AppState, client: idemd.Client = None):  # type: ignore[assignment]
    """The scenarios' app in Django (its WSGI application); with the middleware
    when ``client`` is given."""
    import sys
    import types

    import django
    from django.conf import settings
    from django.urls import re_path

    if not settings.configured:
        settings.configure(DEBUG=False, SECRET_KEY="idemd-tests", ALLOWED_HOSTS=["*"], ROOT_URLCONF="idemd_test_urls",
                           MIDDLEWARE=[], INSTALLED_APPS=[], LOGGING_CONFIG=None)
        django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.http import HttpResponse

    def view(request: Any) -> HttpResponse:
        body = request.body
        path = request.path
        execution = state.count(path)
        if "/slow/" in path:
            time.sleep(SLOW)
        if path.startswith(CRASH_PATHS):
            raise RuntimeError(CRASH_MESSAGE)
        if path.startswith("/norun/"):
            raise idemd.NoSideEffect("card rejected before charging")
        status, headers, payload = answer_of(path, execution, body)
        response = HttpResponse(payload, status=status)
        for name, value in headers:
            response.headers[name] = value
        response.headers["x-body-sha256"] = hashlib.sha256(body).hexdigest()
        if "idemd.execution" in request.META:
            response.headers["x-downstream-key"] = request.META["idemd.execution"].downstream_key("charge")
        return response

    # One URLconf per process (Django's settings are global); the view of the
    # latest app serves it.
    urls = sys.modules.setdefault("idemd_test_urls", types.ModuleType("idemd_test_urls"))
    urls.urlpatterns = [re_path(r"^.*$", view)]  # type: ignore[attr-defined]
    from django.urls import clear_url_caches

    clear_url_caches()
    application = get_wsgi_application()
    if client is not None:
        return idemd_wsgi.django(application, client, routes=ROUTES)
    return application


@contextlib.contextmanager
def serve_asgi(app: Any) -> Iterator[int]:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def serve_wsgi(app: Any) -> Iterator[int]:
    from werkzeug.serving import make_server

    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.server_port
    finally:
        httpd.shutdown()
        thread.join(10)


def alice_async(server: Server) -> Callable[[], AsyncClient]:
    return lambda: AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True)


@pytest.fixture(params=["fastapi", "flask", "django"])
def front_end(request: pytest.FixtureRequest, server: Server) -> Iterator[Tuple[int, AppState]]:
    """A framework's app with the middleware, served over HTTP."""
    state = AppState()
    if request.param == "fastapi":
        with serve_asgi(fastapi_app(state, alice_async(server))) as port:
            yield port, state
    else:
        make = flask_app if request.param == "flask" else django_app
        with server.client("alice") as client, serve_wsgi(make(state, client)) as port:
            yield port, state


def test_http_scenarios(front_end: Tuple[int, AppState]) -> None:
    port, state = front_end
    run_scenarios(port, state.of)


def post(port: int, path: str, body: bytes, headers: dict) -> Tuple[int, http.client.HTTPMessage, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def test_the_app_gets_the_body_unchanged_and_its_execution(front_end: Tuple[int, AppState]) -> None:
    port, _ = front_end
    key = secrets.token_hex(8)
    body = b'{"amount": 4200,  "currency": "usd", "note": "caf\xc3\xa9"}'
    status, headers, _ = post(port, "/v1/payments/b1", body, {"Idempotency-Key": key, "Content-Type": "application/json"})
    assert status == 201
    assert headers["x-body-sha256"] == hashlib.sha256(body).hexdigest(), "read once, handed on byte for byte"
    assert headers["x-downstream-key"] == idemd.downstream_key(key, "charge")


def test_a_handler_exception_leaves_the_key_unknown_with_its_reason(front_end: Tuple[int, AppState], alice: idemd.Client) -> None:
    port, _ = front_end
    key = secrets.token_hex(8)
    status, _, _ = post(port, "/crash/r1", b"{}", {"Idempotency-Key": key, "Content-Type": "application/json"})
    assert status == 500
    record = alice.lookup(idemd.pb.LookupRequest(endpoint="POST /crash/r1", key=key)).record
    assert idemd.pb.State.Name(record.state) == "STATE_UNKNOWN"
    # <Kind>: <message>, as every SDK stores it: never an SDK-internal wrapper's name.
    assert record.reason == "RuntimeError: boom: secret-4711"


def test_a_long_handler_keeps_its_lease(server: Server) -> None:
    """The conformance server's lease is 10 s; a lease of 1 s on the route and
    a handler of 2.5 s: without extension a duplicate would take the key over
    (expired lease) and run the handler again."""
    state = AppState()
    routes = [{"path": "/long/*", "lease": "1s"}]
    app = FastAPI()
    app.add_middleware(AsgiMiddleware, client=alice_async(server), routes=routes)

    @app.post("/long/{name}")
    async def long(name: str) -> dict:
        state.count(name)
        await asyncio.sleep(2.5)
        return {"done": name}

    with serve_asgi(app) as port:
        key = secrets.token_hex(8)
        results: list = []
        first = threading.Thread(target=lambda: results.append(post(port, "/long/l1", b"{}", {"Idempotency-Key": key})))
        first.start()
        time.sleep(1.8)
        status, _, body = post(port, "/long/l1", b"{}", {"Idempotency-Key": key})
        first.join()
        # In progress, not an expired lease (which would be outcome_pending).
        assert status == 409, body
        assert json.loads(body)["type"] == "https://idemd.dev/problems/request_in_progress", body
        assert results[0][0] == 200
        status, headers, _ = post(port, "/long/l1", b"{}", {"Idempotency-Key": key})
        assert (status, headers["idempotent-replayed"]) == (200, "true")
        assert state.of("l1") == 1


class ReadsBodyFirst:
    """A pure ASGI middleware that reads the body with Starlette's Request and
    hands on the drained ``receive``: mounted before ours, the mistake."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await StarletteRequest(scope, receive).body()
        await self.app(scope, receive, send)


def reads_body_first(wsgi_app: Any) -> Any:
    """A WSGI middleware that parses the body with Werkzeug's Request before
    ours runs (the mistake)."""
    from werkzeug.wrappers import Request as WerkzeugRequest

    def app(environ: dict, start_response: Any) -> Any:
        WerkzeugRequest(environ).get_data()
        return wsgi_app(environ, start_response)

    return app


@pytest.fixture(params=["fastapi", "flask"])
def misordered(request: pytest.FixtureRequest, server: Server) -> Iterator[Tuple[int, AppState]]:
    """A framework's app whose body is read by something mounted before the middleware."""
    state = AppState()
    if request.param == "fastapi":
        app = fastapi_app(state, alice_async(server))
        app.add_middleware(ReadsBodyFirst)  # added last: outermost, so it runs before ours
        with serve_asgi(app) as port:
            yield port, state
    else:
        with server.client("alice") as client:
            app = flask_app(state, client)
            app.wsgi_app = reads_body_first(app.wsgi_app)
            with serve_wsgi(app) as port:
                yield port, state


def test_a_body_read_before_the_middleware_is_a_500_at_once_and_claims_nothing(
    misordered: Tuple[int, AppState], alice: idemd.Client, caplog: pytest.LogCaptureFixture
) -> None:
    port, state = misordered
    caplog.set_level(logging.ERROR, logger="idemd")
    for attempt in range(2):
        key = secrets.token_hex(8)
        started = time.monotonic()
        status, headers, body = post(port, "/misordered/m1", b'{"amount": 4200}',
                                     {"Idempotency-Key": key, "Content-Type": "application/json"})
        elapsed = time.monotonic() - started
        assert status == 500, body
        assert headers["content-type"] == "application/problem+json"
        problem = json.loads(body)
        assert (problem["type"], problem["title"], problem["status"]) == (
            "https://idemd.dev/problems/middleware_order", "Internal Server Error", 500)
        assert "read before the idempotency middleware saw it" in problem["detail"], problem
        assert elapsed < 1.0, f"answered after {elapsed:.2f} s"
        assert state.of("/misordered/m1") == 0, "the handler ran"
        with pytest.raises(idemd.RpcError) as missing:
            alice.lookup(idemd.pb.LookupRequest(endpoint="POST /misordered/m1", key=key))
        assert missing.value.code == grpc.StatusCode.NOT_FOUND, "the key was claimed"
    logged = [r for r in caplog.records if r.name == "idemd" and "body parser" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR, [r.getMessage() for r in caplog.records]
    # A request without a body has nothing a parser could have taken: not mistaken for one.
    status, _, body = post(port, "/misordered/m2", b"", {"Idempotency-Key": secrets.token_hex(8)})
    assert status == 201, body
    assert state.of("/misordered/m2") == 1
