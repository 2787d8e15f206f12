"""Plain data types of the executor API."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from .downstream import downstream_key

__all__ = ["Request", "Response", "Result", "Execution"]

Header = Tuple[str, str]


@dataclass(frozen=True)
class Request:
    """The request whose fingerprint tells a retry from a reused key.

    ``path`` is hashed byte for byte: include the query string or not, but the
    same way on every retry. ``ignore_fields`` are JSON Pointers of volatile
    body fields (client timestamps, nonces) left out of the fingerprint.
    """

    method: str
    path: str
    body: Union[bytes, str] = b""
    content_type: str = ""
    ignore_fields: Sequence[str] = ()

    @property
    def body_bytes(self) -> bytes:
        return self.body.encode("utf-8") if isinstance(self.body, str) else bytes(self.body)


@dataclass(frozen=True)
class Response:
    """A response as an HTTP front end sends it; stored and replayed verbatim
    (headers in order, repeats kept; body byte for byte)."""

    status: int
    headers: List[Header] = field(default_factory=list)
    body: bytes = b""
    #: Optional pointer to a body kept elsewhere (for bodies over the policy's
    #: max_response_bytes).
    body_ref: str = ""

    def header(self, name: str) -> Optional[str]:
        """The first value of a header (case-insensitive), or None."""
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None

    @classmethod
    def coerce(cls, value: object) -> "Response":
        """A Response from a handler's return value: a Response, or a
        ``(status, headers, body)`` tuple with a str or bytes body."""
        if isinstance(value, Response):
            response = value
        elif isinstance(value, tuple) and len(value) == 3:
            status, headers, body = value
            response = cls(status, list(headers), body)  # type: ignore[arg-type]
        else:
            raise TypeError(
                f"handler must return idemd.Response or (status, headers, body), not {type(value).__name__}"
            )
        body = response.body
        if isinstance(body, str):
            body = body.encode("utf-8")
        headers = [(str(k), str(v)) for k, v in response.headers]
        if not isinstance(response.status, int) or not 100 <= response.status <= 599:
            raise ValueError(f"response status must be an int in 100..599, not {response.status!r}")
        return cls(response.status, headers, bytes(body), response.body_ref)


@dataclass(frozen=True)
class Result:
    """What :meth:`idemd.Client.execute_once` returns."""

    response: Response
    #: True when the stored response of an earlier execution was returned (an
    #: HTTP front end adds ``Idempotent-Replayed: true``).
    replayed: bool
    #: The attempt number of this execution's claim (1, or more after a
    #: takeover); None when replayed.
    attempt: Optional[int] = None
    #: The fingerprint the server compared (32 bytes).
    fingerprint: bytes = b""


@dataclass(frozen=True)
class Execution:
    """Passed to the handler: what it is executing."""

    endpoint: str
    key: str
    #: 1 for the first execution of this key, incremented on every takeover.
    attempt: int
    #: When the current lease runs out (UTC) unless the executor extends it;
    #: the executor extends it at half the lease while the handler runs.
    lease_expires_at: Optional[_dt.datetime] = None

    def downstream_key(self, step: str) -> str:
        """The idempotency key to send to a third party for ``step``: the same
        on every retry of this operation, different for every step."""
        return downstream_key(self.key, step)
