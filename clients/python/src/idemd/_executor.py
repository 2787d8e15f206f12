"""The parts of execute_once shared by the sync and asyncio clients: building
the Claim, reading its outcome, converting responses."""

from __future__ import annotations

import datetime
import random
import secrets
import time
from typing import Optional, Union

from . import fingerprint as _fp
from ._grpc_util import duration, truncate_utf8
from ._proto import pb
from .errors import IdemdError, KeyReuseError, NoSideEffect, OutcomePendingError, StillInProgressError
from .types import Execution, Request, Response, Result

#: Backoff between Claims of a key held by another execution (full jitter,
#: added to the server's retry_after hint).
IN_PROGRESS_BACKOFF = 0.05
IN_PROGRESS_BACKOFF_CAP = 1.0
#: Floor of a lease derived from lease_expires_at (guards against clock skew).
MIN_DERIVED_LEASE = 1.0
MAX_REASON_BYTES = 1024

RequestLike = Union[Request, "pb.HttpRequest"]


def new_attempt_id() -> str:
    """A fresh attempt id (22 characters of [A-Za-z0-9_-], 128 random bits)."""
    return secrets.token_urlsafe(16)


def build_claim(
    endpoint: str,
    key: str,
    request: RequestLike,
    *,
    fingerprint: str,
    attempt_id: str,
    lease: Optional[float],
    ttl: Optional[float],
) -> "pb.ClaimRequest":
    if fingerprint not in ("server", "local"):
        raise ValueError('fingerprint must be "server" or "local"')
    if isinstance(request, pb.HttpRequest):
        http = request
    elif isinstance(request, Request):
        http = pb.HttpRequest(
            method=request.method,
            path=request.path,
            body=request.body_bytes,
            content_type=request.content_type,
            ignore_fields=list(request.ignore_fields),
        )
    else:
        raise TypeError(f"request must be idemd.Request or idemd.pb.HttpRequest, not {type(request).__name__}")
    claim = pb.ClaimRequest(endpoint=endpoint, key=key, attempt_id=attempt_id)
    if fingerprint == "local":
        claim.sha256 = _fp.fingerprint_v1(
            http.method, http.path, http.body, http.content_type, list(http.ignore_fields)
        )
    else:
        claim.request.CopyFrom(http)
    if lease is not None:
        claim.lease.CopyFrom(duration(lease))
    if ttl is not None:
        claim.ttl.CopyFrom(duration(ttl))
    return claim


def set_wait(claim: "pb.ClaimRequest", seconds: float) -> None:
    if seconds > 0.001:
        claim.wait.CopyFrom(duration(seconds))
    else:
        claim.ClearField("wait")


def response_to_pb(response: Response) -> "pb.StoredResponse":
    return pb.StoredResponse(
        status=response.status,
        headers=[pb.Header(name=k, value=v) for k, v in response.headers],
        body=response.body,
        body_ref=response.body_ref,
    )


def response_from_pb(stored: "pb.StoredResponse") -> Response:
    return Response(
        status=stored.status,
        headers=[(h.name, h.value) for h in stored.headers],
        body=bytes(stored.body),
        body_ref=stored.body_ref,
    )


def state_name(state: int) -> str:
    return pb.State.Name(state).removeprefix("STATE_") if state in pb.State.values() else str(state)


def terminal_outcome(response: "pb.ClaimResponse") -> Optional[Result]:
    """The Result for `replayed`; raises for mismatch/pending; None for
    claimed/in_progress (which the driver handles)."""
    kind = response.WhichOneof("outcome")
    if kind == "replayed":
        return Result(
            response=response_from_pb(response.replayed.response),
            replayed=True,
            fingerprint=bytes(response.fingerprint),
        )
    if kind == "mismatch":
        raise KeyReuseError(
            "the idempotency key was already used with a different request",
            http_status=response.http_status or None,
            error_code=response.error_code or None,
        )
    if kind == "pending":
        state = state_name(response.pending.state)
        raise OutcomePendingError(
            f"the outcome of an earlier execution is undecided ({state}): reconcile it",
            state=state,
            reason=response.pending.reason,
            http_status=response.http_status or None,
            error_code=response.error_code or None,
        )
    if kind in ("claimed", "in_progress"):
        return None
    raise IdemdError(f"unexpected Claim outcome {kind!r} (a newer server?)")


def in_progress_error(response: "pb.ClaimResponse") -> StillInProgressError:
    return StillInProgressError(
        "another execution still holds the key",
        retry_after=response.in_progress.retry_after.ToTimedelta().total_seconds(),
        http_status=response.http_status or None,
        error_code=response.error_code or None,
    )


def in_progress_delay(response: "pb.ClaimResponse", retry: int) -> float:
    """retry_after, plus exponential backoff with full jitter."""
    hint = response.in_progress.retry_after.ToTimedelta().total_seconds()
    return max(0.0, hint) + random.uniform(0, min(IN_PROGRESS_BACKOFF_CAP, IN_PROGRESS_BACKOFF * (2**retry)))


def lease_seconds(claimed: "pb.Claimed", requested: Optional[float], received_at: float) -> float:
    """The lease to keep extending: the requested one, else what remained of
    the granted one when the Claim's reply arrived (clocks are assumed roughly
    in sync; pass ``lease`` to execute_once to not depend on them)."""
    if requested is not None:
        return requested
    remaining = claimed.lease_expires_at.ToNanoseconds() / 1e9 - received_at
    return max(MIN_DERIVED_LEASE, remaining)


def execution(endpoint: str, key: str, claimed: "pb.Claimed") -> Execution:
    expires = None
    if claimed.HasField("lease_expires_at"):
        expires = claimed.lease_expires_at.ToDatetime(tzinfo=datetime.timezone.utc)
    return Execution(endpoint=endpoint, key=key, attempt=claimed.attempt, lease_expires_at=expires)


class Recorded(Exception):
    """An SDK-internal exception that carries the Fail reason to store: its
    own class name means nothing to an operator reading the record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def failure_reason(error: BaseException) -> str:
    """The stored reason of a handler's exception, ``<Kind>: <message>`` with
    the unqualified class name, as every SDK writes it (http-scenarios.md),
    capped at the server's limit on a character boundary."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return truncate_utf8(text, MAX_REASON_BYTES)


def fail_request(endpoint: str, key: str, token: str, error: BaseException) -> "pb.FailRequest":
    """Fail RELEASE for NoSideEffect, Fail UNKNOWN (with the error text) otherwise."""
    if isinstance(error, NoSideEffect):
        return pb.FailRequest(
            endpoint=endpoint, key=key, lease_token=token, disposition=pb.DISPOSITION_RELEASE
        )
    reason = truncate_utf8(error.reason, MAX_REASON_BYTES) if isinstance(error, Recorded) else failure_reason(error)
    return pb.FailRequest(
        endpoint=endpoint,
        key=key,
        lease_token=token,
        disposition=pb.DISPOSITION_UNKNOWN,
        reason=reason,
    )


def add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11+
        error.add_note(note)


def now() -> float:
    return time.time()
