"""What the ASGI and WSGI middleware share: routes, the ``Idempotency-Key``
header, problem details, and turning an executor outcome into an answer.

The contract is ``idemd proxy``'s (docs/proxy.md), checked by the shared
scenarios in clients/conformance/http-scenarios.json: a middleware and the
sidecar answer the same requests the same way.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ._executor import Recorded
from .errors import (
    KeyReuseError,
    NoSideEffect,
    OutcomePendingError,
    RpcError,
    StillInProgressError,
)
from .types import Response

__all__ = ["Route", "Routes", "parse_key"]

KEY_HEADER = "idempotency-key"
REPLAYED_HEADER = "idempotent-replayed"
PROBLEM_TYPE = "https://idemd.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"
#: What describes a response's body and the resource it created; never
#: credentials or cookies (a replay would hand one caller's session to another).
DEFAULT_STORE_HEADERS = (
    "content-type",
    "content-encoding",
    "content-language",
    "content-location",
    "location",
    "etag",
    "last-modified",
    "link",
)
#: How long the first bytes of a body the request declares (Content-Length
#: over 0, or chunked) may take to reach the middleware before it concludes
#: that something mounted before it already read them: a drained stream
#: never ends, it blocks until the client gives up. ASGI gives no other
#: sign, so this is a trade-off: a client whose first body bytes take longer
#: (a round trip for ``Expect: 100-continue`` on a slow link) gets the same
#: 500, so it is half a second, longer than most round trips, and the
#: middleware's ``body_start_timeout`` raises it; WSGI and every other SDK
#: detect the mistake without a timer.
BODY_START_TIMEOUT = 0.5
MIDDLEWARE_ORDER = ("the request body was read before the idempotency middleware saw it; "
                    "mount the middleware before any body parser")
log = logging.getLogger("idemd")
_KEY = re.compile(r"[A-Za-z0-9_-]{1,255}")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")

Headers = List[Tuple[str, str]]


def _seconds(value: Union[None, int, float, str], name: str) -> Optional[float]:
    """Seconds from a number or a ``"5s"``/``"250ms"``/``"1m"`` string (the
    routes file's spelling)."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return None if value is None else float(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{name}: {value!r} is not a duration such as 5s or 250ms")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]


@dataclass(frozen=True)
class Route:
    """One route, as in ``idemd proxy``'s routes file. ``path`` is a template:
    ``{name}`` matches one segment and names the endpoint
    (``POST /v1/payments/{id}``: every payment shares one endpoint); a final
    ``/*`` matches any rest and the endpoint is the request's own path. Fields
    left ``None`` inherit the defaults."""

    path: str = "/*"
    #: Methods made idempotent; others pass through untouched.
    methods: Optional[Sequence[str]] = None
    #: ``"require"`` (no key: 400) or ``"optional"`` (no key: passed through).
    key: Optional[str] = None
    #: Larger bodies get 413 before any claim.
    max_request_bytes: Optional[int] = None
    #: Larger answers are returned but not stored; the key is left UNKNOWN.
    max_response_bytes: Optional[int] = None
    #: How long a duplicate waits for the first request (seconds or "5s"); then 409.
    max_wait: Union[None, float, str] = None
    #: ``"release"`` (a 5xx frees the key) or ``"store"`` (the 5xx is replayed).
    on_5xx: Optional[str] = None
    #: JSON Pointers left out of the fingerprint (timestamps, nonces).
    ignore_fields: Optional[Sequence[str]] = None
    #: Response headers stored and replayed (lower case); ``set-cookie`` only if listed.
    store_headers: Optional[Sequence[str]] = None
    #: ``"server"`` (the body goes to idemd) or ``"local"`` (only its SHA-256 does).
    fingerprint: Optional[str] = None
    #: Record TTL and lease (seconds or "30s"); None: the endpoint's policy.
    ttl: Union[None, float, str] = None
    lease: Union[None, float, str] = None
    #: Development only: a 409 ``outcome_pending`` carries the stored Fail
    #: reason (the handler's exception text) as ``reason``. Off by default,
    #: because that text can hold internal names, SQL or secrets.
    expose_failure_reason: Optional[bool] = None

    @classmethod
    def of(cls, value: Union["Route", Mapping[str, Any]], ignore: Iterable[str] = ()) -> "Route":
        """A Route from a Route or a routes-file table (a dict); names in
        ``ignore`` (such as the proxy's ``upstream_timeout``) are dropped,
        any other unknown name is an error naming it."""
        if isinstance(value, Route):
            return value
        known = {f.name for f in fields(cls)}
        extra = set(value) - known - set(ignore)
        if extra:
            raise ValueError(f"route {value.get('path', '')!r}: unknown setting(s) {sorted(extra)}")
        return cls(**{k: v for k, v in value.items() if k in known})


@dataclass(frozen=True)
class Settings:
    """A route's settings with every default filled in."""

    methods: frozenset
    key_required: bool
    max_request_bytes: int
    max_response_bytes: int
    max_wait: float
    on_5xx_store: bool
    ignore_fields: Tuple[str, ...]
    store_headers: frozenset
    fingerprint: str
    ttl: Optional[float]
    lease: Optional[float]
    expose_failure_reason: bool


BASE = Route(
    methods=("POST", "PATCH"),
    key="require",
    max_request_bytes=1024 * 1024,
    max_response_bytes=256 * 1024,
    max_wait=0.0,
    on_5xx="release",
    ignore_fields=(),
    store_headers=DEFAULT_STORE_HEADERS,
    fingerprint="server",
    expose_failure_reason=False,
)


def _settings(route: Route, base: Route, where: str) -> Settings:
    merged = replace(base, **{f.name: getattr(route, f.name) for f in fields(Route)
                              if f.name != "path" and getattr(route, f.name) is not None})
    if merged.key not in ("require", "optional"):
        raise ValueError(f'{where}.key: {merged.key!r} must be "require" or "optional"')
    if merged.on_5xx not in ("release", "store"):
        raise ValueError(f'{where}.on_5xx: {merged.on_5xx!r} must be "release" or "store"')
    if merged.fingerprint not in ("server", "local"):
        raise ValueError(f'{where}.fingerprint: {merged.fingerprint!r} must be "server" or "local"')
    for name in ("max_request_bytes", "max_response_bytes"):
        value = getattr(merged, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}.{name}: {value!r} must be a whole number of bytes")
    if not isinstance(merged.expose_failure_reason, bool):
        raise ValueError(f"{where}.expose_failure_reason: {merged.expose_failure_reason!r} must be true or false")
    if isinstance(merged.methods, str):
        raise ValueError(f"{where}.methods: give a list of methods, not {merged.methods!r}")
    if isinstance(merged.store_headers, str):
        raise ValueError(f"{where}.store_headers: give a list of header names, not {merged.store_headers!r}")
    return Settings(
        methods=frozenset(m.upper() for m in merged.methods or ()),
        key_required=merged.key == "require",
        max_request_bytes=merged.max_request_bytes,
        max_response_bytes=merged.max_response_bytes,
        max_wait=_seconds(merged.max_wait, f"{where}.max_wait") or 0.0,
        on_5xx_store=merged.on_5xx == "store",
        ignore_fields=tuple(merged.ignore_fields or ()),
        store_headers=frozenset(h.lower() for h in merged.store_headers or ()),
        fingerprint=merged.fingerprint,
        ttl=_seconds(merged.ttl, f"{where}.ttl"),
        lease=_seconds(merged.lease, f"{where}.lease"),
        expose_failure_reason=merged.expose_failure_reason,
    )


class Routes:
    """The middleware's routes: the first whose path matches wins; a request
    no route matches gets the defaults (the proxy's rule)."""

    def __init__(
        self,
        routes: Iterable[Union[Route, Mapping[str, Any]]] = (),
        defaults: Union[None, Route, Mapping[str, Any]] = None,
        *,
        ignore: Iterable[str] = (),
    ) -> None:
        ignore = tuple(ignore)
        base = Route.of(defaults, ignore) if defaults is not None else Route()
        base_settings = _settings(base, BASE, "defaults")
        merged_base = replace(BASE, **{f.name: getattr(base, f.name) for f in fields(Route)
                                       if f.name != "path" and getattr(base, f.name) is not None})
        self._defaults = base_settings
        self._routes: List[Tuple[List[Optional[str]], bool, str, Settings]] = []
        for index, value in enumerate(routes):
            route = Route.of(value, ignore)
            segments, rest = _pattern(route.path, f"routes[{index}].path")
            self._routes.append((segments, rest, route.path, _settings(route, merged_base, f"routes[{index}]")))
        exposing = [template for _, _, template, settings in self._routes if settings.expose_failure_reason]
        if base_settings.expose_failure_reason:
            exposing.insert(0, "defaults")
        if exposing:
            log.warning("expose_failure_reason is set (%s): a 409 outcome_pending shows callers the handler's "
                        "error text; for development only", ", ".join(exposing))

    def find(self, method: str, path: str) -> Tuple[str, Settings]:
        """The endpoint (``METHOD template``) and settings of a request."""
        parts = path.lstrip("/").split("/")
        for segments, rest, template, settings in self._routes:
            if _matches(segments, rest, parts):
                return f"{method} {path if rest else template}", settings
        return f"{method} {path}", self._defaults


def _pattern(path: str, where: str) -> Tuple[List[Optional[str]], bool]:
    if not path.startswith("/"):
        raise ValueError(f"{where}: {path!r} must start with /")
    parts = path.lstrip("/").split("/")
    segments: List[Optional[str]] = []
    rest = False
    for index, part in enumerate(parts):
        if part == "*":
            if index + 1 != len(parts):
                raise ValueError(f"{where}: {path!r}: * may only be the last segment")
            rest = True
        elif part.startswith("{") and part.endswith("}") and len(part) > 2:
            segments.append(None)
        elif any(c in part for c in "{}*"):
            raise ValueError(f"{where}: {path!r}: segment {part!r} is neither literal, {{name}} nor a final *")
        else:
            segments.append(part)
    return segments, rest


def _matches(segments: List[Optional[str]], rest: bool, parts: List[str]) -> bool:
    if len(parts) < len(segments):
        return False
    for segment, part in zip(segments, parts):
        if segment is not None and segment != part:
            return False
    return rest or len(parts) == len(segments)


def parse_key(value: str) -> str:
    """The key of an ``Idempotency-Key`` value: a Structured Field string
    (RFC 8941 section 3.3.3, as the draft specifies) or the bare token
    Stripe-style clients send; then idemd's key rule. Raises ValueError with
    what is wrong."""
    text = value.strip(" ")
    if text.startswith('"'):
        key: List[str] = []
        chars = iter(text[1:])
        for c in chars:
            if c == '"':
                break
            if c == "\\":
                escaped = next(chars, "")
                if escaped not in ('"', "\\"):
                    raise ValueError('has an escape other than \\" or \\\\ in its Structured Field string')
                key.append(escaped)
            elif " " <= c <= "~":
                key.append(c)
            else:
                raise ValueError("has a character a Structured Field string cannot hold")
        else:
            raise ValueError("is a Structured Field string without its closing quote")
        if next(chars, None) is not None:
            raise ValueError("has characters after its Structured Field string")
        text = "".join(key)
    if not text:
        raise ValueError("must not be empty")
    if not _KEY.fullmatch(text):
        raise ValueError("must be 1-255 characters of [A-Za-z0-9_-]")
    return text


@dataclass
class Answer:
    """A whole HTTP answer: status, headers in order (repeats kept), body."""

    status: int
    headers: Headers = field(default_factory=list)
    body: bytes = b""

    def with_length(self) -> "Answer":
        headers = [(k, v) for k, v in self.headers if k.lower() != "content-length"]
        headers.append(("content-length", str(len(self.body))))
        return Answer(self.status, headers, self.body)


def problem(status: int, name: str, detail: str, *, retry_after: Optional[float] = None,
            **extra: Any) -> Answer:
    """An RFC 9457 problem, shaped like the proxy's (``src/web/problem.rs``)."""
    from http import HTTPStatus

    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    members: Dict[str, Any] = {"type": PROBLEM_TYPE + name, "title": title, "status": status, "detail": detail}
    members.update(extra)
    headers = [("content-type", PROBLEM_CONTENT_TYPE)]
    if retry_after is not None:
        headers.append(("retry-after", str(max(1, int(-(-retry_after // 1))))))
    return Answer(status, headers, json.dumps(members, separators=(",", ":")).encode()).with_length()


def missing_key(method: str, path: str) -> Answer:
    return problem(400, "idempotency_key_missing", f"{method} {path} requires an Idempotency-Key header")


def malformed_key(description: str) -> Answer:
    return problem(400, "idempotency_key_malformed", f"Idempotency-Key {description}", field="Idempotency-Key")


def too_large(limit: int) -> Answer:
    return problem(413, "request_too_large", f"request body exceeds {limit} bytes")


class OrderCheck:
    """The answer to a request whose body something mounted before the
    middleware already read: a 500 naming the mistake, before any Claim (the
    key stays unclaimed, the app does not run), logged once per middleware
    (a misordered app fails every such request; one line says why)."""

    def __init__(self, hint: str) -> None:
        self.detail = f"{MIDDLEWARE_ORDER} ({hint})"
        self._seen = itertools.count()  # next() is atomic: once even across threads

    def answer(self) -> Answer:
        if next(self._seen) == 0:
            log.error("idemd middleware: %s", self.detail)
        return problem(500, "middleware_order", self.detail)


#: gRPC code name -> HTTP status (google.rpc.Code's mapping, as the proxy's).
_HTTP_OF_CODE = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "ABORTED": 409, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429, "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504,
}


def refused(error: BaseException, settings: Settings) -> Answer:
    """The answer to an executor error raised before the handler ran."""
    if isinstance(error, StillInProgressError):
        return problem(409, "request_in_progress",
                       "a request with this Idempotency-Key is in progress; retry after Retry-After",
                       retry_after=error.retry_after)
    if isinstance(error, KeyReuseError):
        return problem(422, "idempotency_key_reuse",
                       "this Idempotency-Key was used for a different request (method, path or body); "
                       "use a new key for a new operation")
    if isinstance(error, OutcomePendingError):
        # The stored reason is the handler's own text, for operators (Lookup,
        # the audit log); the caller is a stranger (http-scenarios.md).
        exposed = {"reason": error.reason} if settings.expose_failure_reason else {}
        return problem(409, "outcome_pending",
                       "the outcome of the first request with this Idempotency-Key is not known; "
                       "it is waiting for an operator's decision",
                       state="STATE_" + error.state, **exposed)
    if isinstance(error, RpcError):
        code = error.code.name
        return problem(_HTTP_OF_CODE.get(code, 500), code.lower(), error.message or str(error), grpc_code=code)
    raise error


class Released(NoSideEffect):
    """A 5xx on a route that releases the key (``on_5xx = "release"``): the
    executor frees the key, the middleware returns ``answer`` as it is."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"handler answered {answer.status}")
        self.answer = answer


class Unstorable(Recorded):
    """An answer the middleware will not store (over ``max_response_bytes``,
    or a framework's error page for a view's exception): the executor marks
    the key UNKNOWN with ``reason`` as it is, the middleware returns
    ``answer`` in full."""

    def __init__(self, answer: Answer, reason: str) -> None:
        super().__init__(reason)
        self.answer = answer


def to_store(answer: Answer, settings: Settings) -> Response:
    """What is stored of a fresh answer, or the exception telling the
    executor to release the key or leave it UNKNOWN."""
    if answer.status >= 500 and not settings.on_5xx_store:
        raise Released(answer)
    if len(answer.body) > settings.max_response_bytes:
        raise Unstorable(answer, f"answer exceeds max_response_bytes ({settings.max_response_bytes} bytes); "
                                 "returned to the caller, not stored")
    kept = [(k.lower(), v) for k, v in answer.headers if k.lower() in settings.store_headers]
    return Response(answer.status, kept, answer.body)


def replay(stored: Response) -> Answer:
    headers = [(k, v) for k, v in stored.headers if k.lower() != REPLAYED_HEADER]
    headers.append((REPLAYED_HEADER, "true"))
    return Answer(stored.status, headers, stored.body).with_length()
