"""The proxy matrix (clients/conformance/proxy-matrix.md, issue 51): the SDK's default transport
(grpcio) and its opt-in one (``transport="h2"``, on python-hyper's h2), each with the sync ``Client`` and the asyncio
``AsyncClient``, calling idemd through a real nginx (scripts/nginx.sh) in each profile: h2c, TLS,
a GOAWAY every 10 requests, 4 streams per connection, a 1 s idle timeout; executor and raw runs,
every key then looked up directly in idemd. Prints one ``proxy-matrix:`` line per transport,
client, profile and run. The last test turns the h2 transport's fixes off (its behaviour before
issue 51) and shows that the matrix catches it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import grpc
import pytest

import idemd
from idemd import _h2, pb
from idemd.aio import AsyncClient

from conftest import CREDENTIALS, REPO_ROOT, Server, start_server

NGINX = Path(os.environ.get("IDEMD_TEST_NGINX_SH") or REPO_ROOT / "scripts" / "nginx.sh")
PROFILES = ("h2c", "tls", "goaway", "streams4", "idle1s")
TRANSPORTS = ("grpcio", "h2")  # the default, then the opt-in
KINDS = ("sync", "aio")
ENDPOINT = "POST /v1/proxy-matrix"
REQUEST = idemd.Request("POST", "/v1/proxy-matrix", b'{"amount":4200}', "application/json")
LEASE = 10.0
SEQUENTIAL, CONCURRENT, REPLAYS, RAW, IN_FLIGHT = 300, 600, 100, 300, 32
MANY_IN_FLIGHT = 300
RUN_DEADLINE = 120.0
#: Errors a raw run may surface for requests idemd did receive (their outcome is unknown).
UNKNOWN_OUTCOME = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def body_for(key: str) -> bytes:
    return b"done " + key.encode()


# -- nginx ------------------------------------------------------------------------------------


class Nginx:
    def __init__(self, directory: Path, address: str) -> None:
        self.dir = directory
        self.address = address

    def count(self, what: str) -> int:
        done = subprocess.run(["bash", str(NGINX), "count", "--dir", str(self.dir), what],
                              capture_output=True, text=True, timeout=30)
        try:
            return int(done.stdout.strip() or 0)
        except ValueError:
            return 0

    def counts(self) -> Tuple[int, int, int]:
        """What nginx logged so far: refused streams, clients disconnected for refused streams,
        and what the h2 transport saw of GOAWAYs (nginx 1.22 logs none at `info`)."""
        return (self.count("concurrent streams exceeded"), self.count("too many refused streams"),
                _h2.SEEN["goaway"])


def _certs() -> Path:
    configured = os.environ.get("IDEMD_TEST_CERTS")
    if not configured or not (Path(configured) / "ca.pem").is_file():
        pytest.fail("IDEMD_TEST_CERTS is not set or lacks ca.pem: run `make test-certs`", pytrace=False)
    return Path(configured)


def start_nginx(profile: str, upstream: str, directory: Path) -> Nginx:
    args = ["bash", str(NGINX), "start", "--dir", str(directory), "--upstream", upstream, "--profile", profile]
    if profile in ("tls", "goaway"):
        args += ["--certs", str(_certs())]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"scripts/nginx.sh start --profile {profile} failed:\n{done.stderr}", pytrace=False)
    return Nginx(directory, done.stdout.strip().splitlines()[-1])


def stop_nginx(nginx: Nginx) -> None:
    subprocess.run(["bash", str(NGINX), "stop", "--dir", str(nginx.dir)], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def idemd_server() -> Iterator[Server]:
    with start_server(auth=True) as running:
        yield running


@pytest.fixture(scope="module")
def proxies(idemd_server: Server) -> Iterator[Callable[[str, str], Nginx]]:
    """An nginx per profile and user (a transport and client kind: its own, so that what nginx
    logs is that user's), started on first use, all stopped at the end."""
    started: Dict[str, Nginx] = {}
    lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="idemd-py-nginx-") as root:
        def get(profile: str, user: str) -> Nginx:
            name = f"{profile}-{user}"
            with lock:
                if name not in started:
                    started[name] = start_nginx(profile, idemd_server.address, Path(root) / name)
                return started[name]

        try:
            yield get
        finally:
            for nginx in started.values():
                stop_nginx(nginx)


