"""The executor's paths beyond the shared scenarios, against the live idemd:
lease extension, transport retries with the same attempt_id, Fail dispositions,
a refused Complete, raw RPCs for reconciliation, credentials and TLS options."""

from __future__ import annotations

import secrets
import threading
import time
from typing import List
from unittest import mock

import grpc
import pytest

import idemd
from idemd import pb

from conftest import CREDENTIALS, Server, start_server

ENDPOINT = "POST /v1/payments"
PAYMENT = idemd.Request("POST", "/v1/payments", b'{"amount":4200,"currency":"usd"}', "application/json")
CREATED = idemd.Response(201, [("Content-Type", "application/json")], b'{"id":"pay_1"}')


def new_key() -> str:
    return "py-" + secrets.token_hex(12)


def lookup(client: idemd.Client, key: str, endpoint: str = ENDPOINT) -> "pb.Record":
    return client.lookup(pb.LookupRequest(endpoint=endpoint, key=key, include_response=True)).record


class InjectedUnavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: connection reset after the server answered"

    def trailing_metadata(self):
        return ()

    def result(self, timeout=None):  # what grpc's interceptor machinery calls
        raise self


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """Records every call; can lose the server's reply to the first N calls of
    a method (the call reaches the real server, the caller sees UNAVAILABLE)."""

    def __init__(self, lose_replies_of: str = "", losses: int = 0) -> None:
        self.calls: List[tuple] = []
        self.lose_replies_of = lose_replies_of
        self.losses = losses

    def intercept_unary_unary(self, continuation, details, request):
        method = details.method.rsplit("/", 1)[-1]
        self.calls.append((method, request))
        outcome = continuation(details, request)
        if method == self.lose_replies_of and self.losses > 0:
            self.losses -= 1
            outcome.result()  # the server did process it
            return InjectedUnavailable()
        return outcome


def recorded_client(server: Server, recorder: Recorder, who: str = "alice", **kwargs) -> idemd.Client:
    channel = grpc.intercept_channel(grpc.insecure_channel(server.address), recorder)
    return idemd.Client(server.address, token=CREDENTIALS[who], channel=channel, **kwargs)


def test_lost_claim_reply_is_retried_with_the_same_attempt_id(server: Server) -> None:
    recorder = Recorder(lose_replies_of="Claim", losses=1)
    calls = []
    with recorded_client(server, recorder) as client:
        result = client.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: calls.append(ex) or CREATED)
    claims = [request for method, request in recorder.calls if method == "Claim"]
    assert len(claims) == 2
    assert claims[0].attempt_id and claims[0].attempt_id == claims[1].attempt_id
    assert (result.replayed, result.attempt, len(calls)) == (False, 1, 1)


def test_each_execute_has_its_own_attempt_id(server: Server) -> None:
    recorder = Recorder()
    with recorded_client(server, recorder) as client:
        for _ in range(2):
            client.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)
    ids = [request.attempt_id for method, request in recorder.calls if method == "Claim"]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(len(i) <= 128 and all(c.isalnum() or c in "-_" for c in i) for i in ids)


def test_refusals_are_not_retried(server: Server) -> None:
    recorder = Recorder()
    with recorded_client(server, recorder, who="mallory") as client:
        with pytest.raises(idemd.RpcError) as raised:
            client.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)
    assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert [m for m, _ in recorder.calls] == ["Claim"]


def test_invalid_key_names_the_field(alice: idemd.Client) -> None:
    with pytest.raises(idemd.RpcError) as raised:
        alice.execute_once(ENDPOINT, "bad key!", PAYMENT, lambda ex: CREATED)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in raised.value.field_violations] == ["key"]


def test_long_handler_keeps_its_lease(server: Server, alice: idemd.Client) -> None:
    key = new_key()
    seen = {}

    def slow(execution: idemd.Execution) -> idemd.Response:
        time.sleep(1.6)  # well past the 0.6 s lease
        return CREATED

    def duplicate() -> None:
        time.sleep(1.1)
        with server.client("alice") as other:
            claim = pb.ClaimRequest(
                endpoint=ENDPOINT,
                key=key,
                request=pb.HttpRequest(
                    method=PAYMENT.method, path=PAYMENT.path, body=PAYMENT.body_bytes, content_type=PAYMENT.content_type
                ),
            )
            seen["outcome"] = other.claim(claim).WhichOneof("outcome")

    thread = threading.Thread(target=duplicate)
    thread.start()
    result = alice.execute_once(ENDPOINT, key, PAYMENT, slow, lease=0.6)
    thread.join()
    # Without extensions the lease would have expired: the duplicate would see
    # `pending` (this endpoint's policy) instead of a live holder.
    assert seen["outcome"] == "in_progress"
    assert not result.replayed
    assert lookup(alice, key).state == pb.STATE_COMPLETED


