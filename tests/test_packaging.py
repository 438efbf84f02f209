"""The install is quiet: setuptools (the version constraints.txt pins) reads pyproject.toml's
metadata without a deprecation warning, and the build requirement allows the SPDX license string."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pinned(name: str) -> str:
    pins = re.findall(rf"^{name}==(\S+)$", (ROOT / "constraints.txt").read_text(), flags=re.M)
    assert len(pins) == 1, pins
    return pins[0]


def test_pyproject_metadata_reads_without_setuptools_warnings(monkeypatch):
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    assert setuptools.__version__ == _pinned("setuptools")  # the setuptools `make` installs
    monkeypatch.chdir(ROOT)  # the readme is read relative to the project
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_the_build_requires_a_setuptools_that_reads_spdx_license_strings():
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    (spec,) = [Requirement(r).specifier for r in build if Requirement(r).name == "setuptools"]
    assert "76.9" not in spec and "77.0" in spec  # PEP 639 license strings: setuptools >= 77
    assert _pinned("setuptools") in spec
