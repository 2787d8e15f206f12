"""MessageProcessor.process_batch against the live idemd (as clients/go/consume_batch_test.go):
outcomes as process()'s, the orderings, the crash bound's mechanism (only the window in hand is
claimed), heartbeats of slow handlers, and the fallback against a server without ClaimBatch."""

from __future__ import annotations

import collections
import os
import secrets
import threading
import time
from typing import Dict, List, Optional, Set, Tuple

import pytest

import idemd
from idemd import Message, MessageProcessor, Ordering, Outcome, pb

from conftest import start_server

ENDPOINT = "kafka:batch"


def poll(prefix: str, n: int, partitions: int) -> List[Message]:
    """n messages over partitions 0..partitions-1 (offset = index), keys prefix-i, value {"n":i}."""
    return [Message(b'{"n":%d}' % i, [("idempotency-key", f"{prefix}-{i}".encode())], "payments",
                    i % partitions, i) for i in range(n)]


class Ledger:
    """Each message value's handler runs, and the dead letters (the hook may run concurrently)."""

    def __init__(self, fail: Set[bytes] = frozenset()) -> None:
        self.lock = threading.Lock()
        self.runs: Dict[bytes, int] = collections.Counter()
        self.dead: List[Tuple[bytes, str]] = []
        self.fail = fail

    def handler(self, message: Message) -> None:
        with self.lock:
            self.runs[message.value] += 1
        if message.value in self.fail:
            raise RuntimeError(f"poison {message.value.decode()}")

    def dead_letter(self, message: Message, reason: str) -> None:
        with self.lock:
            self.dead.append((message.value, reason))


def processor(client: idemd.Client, ledger: Ledger, **kwargs) -> MessageProcessor:
    return MessageProcessor(client, ENDPOINT, key_header="idempotency-key", dead_letter=ledger.dead_letter, **kwargs)


def new_prefix() -> str:
    return "py-batch-" + secrets.token_hex(6)


def counts(outs) -> Dict[Outcome, int]:
    return collections.Counter(o.outcome for o in outs)


def state(client: idemd.Client, key: str) -> str:
    try:
        record = client.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=key)).record
    except idemd.RpcError as error:
        return error.code.name
    return pb.State.Name(record.state).removeprefix("STATE_")


def test_each_key_runs_once_repeats_are_duplicates_and_poison_is_dead_lettered(alice: idemd.Client) -> None:
    # 700 messages (two ClaimBatch chunks in one window), 3 repeats of an earlier message's key
    # and value (a producer retry), 2 poison.
    poison = {b'{"n":5}', b'{"n":600}'}
    ledger = Ledger(poison)
    helper = processor(alice, ledger)
    msgs = poll(new_prefix(), 700, 4)
    msgs += [msgs[10], msgs[20], msgs[30]]
    outs = helper.process_batch(msgs, ledger.handler, parallelism=1000)
    assert len(outs) == len(msgs)
    for i, out in enumerate(outs):
        want = Outcome.DUPLICATE if i >= 700 else Outcome.DEAD_LETTERED if msgs[i].value in poison else Outcome.EXECUTED
        assert out.outcome is want, (i, out)
        assert out.key == f"{msgs[i].headers[0][1].decode()}"
    assert counts(outs) == {Outcome.EXECUTED: 698, Outcome.DUPLICATE: 3, Outcome.DEAD_LETTERED: 2}
    assert len(ledger.runs) == 700 and set(ledger.runs.values()) == {1}
    assert sorted(v for v, _ in ledger.dead) == sorted(poison)
    assert all(reason == f"RuntimeError: poison {v.decode()}" for v, reason in ledger.dead), ledger.dead
    assert outs[5].reason == 'RuntimeError: poison {"n":5}'

    # Redelivered: nothing runs; the poison is dead-lettered again as outcome unknown.
    again = processor(alice, ledger).process_batch(msgs, ledger.handler)
    assert counts(again) == {Outcome.DUPLICATE: 701, Outcome.DEAD_LETTERED: 2}
    assert len(ledger.runs) == 700 and set(ledger.runs.values()) == {1}
    for value, reason in ledger.dead[2:]:
        assert value in poison and "outcome unknown" in reason and "poison" in reason, reason
    # And the single helper agrees (the same fingerprint): a duplicate, not a key reuse.
    single = helper.process(msgs[1], ledger.handler)
    assert single.outcome is Outcome.DUPLICATE


