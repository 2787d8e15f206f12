"""``@idempotent`` (non-HTTP work: a queue consumer), sync and async, against
the live idemd."""

from __future__ import annotations

import asyncio
import secrets

import pytest

import idemd
from idemd.aio import AsyncClient

from conftest import CREDENTIALS, Server


def test_sync_runs_once_per_key_and_replays_the_return_value(alice: idemd.Client) -> None:
    calls = []

    @idemd.idempotent(alice, "orders.consume", key="message_id", payload=lambda message_id, order: order)
    def consume(message_id: str, order: dict) -> dict:
        calls.append(message_id)
        return {"shipped": order["sku"], "call": len(calls)}

    message = secrets.token_hex(8)
    first = consume(message, {"sku": "a-1", "qty": 2})
    again = consume(message, {"qty": 2, "sku": "a-1"})  # redelivered; JSON key order does not matter
    assert first == again == {"shipped": "a-1", "call": 1}
    assert calls == [message]
    with pytest.raises(idemd.KeyReuseError):
        consume(message, {"sku": "b-2", "qty": 1})
    assert len(calls) == 1


def test_sync_no_side_effect_releases_and_other_errors_leave_the_outcome_pending(alice: idemd.Client) -> None:
    attempts = []

    @idemd.idempotent(alice, "orders.refund", key=lambda event: event["id"])
    def refund(event: dict) -> str:
        attempts.append(event["id"])
        if event.get("fail") == "before":
            raise idemd.NoSideEffect("refund refused before anything moved")
        if event.get("fail") == "during":
            raise TimeoutError("the bank did not answer")
        return "ok"

    released = {"id": secrets.token_hex(8), "fail": "before"}
    for _ in range(2):
        with pytest.raises(idemd.NoSideEffect):
            refund(released)
    assert len(attempts) == 2, "released: the retry ran again"

    unknown = {"id": secrets.token_hex(8), "fail": "during"}
    with pytest.raises(TimeoutError):
        refund(unknown)
    with pytest.raises(idemd.OutcomePendingError):
        refund(unknown)
    assert len(attempts) == 3


def test_a_key_argument_that_does_not_exist_is_refused_at_decoration(alice: idemd.Client) -> None:
    with pytest.raises(TypeError, match="no argument 'id'"):

        @idemd.idempotent(alice, "orders.consume", key="id")
        def consume(message_id: str) -> None:
            pass


def test_async_runs_once_under_concurrency(server: Server) -> None:
    async def main() -> None:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True) as client:
            calls = []

            @idemd.idempotent(client, "orders.consume.async", key="message_id", max_wait=5.0)
            async def consume(message_id: str) -> dict:
                calls.append(message_id)
                await asyncio.sleep(0.3)
                return {"done": message_id}

            message = secrets.token_hex(8)
            results = await asyncio.gather(*(consume(message) for _ in range(5)))
            assert results == [{"done": message}] * 5
            assert calls == [message]

            # A sync function under an async client is wrapped too.
            @idemd.idempotent(client, "orders.sync-under-async", key="n")
            def double(n: str) -> int:
                calls.append(n)
                return 2 * len(n)

            assert await double("abc") == await double("abc") == 6
            assert calls.count("abc") == 1

    asyncio.run(main())
