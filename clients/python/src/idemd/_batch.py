"""MessageProcessor.process_batch: a whole poll's messages with batched, pipelined bookkeeping
(ClaimBatch / CompleteBatch), the algorithm of clients/go/consume_batch.go.

One thread (the caller's) owns a batch's state and runs its scheduler loop; the idemd calls, the
handlers and the dead-letter hook run on the processor's worker threads (:class:`_Pool`), which
report back through a queue of events run on the loop's thread. Claimed handlers are run by a few
runner threads (Batch._drain), not one thread each: see there why.
"""

from __future__ import annotations

import base64
import collections
import enum
import hashlib
import json
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import grpc

from . import _executor as ex
from ._grpc_util import STATUS_DETAILS_KEY, duration, status_error
from ._proto import pb
from .errors import RpcError
from .fingerprint import VERSION_TAG

from ._message_types import Message, Outcome, Processed, stored_response

log = logging.getLogger("idemd")

#: The server's limit of items per ClaimBatch or CompleteBatch.
MAX_BATCH_ITEMS = 500
#: How many messages process_batch has in flight (being claimed, running, being completed) unless
#: told otherwise: enough that a 0 ms handler's bookkeeping rides in batches of dozens to hundreds
#: of keys, few enough that a crash parks at most that many messages (only those whose handler ran).
DEFAULT_PARALLELISM = 256
#: A handler that has run this long counts as blocked: the waiting ones get more runner threads.
BLOCKED_SECONDS = 0.002
#: A worker thread with nothing to do for this long ends.
WORKER_IDLE_SECONDS = 30.0

_CODES = {code.value[0]: code for code in grpc.StatusCode}


class Ordering(enum.Enum):
    """Which messages of a poll :meth:`MessageProcessor.process_batch` may run side by side."""

    #: Messages with different keys side by side (up to ``parallelism``); two with one key one
    #: after the other, in poll order. Side effects of one partition may happen out of offset
    #: order; offsets are still committed in order.
    PER_KEY = "per_key"
    #: Each partition's messages one at a time in offset order, the partitions side by side.
    PER_PARTITION = "per_partition"


def check_options(ordering: Ordering, parallelism: int) -> None:
    """process_batch's arguments, checked before anything is claimed."""
    if parallelism < 1:
        raise ValueError("parallelism must be at least 1")
    if not isinstance(ordering, Ordering):
        raise TypeError("ordering must be idemd.Ordering.PER_KEY or PER_PARTITION")


class _Pool:
    """Worker threads for a processor's batches, started as tasks need them (every task starts at
    once: a claimed handler never waits for a thread) and ended after WORKER_IDLE_SECONDS idle."""

    def __init__(self) -> None:
        self._tasks: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting for a task that no submit has reserved

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        if spawn:
            threading.Thread(target=self._work, args=(task,), name="idemd-batch", daemon=True).start()
        else:
            self._tasks.put(task)

    def _work(self, task: Callable[[], None]) -> None:
        while True:
            task()
            task = None  # type: ignore[assignment]
            with self._lock:
                self._idle += 1
            while task is None:
                try:
                    task = self._tasks.get(timeout=WORKER_IDLE_SECONDS)
                except queue.Empty:
                    with self._lock:
                        if self._idle > 0:  # no submit counts on this worker: end it
                            self._idle -= 1
                            return


def item_error(error: "pb.ItemError") -> RpcError:
    """A batch item's error as the single RPC's :class:`RpcError`, details included."""
    code = _CODES.get(error.code, grpc.StatusCode.UNKNOWN)
    trailing = [(STATUS_DETAILS_KEY, bytes(error.status_details))] if error.status_details else None
    return status_error(code, error.message, trailing)


def item_errors(response: "pb.CompleteBatchResponse", items: int) -> List[Optional[RpcError]]:
    """Each item's error of a CompleteBatch answer (None: completed); an answer with another
    number of results than items raises INTERNAL rather than guess which item is which."""
    if len(response.results) != items:
        raise RpcError(grpc.StatusCode.INTERNAL,
                       f"idemd: CompleteBatch answered {len(response.results)} results for {items} items")
    return [item_error(result.error) if result.WhichOneof("result") == "error" else None
            for result in response.results]


