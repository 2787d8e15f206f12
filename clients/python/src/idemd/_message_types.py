"""The consumer helpers' value types: a delivered message, what was done with it.

Their own module so that both the single-message helper (:mod:`idemd.messages`) and the batch
scheduler (:mod:`idemd._batch`) import them without importing each other; :mod:`idemd.messages`
re-exports them.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Sequence, Tuple, Union

from .types import Response

HeaderValue = Union[bytes, str, None]


@dataclass(frozen=True)
class Message:
    """One delivery of a message, built by the caller from its broker client's record."""

    value: bytes
    #: In the broker's order; Kafka allows a name to repeat (the last one counts).
    headers: Sequence[Tuple[str, HeaderValue]] = ()
    topic: str = ""
    partition: int = -1
    offset: int = -1


class Outcome(enum.Enum):
    """What :meth:`MessageProcessor.process` did with a delivery."""

    #: The handler ran and its result is stored.
    EXECUTED = "executed"
    #: An earlier delivery ran it: the handler did not run; ``value`` is that run's.
    DUPLICATE = "duplicate"
    #: The dead-letter hook was called with ``reason``; the handler did not run, or raised.
    DEAD_LETTERED = "dead_lettered"
    #: Nothing decided (another consumer holds the key past ``max_wait``, or idemd is
    #: unreachable): do not commit; process this message again.
    RETRY = "retry"

    @property
    def may_commit(self) -> bool:
        return self is not Outcome.RETRY


@dataclass(frozen=True)
class Processed:
    outcome: Outcome
    key: str
    #: Why it was dead-lettered or must be retried; "" otherwise.
    reason: str = ""
    #: The handler's return value (EXECUTED) or the stored one (DUPLICATE), as JSON gives it back.
    value: Any = None

    @property
    def may_commit(self) -> bool:
        return self.outcome.may_commit


def stored_response(value: Any) -> Response:
    """What a consumer's success stores: the handler's return value as JSON (replayed as a
    DUPLICATE's ``value``)."""
    return Response(200, [("content-type", "application/json")], b"" if value is None else json.dumps(value).encode("utf-8"))
