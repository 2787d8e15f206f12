"""Message consumers: each message's side effect once per key, whatever the broker.

::

    processor = MessageProcessor(client, "kafka:orders", key_header="idempotency-key",
                                 dead_letter=lambda message, reason: park(message, reason))
    for record in records:
        done = processor.process(Message(record.value(), record.headers(), record.topic(),
                                         record.partition(), record.offset()), handle)
        if not done.may_commit:
            break  # RETRY: process this record again before any later one of its partition
        commit(record)

Broker-agnostic: the caller builds a :class:`Message` from its client's record.
The rules (docs/sdk.md, "Consumers"):

- **Commit rule:** commit a message's offset once :meth:`MessageProcessor.process`
  returns EXECUTED, DUPLICATE or DEAD_LETTERED (``may_commit``); never after
  RETRY, which must be processed again before any later message of its partition.
- **Dead-letter rule:** a message whose earlier attempt failed or whose outcome
  is unknown (the handler raised, a consumer died inside it, its lease ran out or
  was taken over) or whose key came with another value is never executed again:
  the dead-letter hook gets it with the reason. The hook runs at least once per
  such delivery (a crash before the commit delivers it again): make it idempotent.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import threading
from typing import Any, Awaitable, Callable, List, Optional, Sequence, Union

from . import _batch
from . import _executor as ex
from ._batch import DEFAULT_PARALLELISM, Ordering
from ._grpc_util import key_hash
from ._message_types import HeaderValue, Message, Outcome, Processed, stored_response as _stored
from .aio import AsyncClient
from .client import Client
from .errors import IdemdError, KeyReuseError, OutcomePendingError, RpcError, StillInProgressError
from .types import Execution, Request, Response, Result

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_PARALLELISM",
    "AsyncMessageProcessor",
    "Message",
    "MessageProcessor",
    "MissingKeyError",
    "Ordering",
    "Outcome",
    "Processed",
]

log = logging.getLogger("idemd")

MAX_KEY_CHARS = 255


class MissingKeyError(IdemdError, ValueError):
    """The message lacks the header the processor takes its key from."""


DeadLetter = Callable[[Message, str], Any]

#: The lease (seconds) a processor asks for unless told otherwise: kept alive at half while the
#: handler runs, so a slow handler keeps its key, and a consumer killed inside one holds the
#: redelivered message (its partition) at most this long rather than the endpoint policy's
#: default lease (60 s unless configured, sized for HTTP clients that retry seconds apart). Issue 52.
DEFAULT_LEASE = 5.0


class _Processor:
    def __init__(
        self,
        endpoint: str,
        *,
        key_header: Optional[str],
        key_by_position: bool,
        dead_letter: DeadLetter,
        lease: Optional[float],
        max_wait: float,
        ttl: Optional[float],
    ) -> None:
        if (key_header is None) == (not key_by_position):
            raise ValueError("name exactly one key source: key_header=... or key_by_position=True")
        if not callable(dead_letter):
            raise TypeError("dead_letter must be callable(message, reason)")
        self.endpoint = endpoint
        self.key_header = key_header
        self.key_by_position = key_by_position
        self.dead_letter = dead_letter
        self.lease = lease
        self.max_wait = max_wait
        self.ttl = ttl

    def key_of(self, message: Message) -> str:
        """The message's idempotency key (raises :class:`MissingKeyError` when its header is
        absent). A header value outside idemd's key alphabet (``[A-Za-z0-9_-]``, 1 to 255
        characters) makes :meth:`process` raise idemd's ``INVALID_ARGUMENT``."""
        if self.key_header is None:
            # idemd keys are [A-Za-z0-9_-]: "/" cannot separate, and topics may hold "." and "_".
            # Escaping "_" as "__" and "." as "_d" keeps distinct topics distinct; partition and
            # offset are digits, so "-" separates them unambiguously from the right.
            topic = message.topic.replace("_", "__").replace(".", "_d")
            key = f"{topic}-{message.partition}-{message.offset}"
            if len(key) > MAX_KEY_CHARS:
                # Kafka allows 249 characters and escaping lengthens them: the first 32 hex
                # digits of the topic's SHA-256 stand in for it, as in every SDK.
                digest = hashlib.sha256(message.topic.encode("utf-8")).hexdigest()[:32]
                key = f"h_{digest}-{message.partition}-{message.offset}"
            return key
        found: HeaderValue = None
        for name, value in message.headers:
            if name == self.key_header:
                found = value
        if found is None or found in (b"", ""):
            raise MissingKeyError(f"the message has no {self.key_header!r} header to take its idempotency key from")
        if isinstance(found, bytes):
            try:
                return found.decode("utf-8")
            except UnicodeDecodeError:
                raise MissingKeyError(f"the {self.key_header!r} header is not UTF-8") from None
        return found

    def _request(self, message: Message) -> Request:
        # Only the value's digest leaves the process (fingerprint="local"): the
        # fingerprint is the value's bytes, so a reused key with another value is refused.
        return Request("CONSUME", self.endpoint, bytes(message.value))

    def _outcome(self, key: str, result: Result) -> Processed:
        value = json.loads(result.response.body) if result.response.body else None
        return Processed(Outcome.DUPLICATE if result.replayed else Outcome.EXECUTED, key, value=value)

    def _judge(self, key: str, error: BaseException, from_handler: bool) -> Processed:
        """The outcome of an exception out of execute_once; re-raises what no
        outcome fits (a refused token, a malformed key: fix the configuration)."""
        if from_handler:
            if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: the claim is Failed UNKNOWN already
                raise error
            return Processed(Outcome.DEAD_LETTERED, key, ex.failure_reason(error))
        if isinstance(error, ex.Recorded):
            return Processed(Outcome.DEAD_LETTERED, key, error.reason)
        if isinstance(error, OutcomePendingError):
            verdict = "failed" if error.state == "FAILED" else "unknown"
            return Processed(Outcome.DEAD_LETTERED, key, f"outcome {verdict} ({error.state}): {error.reason}")
        if isinstance(error, KeyReuseError):
            return Processed(Outcome.DEAD_LETTERED, key, "key reuse: the key was already used with another message value")
        if isinstance(error, StillInProgressError):
            return Processed(Outcome.RETRY, key, "another consumer holds the key")
        # LEASE_LOST: the handler ran but its lease was taken; the next delivery
        # finds the record pending or replayed, never runs it again.
        if isinstance(error, RpcError) and (error.retryable or error.reason == "LEASE_LOST"):
            return Processed(Outcome.RETRY, key, f"idemd: {error.code.name}" + (f" ({error.reason})" if error.reason else ""))
        raise error

    def _dead_lettered(self, message: Message, processed: Processed) -> Processed:
        """processed, after the dead-letter hook when it is DEAD_LETTERED (as process() calls it)."""
        if processed.outcome is Outcome.DEAD_LETTERED:
            self.dead_letter(message, processed.reason)
        self._log(processed)
        return processed

    def _log(self, processed: Processed) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("idemd: message with key %s on %s: %s", key_hash(processed.key), self.endpoint, processed.outcome.value)


