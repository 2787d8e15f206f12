"""Runner of clients/conformance/http-scenarios.json (the HTTP front-end
contract shared with ``idemd proxy``) against an app served over real HTTP,
and the app itself, counting executions per path as http-scenarios.md says."""

from __future__ import annotations

import http.client
import json
import re
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from conftest import CONFORMANCE

HTTP_SCENARIOS = json.loads((CONFORMANCE / "http-scenarios.json").read_text(encoding="utf-8"))
#: The middleware's route options: the file's routes, proxy-only fields dropped.
ROUTES = [
    {k: v for k, v in route.items() if k not in HTTP_SCENARIOS["proxy_only_fields"]}
    for route in HTTP_SCENARIOS["routes"]["routes"]
]
SLOW = 0.6
#: The app's handler raises an ordinary error with this message on these paths.
CRASH_PATHS = ("/crash/", "/crash-exposed/")
CRASH_MESSAGE = "boom: secret-4711"


@dataclass
class AppState:
    """What the test app executed, per path."""

    executions: Dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, path: str) -> int:
        with self.lock:
            self.executions[path] = self.executions.get(path, 0) + 1
            return self.executions[path]

    def of(self, path: str) -> int:
        with self.lock:
            return self.executions.get(path, 0)


def answer_of(path: str, execution: int, body: bytes) -> Tuple[int, List[Tuple[str, str]], bytes]:
    """The app's answer (http-scenarios.md, "The app"), after its delay and
    unless it fails."""
    if "/fail/" in path:
        status, payload = 500, b'{"error":"boom"}'
    elif path.startswith("/big/"):
        status, payload = 200, b"x" * 65536
    else:
        status = 201
        payload = json.dumps({"path": path, "execution": execution, "request_bytes": len(body)}).encode()
    headers = [
        ("content-type", "application/json"),
        ("location", path),
        ("set-cookie", f"session=secret-{execution}"),
        ("x-execution", str(execution)),
    ]
    return status, headers, payload


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def header(self, name: str) -> Optional[str]:
        return self.headers.get(name)


def send(port: int, request: dict, prefix: str) -> Optional[Reply]:
    """One request; None when the connection closed without an answer."""
    headers = {}
    for name, value in request.get("headers", []):
        headers[name] = re.sub(r"\{key:(\d+)\}", prefix + r"-\1", value)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(request["method"], request["path"], body=request.get("body", "").encode(), headers=headers)
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    except (ConnectionError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def check(at: str, expect: dict, reply: Optional[Reply], saved: Dict[str, bytes]) -> None:
    if expect.get("failed"):
        assert reply is None or reply.status >= 500, f"{at}: expected a failure, got {reply.status} {reply.body!r}"
        return
    assert reply is not None, f"{at}: no answer"
    if "status" in expect:
        assert reply.status == expect["status"], f"{at}: status {reply.status}, body {reply.body[:300]!r}"
    for name, value in (expect.get("headers") or {}).items():
        assert reply.header(name) == value, f"{at}: header {name} is {reply.header(name)!r}; {dict(reply.headers)}"
    if "problem" in expect:
        assert reply.header("content-type") == "application/problem+json", f"{at}: {dict(reply.headers)}"
        assert json.loads(reply.body)["type"] == "https://idemd.dev/problems/" + expect["problem"], f"{at}: {reply.body!r}"
    if expect.get("retry_after"):
        assert reply.header("retry-after"), f"{at}: Retry-After missing"
    if "body" in expect:
        assert reply.body == expect["body"].encode(), f"{at}: body {reply.body!r}"
    if "body_length" in expect:
        assert len(reply.body) == expect["body_length"], f"{at}: body length {len(reply.body)}"
    for text in expect.get("body_includes", []):
        assert text.encode() in reply.body, f"{at}: body lacks {text!r}: {reply.body!r}"
    for text in expect.get("body_excludes", []):
        assert text.encode() not in reply.body, f"{at}: body has {text!r}: {reply.body!r}"
    if "body_same_as" in expect:
        assert reply.body == saved[expect["body_same_as"]], f"{at}: body differs from {expect['body_same_as']}'s"


def check_parallel(at: str, expect: dict, replies: List[Optional[Reply]]) -> None:
    assert all(r is not None for r in replies), f"{at}: a request got no answer"
    statuses = [r.status for r in replies]  # type: ignore[union-attr]
    if "statuses" in expect:
        assert set(statuses) <= set(expect["statuses"]), f"{at}: {statuses}"
    if "includes_status" in expect:
        assert expect["includes_status"] in statuses, f"{at}: {statuses}"
    if "same_body_for" in expect:
        bodies = {r.body for r in replies if r.status == expect["same_body_for"]}  # type: ignore[union-attr]
        assert len(bodies) <= 1, f"{at}: different bodies {bodies}"
    for reply in replies:
        if reply is not None and reply.status == 409 and "on_409" in expect:
            check(at, expect["on_409"], reply, {})


def run_scenarios(port: int, executions: Callable[[str], int], front_end: str = "middleware") -> int:
    """Runs every scenario for ``front_end``; returns how many ran."""
    ran = 0
    for number, scenario in enumerate(HTTP_SCENARIOS["scenarios"]):
        if scenario.get("only", front_end) != front_end:
            continue
        prefix = secrets.token_hex(8)
        saved: Dict[str, bytes] = {}
        started: Dict[str, tuple] = {}
        with ThreadPoolExecutor(max_workers=24) as pool:
            for index, step in enumerate(scenario["steps"]):
                at = f"scenario {number} ({scenario['name']}), step {index}"
                expect = step.get("expect", {})
                if "sleep_ms" in step:
                    threading.Event().wait(step["sleep_ms"] / 1000)
                    continue
                if "finish" in step:
                    path, future = started.pop(step["finish"])
                    check(at, expect, future.result(), saved)
                elif "start" in step:
                    started[step["start"]] = (step["request"]["path"], pool.submit(send, port, step["request"], prefix))
                    continue
                elif "parallel" in step:
                    path = step["request"]["path"]
                    futures = [pool.submit(send, port, step["request"], prefix) for _ in range(step["parallel"])]
                    check_parallel(at, expect, [f.result() for f in futures])
                else:
                    path = step["request"]["path"]
                    reply = send(port, step["request"], prefix)
                    check(at, expect, reply, saved)
                    if "save_as" in step and reply is not None:
                        saved[step["save_as"]] = reply.body
                if "executions" in expect:
                    assert executions(path) == expect["executions"], f"{at}: executions of {path}: {executions(path)}"
        ran += 1
    assert ran > 10, f"only {ran} scenarios ran"
    return ran