def client_options(profile: str, nginx: Nginx, transport: str) -> Tuple[str, dict]:
    """The target and options a user gives to reach idemd through this nginx."""
    port = nginx.address.rsplit(":", 1)[1]
    options: dict = {"token": CREDENTIALS["alice"], "transport": transport, "timeout": 10.0}
    if profile in ("tls", "goaway"):
        # The test server certificate names localhost; the client trusts the test CA.
        return f"localhost:{port}", dict(options, ca_file=str(_certs() / "ca.pem"))
    return f"127.0.0.1:{port}", dict(options, insecure=True)


# -- what one run does ------------------------------------------------------------------------


class Run:
    """One run's outcome: per key the result or the error, and the handler's calls per key."""

    def __init__(self, name: str, keys: List[str]) -> None:
        self.name = name
        self.keys = keys
        self.outcomes: Dict[str, object] = {}
        self.raw_errors: List[Tuple[str, str, idemd.RpcError, int]] = []  # key, stage, error, attempt
        self.hangs = 0
        self.seconds = 0.0


class Calls:
    def __init__(self) -> None:
        self.counts: Dict[str, int] = {}
        self._lock = threading.Lock()

    def handler(self, execution: idemd.Execution) -> idemd.Response:
        with self._lock:
            self.counts[execution.key] = self.counts.get(execution.key, 0) + 1
        return idemd.Response(201, [("Content-Type", "text/plain")], body_for(execution.key))


def _claim(key: str) -> "pb.ClaimRequest":
    return pb.ClaimRequest(
        endpoint=ENDPOINT, key=key, attempt_id=secrets.token_urlsafe(12),
        request=pb.HttpRequest(method=REQUEST.method, path=REQUEST.path, body=REQUEST.body_bytes,
                               content_type=REQUEST.content_type),
        lease=idemd._grpc_util.duration(LEASE),
    )


def _complete(key: str, token: str) -> "pb.CompleteRequest":
    return pb.CompleteRequest(endpoint=ENDPOINT, key=key, lease_token=token,
                              response=pb.StoredResponse(status=201, body=body_for(key)))


def run_sync(client: idemd.Client, calls: Calls, run: Run, concurrency: int, raw: bool) -> Run:
    def one(key: str) -> None:
        if not raw:
            try:
                run.outcomes[key] = client.execute_once(ENDPOINT, key, REQUEST, calls.handler, lease=LEASE)
            except Exception as e:  # noqa: BLE001 - every error is counted
                run.outcomes[key] = e
            return
        try:
            claimed = client.claim(_claim(key)).claimed
        except idemd.RpcError as e:
            run.raw_errors.append((key, "claim", e, 0))
            return
        try:
            client.complete(_complete(key, claimed.lease_token))
            run.outcomes[key] = True
        except idemd.RpcError as e:
            run.raw_errors.append((key, "complete", e, claimed.attempt))

    started = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)
    futures = [pool.submit(one, key) for key in run.keys]
    _, pending = concurrent.futures.wait(futures, timeout=RUN_DEADLINE)
    run.hangs = len(pending)
    pool.shutdown(wait=False, cancel_futures=True)
    run.seconds = time.monotonic() - started
    return run


async def run_aio(client: AsyncClient, calls: Calls, run: Run, concurrency: int, raw: bool) -> Run:
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str) -> None:
        async with gate:
            if not raw:
                try:
                    run.outcomes[key] = await client.execute_once(ENDPOINT, key, REQUEST, calls.handler, lease=LEASE)
                except Exception as e:  # noqa: BLE001 - every error is counted
                    run.outcomes[key] = e
                return
            try:
                claimed = (await client.claim(_claim(key))).claimed
            except idemd.RpcError as e:
                run.raw_errors.append((key, "claim", e, 0))
                return
            try:
                await client.complete(_complete(key, claimed.lease_token))
                run.outcomes[key] = True
            except idemd.RpcError as e:
                run.raw_errors.append((key, "complete", e, claimed.attempt))

    started = time.monotonic()
    tasks = [asyncio.ensure_future(one(key)) for key in run.keys]
    _, pending = await asyncio.wait(tasks, timeout=RUN_DEADLINE)
    run.hangs = len(pending)
    for task in pending:
        task.cancel()
    run.seconds = time.monotonic() - started
    return run


