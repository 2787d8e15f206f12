"""MessageProcessor (idemd.messages) against the live idemd: every outcome a
consumer loop acts on, and each way an earlier attempt sends a delivery to the
dead-letter hook instead of running it again."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import List, Tuple

import pytest

import idemd
from idemd import Message, MessageProcessor, Outcome, pb
from idemd.aio import AsyncClient

from conftest import CREDENTIALS, Server

TAKEOVER = "POST /v1/takeover"  # on_expired_lease = "takeover" in clients/conformance/idemd.toml


def message(key: str, value: bytes = b'{"n":1}', **kwargs) -> Message:
    return Message(value, [("other", b"x"), ("idempotency-key", key.encode())], **kwargs)


class Recorder:
    def __init__(self) -> None:
        self.runs: List[bytes] = []
        self.dead: List[Tuple[bytes, str]] = []

    def handler(self, message: Message) -> dict:
        self.runs.append(message.value)
        return {"charged": len(self.runs)}

    def dead_letter(self, message: Message, reason: str) -> None:
        self.dead.append((message.value, reason))


def processor(client, recorder: Recorder, endpoint: str = "kafka:test", **kwargs) -> MessageProcessor:
    kwargs.setdefault("key_header", "idempotency-key")
    return MessageProcessor(client, endpoint, dead_letter=recorder.dead_letter, **kwargs)


def new_key() -> str:
    return "py-msg-" + secrets.token_hex(8)


def claim_and_abandon(client: idemd.Client, endpoint: str, key: str, value: bytes, lease: float) -> None:
    """A consumer that claimed the key and died inside its handler."""
    claim = idemd.Request("CONSUME", endpoint, value)
    sha = idemd.fingerprint_v1(claim.method, claim.path, claim.body_bytes, "", [])
    got = client.claim(pb.ClaimRequest(endpoint=endpoint, key=key, sha256=sha, attempt_id="dead-consumer",
                                       lease=idemd._grpc_util.duration(lease)))
    assert got.WhichOneof("outcome") == "claimed"


def test_first_delivery_executes_and_a_redelivery_is_a_duplicate(alice: idemd.Client) -> None:
    seen = Recorder()
    helper = processor(alice, seen)
    key = new_key()
    first = helper.process(message(key, partition=0, offset=1), seen.handler)
    again = helper.process(message(key, partition=1, offset=7), seen.handler)
    assert (first.outcome, first.value, first.may_commit) == (Outcome.EXECUTED, {"charged": 1}, True)
    assert (again.outcome, again.value, again.may_commit) == (Outcome.DUPLICATE, {"charged": 1}, True)
    assert len(seen.runs) == 1 and seen.dead == []


def test_a_handler_that_raises_is_dead_lettered_with_the_stored_reason_and_never_rerun(alice: idemd.Client) -> None:
    seen = Recorder()
    helper = processor(alice, seen)
    key = new_key()

    def poison(message: Message) -> None:
        seen.runs.append(message.value)
        raise RuntimeError("poison message 4")

    first = helper.process(message(key), poison)
    again = helper.process(message(key), poison)
    assert (first.outcome, first.reason, first.may_commit) == (Outcome.DEAD_LETTERED, "RuntimeError: poison message 4", True)
    assert again.outcome is Outcome.DEAD_LETTERED
    assert again.reason == "outcome unknown (UNKNOWN): RuntimeError: poison message 4"
    assert len(seen.runs) == 1 and [r for _, r in seen.dead] == [first.reason, again.reason]
    record = alice.lookup(pb.LookupRequest(endpoint="kafka:test", key=key)).record
    assert (record.state, record.reason) == (pb.STATE_UNKNOWN, "RuntimeError: poison message 4")


def test_no_side_effect_dead_letters_and_releases_the_key_for_a_redrive(alice: idemd.Client) -> None:
    seen = Recorder()
    helper = processor(alice, seen)
    key = new_key()

    def refuse(message: Message) -> None:
        raise idemd.NoSideEffect("rejected before charging")

    first = helper.process(message(key), refuse)
    redrive = helper.process(message(key), seen.handler)
    assert (first.outcome, first.reason) == (Outcome.DEAD_LETTERED, "NoSideEffect: rejected before charging")
    assert redrive.outcome is Outcome.EXECUTED and len(seen.runs) == 1


def test_the_same_key_with_another_value_is_dead_lettered(alice: idemd.Client) -> None:
    seen = Recorder()
    helper = processor(alice, seen)
    key = new_key()
    helper.process(message(key, b'{"amount":100}'), seen.handler)
    reused = helper.process(message(key, b'{"amount":999}'), seen.handler)
    assert reused.outcome is Outcome.DEAD_LETTERED and "key reuse" in reused.reason
    assert seen.runs == [b'{"amount":100}'] and seen.dead == [(b'{"amount":999}', reused.reason)]


def test_a_consumer_that_died_holding_the_key_sends_it_to_the_dead_letters(alice: idemd.Client) -> None:
    seen = Recorder()
    key = new_key()
    claim_and_abandon(alice, "kafka:test", key, b'{"n":1}', lease=0.5)
    time.sleep(0.7)
    out = processor(alice, seen).process(message(key), seen.handler)
    assert out.outcome is Outcome.DEAD_LETTERED and out.may_commit
    assert out.reason.startswith("outcome unknown (IN_PROGRESS): lease expired"), out.reason
    assert seen.runs == [] and len(seen.dead) == 1


def test_a_takeover_after_an_expired_lease_is_dead_lettered_not_run(alice: idemd.Client) -> None:
    seen = Recorder()
    key = new_key()
    claim_and_abandon(alice, TAKEOVER, key, b'{"n":1}', lease=0.5)
    time.sleep(0.7)
    helper = processor(alice, seen, endpoint=TAKEOVER)
    out = helper.process(message(key), seen.handler)
    assert out.outcome is Outcome.DEAD_LETTERED
    assert out.reason.startswith("outcome unknown: attempt 2 took over"), out.reason
    assert seen.runs == []
    # Recorded as UNKNOWN: later deliveries are dead-lettered too, never run.
    record = alice.lookup(pb.LookupRequest(endpoint=TAKEOVER, key=key)).record
    assert record.state == pb.STATE_UNKNOWN
    assert helper.process(message(key), seen.handler).outcome is Outcome.DEAD_LETTERED and seen.runs == []


def test_a_key_held_by_another_consumer_past_max_wait_is_retry(alice: idemd.Client) -> None:
    seen = Recorder()
    key = new_key()
    claim_and_abandon(alice, "kafka:test", key, b'{"n":1}', lease=10)
    started = time.monotonic()
    out = processor(alice, seen, max_wait=0.3).process(message(key), seen.handler)
    assert (out.outcome, out.may_commit) == (Outcome.RETRY, False)
    assert time.monotonic() - started < 3
    assert seen.runs == [] and seen.dead == []


def test_idemd_unreachable_is_retry() -> None:
    seen = Recorder()
    with idemd.Client("127.0.0.1:1", token="t", insecure=True, timeout=1,
                      retry=idemd.RetryPolicy(attempts=1)) as down:
        out = processor(down, seen).process(message(new_key()), seen.handler)
    assert (out.outcome, out.may_commit) == (Outcome.RETRY, False) and "UNAVAILABLE" in out.reason
    assert seen.runs == [] and seen.dead == []


def test_a_handler_slower_than_its_lease_keeps_the_key_while_a_duplicate_waits(alice: idemd.Client) -> None:
    seen = Recorder()
    key = new_key()
    slow = processor(alice, seen, lease=1.0)
    results = {}

    def run_slow() -> None:
        results["slow"] = slow.process(message(key), lambda m: (time.sleep(2.5), seen.handler(m))[1])

    thread = threading.Thread(target=run_slow)
    thread.start()
    time.sleep(0.3)
    results["waiting"] = processor(alice, seen, lease=1.0, max_wait=8).process(message(key), seen.handler)
    thread.join()
    assert results["slow"].outcome is Outcome.EXECUTED
    assert results["waiting"].outcome is Outcome.DUPLICATE
    assert len(seen.runs) == 1 and seen.dead == []


def test_a_failing_dead_letter_hook_propagates(alice: idemd.Client) -> None:
    def hook(message: Message, reason: str) -> None:
        raise OSError("dead-letter topic unavailable")

    helper = MessageProcessor(alice, "kafka:test", key_header="idempotency-key", dead_letter=hook)
    with pytest.raises(OSError, match="dead-letter topic"):
        helper.process(message(new_key()), lambda m: 1 / 0)


def test_keys_come_from_the_named_header_or_the_position(alice: idemd.Client) -> None:
    seen = Recorder()
    by_header = processor(alice, seen)
    assert by_header.key_of(Message(b"", [("idempotency-key", b"a"), ("idempotency-key", "b")])) == "b"
    with pytest.raises(idemd.MissingKeyError, match="no 'idempotency-key' header"):
        by_header.process(Message(b"v", [("message-id", b"m1")]), seen.handler)
    by_position = processor(alice, seen, key_header=None, key_by_position=True)
    assert by_position.key_of(Message(b"", [], "orders", 3, 42)) == "orders-3-42"
    # Topics may hold "." and "_", keys may not hold "."; distinct topics stay distinct keys.
    assert by_position.key_of(Message(b"", [], "eu.orders_v2", 0, 7)) == "eu_dorders__v2-0-7"
    assert by_position.key_of(Message(b"", [], "eu_dorders", 0, 7)) == "eu__dorders-0-7"
    topic = "position-" + secrets.token_hex(4) + ".orders"
    delivered = Message(b'{"n":1}', [], topic, 1, 9)
    assert [by_position.process(delivered, seen.handler).outcome for _ in range(2)] == [Outcome.EXECUTED, Outcome.DUPLICATE]
    assert by_position.process(Message(b'{"n":1}', [], topic, 1, 10), seen.handler).outcome is Outcome.EXECUTED
    with pytest.raises(ValueError, match="exactly one key source"):
        processor(alice, seen, key_by_position=True)
    with pytest.raises(ValueError, match="exactly one key source"):
        processor(alice, seen, key_header=None)
    assert len(seen.runs) == 2 and seen.dead == []


def test_the_async_processor_has_the_same_outcomes(server: Server) -> None:
    seen = Recorder()

    async def handler(message: Message) -> dict:
        return seen.handler(message)

    async def hook(message: Message, reason: str) -> None:
        seen.dead_letter(message, reason)

    async def main() -> list:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True) as client:
            helper = idemd.AsyncMessageProcessor(client, "kafka:test", key_header="idempotency-key", dead_letter=hook)
            key, poison = new_key(), new_key()
            return [
                await helper.process(message(key), handler),
                await helper.process(message(key), handler),
                await helper.process(message(poison), lambda m: 1 / 0),
            ]

    outcomes = asyncio.run(main())
    assert [o.outcome for o in outcomes] == [Outcome.EXECUTED, Outcome.DUPLICATE, Outcome.DEAD_LETTERED]
    assert outcomes[1].value == {"charged": 1} and outcomes[2].reason == "ZeroDivisionError: division by zero"
    assert len(seen.runs) == 1 and [r for _, r in seen.dead] == [outcomes[2].reason]


def test_the_default_lease_is_the_consumer_default_not_the_policys(server: Server, alice: idemd.Client) -> None:
    """MessageProcessor and AsyncMessageProcessor ask for idemd.DEFAULT_LEASE (5 s), not the
    endpoint policy's lease (10 s in the conformance idemd.toml), in process and process_batch
    alike: a consumer killed inside its handler holds the redelivered message about that long
    (issue 52)."""
    left: List[float] = []

    def remaining(message: Message) -> None:
        key = dict(message.headers)["idempotency-key"].decode()
        expires = alice.lookup(pb.LookupRequest(endpoint="kafka:test", key=key)).record.lease_expires_at
        left.append(expires.seconds + expires.nanos / 1e9 - time.time())

    seen = Recorder()
    helper = processor(alice, seen)
    assert helper.process(message(new_key()), remaining).outcome is Outcome.EXECUTED
    outs = helper.process_batch([message(new_key()), message(new_key())], remaining)
    assert [o.outcome for o in outs] == [Outcome.EXECUTED] * 2

    async def main() -> list:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True) as client:
            helper = idemd.AsyncMessageProcessor(client, "kafka:test", key_header="idempotency-key",
                                                 dead_letter=seen.dead_letter)
            return [await helper.process(message(new_key()), remaining)] + \
                await helper.process_batch([message(new_key())], remaining)

    assert [o.outcome for o in asyncio.run(main())] == [Outcome.EXECUTED] * 2
    assert len(left) == 5, left
    # Just claimed: about the whole lease left (the clock is the same one).
    assert all(idemd.DEFAULT_LEASE - 2 < d <= idemd.DEFAULT_LEASE + 0.2 for d in left), left