class _Ran:
    """A claimed handler that returned: what to record."""

    __slots__ = ("index", "key", "token", "attempt", "keeper", "stored", "value")

    def __init__(self, index: int, key: str, token: str, attempt: int, keeper: Any, stored: Any, value: Any) -> None:
        self.index, self.key, self.token, self.attempt = index, key, token, attempt
        self.keeper, self.stored, self.value = keeper, stored, value


class _Fatal(Exception):
    """What process() would have raised for a message: process_batch raises it, once nothing is
    in flight."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Batch:
    """One process_batch call's state: only the loop's thread reads or writes it."""

    def __init__(self, processor: Any, pool: _Pool, messages: Sequence["Message"],
                 handler: Callable[["Message"], Any], ordering: Ordering, parallelism: int) -> None:
        self.p = processor
        self.client = processor.client
        self.pool = pool
        self.msgs = list(messages)
        self.handler = handler
        self.ordering = ordering
        self.parallelism = parallelism
        n = len(self.msgs)
        # Keys first: a message without one raises before anything is claimed, as process() raises.
        self.keys = [processor.key_of(m) for m in self.msgs]
        self.outs: List[Optional["Processed"]] = [None] * n
        self.active = [False] * n
        self.in_flight = 0
        self.undecided = n
        self.active_keys: Dict[str, int] = {}
        self.blocked: Dict[int, bool] = {}
        self.prev_same_key = [-1] * n
        last: Dict[str, int] = {}
        self.partitions: List[int] = []
        self.by_partition: Dict[int, List[int]] = {}
        self.heads: Dict[int, int] = {}
        for i, key in enumerate(self.keys):
            self.prev_same_key[i] = last.get(key, -1)
            last[key] = i
            part = self.msgs[i].partition
            if part not in self.by_partition:
                self.partitions.append(part)
                self.by_partition[part] = []
                self.heads[part] = 0
            self.by_partition[part].append(i)
        self.lo = 0
        self.fallback = False
        self.fatal: Optional[BaseException] = None
        self.events: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()
        self.running = 0
        self.claiming = 0
        self.finished: List[_Ran] = []
        self.endpoint = processor.endpoint
        prefix = hashlib.sha256()
        for part in (VERSION_TAG, b"CONSUME", self.endpoint.encode("utf-8")):
            prefix.update(len(part).to_bytes(8, "big"))
            prefix.update(part)
        self.fingerprint_prefix = prefix
        self.lease_pb = None if processor.lease is None else duration(processor.lease)
        self.ttl_pb = None if processor.ttl is None else duration(processor.ttl)
        self.empty_response = ex.response_to_pb(stored_response(None))
        # Claimed handlers waiting for a runner thread, and the runners (_drain).
        self.ready: "collections.deque[Callable[[], None]]" = collections.deque()
        self.ready_lock = threading.Lock()
        self.runners = 0
        self.report_every = max(1, parallelism // 8)
        self.running_since: List[List[float]] = []

    # -- the loop -----------------------------------------------------------

    def run(self) -> List["Processed"]:
        while self.undecided > 0:
            if not self.step():
                break
            if self.ready:  # handlers waiting for a runner: look again in a tick
                try:
                    event = self.events.get(timeout=BLOCKED_SECONDS)
                except queue.Empty:
                    self.nudge()
                    continue
                event()
                self.nudge()
            else:
                self.events.get()()
            while True:  # what else has arrived, before the next decisions
                try:
                    event = self.events.get_nowait()
                except queue.Empty:
                    break
                event()
        if self.fatal is not None:
            raise self.fatal
        return self.outs  # type: ignore[return-value]

    def step(self) -> bool:
        """One round of decisions, shared by the thread and the asyncio loops: claim for the free
        slots (a chunk of them, or whatever is free once nothing else is under way), flush the
        finished handlers' completions, and say whether anything is still in flight (False: the
        loop ends; raises the fatal error if one stopped it)."""
        chunk = max(1, self.parallelism // 8)
        free = self.parallelism - self.in_flight
        if self.fatal is None and (free >= chunk or (free > 0 and self.claiming == 0 and self.running == 0)):
            picked = self.pick(free)
            if picked:
                self.start(picked)
        if self.finished and (len(self.finished) >= chunk or self.running == 0):
            self.complete(self.finished)
            self.finished = []
        if self.in_flight > 0:
            return True
        if self.fatal is not None:
            raise self.fatal
        # Unreachable (pick always finds the first undecided message of a key), but never return
        # a message without an outcome.
        for i, out in enumerate(self.outs):
            if out is None:
                self.decide(i, Processed(Outcome.RETRY, self.keys[i],
                                         "idemd: process_batch could not start this message"))
        return False

    def decide(self, i: int, out: "Processed") -> None:

        if self.outs[i] is None:
            self.undecided -= 1
        self.outs[i] = out
        if self.active[i]:
            self.active[i] = False
            self.in_flight -= 1
            key = self.keys[i]
            left = self.active_keys[key] - 1
            if left:
                self.active_keys[key] = left
            else:
                del self.active_keys[key]
        if out.outcome is Outcome.RETRY and self.ordering is Ordering.PER_PARTITION:
            self.blocked[self.msgs[i].partition] = True
        self.p._log(out)

    def set_fatal(self, i: int, error: BaseException) -> None:
        """What process() would raise for message i: nothing new starts; raised once nothing is
        in flight. Message i leaves the flight undecided."""
        if self.fatal is None:
            self.fatal = error
        if self.active[i]:
            self.active[i] = False
            self.in_flight -= 1
            key = self.keys[i]
            left = self.active_keys[key] - 1
            if left:
                self.active_keys[key] = left
            else:
                del self.active_keys[key]

    def pick(self, limit: int) -> List[int]:
        """Up to limit messages to start, in poll order: undecided, not in flight, no message with
        its key in flight or undecided before it; PER_PARTITION: only a partition's first
        undecided message. Costs about what it skips over, not the whole poll."""

        outs, active, active_keys, keys, prev = self.outs, self.active, self.active_keys, self.keys, self.prev_same_key

        def eligible(i: int) -> bool:
            if outs[i] is not None or active[i] or keys[i] in active_keys:
                return False
            before = prev[i]
            return before < 0 or outs[before] is not None

        picked: List[int] = []
        if self.ordering is Ordering.PER_PARTITION:
            for part in self.partitions:
                queue_, head = self.by_partition[part], self.heads[part]
                while head < len(queue_) and outs[queue_[head]] is not None:
                    head += 1
                if self.blocked.get(part):
                    for i in queue_[head:]:
                        if outs[i] is None and not active[i]:
                            self.decide(i, Processed(Outcome.RETRY, keys[i],
                                                     "an earlier message of its partition must be retried first"))
                    head = len(queue_)
                self.heads[part] = head
                if head < len(queue_) and len(picked) < limit and eligible(queue_[head]):
                    picked.append(queue_[head])
            return picked
        n = len(self.msgs)
        while self.lo < n and outs[self.lo] is not None:
            self.lo += 1
        i = self.lo
        while i < n and len(picked) < limit:
            if eligible(i):  # a later message of a picked key is not: its earlier one is undecided
                picked.append(i)
            i += 1
        return picked

    # -- claims ---------------------------------------------------------------

    def claim_request(self, i: int, random16: bytes) -> "pb.ClaimRequest":
        """What process() would claim for message i (the batch's endpoint); the attempt id as
        ex.new_attempt_id makes it, from random16."""
        value = bytes(self.msgs[i].value)
        h = self.fingerprint_prefix.copy()
        h.update(len(value).to_bytes(8, "big"))
        h.update(value)
        attempt_id = base64.urlsafe_b64encode(random16).rstrip(b"=").decode("ascii")
        claim = pb.ClaimRequest(key=self.keys[i], attempt_id=attempt_id, sha256=h.digest())
        if self.lease_pb is not None:
            claim.lease.CopyFrom(self.lease_pb)
        if self.ttl_pb is not None:
            claim.ttl.CopyFrom(self.ttl_pb)
        return claim

    def start(self, picked: List[int]) -> None:
        """Claims picked's keys in one ClaimBatch (several past the server's limit); each claimed
        handler starts as the answer arrives."""
        for i in picked:
            self.active[i] = True
            key = self.keys[i]
            self.active_keys[key] = self.active_keys.get(key, 0) + 1
        self.in_flight += len(picked)
        if self.fallback:
            for i in picked:
                self.single(i)
            return
        randomness = os.urandom(16 * len(picked))  # the attempt ids: one system call per window
        claims = [self.claim_request(i, randomness[16 * n:16 * n + 16]) for n, i in enumerate(picked)]
        self.claiming += 1
        self.pool.submit(lambda: self.claim_task(picked, claims))

    def claim_task(self, picked: List[int], claims: List["pb.ClaimRequest"]) -> None:
        try:
            results = self.claim_batch(claims)
            error = None
        except RpcError as e:
            results, error = None, e
        except BaseException as e:  # noqa: BLE001 - reported to the loop, raised there
            results, error = None, e
        tasks = []
        if results is not None:
            received = ex.now()
            for n, i in enumerate(picked):
                result = results[n]
                if result.WhichOneof("result") == "response" and result.response.WhichOneof("outcome") == "claimed":
                    tasks.append(self._handler_task(i, result.response, received))
        self.events.put(lambda error=error: self.claimed(picked, results, error, len(tasks)))
        if tasks:
            # The handlers start here, before anything else (the crash bound): this thread runs
            # them, joined by more runners as soon as one blocks (see _drain).
            self.runnable(tasks)

    def claim_batch(self, claims: List["pb.ClaimRequest"]) -> List["pb.ClaimBatchResult"]:
        """ClaimBatch in chunks of the server's limit, one after the other; a transport error is
        retried as a single Claim's is (the same attempt ids)."""
        results: List["pb.ClaimBatchResult"] = []
        for lo in range(0, len(claims), MAX_BATCH_ITEMS):
            chunk = claims[lo:lo + MAX_BATCH_ITEMS]
            request = pb.ClaimBatchRequest(endpoint=self.endpoint, claims=chunk)
            response = self.client._with_retries("ClaimBatch", request, None, "ClaimBatch")
            if len(response.results) != len(chunk):
                raise RpcError(grpc.StatusCode.INTERNAL,
                               f"idemd: ClaimBatch answered {len(response.results)} results for {len(chunk)} claims")
            results.extend(response.results)
        return results

    def claimed(self, picked: List[int], results: Optional[list], error: Optional[BaseException],
                started: int) -> None:

        self.claiming -= 1
        self.running += started
        if results is not None:
            for n, i in enumerate(picked):
                result = results[n]
                kind = result.WhichOneof("result")
                if kind == "response" and result.response.WhichOneof("outcome") == "claimed":
                    continue
                if kind == "response" and result.response.WhichOneof("outcome") in ("replayed", "mismatch", "pending"):
                    self.terminal(i, result.response)
                else:
                    # in_progress (another consumer holds the key: process() waits up to max_wait)
                    # or an item error (process() retries or raises it): as process() does.
                    self.single(i)
            return
        if isinstance(error, RpcError) and error.code == grpc.StatusCode.UNIMPLEMENTED:
            self.fallback = True
            for i in picked:
                self.single(i)
            return
        if isinstance(error, RpcError) and error.retryable:
            reason = f"idemd: {error.code.name}" + (f" ({error.reason})" if error.reason else "")
            for i in picked:
                self.decide(i, Processed(Outcome.RETRY, self.keys[i], reason))
            return
        for i in picked:  # what process() raises (a refused token...)
            self.set_fatal(i, error)  # type: ignore[arg-type]

    def terminal(self, i: int, response: "pb.ClaimResponse") -> None:
        """replayed, mismatch or pending: as process()."""
        try:
            result = ex.terminal_outcome(response)
        except BaseException as error:  # KeyReuseError, OutcomePendingError: dead-lettered
            self.answer_async(i, lambda error=error: self.dead_lettered(i, error))
            return
        assert result is not None
        self.decide(i, self.p._outcome(self.keys[i], result))

    def dead_lettered(self, i: int, error: BaseException) -> Any:
        """Message i judged from a terminal claim answer, its hook called (a coroutine in AsyncBatch)."""
        return self.p._dead_lettered(self.msgs[i], self.p._judge(self.keys[i], error, False))

    def single(self, i: int) -> None:
        self.answer_async(i, lambda: self.p.process(self.msgs[i], self.handler))

    def answer_async(self, i: int, compute: Callable[[], "Processed"]) -> None:
        """Decides message i with what compute returns, computed on a worker (it may call idemd,
        wait for another holder or call the hook)."""

        def task() -> None:
            try:
                out = compute()
            except BaseException as error:  # noqa: BLE001 - raised by the loop
                self.events.put(lambda error=error: self.set_fatal(i, error))
                return
            self.events.put(lambda: self.decide(i, out))

        self.pool.submit(task)

    # -- handlers -------------------------------------------------------------

    def runnable(self, tasks: List[Callable[[], None]]) -> None:
        """Queues claimed handlers, and runs them on this thread unless a runner is at it
        already; more runner threads join as handlers block (_drain)."""
        with self.ready_lock:
            self.ready.extend(tasks)
            if self.runners:  # a runner takes them (nudge adds runners if it is blocked)
                return
            self.runners += 1
        self._drain()

    def _drain(self) -> None:
        """A handler runner: runs queued handlers one after the other until none is left.

        Handlers are started by a few runner threads rather than one thread each: a 0 ms
        handler's GIL hand-offs among hundreds of runnable threads cost more than the handler
        (a few times the consumer's whole per-message budget). A runner whose handler has run
        for BLOCKED_SECONDS counts as blocked; while handlers wait and every runner is blocked,
        the loop (``nudge``) doubles the runners, so that slow handlers run side by side up
        to ``parallelism`` within a few ticks."""
        me = [0.0]
        # The ends of handlers, reported to the loop together: one event per handler would wake
        # the loop (and hand the GIL over) once per message.
        ends: List[Callable[[], None]] = []
        reported = time.monotonic()
        with self.ready_lock:
            self.running_since.append(me)
        try:
            while True:
                with self.ready_lock:
                    if not self.ready:
                        self.runners -= 1
                        return
                    task = self.ready.popleft()
                    me[0] = now = time.monotonic()
                if ends and (len(ends) >= self.report_every or now - reported >= BLOCKED_SECONDS):
                    self.events.put(_all(ends))
                    ends = []
                    reported = now
                ends.append(task())
                me[0] = 0.0
        finally:
            if ends:
                self.events.put(_all(ends))
            with self.ready_lock:
                self.running_since.remove(me)

    def nudge(self) -> None:
        """Called by the loop while handlers wait in the queue: more runners if all are blocked."""
        now = time.monotonic()
        with self.ready_lock:
            if not self.ready:
                return
            blocked = sum(1 for since in self.running_since if since[0] and now - since[0] >= BLOCKED_SECONDS)
            if blocked < self.runners:
                return
            more = min(len(self.ready), max(1, self.runners))
            self.runners += more
        for _ in range(more):
            self.pool.submit(self._drain)

    def _handler_task(self, i: int, response: "pb.ClaimResponse", received: float) -> Callable[[], None]:
        def task() -> Callable[[], None]:
            """Runs the handler; returns the event that reports its end to the loop."""
            try:
                done = self.run_one(i, response, received)
            except BaseException as error:  # noqa: BLE001 - raised by the loop
                return lambda error=error: self.handler_fatal(i, error)
            return lambda: self.handler_done(i, done)

        return task

    def run_one(self, i: int, response: "pb.ClaimResponse", received: float) -> Any:
        """Runs message i's handler with its lease extended while it runs. Returns a _Ran for a
        success, else the message's Processed (Fail recorded, dead-lettered) as process()."""
        from .client import _LeaseKeeper

        claimed = response.claimed
        key, token, message = self.keys[i], claimed.lease_token, self.msgs[i]
        if claimed.attempt > 1:
            # As process(): an earlier consumer's lease expired mid-handler; it may have run it.
            error = ex.Recorded(
                f"outcome unknown: attempt {claimed.attempt} took over an expired lease; "
                "an earlier attempt may have run the side effect"
            )
            self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key)
            return self.p._dead_lettered(message, self.p._judge(key, error, False))
        keeper = _LeaseKeeper(self.client, self.endpoint, key, token, ex.lease_seconds(claimed, self.p.lease, received))
        keeper.start()
        try:
            try:
                value = self.handler(message)
                stored = stored_response(value)
            finally:
                keeper.stop()
        except BaseException as error:
            self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key, keeper.expires)
            return self.p._dead_lettered(message, self.p._judge(key, error, True))
        if value is not None:
            value = json.loads(stored.body)  # as process() gives it back
        return _Ran(i, key, token, claimed.attempt, keeper, stored, value)

    def handler_done(self, i: int, done: Any) -> None:
        self.running -= 1
        if isinstance(done, _Ran):
            self.finished.append(done)
        else:
            self.decide(i, done)

    def handler_fatal(self, i: int, error: BaseException) -> None:
        self.running -= 1
        self.set_fatal(i, error)

    # -- completions ----------------------------------------------------------

    def complete(self, finished: List[_Ran]) -> None:
        """Records finished successes with CompleteBatch (on a worker), then decides them."""

        def task() -> None:
            outs: List[Any] = []
            for lo in range(0, len(finished), MAX_BATCH_ITEMS):
                chunk = finished[lo:lo + MAX_BATCH_ITEMS]
                for end, out in zip(chunk, self.complete_chunk(chunk)):
                    outs.append((end.index, out))
            self.events.put(lambda: self.completed(outs))

        self.pool.submit(task)

    def complete_chunk(self, chunk: List[_Ran]) -> List[Any]:
        """Each item's Processed, or the exception process() would raise for it."""

        request = self.complete_batch_request(chunk)
        try:
            # Retried on transport errors while the leases hold, as a single Complete is.
            response = self.client._deliver_response("CompleteBatch", request, min(end.keeper.expires for end in chunk))
            errors = item_errors(response, len(chunk))
        except RpcError as error:
            errors = [error] * len(chunk)
        outs: List[Any] = []
        for end, error in zip(chunk, errors):
            if error is None:
                outs.append(Processed(Outcome.EXECUTED, end.key, value=end.value))
                continue
            try:
                outs.append(self.complete_failed(end, error))
            except BaseException as raised:  # noqa: BLE001 - raised by the loop
                outs.append(_Fatal(raised))
        return outs

    def complete_batch_request(self, chunk: List[_Ran]) -> "pb.CompleteBatchRequest":
        """One CompleteBatch for the chunk: each handler's stored response (the empty one for a
        handler that returned None)."""
        empty = self.empty_response
        return pb.CompleteBatchRequest(endpoint=self.endpoint, completions=[
            pb.CompleteRequest(key=end.key, lease_token=end.token,
                               response=empty if end.value is None else ex.response_to_pb(end.stored))
            for end in chunk
        ])

    def complete_failed(self, end: _Ran, error: RpcError) -> "Processed":
        """A Complete refused or undelivered: what process() makes of it (client._run's tail)."""

        key, token = end.key, end.token
        request = pb.CompleteRequest(endpoint=self.endpoint, key=key, lease_token=token,
                                     response=ex.response_to_pb(end.stored))
        if error.retryable and error.reason != "LEASE_LOST":
            try:  # an item's transient error: the single Complete, retried as process() retries it
                self.client._deliver("Complete", request, end.keeper.expires)
                return Processed(Outcome.EXECUTED, key, value=end.value)
            except RpcError as again:
                error = again
        if error.reason != "LEASE_LOST":
            completed = error.retryable and self.client._completed(self.endpoint, key, end.attempt)
            if not completed:
                undelivered = self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key,
                                                end.keeper.expires)
                completed = undelivered and self.client._completed(self.endpoint, key, end.attempt)
            if completed:
                return Processed(Outcome.EXECUTED, key, value=end.value)
        return self.p._dead_lettered(self.msgs[end.index], self.p._judge(key, error, False))

    def completed(self, outs: List[Any]) -> None:
        for i, out in outs:
            if isinstance(out, _Fatal):
                self.set_fatal(i, out.error)
            else:
                self.decide(i, out)


