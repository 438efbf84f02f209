"""Generates the gRPC stubs from proto/rankscope.proto when the package is built
(``pip install .``, ``pip install -e .``, a wheel), so importing ``proto`` never runs
protoc. Everything else about the package is in pyproject.toml."""

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithStubs(build_py):
    def run(self) -> None:
        # By path: importing the `proto` package would need the stubs this makes.
        # It needs grpcio-tools, a build requirement (pyproject.toml).
        runpy.run_path(str(Path(__file__).parent / "proto" / "generate.py"), run_name="generate")["generate"]()
        super().run()


setup(cmdclass={"build_py": BuildWithStubs})
