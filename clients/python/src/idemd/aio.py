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
from . import _h2
from ._grpc_util import USER_AGENT, RetryPolicy, call_metadata, channel_credentials, duration, key_hash, to_rpc_error
from ._proto import pb, pb_grpc
from .errors import RpcError
from .types import Execution, Response, Result

__all__ = ["AsyncClient"]

log = logging.getLogger("idemd")

AsyncHandler = Callable[[Execution], Union[object, Awaitable[object]]]
T = TypeVar("T")


class _DefaultsStub:
    """The generated stub's methods with the client's credentials metadata and
    default deadline added to every call (what an interceptor would do, without
    grpc.aio's per-call interceptor task); each returns grpc.aio's call object
    unchanged."""

    def __init__(self, stub: object, metadata: Tuple[Tuple[str, str], ...], timeout: Optional[float]) -> None:
        self._stub = stub
        self._metadata = metadata
        self._timeout = timeout

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self._stub, name)

        def call(request: object, *, timeout: Optional[float] = None, metadata=None, **kwargs: object) -> object:
            pairs = list(metadata or ())
            present = {k for k, _ in pairs}
            pairs.extend((k, v) for k, v in self._metadata if k not in present)
            return method(request, timeout=self._timeout if timeout is None else timeout,
                          metadata=pairs or None, **kwargs)

        return call