def _taken_over(execution: Execution) -> None:
    # The record's earlier holder let its lease run out (on_expired_lease = "takeover"):
    # it may have run the side effect, so this one must not. Recorded makes the
    # executor Fail the claim UNKNOWN with this reason.
    if execution.attempt > 1:
        raise ex.Recorded(
            f"outcome unknown: attempt {execution.attempt} took over an expired lease; "
            "an earlier attempt may have run the side effect"
        )


class MessageProcessor(_Processor):
    """Runs a per-message handler once per key across consumers and restarts,
    on :meth:`idemd.Client.execute_once` (lease extension while it runs, transport
    retries of idemd calls).

    ``endpoint`` is the idemd endpoint the keys live under (``"kafka:<topic>"``).
    The key is the value of header ``key_header`` (the producer's idempotency key
    or message id; a message without it raises :class:`MissingKeyError`), or with
    ``key_by_position=True`` ``"<topic>-<partition>-<offset>"`` (in the topic, ``_`` written
    ``__`` and ``.`` written ``_d``: idemd keys are ``[A-Za-z0-9_-]``): that needs no
    producer cooperation but only catches redeliveries of one record, not a
    producer that sends the same message twice (its retry gets a new offset).

    The fingerprint is the message value: the same key with another value is
    dead-lettered, never run. ``dead_letter(message, reason)`` is called for every
    DEAD_LETTERED delivery (if it raises, :meth:`process` raises and nothing may
    be committed); it runs at least once per such delivery: make it idempotent.
    ``lease`` (seconds, default :data:`DEFAULT_LEASE`; None: the endpoint policy's) is
    asked of idemd for each claim and extended at half its length while the handler
    runs; ``max_wait`` bounds the wait for another consumer holding the key before
    RETRY; ``ttl`` overrides the policy's.
    """

    def __init__(
        self,
        client: Client,
        endpoint: str,
        *,
        dead_letter: DeadLetter,
        key_header: Optional[str] = None,
        key_by_position: bool = False,
        lease: Optional[float] = DEFAULT_LEASE,
        max_wait: float = 5.0,
        ttl: Optional[float] = None,
    ) -> None:
        super().__init__(
            endpoint, key_header=key_header, key_by_position=key_by_position, dead_letter=dead_letter,
            lease=lease, max_wait=max_wait, ttl=ttl,
        )
        self.client = client
        self._pool: Optional[_batch._Pool] = None
        self._pool_lock = threading.Lock()

    def process_batch(
        self,
        messages: Sequence[Message],
        handler: Callable[[Message], Any],
        *,
        ordering: Ordering = Ordering.PER_KEY,
        parallelism: int = DEFAULT_PARALLELISM,
    ) -> List[Processed]:
        """:meth:`process` for a whole poll: one :class:`Processed` per message, in ``messages``'
        order, each meaning exactly what :meth:`process` would have returned for it (the same
        outcomes, reasons and dead-letter hook calls). The bookkeeping is batched and pipelined:
        as slots free up (at most ``parallelism`` messages in flight: being claimed, running,
        being completed), the next messages' keys are claimed in one ClaimBatch; the claimed
        handlers start the moment the answer arrives, on the thread that received it, one after
        the other while they are fast, with more runner threads joining as soon as one runs for
        2 ms (so that slow handlers run side by side, up to ``parallelism``), each with its lease
        extended while it runs; finished handlers' successes are recorded together with
        CompleteBatch calls that overlap the next claims. A message whose key an earlier message of the poll
        has in flight waits until that one is decided (and is then a DUPLICATE).

        ``ordering``: :attr:`Ordering.PER_KEY` (default) runs different keys side by side;
        :attr:`Ordering.PER_PARTITION` runs each partition's messages one at a time in offset
        order (the partitions side by side), and once one of them is RETRY every later message
        of its partition is RETRY too, not run.

        Commit offsets in order: for each partition, up to (not including) its first message
        that is not ``may_commit``. With PER_KEY a later message of that partition may already
        have run; redelivered, it is a DUPLICATE.

        The crash bound: a key is claimed only for a free slot, and the claimed handlers are
        started as soon as their ClaimBatch answers (no other idemd call or message comes in
        between; a fast handler may wait for the one before it, a few milliseconds at most). A
        process killed at any point therefore parks as outcome-unknown at most ``parallelism``
        messages, the claimed ones, whose handlers were started or about to; the rest of the
        poll was never claimed and runs normally on redelivery.

        The handler and the dead-letter hook run on worker threads, several at once: make them
        thread-safe. Against a server without ClaimBatch (UNIMPLEMENTED) each message goes
        through :meth:`process` instead, still up to ``parallelism`` at once. What
        :meth:`process` would raise (a message without a key, before anything is claimed; a
        refused token; a dead-letter hook that raised) is raised once nothing is in flight any
        more; commit nothing of the poll then."""
        _batch.check_options(ordering, parallelism)
        if not messages:
            return []
        with self._pool_lock:
            if self._pool is None:
                self._pool = _batch._Pool()
        return _batch.Batch(self, self._pool, messages, handler, ordering, parallelism).run()

    def process(self, message: Message, handler: Callable[[Message], Any]) -> Processed:
        """Runs ``handler(message)`` unless an earlier delivery did or must be
        looked at first. The handler returns None or a JSON-serialisable value
        (a DUPLICATE carries it back); if it raises, the claim is recorded as
        Failed UNKNOWN (``<Kind>: <message>``; :class:`idemd.NoSideEffect`
        releases the key instead, so a re-drive from the dead letters runs it)
        and the message is dead-lettered with that reason."""
        key = self.key_of(message)
        raised: list = []

        def run(execution: Execution) -> Response:
            _taken_over(execution)
            try:
                return _stored(handler(message))
            except BaseException as error:
                raised.append(error)
                raise

        try:
            processed = self._outcome(key, self.client.execute_once(
                self.endpoint, key, self._request(message), run,
                max_wait=self.max_wait, fingerprint="local", lease=self.lease, ttl=self.ttl,
            ))
        except BaseException as error:
            processed = self._judge(key, error, bool(raised) and raised[0] is error)
            if processed.outcome is Outcome.DEAD_LETTERED:
                self.dead_letter(message, processed.reason)
        self._log(processed)
        return processed