def _all(events: List[Callable[[], None]]) -> Callable[[], None]:
    def run() -> None:
        for event in events:
            event()

    return run


class AsyncBatch(Batch):
    """process_batch of an AsyncMessageProcessor: the same scheduler on the event loop. The idemd
    calls, handlers and hooks are tasks, which change the state directly (one thread) and wake the
    loop; a claimed handler's task is created as its ClaimBatch answers."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        import asyncio

        self.wake = asyncio.Event()
        self.tasks: set = set()

    def spawn(self, coroutine: Any) -> None:
        import asyncio

        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run_async(self) -> List["Processed"]:
        while self.undecided > 0:
            if not self.step():
                break
            await self.wake.wait()
            self.wake.clear()
        if self.fatal is not None:
            raise self.fatal
        return self.outs  # type: ignore[return-value]

    def start(self, picked: List[int]) -> None:
        for i in picked:
            self.active[i] = True
            key = self.keys[i]
            self.active_keys[key] = self.active_keys.get(key, 0) + 1
        self.in_flight += len(picked)
        if self.fallback:
            for i in picked:
                self.single(i)
            return
        randomness = os.urandom(16 * len(picked))
        claims = [self.claim_request(i, randomness[16 * n:16 * n + 16]) for n, i in enumerate(picked)]
        self.claiming += 1
        self.spawn(self.claim_task_async(picked, claims))

    async def claim_task_async(self, picked: List[int], claims: List["pb.ClaimRequest"]) -> None:
        results: Optional[list] = None
        error: Optional[BaseException] = None
        try:
            results = []
            for lo in range(0, len(claims), MAX_BATCH_ITEMS):
                chunk = claims[lo:lo + MAX_BATCH_ITEMS]
                request = pb.ClaimBatchRequest(endpoint=self.endpoint, claims=chunk)
                response = await self.client._with_retries("ClaimBatch", request, "ClaimBatch")
                if len(response.results) != len(chunk):
                    raise RpcError(grpc.StatusCode.INTERNAL, f"idemd: ClaimBatch answered {len(response.results)} "
                                                             f"results for {len(chunk)} claims")
                results.extend(response.results)
        except BaseException as e:  # noqa: BLE001 - raised by the loop
            results, error = None, e
        started = 0
        if results is not None:
            received = ex.now()
            for n, i in enumerate(picked):  # the handlers' tasks first (the crash bound)
                result = results[n]
                if result.WhichOneof("result") == "response" and result.response.WhichOneof("outcome") == "claimed":
                    started += 1
                    self.spawn(self.handler_task_async(i, result.response, received))
        self.claimed(picked, results, error, started)
        self.wake.set()

    def dead_lettered(self, i: int, error: BaseException) -> Any:
        return self.p._dead_lettered_async(self.msgs[i], self.p._judge(self.keys[i], error, False))

    def answer_async(self, i: int, compute: Callable[[], Any]) -> None:
        async def task() -> None:
            try:
                out = await compute()
            except BaseException as error:  # noqa: BLE001 - raised by the loop
                self.set_fatal(i, error)
            else:
                self.decide(i, out)
            self.wake.set()

        self.spawn(task())

    async def handler_task_async(self, i: int, response: "pb.ClaimResponse", received: float) -> None:
        try:
            done = await self.run_one_async(i, response, received)
        except BaseException as error:  # noqa: BLE001 - raised by the loop
            self.handler_fatal(i, error)
        else:
            self.handler_done(i, done)
        self.wake.set()

    async def run_one_async(self, i: int, response: "pb.ClaimResponse", received: float) -> Any:
        import inspect

        from .aio import _LeaseKeeper

        claimed = response.claimed
        key, token, message = self.keys[i], claimed.lease_token, self.msgs[i]
        if claimed.attempt > 1:
            error = ex.Recorded(
                f"outcome unknown: attempt {claimed.attempt} took over an expired lease; "
                "an earlier attempt may have run the side effect"
            )
            await self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key)
            return await self.p._dead_lettered_async(message, self.p._judge(key, error, False))
        keeper = _LeaseKeeper(self.client, self.endpoint, key, token, ex.lease_seconds(claimed, self.p.lease, received))
        try:
            try:
                value = self.handler(message)
                if inspect.isawaitable(value):
                    value = await value
                stored = stored_response(value)
            finally:
                await keeper.stop()
        except BaseException as error:
            await self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key, keeper.expires)
            return await self.p._dead_lettered_async(message, self.p._judge(key, error, True))
        if value is not None:
            value = json.loads(stored.body)
        return _Ran(i, key, token, claimed.attempt, keeper, stored, value)

    def complete(self, finished: List[_Ran]) -> None:
        async def task() -> None:
            outs: List[Any] = []
            for lo in range(0, len(finished), MAX_BATCH_ITEMS):
                chunk = finished[lo:lo + MAX_BATCH_ITEMS]
                for end, out in zip(chunk, await self.complete_chunk_async(chunk)):
                    outs.append((end.index, out))
            self.completed(outs)
            self.wake.set()

        self.spawn(task())

    async def complete_chunk_async(self, chunk: List[_Ran]) -> List[Any]:

        request = self.complete_batch_request(chunk)
        try:
            response = await self._deliver_response(request, min(end.keeper.expires for end in chunk))
            errors = item_errors(response, len(chunk))
        except RpcError as error:
            errors = [error] * len(chunk)
        outs: List[Any] = []
        for end, error in zip(chunk, errors):
            if error is None:
                outs.append(Processed(Outcome.EXECUTED, end.key, value=end.value))
                continue
            try:
                outs.append(await self.complete_failed_async(end, error))
            except BaseException as raised:  # noqa: BLE001 - raised by the loop
                outs.append(_Fatal(raised))
        return outs

    async def _deliver_response(self, request: Any, until: float) -> Any:
        """CompleteBatch, retried on transport errors as aio's _deliver retries a Complete."""
        import asyncio

        retry = 0
        while True:
            try:
                return await self.client._call("CompleteBatch", request, None)
            except RpcError as e:
                retry += 1
                left = until - time.monotonic()
                if not e.retryable or (retry >= self.client.retry.attempts and left <= 0):
                    raise
                delay = self.client.retry.backoff(retry - 1)
                if retry >= self.client.retry.attempts:
                    delay = min(delay, left)
                await asyncio.sleep(delay)

    async def complete_failed_async(self, end: _Ran, error: RpcError) -> "Processed":

        key, token = end.key, end.token
        request = pb.CompleteRequest(endpoint=self.endpoint, key=key, lease_token=token,
                                     response=ex.response_to_pb(end.stored))
        if error.retryable and error.reason != "LEASE_LOST":
            try:
                await self.client._deliver("Complete", request, end.keeper.expires)
                return Processed(Outcome.EXECUTED, key, value=end.value)
            except RpcError as again:
                error = again
        if error.reason != "LEASE_LOST":
            completed = error.retryable and await self.client._completed(self.endpoint, key, end.attempt)
            if not completed:
                undelivered = await self.client._fail(ex.fail_request(self.endpoint, key, token, error), error, key,
                                                      end.keeper.expires)
                completed = undelivered and await self.client._completed(self.endpoint, key, end.attempt)
            if completed:
                return Processed(Outcome.EXECUTED, key, value=end.value)
        return await self.p._dead_lettered_async(self.msgs[end.index], self.p._judge(key, error, False))
