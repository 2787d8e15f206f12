"""``@idempotent``: execute-once for work that is not an HTTP request (a
queue consumer, a scheduled job), the key taken from the function's
arguments.

::

    @idempotent(client, "orders.consume", key="message_id")
    def consume(message_id: str, order: dict) -> dict:
        return ship(order)

The function runs at most once per key; a call with a key that already ran
returns the stored return value (JSON: the function must return something
``json.dumps`` accepts, and a replay returns its ``json.loads``). With an
:class:`idemd.aio.AsyncClient` the wrapper is a coroutine function (the
function itself may be sync or async). Raising :class:`idemd.NoSideEffect`
releases the key; any other exception leaves it UNKNOWN. A call with the same
key but another ``payload`` raises :class:`idemd.KeyReuseError`.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any, Callable, Optional, Union

from .aio import AsyncClient
from .client import Client
from .types import Execution, Request, Response

__all__ = ["idempotent"]

KeyOf = Union[str, Callable[..., str]]


def idempotent(
    client: Union[Client, AsyncClient],
    endpoint: str,
    *,
    key: KeyOf,
    payload: Optional[Callable[..., Any]] = None,
    max_wait: float = 5.0,
    ttl: Optional[float] = None,
    lease: Optional[float] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wraps a function so it runs once per key.

    ``key`` names the argument holding the key, or is a function of the
    call's arguments returning it. ``payload``, a function of the same
    arguments, gives what a retry must repeat (bytes, str or anything
    JSON-serialisable); its fingerprint is computed here, so it never leaves
    the process. Without it, only the key identifies the work.
    """

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(function)
        if isinstance(key, str) and key not in signature.parameters:
            raise TypeError(f"idempotent: {function.__qualname__} has no argument {key!r} (key=)")

        def prepare(args: tuple, kwargs: dict) -> tuple:
            if isinstance(key, str):
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                value = bound.arguments[key]
            else:
                value = key(*args, **kwargs)
            if not isinstance(value, str):
                raise TypeError(f"idempotent: the key must be a str, not {type(value).__name__}")
            body, content_type = (b"", "") if payload is None else _bytes(payload(*args, **kwargs))
            return value, Request("CALL", endpoint, body, content_type)

        if isinstance(client, AsyncClient):

            @functools.wraps(function)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                value, request = prepare(args, kwargs)

                async def handler(execution: Execution) -> Response:
                    out = function(*args, **kwargs)
                    if inspect.isawaitable(out):
                        out = await out
                    return _stored(out)

                result = await client.execute_once(
                    endpoint, value, request, handler, max_wait=max_wait, fingerprint="local", ttl=ttl, lease=lease
                )
                return json.loads(result.response.body)

            return run_async

        if inspect.iscoroutinefunction(function):
            raise TypeError("idempotent: an async function needs an idemd.aio.AsyncClient")

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            value, request = prepare(args, kwargs)
            result = client.execute_once(
                endpoint, value, request, lambda execution: _stored(function(*args, **kwargs)),
                max_wait=max_wait, fingerprint="local", ttl=ttl, lease=lease,
            )
            return json.loads(result.response.body)

        return run

    return decorate


def _bytes(value: Any) -> tuple:
    """The payload's bytes and content type: JSON values are canonicalised by
    the fingerprint (key order and number spelling do not matter)."""
    if isinstance(value, bytes):
        return value, ""
    if isinstance(value, str):
        return value.encode("utf-8"), ""
    return json.dumps(value).encode("utf-8"), "application/json"


def _stored(value: Any) -> Response:
    return Response(200, [("content-type", "application/json")], json.dumps(value).encode("utf-8"))
