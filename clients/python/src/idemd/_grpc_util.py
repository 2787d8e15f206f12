"""gRPC plumbing shared by the sync and asyncio clients."""

from __future__ import annotations

import collections
import hashlib
import random
import ssl
from typing import List, Optional, Sequence, Tuple

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from .errors import RpcError

STATUS_DETAILS_KEY = "grpc-status-details-bin"
USER_AGENT = "idemd-python/0.1.0"


def key_hash(key: str) -> str:
    """How a key appears in logs: the first 12 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(max(0, int(round(seconds * 1e9))))
    return d


def to_rpc_error(error: grpc.RpcError, trailing: Optional[Sequence[Tuple[str, object]]] = None) -> RpcError:
    """An :class:`RpcError` with the rich status details (ErrorInfo, BadRequest)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    if trailing is None and hasattr(error, "trailing_metadata"):
        trailing = error.trailing_metadata()
    return status_error(code or grpc.StatusCode.UNKNOWN, message or "", trailing)


def status_error(
    code: grpc.StatusCode, message: str, trailing: Optional[Sequence[Tuple[str, object]]]
) -> RpcError:
    """The :class:`RpcError` of a status and its trailing metadata (``-bin`` values as bytes),
    whichever transport received them."""
    reason = domain = None
    info_metadata = {}
    violations: List[Tuple[str, str]] = []
    for key, value in trailing or ():
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # a malformed detail must not hide the status itself
            continue
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain = info.reason or None, info.domain or None
                info_metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations.extend((v.field, v.description) for v in bad.field_violations)
    return RpcError(
        code,
        message,
        reason=reason,
        domain=domain,
        metadata=info_metadata,
        field_violations=violations,
    )


class RetryPolicy:
    """Retries of transport failures (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED):
    exponential backoff with full jitter. Claim is retried with the same
    ``attempt_id``; Complete, Fail and ExtendLease with the same lease token,
    which the server makes safe."""

    def __init__(self, attempts: int = 5, initial_backoff: float = 0.05, max_backoff: float = 1.0) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.attempts = attempts
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff

    def backoff(self, retry: int) -> float:
        return random.uniform(0, min(self.max_backoff, self.initial_backoff * (2**retry)))


def channel_credentials(
    ca_file: Optional[str],
    root_certificates: Optional[bytes],
    cert_file: Optional[str],
    key_file: Optional[str],
) -> grpc.ChannelCredentials:
    roots = root_certificates
    if roots is None and ca_file is not None:
        with open(ca_file, "rb") as f:
            roots = f.read()
    if roots is None:
        roots = _system_roots()
    chain = key = None
    if cert_file is not None or key_file is not None:
        if cert_file is None or key_file is None:
            raise ValueError("cert_file and key_file go together (client certificate)")
        with open(cert_file, "rb") as f:
            chain = f.read()
        with open(key_file, "rb") as f:
            key = f.read()
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def _system_roots() -> Optional[bytes]:
    """The operating system's CA bundle, if it has one (else gRPC's own roots)."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate:
            try:
                with open(candidate, "rb") as f:
                    return f.read()
            except OSError:
                continue
    return None


def call_metadata(token: Optional[str], tenant: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    metadata = []
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    if tenant:
        metadata.append(("x-tenant-id", tenant))
    return tuple(metadata)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def with_defaults(details, metadata: Tuple[Tuple[str, str], ...], timeout: Optional[float]):
    """Call details with the client's credentials metadata and default deadline."""
    merged = list(details.metadata or ())
    present = {k for k, _ in merged}
    merged.extend((k, v) for k, v in metadata if k not in present)
    return _CallDetails(
        details.method,
        details.timeout if details.timeout is not None else timeout,
        merged,
        details.credentials,
        getattr(details, "wait_for_ready", None),
        getattr(details, "compression", None),
    )


class DefaultsInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Adds the bearer token / tenant header and the default deadline to every
    unary call, so the raw stub gets them too."""

    def __init__(self, metadata: Tuple[Tuple[str, str], ...], timeout: Optional[float]) -> None:
        self._metadata = metadata
        self._timeout = timeout

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(with_defaults(client_call_details, self._metadata, self._timeout), request)


def truncate_utf8(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."
