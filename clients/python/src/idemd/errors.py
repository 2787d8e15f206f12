"""Errors raised by the idemd client and executor."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import grpc

__all__ = [
    "IdemdError",
    "RpcError",
    "IdempotencyError",
    "KeyReuseError",
    "OutcomePendingError",
    "StillInProgressError",
    "NoSideEffect",
]


class IdemdError(Exception):
    """Base class of every error this SDK raises itself."""


class RpcError(IdemdError):
    """An idemd RPC failed with a gRPC status.

    ``code`` is the :class:`grpc.StatusCode`; ``reason`` the ``google.rpc.ErrorInfo``
    reason when the server sent one (``LEASE_LOST``, ``NOT_PENDING``,
    ``ALREADY_COMPLETED``, ``NOT_IN_PROGRESS``, ``OUTCOME_UNKNOWN``); and
    ``field_violations`` the ``google.rpc.BadRequest`` (field, description) pairs.
    The original :class:`grpc.RpcError` is the ``__cause__``.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: Optional[str] = None,
        domain: Optional[str] = None,
        metadata: Optional[Dict[str, str]] = None,
        field_violations: Optional[List[Tuple[str, str]]] = None,
    ) -> None:
        label = code.name + (f" ({reason})" if reason else "")
        super().__init__(f"{label}: {message}" if message else label)
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.metadata = metadata or {}
        self.field_violations = field_violations or []

    @property
    def retryable(self) -> bool:
        """True for statuses where retrying the same call is safe and may succeed."""
        return self.code in _RETRYABLE_CODES


_RETRYABLE_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


class IdempotencyError(IdemdError):
    """The key cannot be executed now; an HTTP front end answers ``http_status``
    with ``{"error": error_code}``."""

    http_status: int = 409
    error_code: str = ""

    def __init__(self, message: str, *, http_status: Optional[int] = None, error_code: Optional[str] = None) -> None:
        super().__init__(message)
        if http_status is not None:
            self.http_status = http_status
        if error_code is not None:
            self.error_code = error_code

    def to_http(self) -> Tuple[int, List[Tuple[str, str]], bytes]:
        """(status, headers, body) a JSON HTTP API would answer."""
        body = ('{"error":"%s"}' % self.error_code).encode("ascii")
        return self.http_status, [("Content-Type", "application/json")], body


class KeyReuseError(IdempotencyError):
    """The key was already used with a different request (HTTP 422
    ``idempotency_key_reuse``). A client bug: never retried."""

    http_status = 422
    error_code = "idempotency_key_reuse"


class OutcomePendingError(IdempotencyError):
    """An earlier execution's outcome is undecided (HTTP 409 ``outcome_pending``).

    Never re-executed: reconcile it (``list_pending`` / ``reconcile``). ``state``
    is the record state name (``IN_PROGRESS``, ``UNKNOWN``, ``FAILED``) and
    ``reason`` why it is pending.
    """

    http_status = 409
    error_code = "outcome_pending"

    def __init__(self, message: str, *, state: str, reason: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.state = state
        self.reason = reason


class StillInProgressError(IdempotencyError):
    """Another execution still holds the key after the wait budget (HTTP 409
    ``request_in_progress``); ``retry_after`` (seconds) is the server's hint."""

    http_status = 409
    error_code = "request_in_progress"

    def __init__(self, message: str, *, retry_after: float, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after

    def to_http(self) -> Tuple[int, List[Tuple[str, str]], bytes]:
        status, headers, body = super().to_http()
        seconds = max(1, int(-(-self.retry_after // 1)))  # ceil, at least 1
        return status, headers + [("Retry-After", str(seconds))], body


class NoSideEffect(Exception):
    """Raised by a handler (or wrapping its error) when it failed *before any
    side effect happened*: the executor releases the key (Fail RELEASE) so a
    retry executes again, then re-raises this exception.

    Raise it directly, subclass it, or wrap another error::

        try:
            validate(card)
        except CardInvalid as e:
            raise NoSideEffect("card rejected before charging") from e

    Any other exception means the outcome is unknown (Fail UNKNOWN): a retry
    then gets :class:`OutcomePendingError` until someone reconciles the key.
    """
