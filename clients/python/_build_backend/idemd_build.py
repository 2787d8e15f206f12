"""PEP 517 backend: setuptools, with the idemd.v1 stubs generated first.

pyproject.toml lists the generated package ``idemd.v1``, and setuptools checks
every listed package directory as soon as it runs ``egg_info``, which it does in
its very first hook (get_requires_for_build_*). A ``build_py`` hook in setup.py
therefore ran too late: from a clean checkout the build stopped with "package
directory 'src/idemd/v1' does not exist". Wrapping the backend puts generation
ahead of every setuptools hook that looks at the packages.

Decision on the sdist: it carries the generated stubs (generated when the sdist
is built), because the proto lives outside this folder (../../proto) and is not
in the sdist. Building a wheel from an unpacked sdist (recognised by its
PKG-INFO) uses those stubs and never runs protoc, so grpcio-tools is requested
only when the stubs have to be generated.
"""

from __future__ import annotations

import os
import sys

from setuptools import build_meta as _setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Keep in step with requirements-dev.txt: the generated code's protobuf
# version is the runtime floor declared in pyproject.toml.
GRPCIO_TOOLS = "grpcio-tools==1.85.1"


def _in_sdist() -> bool:
    return os.path.isfile(os.path.join(ROOT, "PKG-INFO"))


def _generate() -> None:
    if _in_sdist():
        stub = os.path.join(ROOT, "src", "idemd", "v1", "idempotency_pb2.py")
        if not os.path.isfile(stub):
            raise SystemExit("idemd: this sdist lacks the generated src/idemd/v1 stubs")
        return
    sys.path.insert(0, ROOT)
    try:
        import build_protos
    finally:
        sys.path.remove(ROOT)
    build_protos.generate()


def _requires(config_settings=None) -> list[str]:
    # Not delegated: setuptools would run egg_info here, before grpcio-tools is
    # installed to generate the stubs it checks for. With no setup.py (hence no
    # setup_requires) setuptools itself asks for nothing more.
    return [] if _in_sdist() else [GRPCIO_TOOLS]


get_requires_for_build_wheel = _requires
get_requires_for_build_sdist = _requires
get_requires_for_build_editable = _requires


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _generate()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _generate()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    _generate()
    return _setuptools.build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _generate()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _generate()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