def test_per_partition_keeps_offset_order_and_a_held_key_blocks_its_partition(alice: idemd.Client) -> None:
    ledger = Ledger()
    helper = processor(alice, ledger, max_wait=0.2)
    prefix = new_prefix()
    msgs = poll(prefix, 60, 3)
    # Another consumer holds message 30's key (partition 0) past max_wait.
    sha = idemd.fingerprint_v1("CONSUME", ENDPOINT, b'{"n":30}')
    held = alice.claim(pb.ClaimRequest(endpoint=ENDPOINT, key=f"{prefix}-30", sha256=sha, attempt_id="other",
                                       lease=idemd._grpc_util.duration(30)))
    assert held.WhichOneof("outcome") == "claimed"

    lock = threading.Lock()
    last: Dict[int, int] = {}
    running = [0, 0]  # now, most
    out_of_order: List[str] = []

    def handler(message: Message) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
            if message.partition in last and message.offset <= last[message.partition]:
                out_of_order.append(f"partition {message.partition}: {message.offset} after {last[message.partition]}")
            last[message.partition] = message.offset
        time.sleep(0.002)
        with lock:
            running[0] -= 1

    outs = helper.process_batch(msgs, handler, ordering=Ordering.PER_PARTITION)
    for i, out in enumerate(outs):
        want = Outcome.RETRY if i % 3 == 0 and i >= 30 else Outcome.EXECUTED
        assert out.outcome is want, (i, out)
    assert outs[30].reason == "another consumer holds the key"
    assert outs[33].reason == "an earlier message of its partition must be retried first"
    assert out_of_order == []
    assert running[1] <= 3, f"{running[1]} handlers ran at once over 3 partitions"
    assert last[0] == 27
    assert state(alice, f"{prefix}-33") == "NOT_FOUND"  # never claimed


def test_only_the_window_in_hand_is_claimed(alice: idemd.Client) -> None:
    ledger = Ledger()
    helper = processor(alice, ledger)
    prefix = new_prefix()
    msgs = poll(prefix, 20, 1)
    release = threading.Event()
    started = [0]
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            started[0] += 1
            first = started[0] <= 4
        if first:
            assert release.wait(20)

    result: List[list] = []
    worker = threading.Thread(target=lambda: result.append(helper.process_batch(msgs, handler, parallelism=4)))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while started[0] < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert started[0] == 4
        time.sleep(0.1)  # a wrongly eager claim would have the time to land
        assert started[0] == 4
        for i in range(20):
            want = "IN_PROGRESS" if i < 4 else "NOT_FOUND"
            assert state(alice, f"{prefix}-{i}") == want, i
    finally:
        release.set()
        worker.join(30)
    assert counts(result[0]) == {Outcome.EXECUTED: 20}


def test_slow_handlers_keep_their_leases(alice: idemd.Client) -> None:
    ledger = Ledger()
    helper = processor(alice, ledger, lease=1.0)
    msgs = poll(new_prefix(), 8, 2)
    started = time.monotonic()
    outs = helper.process_batch(msgs, lambda m: time.sleep(2.5))
    assert [o.outcome for o in outs] == [Outcome.EXECUTED] * 8, outs
    assert time.monotonic() - started < 10  # side by side
    assert ledger.dead == []


def test_values_and_no_side_effect_as_process(alice: idemd.Client) -> None:
    ledger = Ledger()
    helper = processor(alice, ledger)
    msgs = poll(new_prefix(), 4, 2)
    reuse = Message(b'{"other":1}', msgs[0].headers, "payments", 0, 9)

    def handler(message: Message) -> Optional[dict]:
        if message.offset == 1:
            raise idemd.NoSideEffect("rejected before any side effect")
        return {"n": message.offset}

    outs = helper.process_batch(msgs + [reuse], handler)
    assert [(o.outcome, o.value) for o in outs] == [
        (Outcome.EXECUTED, {"n": 0}), (Outcome.DEAD_LETTERED, None), (Outcome.EXECUTED, {"n": 2}),
        (Outcome.EXECUTED, {"n": 3}), (Outcome.DEAD_LETTERED, None)]
    assert outs[4].reason == "key reuse: the key was already used with another message value"
    again = helper.process_batch(msgs, handler)
    # The released key runs again; the others replay their stored values.
    assert [(o.outcome, o.value) for o in again] == [
        (Outcome.DUPLICATE, {"n": 0}), (Outcome.DEAD_LETTERED, None), (Outcome.DUPLICATE, {"n": 2}),
        (Outcome.DUPLICATE, {"n": 3})]


def test_a_message_without_a_key_raises_before_anything_is_claimed(alice: idemd.Client) -> None:
    ledger = Ledger()
    prefix = new_prefix()
    msgs = poll(prefix, 3, 1) + [Message(b"{}", [], "payments", 0, 3)]
    with pytest.raises(idemd.MissingKeyError):
        processor(alice, ledger).process_batch(msgs, ledger.handler)
    assert state(alice, f"{prefix}-0") == "NOT_FOUND" and not ledger.runs


