"""The PEP 517 build generates the stubs and ships them in the wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import SDK_ROOT


def test_wheel_contains_generated_stubs_and_imports(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(SDK_ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("idemd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for generated in ("idemd/v1/idempotency_pb2.py", "idemd/v1/idempotency_pb2_grpc.py", "idemd/v1/__init__.py"):
        assert generated in names
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    # The wheel works on its own (no src/ on the path).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = (
        f"import sys; sys.path.insert(0, {str(wheel)!r}); import idemd; "
        f"assert idemd.__file__.startswith({str(wheel)!r}), idemd.__file__; "
        "print(idemd.pb.ClaimRequest.DESCRIPTOR.full_name)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "idemd.v1.ClaimRequest"