class AsyncMessageProcessor(_Processor):
    """:class:`MessageProcessor` on an :class:`idemd.aio.AsyncClient`: ``process``
    is a coroutine; the handler and the dead-letter hook may be coroutine functions."""

    def __init__(
        self,
        client: AsyncClient,
        endpoint: str,
        *,
        dead_letter: Callable[[Message, str], Any],
        key_header: Optional[str] = None,
        key_by_position: bool = False,
        lease: Optional[float] = DEFAULT_LEASE,
        max_wait: float = 5.0,
        ttl: Optional[float] = None,
    ) -> None:
        super().__init__(
            endpoint, key_header=key_header, key_by_position=key_by_position, dead_letter=dead_letter,
            lease=lease, max_wait=max_wait, ttl=ttl,
        )
        self.client = client

    async def process_batch(
        self,
        messages: Sequence[Message],
        handler: Callable[[Message], Union[Any, Awaitable[Any]]],
        *,
        ordering: Ordering = Ordering.PER_KEY,
        parallelism: int = DEFAULT_PARALLELISM,
    ) -> List[Processed]:
        """See :meth:`MessageProcessor.process_batch`: the same scheduler, on the event loop. Each
        claimed handler's task is created as its ClaimBatch answers; a handler that is a plain
        function runs on the event loop (keep it short, or make it a coroutine function). The
        dead-letter hook may be called for several messages at once (as tasks)."""
        _batch.check_options(ordering, parallelism)
        if not messages:
            return []
        return await _batch.AsyncBatch(self, None, messages, handler, ordering, parallelism).run_async()

    async def _dead_lettered_async(self, message: Message, processed: Processed) -> Processed:
        if processed.outcome is Outcome.DEAD_LETTERED:
            out = self.dead_letter(message, processed.reason)
            if inspect.isawaitable(out):
                await out
        self._log(processed)
        return processed

    async def process(self, message: Message, handler: Callable[[Message], Union[Any, Awaitable[Any]]]) -> Processed:
        """See :meth:`MessageProcessor.process`."""
        key = self.key_of(message)
        raised: list = []

        async def run(execution: Execution) -> Response:
            _taken_over(execution)
            try:
                out = handler(message)
                if inspect.isawaitable(out):
                    out = await out
                return _stored(out)
            except BaseException as error:
                raised.append(error)
                raise

        try:
            processed = self._outcome(key, await self.client.execute_once(
                self.endpoint, key, self._request(message), run,
                max_wait=self.max_wait, fingerprint="local", lease=self.lease, ttl=self.ttl,
            ))
        except BaseException as error:
            processed = self._judge(key, error, bool(raised) and raised[0] is error)
        # The hook (for a DEAD_LETTERED outcome) and the log line, as for a batch's messages.
        return await self._dead_lettered_async(message, processed)
