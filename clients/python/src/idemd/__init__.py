"""Python SDK for idemd: idempotency keys as a service.

::

    from idemd import Client, Request, Response

    client = Client("localhost:50051", token=TOKEN, insecure=True)
    result = client.execute_once("POST /v1/payments", key, Request("POST", "/v1/payments", body, "application/json"),
                                 lambda ex: Response(201, [("Content-Type", "application/json")], charge()))
    result.response, result.replayed

See docs/sdk.md in the idemd repository for the contract every SDK implements.
"""

from ._grpc_util import RetryPolicy
from ._proto import pb
from .client import Client
from .decorators import idempotent
from .downstream import downstream_key
from .errors import (
    IdemdError,
    IdempotencyError,
    KeyReuseError,
    NoSideEffect,
    OutcomePendingError,
    RpcError,
    StillInProgressError,
)
from .fingerprint import FingerprintError, canonical_body, fingerprint_v1
from .messages import (
    DEFAULT_LEASE,
    DEFAULT_PARALLELISM,
    AsyncMessageProcessor,
    Message,
    MessageProcessor,
    MissingKeyError,
    Ordering,
    Outcome,
    Processed,
)
from .types import Execution, Request, Response, Result

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_PARALLELISM",
    "AsyncMessageProcessor",
    "Client",
    "Execution",
    "FingerprintError",
    "IdemdError",
    "IdempotencyError",
    "KeyReuseError",
    "Message",
    "MessageProcessor",
    "MissingKeyError",
    "NoSideEffect",
    "Ordering",
    "Outcome",
    "OutcomePendingError",
    "Processed",
    "Request",
    "Response",
    "Result",
    "RetryPolicy",
    "RpcError",
    "StillInProgressError",
    "canonical_body",
    "downstream_key",
    "fingerprint_v1",
    "idempotent",
    "pb",
]