def test_ambiguous_failure_records_the_reason_and_is_reconciled(alice: idemd.Client) -> None:
    key = new_key()

    def timeout(execution: idemd.Execution) -> idemd.Response:
        raise TimeoutError("provider timed out")

    with pytest.raises(TimeoutError):
        alice.execute_once(ENDPOINT, key, PAYMENT, timeout)
    record = lookup(alice, key)
    assert record.state == pb.STATE_UNKNOWN
    assert record.reason == "TimeoutError: provider timed out"

    with pytest.raises(idemd.OutcomePendingError) as raised:
        alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED)
    assert (raised.value.http_status, raised.value.error_code) == (409, "outcome_pending")
    assert (raised.value.state, raised.value.reason) == ("UNKNOWN", "TimeoutError: provider timed out")
    assert raised.value.to_http()[0] == 409

    # A reconciler finds it and records that the charge did happen.
    pending = alice.list_pending(pb.ListPendingRequest(endpoint=ENDPOINT, page_size=1000))
    assert key in [r.key for r in pending.records]
    alice.reconcile(
        pb.ReconcileRequest(endpoint=ENDPOINT, key=key, committed=pb.StoredResponse(status=201, body=b"reconciled"))
    )
    result = alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED)
    assert result.replayed and result.response.body == b"reconciled"


def test_no_side_effect_wrapping_another_error_releases(alice: idemd.Client) -> None:
    key = new_key()

    class CardDeclined(Exception):
        pass

    def declined(execution: idemd.Execution) -> idemd.Response:
        try:
            raise CardDeclined("insufficient funds")
        except CardDeclined as e:
            raise idemd.NoSideEffect("declined before charging") from e

    with pytest.raises(idemd.NoSideEffect) as raised:
        alice.execute_once(ENDPOINT, key, PAYMENT, declined)
    assert isinstance(raised.value.__cause__, CardDeclined)
    with pytest.raises(idemd.RpcError) as missing:
        lookup(alice, key)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED).attempt == 1


def test_handler_returning_garbage_is_an_unknown_outcome(alice: idemd.Client) -> None:
    key = new_key()
    with pytest.raises(TypeError):
        alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: None)
    assert lookup(alice, key).state == pb.STATE_UNKNOWN


def test_refused_complete_never_lets_a_retry_run_again(alice: idemd.Client) -> None:
    key = new_key()
    huge = idemd.Response(200, [], b"x" * (300 * 1024))  # over the default 256 KiB max_response_bytes
    with pytest.raises(idemd.RpcError) as raised:
        alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: huge)
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    record = lookup(alice, key)
    assert record.state == pb.STATE_UNKNOWN and "RESOURCE_EXHAUSTED" in record.reason


def test_tuple_responses_and_headers_round_trip(alice: idemd.Client) -> None:
    key = new_key()
    headers = [("Set-Cookie", "a=1"), ("Content-Type", "text/plain"), ("Set-Cookie", "b=2")]
    first = alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: (200, headers, "h\u00e9llo"))
    again = alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED)
    assert first.response == again.response == idemd.Response(200, headers, "h\u00e9llo".encode())
    assert again.response.header("content-type") == "text/plain"
    assert again.replayed and len(again.fingerprint) == 32


def test_local_fingerprint_with_ignore_fields_matches_the_server(alice: idemd.Client) -> None:
    key = new_key()
    ignore = ["/client_ts"]
    first = idemd.Request("POST", "/v1/payments", '{"amount":1,"client_ts":"10:00"}', "application/json", ignore)
    retry = idemd.Request("POST", "/v1/payments", '{"client_ts":"10:05","amount":1.0}', "application/json", ignore)
    local = alice.execute_once(ENDPOINT, key, first, lambda ex: CREATED, fingerprint="local")
    replay = alice.execute_once(ENDPOINT, key, retry, lambda ex: CREATED, fingerprint="server")
    assert replay.replayed and replay.fingerprint == local.fingerprint == idemd.fingerprint_v1(
        "POST", "/v1/payments", first.body, "application/json", ignore
    )


def test_local_fingerprint_refuses_malformed_json_before_any_call(alice: idemd.Client) -> None:
    bad = idemd.Request("POST", "/v1/payments", b'{"amount":1,"amount":2}', "application/json")
    with pytest.raises(idemd.FingerprintError) as raised:
        alice.execute_once(ENDPOINT, new_key(), bad, lambda ex: CREATED, fingerprint="local")
    assert raised.value.kind == "duplicate_key"


