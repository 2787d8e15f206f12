"""Runs every scenario of clients/conformance/scenarios.json against a live idemd.

The runner interprets the step language of clients/conformance/README.md; an
unknown op, field, handler action or expectation fails the scenario loudly.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

import pytest

import idemd
from idemd import pb
from idemd.aio import AsyncClient

from conftest import CREDENTIALS, SCENARIOS, Server

COMMON_FIELDS = {"op", "as", "expect"}
STEP_FIELDS = {
    "execute": {"endpoint", "key", "request", "handler", "fingerprint", "max_wait_ms", "parallel"},
    "claim": {"endpoint", "key", "request", "lease_ms", "save_as"},
    "complete": {"endpoint", "key", "lease_from", "response"},
    "lookup": {"endpoint", "key"},
    "sleep": {"ms"},
}
EXPECT_FIELDS = {
    "execute": {
        "result", "status", "body", "headers", "http_status", "error_code",
        "attempt", "handler_calls", "results", "error",
    },
    "claim": {"outcome", "attempt", "error"},
    "complete": {"ok", "error"},
    "lookup": {"state", "error"},
    "sleep": set(),
}
REQUEST_FIELDS = {"method", "path", "content_type", "body"}
HANDLER_FIELDS = {"action", "status", "headers", "body", "delay_ms"}
RESPONSE_FIELDS = {"status", "headers", "body"}
ERROR_FIELDS = {"code", "reason"}
RESULTS = {"executed", "replayed", "mismatch", "pending", "in_progress", "handler_error"}


class ScenarioError(AssertionError):
    pass


def check_fields(what: str, given: Dict[str, Any], allowed: set) -> None:
    unknown = set(given) - allowed
    if unknown:
        raise ScenarioError(f"{what}: unknown field(s) {sorted(unknown)}: the runner must be taught them")


class HandlerFailedBeforeSideEffect(idemd.NoSideEffect):
    pass


class HandlerAmbiguousFailure(TimeoutError):
    pass


class Outcome:
    """How one execute ended."""

    def __init__(self, kind: str, result: Optional[idemd.Result] = None, error: Optional[BaseException] = None):
        self.kind = kind
        self.result = result
        self.error = error

    def __repr__(self) -> str:
        return f"Outcome({self.kind}, {self.result or self.error!r})"


class Runner:
    def __init__(self, server: Server, scenario: Dict[str, Any], flavour: str = "sync") -> None:
        self.server = server
        self.flavour = flavour
        self.scenario = scenario
        self.prefix = secrets.token_hex(6)
        self.clients: Dict[str, idemd.Client] = {}
        self.leases: Dict[str, Tuple[str, str, str]] = {}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def client(self, who: str) -> idemd.Client:
        if who not in CREDENTIALS:
            raise ScenarioError(f"unknown credential {who!r}")
        if who not in self.clients:
            self.clients[who] = idemd.Client(self.server.address, token=CREDENTIALS[who], insecure=True, timeout=10)
        return self.clients[who]

    def key(self, template: str) -> str:
        return re.sub(r"\{key:(\d+)\}", lambda m: f"{self.prefix}-{m.group(1)}", template)

    def run(self) -> None:
        check_fields("scenario", self.scenario, {"name", "steps"})
        for index, step in enumerate(self.scenario["steps"]):
            op = step.get("op")
            try:
                if op not in STEP_FIELDS:
                    raise ScenarioError(f"unknown op {op!r}")
                check_fields("step", step, COMMON_FIELDS | STEP_FIELDS[op])
                expect = step.get("expect", {})
                check_fields("expect", expect, EXPECT_FIELDS[op])
                getattr(self, f"op_{op}")(step, expect)
            except AssertionError as e:
                raise ScenarioError(f"scenario {self.scenario['name']!r}, step {index} ({op}): {e}") from e

    # -- ops -----------------------------------------------------------------

    def op_sleep(self, step: Dict[str, Any], expect: Dict[str, Any]) -> None:
        time.sleep(step["ms"] / 1000)

    def op_execute(self, step: Dict[str, Any], expect: Dict[str, Any]) -> None:
        handler_spec = step["handler"]
        check_fields("handler", handler_spec, HANDLER_FIELDS)
        action = handler_spec["action"]
        if action not in ("respond", "error_before_side_effect", "error_ambiguous"):
            raise ScenarioError(f"unknown handler action {action!r}")
        request = self.request(step["request"])
        calls = [0]
        raised: List[BaseException] = []
        lock = threading.Lock()

        def begin() -> None:
            with lock:
                calls[0] += 1

        def finish() -> idemd.Response:
            if action == "respond":
                return idemd.Response(
                    handler_spec["status"],
                    [(name, value) for name, value in handler_spec.get("headers", [])],
                    handler_spec.get("body", "").encode("utf-8"),
                )
            if action == "error_before_side_effect":
                error: BaseException = HandlerFailedBeforeSideEffect("card declined before charging")
            else:
                error = HandlerAmbiguousFailure("payment provider timed out")
            with lock:
                raised.append(error)
            raise error

        def handler(execution: idemd.Execution) -> idemd.Response:
            begin()
            time.sleep(handler_spec.get("delay_ms", 0) / 1000)
            return finish()

        async def async_handler(execution: idemd.Execution) -> idemd.Response:
            begin()
            await asyncio.sleep(handler_spec.get("delay_ms", 0) / 1000)
            return finish()

        args = (step["endpoint"], self.key(step["key"]), request)
        kwargs = dict(max_wait=step.get("max_wait_ms", 5000) / 1000, fingerprint=step.get("fingerprint", "server"))
        parallel = step.get("parallel", 1)
        if self.flavour == "sync":
            client = self.client(step["as"])

            def one() -> Outcome:
                return self.classify(lambda: client.execute_once(*args, handler, **kwargs), raised)

            with ThreadPoolExecutor(max_workers=parallel) as pool:
                outcomes = [f.result() for f in [pool.submit(one) for _ in range(parallel)]]
        else:

            async def all_async() -> List[Outcome]:
                async with AsyncClient(self.server.address, token=CREDENTIALS[step["as"]], insecure=True) as aclient:
                    async def one_async() -> Outcome:
                        try:
                            result = await aclient.execute_once(*args, async_handler, **kwargs)
                        except BaseException as e:
                            return self.classify_error(e, raised)
                        return self.classify(lambda: result, raised)

                    return list(await asyncio.gather(*[one_async() for _ in range(parallel)]))

            outcomes = asyncio.run(all_async())

        for outcome in outcomes:
            self.check_execute(expect, outcome)
        if "handler_calls" in expect:
            assert calls[0] == expect["handler_calls"], f"handler_calls: {calls[0]} != {expect['handler_calls']}"
        if "results" in expect:
            unknown = set(expect["results"]) - RESULTS
            if unknown:
                raise ScenarioError(f"results: unknown result name(s) {sorted(unknown)}")
            got = Counter(o.kind for o in outcomes)
            want = Counter({k: v for k, v in expect["results"].items() if v})
            assert got == want, f"results: {dict(got)} != {dict(want)} ({outcomes})"

    @classmethod
    def classify(cls, execute, raised: List[BaseException]) -> Outcome:
        try:
            result = execute()
        except BaseException as e:
            return cls.classify_error(e, raised)
        return Outcome("replayed" if result.replayed else "executed", result=result)

    @staticmethod
    def classify_error(e: BaseException, raised: List[BaseException]) -> Outcome:
        if isinstance(e, idemd.KeyReuseError):
            return Outcome("mismatch", error=e)
        if isinstance(e, idemd.OutcomePendingError):
            return Outcome("pending", error=e)
        if isinstance(e, idemd.StillInProgressError):
            return Outcome("in_progress", error=e)
        if isinstance(e, idemd.RpcError):
            return Outcome("error", error=e)
        if any(e is r for r in raised):
            return Outcome("handler_error", error=e)
        raise e

    def check_execute(self, expect: Dict[str, Any], outcome: Outcome) -> None:
        if "result" in expect:
            if expect["result"] not in RESULTS:
                raise ScenarioError(f"result: unknown result {expect['result']!r}")
            assert outcome.kind == expect["result"], f"result: {outcome} != {expect['result']}"
        if "error" in expect:
            self.check_error(expect["error"], outcome.error if outcome.kind == "error" else None, repr(outcome))
        elif outcome.kind == "error":
            raise AssertionError(f"unexpected error {outcome.error}")
        response_fields = {"status", "body", "headers", "attempt"} & set(expect)
        if response_fields:
            assert outcome.result is not None, f"{sorted(response_fields)} expected, but {outcome}"
            response = outcome.result.response
            if "status" in expect:
                assert response.status == expect["status"], f"status: {response.status} != {expect['status']}"
            if "body" in expect:
                want = expect["body"].encode("utf-8")
                assert response.body == want, f"body: {response.body!r} != {want!r}"
            if "headers" in expect:
                want_headers = [(n, v) for n, v in expect["headers"]]
                assert response.headers == want_headers, f"headers: {response.headers} != {want_headers}"
            if "attempt" in expect:
                assert outcome.result.attempt == expect["attempt"], (
                    f"attempt: {outcome.result.attempt} != {expect['attempt']}"
                )
        for field in ("http_status", "error_code"):
            if field in expect:
                assert isinstance(outcome.error, idemd.IdempotencyError), f"{field} expected, but {outcome}"
                got = getattr(outcome.error, field)
                assert got == expect[field], f"{field}: {got!r} != {expect[field]!r}"

    def op_claim(self, step: Dict[str, Any], expect: Dict[str, Any]) -> None:
        key = self.key(step["key"])
        http = self.request(step["request"])
        claim = pb.ClaimRequest(
            endpoint=step["endpoint"],
            key=key,
            request=pb.HttpRequest(
                method=http.method, path=http.path, body=http.body_bytes, content_type=http.content_type
            ),
        )
        if "lease_ms" in step:
            claim.lease.FromMilliseconds(step["lease_ms"])
        response, error = self.call(lambda: self.client(step["as"]).claim(claim))
        self.check_raw(expect, error)
        if response is None:
            return
        kind = response.WhichOneof("outcome")
        if "outcome" in expect:
            assert kind == expect["outcome"], f"outcome: {kind} != {expect['outcome']}"
        if "attempt" in expect:
            assert kind == "claimed", f"attempt expected, but outcome {kind}"
            assert response.claimed.attempt == expect["attempt"], (
                f"attempt: {response.claimed.attempt} != {expect['attempt']}"
            )
        if "save_as" in step:
            assert kind == "claimed", f"save_as needs a claimed outcome, got {kind}"
            self.leases[step["save_as"]] = (step["endpoint"], key, response.claimed.lease_token)

    def op_complete(self, step: Dict[str, Any], expect: Dict[str, Any]) -> None:
        spec = step["response"]
        check_fields("response", spec, RESPONSE_FIELDS)
        if step["lease_from"] not in self.leases:
            raise ScenarioError(f"lease_from {step['lease_from']!r} was never saved")
        _, _, token = self.leases[step["lease_from"]]
        request = pb.CompleteRequest(
            endpoint=step["endpoint"],
            key=self.key(step["key"]),
            lease_token=token,
            response=pb.StoredResponse(
                status=spec["status"],
                headers=[pb.Header(name=n, value=v) for n, v in spec.get("headers", [])],
                body=spec.get("body", "").encode("utf-8"),
            ),
        )
        _, error = self.call(lambda: self.client(step["as"]).complete(request))
        self.check_raw(expect, error)
        if "ok" in expect:
            assert (error is None) == bool(expect["ok"]), f"ok: {error} (expected ok={expect['ok']})"

    def op_lookup(self, step: Dict[str, Any], expect: Dict[str, Any]) -> None:
        request = pb.LookupRequest(endpoint=step["endpoint"], key=self.key(step["key"]))
        response, error = self.call(lambda: self.client(step["as"]).lookup(request))
        self.check_raw(expect, error)
        if "state" in expect:
            assert response is not None
            state = pb.State.Name(response.record.state).removeprefix("STATE_")
            assert state == expect["state"], f"state: {state} != {expect['state']}"

    # -- helpers -------------------------------------------------------------

    def request(self, spec: Dict[str, Any]) -> idemd.Request:
        check_fields("request", spec, REQUEST_FIELDS)
        return idemd.Request(
            method=spec["method"],
            path=spec["path"],
            body=spec.get("body", "").encode("utf-8"),
            content_type=spec.get("content_type", ""),
        )

    @staticmethod
    def call(fn):
        try:
            return fn(), None
        except idemd.RpcError as e:
            return None, e

    def check_raw(self, expect: Dict[str, Any], error: Optional[idemd.RpcError]) -> None:
        if "error" in expect:
            self.check_error(expect["error"], error, "success")
        elif error is not None:
            raise AssertionError(f"unexpected error {error}")

    @staticmethod
    def check_error(spec: Dict[str, Any], error: Optional[BaseException], got: str) -> None:
        check_fields("error", spec, ERROR_FIELDS)
        assert isinstance(error, idemd.RpcError), f"error {spec} expected, got {got}"
        assert error.code.name == spec["code"], f"error code: {error.code.name} != {spec['code']} ({error})"
        if "reason" in spec:
            assert error.reason == spec["reason"], f"error reason: {error.reason} != {spec['reason']}"


def test_scenario_file_is_not_empty() -> None:
    assert SCENARIOS["version"] == 1
    assert len(SCENARIOS["scenarios"]) >= 10


@pytest.mark.parametrize("flavour", ["sync", "aio"])
@pytest.mark.parametrize("scenario", SCENARIOS["scenarios"], ids=[s["name"] for s in SCENARIOS["scenarios"]])
def test_conformance(server: Server, scenario: Dict[str, Any], flavour: str) -> None:
    """Every scenario, with the sync Client and with the asyncio AsyncClient."""
    runner = Runner(server, scenario, flavour)
    try:
        runner.run()
    finally:
        runner.close()
