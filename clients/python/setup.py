"""Build hook: generate the gRPC stubs before the package files are collected.

Everything else is declared in pyproject.toml; this only makes `pip install`,
`pip wheel` and editable installs run build_protos.py (grpcio-tools is a
build requirement).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_protos  # noqa: E402


class BuildPyWithProtos(build_py):
    def run(self):
        build_protos.generate()
        super().run()


class SdistWithProtos(sdist):
    # An sdist carries the generated stubs, so it builds without the repository.
    def run(self):
        build_protos.generate()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos})
