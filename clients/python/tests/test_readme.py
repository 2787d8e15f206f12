"""README.md's usage block runs as written against the live idemd."""

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
