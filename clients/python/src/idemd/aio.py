"""The asyncio idemd client (grpc.aio): the same API as :class:`idemd.Client`,
with coroutines.

::

    from idemd.aio import AsyncClient

    async with AsyncClient("localhost:50051", token=TOKEN, insecure=True) as client:
        result = await client.execute_once("POST /v1/payments", key, request, handler)

The handler may be a coroutine function or a plain function.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from typing import Awaitable, Callable, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import grpc.aio

from . import _executor as ex
from ._grpc_util import USER_AGENT, RetryPolicy, call_metadata, channel_credentials, duration, key_hash, to_rpc_error
from ._proto import pb, pb_grpc
from .errors import RpcError
from .types import Execution, Response, Result

__all__ = ["AsyncClient"]

log = logging.getLogger("idemd")

AsyncHandler = Callable[[Execution], Union[object, Awaitable[object]]]
T = TypeVar("T")


class _DefaultsInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, metadata: Tuple[Tuple[str, str], ...], timeout: Optional[float]) -> None:
        self._metadata = metadata
        self._timeout = timeout

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        pairs = list(client_call_details.metadata or ())
        present = {k for k, _ in pairs}
        pairs.extend((k, v) for k, v in self._metadata if k not in present)
        details = grpc.aio.ClientCallDetails(
            client_call_details.method,
            client_call_details.timeout if client_call_details.timeout is not None else self._timeout,
            grpc.aio.Metadata(*pairs),
            client_call_details.credentials,
            client_call_details.wait_for_ready,
        )
        return await continuation(details, request)


class AsyncClient:
    """asyncio counterpart of :class:`idemd.Client` (same options)."""

    def __init__(
        self,
        target: str,
        *,
        token: Optional[str] = None,
        tenant: Optional[str] = None,
        insecure: bool = False,
        ca_file: Optional[str] = None,
        root_certificates: Optional[bytes] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
        timeout: Optional[float] = 10.0,
        retry: Optional[RetryPolicy] = None,
        options: Sequence[Tuple[str, object]] = (),
        channel: Optional[grpc.aio.Channel] = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._metadata = call_metadata(token, tenant)
        if channel is None:
            opts = [("grpc.primary_user_agent", USER_AGENT), *options]
            interceptors = [_DefaultsInterceptor(self._metadata, timeout)]
            if insecure:
                if ca_file or root_certificates or cert_file or key_file:
                    raise ValueError("insecure=True contradicts the TLS options")
                channel = grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors)
            else:
                creds = channel_credentials(ca_file, root_certificates, cert_file, key_file)
                channel = grpc.aio.secure_channel(target, creds, options=opts, interceptors=interceptors)
        self.channel = channel
        self.stub = pb_grpc.IdempotencyStub(channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- raw RPCs -----------------------------------------------------------

    async def _call(self, method: Callable[..., Awaitable[T]], request: object, timeout: Optional[float]) -> T:
        try:
            return await method(
                request,
                timeout=timeout if timeout is not None else self.timeout,
                metadata=self._metadata or None,
            )
        except grpc.RpcError as e:
            raise to_rpc_error(e) from e

    async def claim(self, request: "pb.ClaimRequest", *, timeout: Optional[float] = None) -> "pb.ClaimResponse":
        return await self._call(self.stub.Claim, request, timeout)

    async def complete(
        self, request: "pb.CompleteRequest", *, timeout: Optional[float] = None
    ) -> "pb.CompleteResponse":
        return await self._call(self.stub.Complete, request, timeout)

    async def fail(self, request: "pb.FailRequest", *, timeout: Optional[float] = None) -> "pb.FailResponse":
        return await self._call(self.stub.Fail, request, timeout)

    async def extend_lease(
        self, request: "pb.ExtendLeaseRequest", *, timeout: Optional[float] = None
    ) -> "pb.ExtendLeaseResponse":
        return await self._call(self.stub.ExtendLease, request, timeout)

    async def lookup(self, request: "pb.LookupRequest", *, timeout: Optional[float] = None) -> "pb.LookupResponse":
        return await self._call(self.stub.Lookup, request, timeout)

    async def list_pending(
        self, request: "pb.ListPendingRequest", *, timeout: Optional[float] = None
    ) -> "pb.ListPendingResponse":
        return await self._call(self.stub.ListPending, request, timeout)

    async def reconcile(
        self, request: "pb.ReconcileRequest", *, timeout: Optional[float] = None
    ) -> "pb.ReconcileResponse":
        return await self._call(self.stub.Reconcile, request, timeout)

    async def _with_retries(self, method: Callable[..., Awaitable[T]], request: object, what: str) -> T:
        retry = 0
        while True:
            try:
                return await self._call(method, request, None)
            except RpcError as e:
                if not e.retryable or retry + 1 >= self.retry.attempts:
                    raise
                delay = self.retry.backoff(retry)
                log.debug("idemd: %s failed with %s; retrying in %.3fs", what, e.code.name, delay)
                retry += 1
                await asyncio.sleep(delay)

    # -- the executor -------------------------------------------------------

    async def execute_once(
        self,
        endpoint: str,
        key: str,
        request: "ex.RequestLike",
        handler: AsyncHandler,
        *,
        max_wait: float = 5.0,
        fingerprint: str = "server",
        lease: Optional[float] = None,
        ttl: Optional[float] = None,
    ) -> Result:
        """See :meth:`idemd.Client.execute_once`."""
        claim = ex.build_claim(
            endpoint, key, request, fingerprint=fingerprint, attempt_id=ex.new_attempt_id(), lease=lease, ttl=ttl
        )
        deadline = time.monotonic() + max_wait
        waited = transport_retries = 0
        while True:
            remaining = deadline - time.monotonic()
            ex.set_wait(claim, remaining)
            rpc_timeout = None if self.timeout is None else self.timeout + max(0.0, remaining)
            try:
                response = await self._call(self.stub.Claim, claim, rpc_timeout)
            except RpcError as e:
                if not e.retryable or transport_retries + 1 >= self.retry.attempts:
                    raise
                transport_retries += 1
                await asyncio.sleep(self.retry.backoff(transport_retries - 1))
                continue
            result = ex.terminal_outcome(response)
            if result is not None:
                return result
            if response.WhichOneof("outcome") == "claimed":
                return await self._run(endpoint, key, response, handler, lease, ex.now())
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ex.in_progress_error(response)
            await asyncio.sleep(min(ex.in_progress_delay(response, waited), remaining))
            waited += 1

    async def _run(
        self,
        endpoint: str,
        key: str,
        response: "pb.ClaimResponse",
        handler: AsyncHandler,
        lease: Optional[float],
        received_at: float,
    ) -> Result:
        claimed = response.claimed
        token = claimed.lease_token
        keeper = asyncio.ensure_future(
            self._keep_lease(endpoint, key, token, ex.lease_seconds(claimed, lease, received_at))
        )
        try:
            try:
                value = handler(ex.execution(endpoint, key, claimed))
                if inspect.isawaitable(value):
                    value = await value
                out = Response.coerce(value)
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
        except BaseException as error:
            await self._fail(ex.fail_request(endpoint, key, token, error), error, key)
            raise
        try:
            await self._with_retries(
                self.stub.Complete,
                pb.CompleteRequest(endpoint=endpoint, key=key, lease_token=token, response=ex.response_to_pb(out)),
                "Complete",
            )
        except RpcError as error:
            if error.reason != "LEASE_LOST":
                await self._fail(ex.fail_request(endpoint, key, token, error), error, key)
            raise
        return Result(response=out, replayed=False, attempt=claimed.attempt, fingerprint=bytes(response.fingerprint))

    async def _fail(self, request: "pb.FailRequest", error: BaseException, key: str) -> None:
        try:
            await self._with_retries(self.stub.Fail, request, "Fail")
        except RpcError as fail_error:
            disposition = pb.Disposition.Name(request.disposition)
            log.warning("idemd: Fail %s for key %s failed: %s", disposition, key_hash(key), fail_error.code.name)
            ex.add_note(error, f"idemd: Fail {disposition} also failed: {fail_error}")

    async def _keep_lease(self, endpoint: str, key: str, token: str, lease: float) -> None:
        request = pb.ExtendLeaseRequest(endpoint=endpoint, key=key, lease_token=token, lease=duration(lease))
        interval = lease / 2
        while True:
            await asyncio.sleep(interval)
            try:
                await self._call(self.stub.ExtendLease, request, lease / 2)
                interval = lease / 2
            except RpcError as e:
                if e.retryable:
                    interval = lease / 4  # try again well before the lease runs out
                    continue
                log.warning("idemd: lease of key %s lost: %s", key_hash(key), e.code.name)
                return