def plan(prefix: str, many: bool) -> List[Tuple[str, List[str], int, bool]]:
    """The runs of one transport, client and profile: (name, keys, in flight, raw)."""
    sequential = [f"{prefix}-s{i}" for i in range(SEQUENTIAL)]
    runs = [
        ("executor-sequential", sequential, 1, False),
        ("executor-concurrent", [f"{prefix}-c{i}" for i in range(CONCURRENT)], IN_FLIGHT, False),
        ("replays", sequential[:REPLAYS], 1, False),
        ("raw", [f"{prefix}-r{i}" for i in range(RAW)], IN_FLIGHT, True),
    ]
    if many:
        runs.append(("executor-300-in-flight", [f"{prefix}-m{i}" for i in range(MANY_IN_FLIGHT)], MANY_IN_FLIGHT, False))
    return runs


def execute(kind: str, target: str, options: dict, prefix: str, many: bool,
            between: Callable[[], None]) -> Tuple[List[Run], Calls]:
    """Every run of ``plan`` on one client of ``kind``; ``between`` is called after each run."""
    calls = Calls()
    runs: List[Run] = []
    if kind == "sync":
        with idemd.Client(target, **options) as client:
            for name, keys, concurrency, raw in plan(prefix, many):
                runs.append(run_sync(client, calls, Run(name, keys), concurrency, raw))
                between()
        return runs, calls

    async def main() -> None:
        async with AsyncClient(target, **options) as client:
            for name, keys, concurrency, raw in plan(prefix, many):
                runs.append(await run_aio(client, calls, Run(name, keys), concurrency, raw))
                between()

    asyncio.run(main())
    return runs, calls


# -- what must hold ---------------------------------------------------------------------------


def lookup_all(direct: idemd.Client, keys: List[str]) -> Dict[str, Optional["pb.Record"]]:
    """Each key's record in idemd (None: absent), looked up directly, not through nginx."""
    def one(key: str) -> Tuple[str, Optional["pb.Record"]]:
        try:
            return key, direct.lookup(pb.LookupRequest(endpoint=ENDPOINT, key=key, include_response=True)).record
        except idemd.RpcError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return key, None
            raise

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return dict(pool.map(one, keys))


def check(run: Run, calls: Calls, direct: idemd.Client) -> Tuple[int, List[str], int]:
    """(errors, violations, errors on requests idemd received) of one run."""
    violations: List[str] = []
    if run.hangs:
        violations.append(f"{run.hangs} calls still running after {RUN_DEADLINE:.0f} s")
    if run.name == "raw":
        errors = len(run.raw_errors)
        received = 0
        records = lookup_all(direct, [key for key, *_ in run.raw_errors])
        for key, stage, error, attempt in run.raw_errors:
            record = records[key]
            if stage == "claim" and record is None:
                violations.append(f"{key}: Claim failed ({error.code.name}: {error.message}) but idemd never got it")
            elif stage == "complete" and record is not None and record.state == pb.STATE_IN_PROGRESS \
                    and record.attempt == attempt:
                violations.append(f"{key}: Complete failed ({error.code.name}: {error.message}) but idemd never got it")
            elif error.code not in UNKNOWN_OUTCOME:
                violations.append(f"{key}: {stage} failed with {error.code.name}: {error.message}")
            else:
                received += 1
        return errors, violations, received
    failed = {key: o for key, o in run.outcomes.items() if isinstance(o, BaseException)}
    for key, error in list(failed.items())[:5]:
        violations.append(f"{key}: {type(error).__name__}: {error}")
    records = lookup_all(direct, run.keys)
    for key in run.keys:
        outcome = run.outcomes.get(key)
        ran = calls.counts.get(key, 0)
        if ran != 1:
            violations.append(f"{key}: the handler ran {ran} times")
        record = records[key]
        if record is None or record.state != pb.STATE_COMPLETED:
            state = "absent" if record is None else pb.State.Name(record.state)
            violations.append(f"{key}: {state} in idemd, not COMPLETED")
        elif bytes(record.response.body) != body_for(key):
            violations.append(f"{key}: COMPLETED with another response")
        if isinstance(outcome, idemd.Result):
            if outcome.response.body != body_for(key):
                violations.append(f"{key}: the caller got another response")
            if outcome.replayed != (run.name == "replays"):
                violations.append(f"{key}: replayed={outcome.replayed} in run {run.name}")
    return len(failed), violations, 0