class AsyncClient:
    """asyncio counterpart of :class:`idemd.Client` (same options, ``transport`` and
    ``keepalive`` too: by default grpc.aio makes the client's own calls; with
    ``transport="h2"`` they are multiplexed on one HTTP/2 connection of the SDK's transport on
    ``h2``, at most as many at once as the server's SETTINGS allow, answered in the event loop's
    callback)."""

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
        transport: Optional[str] = None,
        keepalive: Optional[object] = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._metadata = call_metadata(token, tenant)
        endpoint = _h2.endpoint(
            target, transport or _h2.DEFAULT_TRANSPORT, channel is not None or bool(options), self._metadata,
            insecure, ca_file, root_certificates, cert_file, key_file, keepalive,
        )
        self._lean = None if endpoint is None else _h2.AsyncTransport(endpoint)
        if channel is None:
            # No interceptor: grpc.aio runs an intercepted call through a task
            # of its own, which cost ~0.1 ms per Claim+Complete pair (issue
            # 37's bench). The client's own calls pass the metadata and the
            # deadline themselves; `stub` fills them in for raw calls.
            opts = [("grpc.primary_user_agent", USER_AGENT), *_h2.grpcio_keepalive_options(keepalive), *options]
            if insecure:
                if ca_file or root_certificates or cert_file or key_file:
                    raise ValueError("insecure=True contradicts the TLS options")
                channel = grpc.aio.insecure_channel(target, options=opts)
            else:
                creds = channel_credentials(ca_file, root_certificates, cert_file, key_file)
                channel = grpc.aio.secure_channel(target, creds, options=opts)
        self.channel = channel
        self._stub = pb_grpc.IdempotencyStub(channel)
        self.stub = _DefaultsStub(self._stub, self._metadata, timeout)

    async def close(self) -> None:
        if self._lean is not None:
            self._lean.close()
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- raw RPCs -----------------------------------------------------------

    async def _call(self, name: str, request: object, timeout: Optional[float]) -> T:
        """RPC ``name`` (``"Claim"``...) over the lean transport, else grpc.aio."""
        if timeout is None:
            timeout = self.timeout
        if self._lean is not None:
            path, response_type = _h2.METHODS[name]
            return response_type.FromString(await self._lean.unary(path, request.SerializeToString(), timeout))
        deadline = None if timeout is None else time.monotonic() + timeout
        moves = 0
        while True:
            try:
                return await getattr(self._stub, name)(request, timeout=timeout, metadata=self._metadata or None)
            except grpc.RpcError as e:
                # A call the server never took moves on, as the h2 transport moves it.
                left = None if deadline is None else deadline - time.monotonic()
                if not _h2.grpcio_not_taken(e) or moves >= _h2.MAX_MOVES or (left is not None and left <= 0):
                    raise to_rpc_error(e) from e
                moves += 1
                timeout = left

    async def claim(self, request: "pb.ClaimRequest", *, timeout: Optional[float] = None) -> "pb.ClaimResponse":
        return await self._call("Claim", request, timeout)

    async def complete(
        self, request: "pb.CompleteRequest", *, timeout: Optional[float] = None
    ) -> "pb.CompleteResponse":
        return await self._call("Complete", request, timeout)

    async def claim_batch(
        self, request: "pb.ClaimBatchRequest", *, timeout: Optional[float] = None
    ) -> "pb.ClaimBatchResponse":
        return await self._call("ClaimBatch", request, timeout)

    async def complete_batch(
        self, request: "pb.CompleteBatchRequest", *, timeout: Optional[float] = None
    ) -> "pb.CompleteBatchResponse":
        return await self._call("CompleteBatch", request, timeout)

    async def fail(self, request: "pb.FailRequest", *, timeout: Optional[float] = None) -> "pb.FailResponse":
        return await self._call("Fail", request, timeout)

    async def extend_lease(
        self, request: "pb.ExtendLeaseRequest", *, timeout: Optional[float] = None
    ) -> "pb.ExtendLeaseResponse":
        return await self._call("ExtendLease", request, timeout)

    async def lookup(self, request: "pb.LookupRequest", *, timeout: Optional[float] = None) -> "pb.LookupResponse":
        return await self._call("Lookup", request, timeout)

    async def list_pending(
        self, request: "pb.ListPendingRequest", *, timeout: Optional[float] = None
    ) -> "pb.ListPendingResponse":
        return await self._call("ListPending", request, timeout)

    async def reconcile(
        self, request: "pb.ReconcileRequest", *, timeout: Optional[float] = None
    ) -> "pb.ReconcileResponse":
        return await self._call("Reconcile", request, timeout)

    async def _with_retries(self, method: str, request: object, what: str) -> T:
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
                response = await self._call("Claim", claim, rpc_timeout)
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
        keeper = _LeaseKeeper(self, endpoint, key, token, ex.lease_seconds(claimed, lease, received_at))
        try:
            try:
                value = handler(ex.execution(endpoint, key, claimed))
                if inspect.isawaitable(value):
                    value = await value
                out = Response.coerce(value)
            finally:
                await keeper.stop()
        except BaseException as error:
            await self._fail(ex.fail_request(endpoint, key, token, error), error, key, keeper.expires)
            raise
        result = Result(response=out, replayed=False, attempt=claimed.attempt, fingerprint=bytes(response.fingerprint))
        try:
            await self._deliver(
                "Complete",
                pb.CompleteRequest(endpoint=endpoint, key=key, lease_token=token, response=ex.response_to_pb(out)),
                keeper.expires,
            )
        except RpcError as error:
            if error.reason == "LEASE_LOST":
                raise
            # See idemd.Client._run: a Complete that arrived before its connection broke counts.
            if error.retryable and await self._completed(endpoint, key, claimed.attempt):
                return result
            if await self._fail(ex.fail_request(endpoint, key, token, error), error, key, keeper.expires) and \
                    await self._completed(endpoint, key, claimed.attempt):
                return result
            raise
        return result

    async def _deliver(self, method: str, request: object, until: float) -> None:
        """See :meth:`idemd.Client._deliver`."""
        retry = 0
        while True:
            try:
                await self._call(method, request, None)
                return
            except RpcError as e:
                retry += 1
                left = until - time.monotonic()
                if not e.retryable or (retry >= self.retry.attempts and left <= 0):
                    raise
                delay = self.retry.backoff(retry - 1)
                if retry >= self.retry.attempts:
                    delay = min(delay, left)
                log.debug("idemd: %s failed with %s; retrying in %.3fs", method, e.code.name, delay)
                await asyncio.sleep(delay)

    async def _completed(self, endpoint: str, key: str, attempt: int) -> bool:
        try:
            record = (await self._with_retries("Lookup", pb.LookupRequest(endpoint=endpoint, key=key), "Lookup")).record
        except RpcError:
            return False
        return record.state == pb.STATE_COMPLETED and record.attempt == attempt

    async def _fail(self, request: "pb.FailRequest", error: BaseException, key: str,
                    until: Optional[float] = None) -> bool:
        try:
            await self._deliver("Fail", request, time.monotonic() if until is None else until)
            return False
        except RpcError as fail_error:
            disposition = pb.Disposition.Name(request.disposition)
            log.warning("idemd: Fail %s for key %s failed: %s", disposition, key_hash(key), fail_error.code.name)
            ex.add_note(error, f"idemd: Fail {disposition} also failed: {fail_error}")
            return True

    async def _keep_lease(self, endpoint: str, key: str, token: str, lease: float, keeper: "_LeaseKeeper") -> None:
        """Extends the lease now (half of it has passed), then every half lease."""
        request = pb.ExtendLeaseRequest(endpoint=endpoint, key=key, lease_token=token, lease=duration(lease))
        while True:
            try:
                sent = time.monotonic()
                await self._call("ExtendLease", request, lease / 2)
                keeper.expires = sent + lease
                interval = lease / 2
            except RpcError as e:
                if not e.retryable:
                    log.warning("idemd: lease of key %s lost: %s", key_hash(key), e.code.name)
                    return
                interval = lease / 4  # try again well before the lease runs out
            await asyncio.sleep(interval)


class _LeaseKeeper:
    """Extends a lease at half its length while a handler runs: a timer until
    the first extension is due, and a task only from then on. Most handlers
    end well within half a lease, and a task made and cancelled per request
    cost more than the timer (issue 37's bench)."""

    def __init__(self, client: AsyncClient, endpoint: str, key: str, token: str, lease: float) -> None:
        self._extend = lambda: client._keep_lease(endpoint, key, token, lease, self)
        self._task: Optional["asyncio.Future[None]"] = None
        #: When the lease runs out (monotonic), as far as this side knows.
        self.expires = time.monotonic() + lease
        self._timer = asyncio.get_running_loop().call_later(lease / 2, self._start)

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._extend())

    async def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
