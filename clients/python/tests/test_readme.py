"""README.md's blocks run as written against the live idemd: the usage block, the ingress block
(through nginx with TLS, scripts/nginx.sh), the FastAPI and Flask blocks."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import CREDENTIALS, SDK_ROOT, Server

README = (SDK_ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_usage_block_runs_as_written(server: Server) -> None:
    usage = BLOCKS[0]
    assert "execute_once" in usage
    env = dict(os.environ, IDEMD_ADDR=server.address, IDEMD_TOKEN=CREDENTIALS["alice"])
    env["PYTHONPATH"] = os.pathsep.join([str(SDK_ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", usage], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_every_python_block_compiles() -> None:
    assert len(BLOCKS) >= 3
    for index, block in enumerate(BLOCKS):
        compile(block, f"README.md python block {index}", "exec")


def _middleware_block(marker: str) -> str:
    found = [block for block in BLOCKS if marker in block]
    assert len(found) == 1, marker
    return found[0]


def _pays_once(port: int) -> None:
    import http.client
    import secrets

    key = secrets.token_hex(8)
    answers = []
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        conn.request("POST", "/v1/payments/p1", body=b"{}",
                     headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        response = conn.getresponse()
        answers.append((response.status, response.getheader("Idempotent-Replayed"), response.read()))
        conn.close()
    assert answers[0][:2] == (201, None), answers
    assert answers[1] == (201, "true", answers[0][2]), answers


def test_middleware_blocks_serve_as_written(server: Server, monkeypatch) -> None:
    """The README's FastAPI and Flask blocks, run as written, make a POST idempotent."""
    from test_middleware import serve_asgi, serve_wsgi

    monkeypatch.setenv("IDEMD_ADDR", server.address)
    monkeypatch.setenv("IDEMD_TOKEN", CREDENTIALS["alice"])
    fastapi_ns: dict = {}
    exec(compile(_middleware_block("IdempotencyMiddleware, routes="), "README fastapi", "exec"), fastapi_ns)
    with serve_asgi(fastapi_ns["app"]) as port:
        _pays_once(port)
    flask_ns: dict = {"__name__": "readme_flask"}
    exec(compile(_middleware_block("idempotent_flask(app"), "README flask", "exec"), flask_ns)
    with serve_wsgi(flask_ns["app"]) as port:
        _pays_once(port)


def test_ingress_tls_block_runs_as_written(server: Server, tmp_path) -> None:
    """The "Through an ingress, with TLS" block, as written, through nginx terminating TLS in
    front of idemd (the proxy matrix's ``goaway`` profile: TLS and a GOAWAY every 10 requests),
    trusting the test CA; once with the default transport and once with ``h2``."""
    from test_proxy_matrix import _certs, start_nginx, stop_nginx

    block = _middleware_block("IDEMD_INGRESS")
    nginx = start_nginx("goaway", server.address, tmp_path / "nginx")
    try:
        port = nginx.address.rsplit(":", 1)[1]
        env = dict(os.environ, IDEMD_INGRESS=f"localhost:{port}", IDEMD_CA_FILE=str(_certs() / "ca.pem"),
                   IDEMD_TOKEN=CREDENTIALS["alice"])
        env["PYTHONPATH"] = os.pathsep.join([str(SDK_ROOT / "src"), env.get("PYTHONPATH", "")])
        for block_as_run in (block, block.replace('token=os.environ["IDEMD_TOKEN"])',
                                                  'token=os.environ["IDEMD_TOKEN"], transport="h2")')):
            assert block_as_run.count("Client(") == 1
            done = subprocess.run([sys.executable, "-c", block_as_run], env=env, capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["201", "False"], done.stdout
    finally:
        stop_nginx(nginx)
