"""The generated stubs (idemd.v1), with a clear message when they are missing."""

try:
    from .v1 import idempotency_pb2 as pb  # noqa: F401
    from .v1 import idempotency_pb2_grpc as pb_grpc  # noqa: F401
except ImportError as e:  # pragma: no cover - only without generated stubs
    raise ImportError(
        "idemd: the generated gRPC stubs (idemd.v1) are missing. Install the package "
        "(pip install clients/python) or generate them in a checkout with "
        "`python clients/python/build_protos.py`."
    ) from e

__all__ = ["pb", "pb_grpc"]
