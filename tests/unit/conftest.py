"""The unit tier: pure-function tests (tmp files and in-process DuckDB on small data are fine).
Every test here, and the setup of every fixture it uses (a module-scoped one too), runs under
tests.unit._purity.pure(): a socket, process, browser or process group fails it, with the hint to
move it to tests/integration."""

from __future__ import annotations

import pytest

from tests.unit._purity import pure


@pytest.fixture(autouse=True)
def _pure():
    with pure():
        yield


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.argname == "_pure":  # it holds its own pure() open across the test
        return (yield)
    with pure():
        return (yield)
