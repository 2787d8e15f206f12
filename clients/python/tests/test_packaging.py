"""The PEP 517 build generates the stubs and ships them in the wheel and the sdist,
starting from what git ships (no stubs generated in the work tree)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from conftest import clean_checkout

STUBS = ("idemd/v1/idempotency_pb2.py", "idemd/v1/idempotency_pb2_grpc.py", "idemd/v1/__init__.py")


def build(args: list, env: dict | None = None) -> None:
    # No build isolation: the test venv already has setuptools and grpcio-tools
    # pinned, and a PyPI round trip per build would only slow the suite down
    # (test_consumer.py covers the isolated build a user runs).
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_wheel_from_a_clean_checkout_contains_generated_stubs_and_imports(tmp_path: Path) -> None:
    sdk = clean_checkout(tmp_path / "checkout")
    # `pip wheel` goes through the same hooks as `pip install ./clients/python`.
    build([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
           "-w", str(tmp_path / "dist"), str(sdk)])
    (wheel,) = (tmp_path / "dist").glob("idemd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for generated in STUBS:
        assert generated in names
    assert not any(n.startswith(("tests/", "examples/", "_build_backend/")) for n in names)
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


def test_sdist_carries_the_stubs_and_builds_without_proto_or_protoc(tmp_path: Path) -> None:
    sdk = clean_checkout(tmp_path / "checkout")
    build([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path / "dist"), str(sdk)])
    (sdist,) = (tmp_path / "dist").glob("idemd-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        for generated in STUBS:
            assert f"src/{generated}" in names
        assert "_build_backend/idemd_build.py" in names
        if hasattr(tarfile, "data_filter"):  # 3.10.12+; the archive is our own either way
            archive.extractall(tmp_path / "unpacked", filter="data")
        else:
            archive.extractall(tmp_path / "unpacked")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    # A grpc_tools that cannot be imported, ahead of the real one: building the
    # wheel from the sdist must not generate anything (and the unpacked sdist
    # has no ../../proto to generate from).
    poison = tmp_path / "poison" / "grpc_tools"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('protoc must not run when building from the sdist')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "IDEMD_PROTO_ROOT")}
    env["PYTHONPATH"] = str(poison.parent)
    probe = "import sys; sys.path.insert(0, '_build_backend'); import idemd_build; print(idemd_build.get_requires_for_build_wheel())"
    done = subprocess.run([sys.executable, "-c", probe], cwd=unpacked, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
    build([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(tmp_path / "wheel"), str(unpacked)], env=env)
    (wheel,) = (tmp_path / "wheel").glob("idemd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for generated in STUBS:
        assert generated in names
