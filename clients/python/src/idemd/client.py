"""The synchronous idemd client: raw RPCs and the execute_once executor."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple, TypeVar

import grpc

from . import _executor as ex
from . import _h2
from ._grpc_util import (
    USER_AGENT,
    DefaultsInterceptor,
    RetryPolicy,
    call_metadata,
    channel_credentials,
    duration,
    key_hash,
    to_rpc_error,
)
from ._proto import pb, pb_grpc
from .errors import RpcError
from .types import Execution, Response, Result

__all__ = ["Client"]

log = logging.getLogger("idemd")

Handler = Callable[[Execution], object]
T = TypeVar("T")


class Client:
    """A connection to idemd.

    ::

        client = Client("idemd.internal:50051", token=os.environ["IDEMD_TOKEN"])          # TLS, system roots
        client = Client("idemd.internal:50051", token=..., ca_file="/etc/idemd/ca.pem")   # TLS, private CA
        client = Client("idemd.internal:50051", ca_file="/etc/idemd/ca.pem",
                        cert_file="/etc/idemd/client.crt", key_file="/etc/idemd/client.key")  # mTLS
        client = Client("localhost:50051", insecure=True, tenant="dev")                   # plaintext dev server

    ``token`` is sent as ``authorization: Bearer <token>`` on every call;
    ``tenant`` as ``x-tenant-id`` (only honoured by servers running without
    authentication). ``ca_file`` (PEM path) or ``root_certificates`` (PEM
    bytes) verify the server instead of the system roots; ``cert_file`` and
    ``key_file`` (PEM paths, both or neither, else ``ValueError``) present a
    client certificate to a server that requires one (mTLS: the server takes
    the tenant from it, no token needed). ``insecure=True`` is plaintext and
    refuses the TLS options. ``timeout`` is the default per-call deadline in seconds.
    Every raw RPC method takes and returns the generated messages unchanged
    (``idemd.pb``) and raises :class:`idemd.RpcError`; :attr:`stub` is the
    generated stub itself (with the same credentials and default deadline).

    The client's own calls (the raw RPC methods and the executor's) go through
    grpcio by default (grpc-core's HTTP/2: the server's SETTINGS, GOAWAY and
    ``grpc_proxy``/``https_proxy``/``no_proxy`` are its; a call it fails
    because the server never took it, after a GOAWAY, is sent again without
    spending a retry). ``transport="h2"`` makes them over the SDK's own
    transport on python-hyper's ``h2`` instead (``idemd._h2`` says what it
    does and costs), for ``host:port``/``dns:`` targets without ``channel`` or
    ``options``. ``keepalive=(interval, timeout)`` (seconds; off by default)
    pings the connection, on either transport. :attr:`stub` and
    :attr:`channel` are always grpcio's.

    Thread-safe; one client per process and target is enough. Close it (or use
    it as a context manager) to release the channel.
    """

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
        channel: Optional[grpc.Channel] = None,
        transport: Optional[str] = None,
        keepalive: Optional[object] = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        endpoint = _h2.endpoint(
            target, transport or _h2.DEFAULT_TRANSPORT, channel is not None or bool(options),
            call_metadata(token, tenant), insecure, ca_file, root_certificates, cert_file, key_file, keepalive,
        )
        self._lean = None if endpoint is None else _h2.SyncTransport(endpoint)
        if channel is None:
            opts = [("grpc.primary_user_agent", USER_AGENT), *_h2.grpcio_keepalive_options(keepalive), *options]
            if insecure:
                if ca_file or root_certificates or cert_file or key_file:
                    raise ValueError("insecure=True contradicts the TLS options")
                channel = grpc.insecure_channel(target, options=opts)
            else:
                creds = channel_credentials(ca_file, root_certificates, cert_file, key_file)
                channel = grpc.secure_channel(target, creds, options=opts)
        self._base_channel = channel
        self._metadata = call_metadata(token, tenant)
        self.channel = grpc.intercept_channel(channel, DefaultsInterceptor(self._metadata, timeout))
        self.stub = pb_grpc.IdempotencyStub(self.channel)
        # The client's own calls skip the interceptor (they pass the metadata
        # and deadline themselves): it cost a few tens of microseconds a call.
        self._stub = pb_grpc.IdempotencyStub(channel)
        self._timers = _Timers()

    # -- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        self._timers.close()
        if self._lean is not None:
            self._lean.close()
        self._base_channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- raw RPCs -----------------------------------------------------------

    def _call(self, name: str, request: object, timeout: Optional[float]) -> T:
        """RPC ``name`` (``"Claim"``...) over the lean transport, else grpcio."""
        if timeout is None:
            timeout = self.timeout
        if self._lean is not None:
            path, response_type = _h2.METHODS[name]
            return response_type.FromString(self._lean.unary(path, request.SerializeToString(), timeout))
        deadline = None if timeout is None else time.monotonic() + timeout
        moves = 0
        while True:
            try:
                return getattr(self._stub, name)(request, timeout=timeout, metadata=self._metadata or None)
            except grpc.RpcError as e:
                # A call the server never took moves on, as the h2 transport moves it.
                left = None if deadline is None else deadline - time.monotonic()
                if not _h2.grpcio_not_taken(e) or moves >= _h2.MAX_MOVES or (left is not None and left <= 0):
                    raise to_rpc_error(e) from e
                moves += 1
                timeout = left

    def claim(self, request: "pb.ClaimRequest", *, timeout: Optional[float] = None) -> "pb.ClaimResponse":
        """Claim (no retries; see :meth:`execute_once` for the full protocol)."""
        return self._call("Claim", request, timeout)

    def complete(self, request: "pb.CompleteRequest", *, timeout: Optional[float] = None) -> "pb.CompleteResponse":
        return self._call("Complete", request, timeout)

    def fail(self, request: "pb.FailRequest", *, timeout: Optional[float] = None) -> "pb.FailResponse":
        return self._call("Fail", request, timeout)

    def claim_batch(
        self, request: "pb.ClaimBatchRequest", *, timeout: Optional[float] = None
    ) -> "pb.ClaimBatchResponse":
        """ClaimBatch: up to 500 claims in one call, each answered as :meth:`claim` would
        (no retries; :meth:`idemd.MessageProcessor.process_batch` uses it)."""
        return self._call("ClaimBatch", request, timeout)

    def complete_batch(
        self, request: "pb.CompleteBatchRequest", *, timeout: Optional[float] = None
    ) -> "pb.CompleteBatchResponse":
        """CompleteBatch: up to 500 completions in one call, each answered as :meth:`complete` would."""
        return self._call("CompleteBatch", request, timeout)

    def extend_lease(
        self, request: "pb.ExtendLeaseRequest", *, timeout: Optional[float] = None
    ) -> "pb.ExtendLeaseResponse":
        return self._call("ExtendLease", request, timeout)

    def lookup(self, request: "pb.LookupRequest", *, timeout: Optional[float] = None) -> "pb.LookupResponse":
        return self._call("Lookup", request, timeout)

    def list_pending(
        self, request: "pb.ListPendingRequest", *, timeout: Optional[float] = None
    ) -> "pb.ListPendingResponse":
        return self._call("ListPending", request, timeout)

    def reconcile(self, request: "pb.ReconcileRequest", *, timeout: Optional[float] = None) -> "pb.ReconcileResponse":
        return self._call("Reconcile", request, timeout)

    def _with_retries(self, method: str, request: object, timeout: Optional[float], what: str) -> T:
        """A call retried on transport failures with the same request (the
        same lease token): safe for Complete and Fail."""
        retry = 0
        while True:
            try:
                return self._call(method, request, timeout)
            except RpcError as e:
                if not e.retryable or retry + 1 >= self.retry.attempts:
                    raise
                delay = self.retry.backoff(retry)
                log.debug("idemd: %s failed with %s; retrying in %.3fs", what, e.code.name, delay)
                retry += 1
                time.sleep(delay)

    # -- the executor -------------------------------------------------------

    def execute_once(
        self,
        endpoint: str,
        key: str,
        request: "ex.RequestLike",
        handler: Handler,
        *,
        max_wait: float = 5.0,
        fingerprint: str = "server",
        lease: Optional[float] = None,
        ttl: Optional[float] = None,
    ) -> Result:
        """Run ``handler`` at most once per (endpoint, key), across retries,
        processes and machines, and return its response, or the stored one.

        ``request`` (an :class:`idemd.Request`) identifies the operation's
        content: a retry must send the same one; another request under the same
        key raises :class:`KeyReuseError`. With ``fingerprint="local"`` the
        fingerprint is computed here and only its digest is sent.

        ``handler(execution)`` returns an :class:`idemd.Response` (or a
        ``(status, headers, body)`` tuple). If it raises :class:`NoSideEffect`
        the key is released (a retry executes again); any other exception
        records the outcome as unknown (retries get
        :class:`OutcomePendingError` until reconciled). Either way the
        handler's exception propagates. While the handler runs, the lease is
        extended at half its length.

        Waits up to ``max_wait`` seconds for an in-flight duplicate, then
        raises :class:`StillInProgressError`. ``lease`` and ``ttl`` (seconds)
        override the endpoint policy.
        """
        attempt_id = ex.new_attempt_id()
        claim = ex.build_claim(
            endpoint, key, request, fingerprint=fingerprint, attempt_id=attempt_id, lease=lease, ttl=ttl
        )
        deadline = time.monotonic() + max_wait
        waited = transport_retries = 0
        while True:
            remaining = deadline - time.monotonic()
            ex.set_wait(claim, remaining)  # server-side wait, bounded by what is left of the budget
            rpc_timeout = None if self.timeout is None else self.timeout + max(0.0, remaining)
            try:
                response = self._call("Claim", claim, rpc_timeout)
            except RpcError as e:
                # Same attempt_id: a Claim whose reply was lost returns the same lease.
                if not e.retryable or transport_retries + 1 >= self.retry.attempts:
                    raise
                delay = self.retry.backoff(transport_retries)
                log.debug("idemd: Claim failed with %s; retrying in %.3fs", e.code.name, delay)
                transport_retries += 1
                time.sleep(delay)
                continue
            result = ex.terminal_outcome(response)
            if result is not None:
                if log.isEnabledFor(logging.DEBUG):  # the key's hash is not free to compute
                    log.debug("idemd: key %s on %s replayed", key_hash(key), endpoint)
                return result
            if response.WhichOneof("outcome") == "claimed":
                return self._run(endpoint, key, response, handler, lease, ex.now())
            # in_progress: another execution holds the key.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ex.in_progress_error(response)
            time.sleep(min(ex.in_progress_delay(response, waited), remaining))
            waited += 1

    def _run(
        self,
        endpoint: str,
        key: str,
        response: "pb.ClaimResponse",
        handler: Handler,
        lease: Optional[float],
        received_at: float,
    ) -> Result:
        claimed = response.claimed
        token = claimed.lease_token
        if log.isEnabledFor(logging.DEBUG):
            log.debug("idemd: key %s on %s claimed (attempt %d)", key_hash(key), endpoint, claimed.attempt)
        keeper = _LeaseKeeper(self, endpoint, key, token, ex.lease_seconds(claimed, lease, received_at))
        keeper.start()
        try:
            try:
                out = Response.coerce(handler(ex.execution(endpoint, key, claimed)))
            finally:
                keeper.stop()
        except BaseException as error:
            self._fail(ex.fail_request(endpoint, key, token, error), error, key, keeper.expires)
            raise
        result = Result(response=out, replayed=False, attempt=claimed.attempt, fingerprint=bytes(response.fingerprint))
        try:
            self._deliver(
                "Complete",
                pb.CompleteRequest(endpoint=endpoint, key=key, lease_token=token, response=ex.response_to_pb(out)),
                keeper.expires,
            )
        except RpcError as error:
            if error.reason == "LEASE_LOST":
                raise
            # Undelivered within the lease, or refused: a Complete that did arrive on a
            # connection that then broke made the key COMPLETED, and so the call succeeded.
            if error.retryable and self._completed(endpoint, key, claimed.attempt):
                return result
            # The side effect happened but its response could not be stored: never let a
            # retry run it again.
            if self._fail(ex.fail_request(endpoint, key, token, error), error, key, keeper.expires) and \
                    self._completed(endpoint, key, claimed.attempt):
                return result
            raise
        return result

    def _deliver(self, method: str, request: object, until: float) -> None:
        """Complete or Fail, retried on transport failures (a new connection each time) with
        the same lease token, at least ``retry.attempts`` times and until the lease runs out
        (``until``, monotonic), before the error is reported."""
        self._deliver_response(method, request, until)

    def _deliver_response(self, method: str, request: object, until: float) -> T:
        """:meth:`_deliver`, returning the response (CompleteBatch's)."""
        retry = 0
        while True:
            try:
                return self._call(method, request, None)
            except RpcError as e:
                retry += 1
                left = until - time.monotonic()
                if not e.retryable or (retry >= self.retry.attempts and left <= 0):
                    raise
                delay = self.retry.backoff(retry - 1)
                if retry >= self.retry.attempts:
                    delay = min(delay, left)
                log.debug("idemd: %s failed with %s; retrying in %.3fs", method, e.code.name, delay)
                time.sleep(delay)

    def _completed(self, endpoint: str, key: str, attempt: int) -> bool:
        """Whether idemd holds the key COMPLETED by this attempt (a direct Lookup, retried)."""
        request = pb.LookupRequest(endpoint=endpoint, key=key)
        try:
            record = self._with_retries("Lookup", request, None, "Lookup").record
        except RpcError:
            return False
        return record.state == pb.STATE_COMPLETED and record.attempt == attempt

    def _fail(self, request: "pb.FailRequest", error: BaseException, key: str,
              until: Optional[float] = None) -> bool:
        """Fail, delivered like Complete; True when it could not be (noted on ``error``)."""
        try:
            self._deliver("Fail", request, time.monotonic() if until is None else until)
            return False
        except RpcError as fail_error:
            disposition = pb.Disposition.Name(request.disposition)
            log.warning("idemd: Fail %s for key %s failed: %s", disposition, key_hash(key), fail_error.code.name)
            ex.add_note(error, f"idemd: Fail {disposition} also failed: {fail_error}")
            return True


class _LeaseKeeper:
    """Extends a lease at half its length while a handler runs: the client's
    timer thread starts a thread for it when the first extension is due, so
    that a handler ending within half a lease (most do) costs no thread; one
    started and joined per request cost ~0.1 ms (issue 37's bench)."""

    def __init__(self, client: Client, endpoint: str, key: str, token: str, lease: float) -> None:
        self._client = client
        self._request = pb.ExtendLeaseRequest(endpoint=endpoint, key=key, lease_token=token, lease=duration(lease))
        self._interval = lease / 2
        self._key = key
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # orders _begin against stop
        self._thread: Optional[threading.Thread] = None
        self._timer: Optional[list] = None
        self.lost: Optional[RpcError] = None
        self._lease = lease
        #: When the lease runs out (monotonic), as far as this side knows: the claim's, then
        #: each extension's.
        self.expires = time.monotonic() + lease

    def start(self) -> None:
        self._timer = self._client._timers.schedule(self._interval, self._begin)

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._client._timers.cancel(self._timer)
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def _begin(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._thread = threading.Thread(target=self._loop, name="idemd-lease", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        interval = 0.0  # the timer waited the first half lease
        while not self._stopped.wait(interval):
            try:
                sent = time.monotonic()
                self._client._call("ExtendLease", self._request, self._interval)
                self.expires = sent + self._lease
                interval = self._interval
            except RpcError as e:
                if e.retryable:
                    interval = self._interval / 4  # try again well before the lease runs out
                    continue
                log.warning("idemd: lease of key %s lost: %s", key_hash(self._key), e.code.name)
                self.lost = e
                return


class _Timers:
    """One thread per client that calls functions when they come due (the
    lease keepers' first extensions). A cancelled entry stays in the heap
    until it comes due, or until cancelled ones are most of it, and the
    thread sleeps until the first entry's time whether or not it was
    cancelled; it is woken only for an entry due before that. Dropping
    cancelled heads at once emptied the heap between requests, so that every
    request's schedule woke the thread: a thread switch and a GIL hand-off,
    8 of a Flask request's 26 context switches (issue 37)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: List[list] = []
        self._order = itertools.count()  # ties in due time never compare functions
        self._cancelled = 0
        self._wake_at: Optional[float] = None  # when the waiting thread wakes by itself; None: never
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def schedule(self, delay: float, fn: Callable[[], None]) -> list:
        """An entry that calls ``fn`` in ``delay`` seconds, for :meth:`cancel`."""
        entry = [time.monotonic() + delay, next(self._order), fn]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idemd-timers", daemon=True)
                self._thread.start()
            elif self._wake_at is None or entry[0] < self._wake_at:
                self._cond.notify()
        return entry

    def cancel(self, entry: list) -> None:
        """``fn`` will not be called, unless it already was or is being called."""
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                fn = None
                while not self._closed:
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        entry = heapq.heappop(self._heap)
                        fn, entry[2] = entry[2], None
                        if fn is not None:
                            break
                        self._cancelled -= 1
                        continue
                    self._wake_at = self._heap[0][0] if self._heap else None
                    self._cond.wait(self._wake_at - time.monotonic() if self._heap else None)
                if self._closed:
                    return
            try:
                fn()
            except Exception:  # a keeper that cannot start must not stop the others'
                log.exception("idemd: lease keeper failed to start")