def matrix(profile: str, transport: str, kind: str, proxies, direct: idemd.Client,
           label: str) -> Tuple[List[str], List[str]]:
    """Runs one transport and client kind through an nginx of ``profile``: its output lines and
    its violations (an executor run's errors are violations too)."""
    nginx = proxies(profile, f"{label}-{kind}")
    target, options = client_options(profile, nginx, transport)
    prefix = f"pm-{secrets.token_hex(4)}-{transport}-{kind}-{profile}"
    marks = [nginx.counts()]
    runs, calls = execute(kind, target, options, prefix, profile == "h2c", lambda: marks.append(nginx.counts()))
    problems: List[str] = []
    lines: List[str] = []
    for i, run in enumerate(runs):
        errors, violations, received = check(run, calls, direct)
        refused, dropped, goaways = (marks[i + 1][j] - marks[i][j] for j in range(3))
        # The h2 transport's GOAWAY count is process-wide: the users of a profile run at once.
        seen = f", GOAWAYs seen by h2 clients {goaways}" if transport == "h2" else ""
        extra = f", {received} errors on requests idemd received (outcome unknown)" if run.name == "raw" else ""
        lines.append(f"proxy-matrix: python {label}-{kind} {profile} {run.name}: {len(run.keys)} calls, {errors} "
                     f"errors, {len(violations)} violations, {run.seconds:.1f} s (nginx: {refused} refused streams, "
                     f"{dropped} clients dropped for refused streams{seen}){extra}")
        if run.name != "raw" and errors:
            problems.append(f"{label}-{kind} {profile} {run.name}: {errors} errors")
        problems.extend(f"{label}-{kind} {profile} {run.name}: {v}" for v in violations[:10])
    return lines, problems


@pytest.mark.parametrize("profile", PROFILES)
def test_proxy_matrix(profile: str, idemd_server: Server, proxies, capsys: pytest.CaptureFixture) -> None:
    """Each transport and client kind through its own nginx of the profile, the four at once
    (their sequential runs wait on idemd's durable writes, not on the CPU)."""
    problems: List[str] = []
    users = [(transport, kind) for transport in TRANSPORTS for kind in KINDS]
    with idemd_server.client("alice") as direct:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(users)) as pool:
            done = list(pool.map(lambda user: matrix(profile, user[0], user[1], proxies, direct, user[0]), users))
    with capsys.disabled():
        print()
        for lines, found in done:
            for line in lines:
                print(line, flush=True)
            problems += found
    assert not problems, "\n".join(problems[:40])


def test_the_matrix_fails_a_transport_that_ignores_the_stream_limit_and_goaway(
        idemd_server: Server, proxies, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The h2 transport with issue 51's fixes off (``_h2._PRE_ISSUE_51``: streams opened before
    the server's SETTINGS and above its limit, a GOAWAY's or REFUSED_STREAM's calls surfaced as
    UNAVAILABLE), as the asyncio transport before issue 51 behaved: the matrix must see it."""
    monkeypatch.setattr(_h2, "_PRE_ISSUE_51", True)
    found: Dict[str, int] = {}
    with idemd_server.client("alice") as direct, capsys.disabled():
        print()
        for profile in ("streams4", "goaway"):
            nginx = proxies(profile, "h2-pre-issue-51-aio")
            target, options = client_options(profile, nginx, "h2")
            prefix = f"pm-{secrets.token_hex(4)}-pre51-{profile}"
            calls = Calls()

            async def main() -> List[Run]:
                async with AsyncClient(target, **options) as client:
                    return [
                        await run_aio(client, calls, Run("raw", [f"{prefix}-r{i}" for i in range(RAW)]), IN_FLIGHT, True),
                    ]

            for run in asyncio.run(main()):
                errors, violations, _ = check(run, calls, direct)
                refused, dropped, _ = nginx.counts()
                print(f"proxy-matrix: python h2-pre-issue-51-aio {profile} {run.name}: {len(run.keys)} calls, "
                      f"{errors} errors, {len(violations)} violations, {run.seconds:.1f} s (nginx: {refused} refused "
                      f"streams, {dropped} clients dropped for refused streams)", flush=True)
                for violation in violations[:3]:
                    print(f"  e.g. {violation}", flush=True)
                found[profile] = len(violations)
    assert all(found.values()), f"the matrix did not catch the transport without the fixes: {found}"
