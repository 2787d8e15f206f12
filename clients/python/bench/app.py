"""The middleware load bench's app (bench/scripts/middleware.sh drives it; the
commands are in README.md here): ``POST /pay`` counts its executions and
answers 201 ``{"ok":true,"execution":N}``, served the way the framework runs
in production, with or without the SDK's middleware in front, so the two
runs differ by the middleware alone.

    python bench/app.py --framework fastapi|flask --middleware on|off --port PORT --idemd HOST:PORT

FastAPI runs under uvicorn (one process, its default asyncio loop), Flask
under waitress (its default four threads). When it listens it prints
``listening on PORT`` (PORT 0 picks one) and flushes; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
from typing import Any, Callable

#: The one route the middleware guards; the rest of its settings are defaults
#: (key required, server fingerprint).
ROUTES = [{"path": "/pay"}]
#: idemd serves loopback callers without tokens and takes their tenant from this.
TENANT = "bench"


class Counter:
    """Executions of the handler; a lock because waitress runs views on several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def next(self) -> int:
        with self._lock:
            self._count += 1
            return self._count


def answer(execution: int) -> bytes:
    return json.dumps({"ok": True, "execution": execution}, separators=(",", ":")).encode()


def fastapi_app(address: str, middleware: bool) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI()
    executions = Counter()

    @app.post("/pay")
    async def pay() -> Response:
        return Response(answer(executions.next()), status_code=201, media_type="application/json")

    if middleware:
        from idemd.aio import AsyncClient
        from idemd.asgi import IdempotencyMiddleware

        # A factory: the grpc.aio channel must be made inside uvicorn's loop.
        app.add_middleware(IdempotencyMiddleware, client=lambda: AsyncClient(address, tenant=TENANT, insecure=True),
                           routes=ROUTES)
    return app


def flask_app(address: str, middleware: bool) -> Any:
    import flask

    app = flask.Flask("bench")
    executions = Counter()

    @app.post("/pay")
    def pay() -> flask.Response:
        return flask.Response(answer(executions.next()), status=201, mimetype="application/json")

    if middleware:
        from idemd import Client
        from idemd.wsgi import flask as install

        install(app, Client(address, tenant=TENANT, insecure=True), routes=ROUTES)
    return app


def _exit(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def listening(port: int) -> None:
    print(f"listening on {port}", flush=True)


def serve_fastapi(app: Any, port: int) -> None:
    import asyncio

    import uvicorn

    # Bound here so that port 0 is known before uvicorn starts. uvicorn
    # handles SIGTERM itself (a graceful shutdown), then raises it again for
    # the handler it found, which is this one: exit 0, as the Flask app does.
    signal.signal(signal.SIGTERM, _exit)
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose
    # proto says TCP, and an accepted socket inherits proto 0 otherwise; then
    # uvicorn's two writes per answer (head, body) wait out the client's
    # delayed ACK on a keep-alive connection: 44 ms a request under wrk.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    async def run() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            listening(sock.getsockname()[1])
        await serving

    asyncio.run(run())


def serve_flask(app: Any, port: int) -> None:
    import waitress

    server = waitress.create_server(app, host="127.0.0.1", port=port)
    signal.signal(signal.SIGTERM, _exit)  # waitress has no handler of its own; this ends server.run()
    listening(server.effective_port)
    try:
        server.run()
    finally:
        server.close()


FRAMEWORKS: dict = {"fastapi": (fastapi_app, serve_fastapi), "flask": (flask_app, serve_flask)}


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", required=True, choices=sorted(FRAMEWORKS))
    parser.add_argument("--middleware", required=True, choices=["on", "off"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--idemd", default="127.0.0.1:50051", help="idemd's gRPC address (plaintext)")
    args = parser.parse_args(argv)
    make: Callable[[str, bool], Any]
    make, serve = FRAMEWORKS[args.framework]
    serve(make(args.idemd, args.middleware == "on"), args.port)


if __name__ == "__main__":
    sys.exit(main())
