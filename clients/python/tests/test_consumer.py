"""The SDK installs from outside the repository exactly as README.md's Install
section says, and a fresh project can use it against the live idemd
(clients/conformance/README.md, "Consumer project")."""

from __future__ import annotations

import http.client
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import CREDENTIALS, SDK_ROOT, Server, clean_checkout
from kafka_clients import KafkaClients, Record

# What the Install section must say, line for line; the test runs the block as
# one shell script from the root of a fresh copy of the checkout, with nothing
# but a Python 3.10+ on PATH (the one test.sh chose).
VENV = "python3 -m venv .venv && . .venv/bin/activate"
INSTALL = "pip install ./clients/python"

PROGRAM = '''
import os, uuid
from idemd import Client, KeyReuseError, Request, Response
client = Client(os.environ["IDEMD_ADDR"], token=os.environ["IDEMD_TOKEN"], insecure=True)
calls = []
handler = lambda execution: calls.append(execution.key) or Response(201, [("Content-Type", "text/plain")], b"paid")
key, payment = str(uuid.uuid4()), Request("POST", "/v1/payments", b'{"amount":1}', "application/json")
first = client.execute_once("POST /v1/payments", key, payment, handler)
retry = client.execute_once("POST /v1/payments", key, payment, handler)
assert (first.replayed, retry.replayed, len(calls)) == (False, True, 1) and retry.response == first.response
try:
    client.execute_once("POST /v1/payments", key, Request("POST", "/v1/payments", b'{"amount":2}', "application/json"), handler)
    raise SystemExit("a different body with the same key was not refused")
except KeyReuseError as err:
    assert err.http_status == 422 and len(calls) == 1, (err.http_status, calls)
import idemd; print(idemd.__file__)
'''


def install_commands() -> list:
    readme = (SDK_ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Install\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section, "README.md has no '## Install' section"
    block = re.search(r"```sh\n(.*?)```", section.group(1), flags=re.S)
    assert block, "README.md's Install section has no sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


def run(command: str, cwd: Path, bin_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")}
    env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"`{command}` failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_readme_install_section_is_what_this_test_runs() -> None:
    assert install_commands() == [VENV, INSTALL]


@dataclass
class FreshProject:
    checkout: Path
    root: Path
    bin: Path
    env: dict
    pins: dict


@pytest.fixture(scope="module")
def fresh_project(server: Server, tmp_path_factory: pytest.TempPathFactory) -> FreshProject:
    tmp_path = tmp_path_factory.mktemp("fresh")
    checkout = tmp_path / "checkout"
    clean_checkout(checkout)
    # The block as written, as one script (its venv stays active for the
    # install). pip builds the wheel with build isolation, as for a user: the
    # build requirements come from pyproject.toml, not from this venv.
    run("set -e\n" + "\n".join(install_commands()), checkout, Path(sys.executable).parent)
    # A fresh project elsewhere, on the environment the block made.
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(IDEMD_ADDR=server.address, IDEMD_TOKEN=CREDENTIALS["alice"])
    pins = {
        line.split("==")[0].lower(): line.strip()
        for line in (SDK_ROOT / "requirements-dev.txt").read_text(encoding="utf-8").splitlines()
        if "==" in line and not line.startswith("#")
    }
    return FreshProject(checkout, consumer, checkout / ".venv" / "bin", env, pins)


@pytest.mark.consumer
def test_fresh_project_installs_the_wheel_and_runs(fresh_project: FreshProject) -> None:
    checkout, consumer, consumer_bin, env, pins = (
        fresh_project.checkout, fresh_project.root, fresh_project.bin, fresh_project.env, fresh_project.pins)
    (consumer / "app.py").write_text(PROGRAM, encoding="utf-8")
    done = subprocess.run(
        [str(consumer_bin / "python"), "app.py"],
        cwd=consumer, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The SDK came from the installed wheel, not from this repository's src/.
    assert done.stdout.strip().startswith(str(checkout / ".venv")), done.stdout

    # The README's FastAPI block, as written, in the same fresh project: the
    # framework installed next to the SDK as the README says (at the versions
    # this suite pins), served by uvicorn, one payment posted twice.
    run(f"pip install -q {pins['fastapi']} {pins['uvicorn']}", consumer, consumer_bin)
    readme = (SDK_ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "IdempotencyMiddleware, routes=" in b)
    (consumer / "main.py").write_text(block, encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = subprocess.Popen(
        [str(consumer_bin / "python"), "-m", "uvicorn", "main:app", "--port", str(port), "--log-level", "warning"],
        cwd=consumer, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        key = secrets.token_hex(8)
        answers = []
        deadline = time.monotonic() + 30
        while len(answers) < 2:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("POST", "/v1/payments/p1", body=b"{}", headers={"Idempotency-Key": key})
                response = conn.getresponse()
                answers.append((response.status, response.getheader("Idempotent-Replayed"), response.read()))
                conn.close()
            except ConnectionRefusedError:
                assert served.poll() is None and time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.1)
        assert answers[0][:2] == (201, None), answers
        assert answers[1] == (201, "true", answers[0][2]), answers
    finally:
        served.terminate()
        served.wait(10)


# The Consumers section's install line; the test installs it at the version this suite pins.
KAFKA_INSTALL = "pip install confluent-kafka"


@pytest.mark.consumer
def test_fresh_project_runs_the_readme_kafka_block(fresh_project: FreshProject, kafka: KafkaClients) -> None:
    """The README's Kafka block, as written, in the fresh project: one message produced twice
    (same key header, same value) is charged once, both offsets are committed, SIGTERM exits 0.
    The topic, the producer and the offset checks run in a child process (``kafka``), like the block
    itself: no librdkafka client runs in pytest's process (tests/kafka_clients.py says why)."""
    readme = (SDK_ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Consumers\n(.*?)(?=^## )", readme, flags=re.S | re.M)
    assert section, "README.md has no '## Consumers' section"
    assert re.findall(r"```sh\n(.*?)```", section.group(1), flags=re.S) == [KAFKA_INSTALL + "\n"]
    run(f"pip install -q {fresh_project.pins['confluent-kafka']}", fresh_project.root, fresh_project.bin)
    [block] = [b for b in re.findall(r"```python\n(.*?)```", section.group(1), flags=re.S) if "MessageProcessor(" in b]
    (fresh_project.root / "consume.py").write_text(block, encoding="utf-8")

    topic = "readme-orders-" + secrets.token_hex(4)
    kafka.create_topic(topic, 1)
    key = ("order-" + secrets.token_hex(6)).encode()
    # A producer's retry: the same message, the same key.
    assert kafka.produce(topic, [Record(b'{"amount": 100}', [("idempotency-key", key)])] * 2) == 0
    env = dict(fresh_project.env, KAFKA_BROKERS=kafka.brokers, KAFKA_TOPIC=topic)
    consuming = subprocess.Popen([str(fresh_project.bin / "python"), "consume.py"], cwd=fresh_project.root,
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while kafka.committed("billing", topic, 1)[0] < 2:
            assert consuming.poll() is None, consuming.communicate()
            assert time.monotonic() < deadline, "the README block did not commit both offsets within 60 s"
            time.sleep(0.3)
    finally:
        consuming.terminate()
        out, err = consuming.communicate(timeout=30)
    assert consuming.returncode == 0, err
    assert out.splitlines() == ["charged 100"], out + err