def test_what_process_raises_is_raised_once_nothing_is_in_flight(alice: idemd.Client) -> None:
    ledger = Ledger({b'{"n":2}'})

    def hook(message: Message, reason: str) -> None:
        raise RuntimeError("the dead-letter queue is down")

    helper = MessageProcessor(alice, ENDPOINT, key_header="idempotency-key", dead_letter=hook)
    with pytest.raises(RuntimeError, match="dead-letter queue is down"):
        helper.process_batch(poll(new_prefix(), 40, 2), ledger.handler, parallelism=8)
    assert ledger.runs[b'{"n":2}'] == 1 and set(ledger.runs.values()) == {1}


def test_idemd_unreachable_is_retry_for_every_message() -> None:
    ledger = Ledger()
    with idemd.Client("127.0.0.1:1", token="t", insecure=True, timeout=1,
                      retry=idemd.RetryPolicy(attempts=1)) as down:
        outs = processor(down, ledger).process_batch(poll(new_prefix(), 5, 2), ledger.handler,
                                                     ordering=Ordering.PER_PARTITION)
    assert [(o.outcome, o.may_commit) for o in outs] == [(Outcome.RETRY, False)] * 5
    assert outs[0].reason == "idemd: UNAVAILABLE" and not ledger.runs


def test_falls_back_to_process_on_a_server_without_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    previous = os.environ.get("IDEMD_PREVIOUS_BIN")
    if not previous:
        pytest.skip("IDEMD_PREVIOUS_BIN is unset (clients/python/test.sh sets it from scripts/previous-release.sh)")
    monkeypatch.setenv("IDEMD_BIN", previous)
    poison = {b'{"n":7}'}
    ledger = Ledger(poison)
    with start_server() as old, old.client("alice") as client:
        with pytest.raises(idemd.RpcError) as refused:
            client.claim_batch(pb.ClaimBatchRequest(endpoint=ENDPOINT))
        assert refused.value.code.name == "UNIMPLEMENTED"
        msgs = poll(new_prefix(), 30, 3)
        msgs.append(msgs[4])
        outs = processor(client, ledger).process_batch(msgs, ledger.handler)
    for i, out in enumerate(outs):
        want = Outcome.DUPLICATE if i == 30 else Outcome.DEAD_LETTERED if i == 7 else Outcome.EXECUTED
        assert out.outcome is want, (i, out)
    assert len(ledger.runs) == 30 and set(ledger.runs.values()) == {1}


def test_the_async_processor_has_the_same_outcomes_and_window(server) -> None:
    import asyncio

    from idemd.aio import AsyncClient

    from conftest import CREDENTIALS

    poison = {b'{"n":3}'}
    ledger = Ledger(poison)

    async def main() -> None:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True) as client:
            helper = idemd.AsyncMessageProcessor(client, ENDPOINT, key_header="idempotency-key",
                                                 dead_letter=ledger.dead_letter)
            prefix = new_prefix()
            msgs = poll(prefix, 600, 4)
            msgs.append(msgs[9])
            outs = await helper.process_batch(msgs, ledger.handler, parallelism=700)
            for i, out in enumerate(outs):
                want = Outcome.DUPLICATE if i == 600 else Outcome.DEAD_LETTERED if i == 3 else Outcome.EXECUTED
                assert out.outcome is want, (i, out)
            assert len(ledger.runs) == 600 and set(ledger.runs.values()) == {1}
            again = await helper.process_batch(msgs[:10], ledger.handler, ordering=Ordering.PER_PARTITION)
            assert [o.outcome for o in again] == [Outcome.DUPLICATE] * 3 + [Outcome.DEAD_LETTERED] + [Outcome.DUPLICATE] * 6

            # Only the window in hand is claimed while its (coroutine) handlers wait.
            prefix = new_prefix()
            release = asyncio.Event()
            started = []

            async def handler(message: Message) -> dict:
                started.append(message.offset)
                if len(started) <= 4:
                    await release.wait()
                await asyncio.sleep(0.001)
                return {"offset": message.offset}

            run = asyncio.ensure_future(helper.process_batch(poll(prefix, 12, 1), handler, parallelism=4))
            for _ in range(1000):
                if len(started) >= 4:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert sorted(started) == [0, 1, 2, 3]
            for i in range(12):
                try:
                    record = (await client.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=f"{prefix}-{i}"))).record
                    got = pb.State.Name(record.state).removeprefix("STATE_")
                except idemd.RpcError as error:
                    got = error.code.name
                assert got == ("IN_PROGRESS" if i < 4 else "NOT_FOUND"), i
            release.set()
            outs = await run
            assert [(o.outcome, o.value) for o in outs] == [(Outcome.EXECUTED, {"offset": i}) for i in range(12)]

    asyncio.run(main())
