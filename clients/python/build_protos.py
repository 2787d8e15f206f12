#!/usr/bin/env python3
"""Generates the idemd.v1 gRPC stubs from proto/idemd/v1/idempotency.proto.

Run by test.sh and by the package build (_build_backend/idemd_build.py); the
generated modules go to src/idemd/v1/ (git-ignored) and are never committed.
Needs grpcio-tools.

    python build_protos.py [--proto-root DIR]

The proto root defaults to $IDEMD_PROTO_ROOT, else ../../proto (this SDK's
place in the idemd repository).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO = os.path.join("idemd", "v1", "idempotency.proto")
OUT = os.path.join(HERE, "src")
GENERATED = os.path.join(OUT, "idemd", "v1")


def default_proto_root() -> str:
    return os.environ.get("IDEMD_PROTO_ROOT") or os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


def generate(proto_root: str | None = None) -> str:
    """Generates the stubs; returns the directory they were written to."""
    root = proto_root or default_proto_root()
    source = os.path.join(root, PROTO)
    if not os.path.isfile(source):
        if os.path.isfile(os.path.join(GENERATED, "idempotency_pb2.py")):
            return GENERATED  # e.g. building from an sdist that carries the stubs
        raise SystemExit(f"build_protos: {source} not found (set IDEMD_PROTO_ROOT)")
    import grpc_tools
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(GENERATED, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"-I{include}",
        f"--python_out={OUT}",
        f"--pyi_out={OUT}",
        f"--grpc_python_out={OUT}",
        source,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("build_protos: protoc failed")
    init = os.path.join(GENERATED, "__init__.py")
    with open(init, "w", encoding="utf-8") as f:
        f.write('"""Generated from proto/idemd/v1/idempotency.proto by build_protos.py. Do not edit."""\n')
    return GENERATED


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-root", default=None)
    args = parser.parse_args(argv)
    print(generate(args.proto_root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
