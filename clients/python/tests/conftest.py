"""Test fixtures: a real idemd server started as clients/conformance/README.md says."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, Sequence

import pytest

import idemd
from kafka_clients import KafkaClients

HERE = Path(__file__).resolve().parent
SDK_ROOT = HERE.parent
REPO_ROOT = SDK_ROOT.parent.parent
CONFORMANCE = REPO_ROOT / "clients" / "conformance"
SCENARIOS = json.loads((CONFORMANCE / "scenarios.json").read_text(encoding="utf-8"))
CREDENTIALS: Dict[str, str] = SCENARIOS["credentials"]
STARTUP_TIMEOUT = 30.0


class Server:
    def __init__(self, address: str, process: subprocess.Popen, log_lines: list) -> None:
        self.address = address
        self.process = process
        self.log_lines = log_lines

    def client(self, who: str = "alice", **kwargs) -> idemd.Client:
        kwargs.setdefault("insecure", True)
        return idemd.Client(self.address, token=CREDENTIALS[who], **kwargs)


def _idemd_bin() -> Path:
    path = Path(os.environ.get("IDEMD_BIN") or REPO_ROOT / "target" / "debug" / "idemd")
    if not path.is_file():
        pytest.fail(f"idemd binary not found at {path} (set IDEMD_BIN or run `cargo build`)", pytrace=False)
    return path


@contextlib.contextmanager
def start_server(auth: bool = True, extra_args: Sequence[str] = ()) -> Iterator[Server]:
    """An idemd on 127.0.0.1:0 with a fresh data dir, the conformance policies,
    (with auth) the conformance tokens and ``extra_args``; stopped with SIGTERM."""
    with tempfile.TemporaryDirectory(prefix="idemd-py-") as data_dir:
        args = [
            str(_idemd_bin()),
            "--listen", "127.0.0.1:0",
            "--data-dir", data_dir,
            "--config", str(CONFORMANCE / "idemd.toml"),
            "--log-format", "json",
        ]
        if auth:
            args += ["--auth-tokens", str(CONFORMANCE / "tokens.txt")]
        args += extra_args
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        lines: list = []
        found: "queue.Queue[str]" = queue.Queue()

        def drain() -> None:  # keep reading so the server never blocks on a full pipe
            assert process.stderr is not None
            for raw in process.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append(line)
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("message") == "idemd serving":
                    found.put(entry["address"])

        threading.Thread(target=drain, name="idemd-stderr", daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        address = None
        while address is None:
            if process.poll() is not None:
                time.sleep(0.2)
                pytest.fail(f"idemd exited with {process.returncode}:\n" + "\n".join(lines[-20:]), pytrace=False)
            if time.monotonic() > deadline:
                process.kill()
                pytest.fail("idemd did not report 'idemd serving':\n" + "\n".join(lines[-20:]), pytrace=False)
            try:
                address = found.get(timeout=0.1)
            except queue.Empty:
                pass
        try:
            yield Server(address, process, lines)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=25)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def clean_checkout(dest: Path) -> Path:
    """Copies what git would ship of this SDK (tracked plus untracked-but-not-ignored
    files, never the ignored generated stubs, .venv or build output) and the proto
    it is generated from into ``dest``, laid out like the repository; returns the
    copy of the SDK folder. A packaging step that only works because stubs were
    generated in the work tree fails on this copy."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z", "clients/python", "proto"],
        cwd=REPO_ROOT, check=True, capture_output=True,
    ).stdout.decode("utf-8").split("\0")
    for name in filter(None, listed):
        source = REPO_ROOT / name
        if not source.is_file():  # deleted in the work tree, not yet in the index
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    sdk = dest / "clients" / "python"
    assert not (sdk / "src" / "idemd" / "v1").exists()
    return sdk


def pytest_collection_modifyitems(items: list) -> None:
    # The latency check runs after everything else (conformance README), so the
    # other tests' servers and builds are not competing for the CPU it measures.
    items.sort(key=lambda item: item.get_closest_marker("latency") is not None)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with start_server(auth=True) as running:
        yield running


@pytest.fixture
def alice(server: Server) -> Iterator[idemd.Client]:
    with server.client("alice") as client:
        yield client


@pytest.fixture(scope="session")
def brokers() -> str:
    """The Kafka broker test.sh started (scripts/kafka.sh run): from test.sh a missing one fails
    the tests that need it (a skipped suite hides a broken setup); pytest alone skips them."""
    found = os.environ.get("IDEMD_TEST_KAFKA_BROKERS")
    if not found:
        if os.environ.get("IDEMD_TEST_KAFKA_REQUIRED"):
            pytest.fail("IDEMD_TEST_KAFKA_BROKERS is unset: the consumer scenarios need a broker "
                        "(test.sh runs pytest under scripts/kafka.sh run -- ...)", pytrace=False)
        pytest.skip("IDEMD_TEST_KAFKA_BROKERS is unset (clients/python/test.sh starts a broker)")
    return found


@pytest.fixture
def kafka(brokers: str) -> Iterator[KafkaClients]:
    """Topics, producing and committed offsets on the broker, from a child process of its own
    (tests/kafka_clients.py says why no librdkafka client lives in pytest's process)."""
    with KafkaClients(brokers) as clients:
        yield clients