def test_downstream_key_of_an_execution(alice: idemd.Client) -> None:
    key = new_key()
    seen = []
    alice.execute_once(ENDPOINT, key, PAYMENT, lambda ex: seen.append(ex.downstream_key("charge")) or CREATED)
    assert seen == [idemd.downstream_key(key, "charge")]


def test_stub_gets_credentials_and_default_deadline(server: Server) -> None:
    with server.client("alice") as client:
        with pytest.raises(grpc.RpcError) as raised:
            client.stub.Lookup(pb.LookupRequest(endpoint=ENDPOINT, key=new_key()))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND  # not UNAUTHENTICATED


def test_async_stub_gets_credentials_and_default_deadline(server: Server) -> None:
    import asyncio

    from idemd.aio import AsyncClient

    async def main() -> grpc.StatusCode:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True, timeout=5) as client:
            call = client.stub.Lookup(pb.LookupRequest(endpoint=ENDPOINT, key=new_key()))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            assert call.time_remaining() is not None  # the client's default deadline
            return raised.value.code()

    assert asyncio.run(main()) == grpc.StatusCode.NOT_FOUND  # not UNAUTHENTICATED


def test_a_handler_within_half_its_lease_starts_no_thread(alice: idemd.Client) -> None:
    # A thread started and joined per execution cost ~0.1 ms (issue 37):
    # only a handler still running at half its lease gets a keeper thread.
    threads = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        threads.append(thread.name)
        real_start(thread)

    alice.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)  # the client's timer thread, once
    with mock.patch.object(threading.Thread, "start", start):
        for _ in range(3):
            alice.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)
    assert threads == []


def test_handlers_within_half_their_lease_do_not_wake_the_timer_thread(alice: idemd.Client) -> None:
    # Each wake-up is a thread switch and a GIL hand-off (issue 37: 8 of a
    # Flask request's 26 context switches). Enough executions that cancelled entries
    # get compacted away, which used to leave the heap empty, so that every
    # later schedule woke the thread.
    alice.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)  # starts the timer thread
    time.sleep(0.05)  # until it waits for that first entry
    timers = alice._timers
    wakeups = []
    real_notify = timers._cond.notify

    def notify(n: int = 1) -> None:
        wakeups.append(n)
        real_notify(n)

    with mock.patch.object(timers._cond, "notify", notify):
        for _ in range(100):
            alice.execute_once(ENDPOINT, new_key(), PAYMENT, lambda ex: CREATED)
    assert wakeups == []


def test_tls_client_does_not_talk_plaintext(server: Server) -> None:
    with idemd.Client(server.address, token=CREDENTIALS["alice"], timeout=3, retry=idemd.RetryPolicy(attempts=1)) as c:
        with pytest.raises(idemd.RpcError) as raised:
            c.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=new_key()))
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(ValueError):
        idemd.Client(server.address, insecure=True, ca_file="/nonexistent/ca.pem")


def test_tenant_header_on_a_server_without_auth() -> None:
    with start_server(auth=False) as dev:
        key = new_key()
        with idemd.Client(dev.address, insecure=True, tenant="team-a") as a, idemd.Client(
            dev.address, insecure=True, tenant="team-b"
        ) as b:
            assert not a.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED).replayed
            assert a.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED).replayed
            with pytest.raises(idemd.RpcError) as raised:
                lookup(b, key)
            assert raised.value.code == grpc.StatusCode.NOT_FOUND


def test_async_client_keeps_the_lease_and_accepts_plain_handlers(server: Server) -> None:
    import asyncio

    from idemd.aio import AsyncClient

    key = new_key()

    async def main() -> None:
        async with AsyncClient(server.address, token=CREDENTIALS["alice"], insecure=True) as client:

            async def slow(execution: idemd.Execution) -> idemd.Response:
                await asyncio.sleep(1.6)  # well past the 0.6 s lease
                return CREATED

            async def duplicate() -> str:
                await asyncio.sleep(1.1)
                with pytest.raises(idemd.StillInProgressError):
                    await client.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED, max_wait=0)
                return "in_progress"

            result, seen = await asyncio.gather(
                client.execute_once(ENDPOINT, key, PAYMENT, slow, lease=0.6), duplicate()
            )
            assert (result.replayed, seen) == (False, "in_progress")
            again = await client.execute_once(ENDPOINT, key, PAYMENT, lambda ex: CREATED)  # plain function
            assert again.replayed and again.response == CREATED
            record = (await client.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=key))).record
            assert record.state == pb.STATE_COMPLETED
            with pytest.raises(idemd.NoSideEffect):
                await client.execute_once(ENDPOINT, new_key(), PAYMENT, _raise_no_side_effect)

    asyncio.run(main())


async def _raise_no_side_effect(execution: idemd.Execution) -> idemd.Response:
    raise idemd.NoSideEffect("nothing happened")
