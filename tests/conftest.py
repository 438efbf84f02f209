"""Fixtures shared by the tests of every role (tests/<role>/): a free port, a live
collector, and the isolation every test gets (its own spool dir, no developer's
collector, no process group left over). Helpers are in collector.testing."""

from __future__ import annotations

import os
import sys

import pytest

from collector.testing.ports import free_port
from tests._durations import pytest_configure, pytest_fixture_setup, pytest_runtest_makereport  # noqa: F401 (hooks)


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(autouse=True)
def _isolated_telemetry_env(tmp_path, monkeypatch):
    """No test talks to a developer's collector or writes into a shared spool."""
    for var in ("RANKSCOPE_ENDPOINT", "RANKSCOPE_RUN", "RANKSCOPE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANKSCOPE_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))


@pytest.fixture(autouse=True)
def _no_leaked_process_group():
    """A test that initialises torch.distributed in the pytest process (a world of one)
    must not hand its process group to the next test: rank-dependent code would read
    rank 0 from it instead of the RANK that test sets."""
    yield
    dist = sys.modules.get("torch.distributed")  # never import torch just for this
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def live_collector(tmp_path):
    """A real collector over tmp_path/data (collector.testing.collectors.live_collector);
    unpacks as (endpoint, data_dir)."""
    from collector.testing.collectors import live_collector as collector_at

    with collector_at(tmp_path / "data") as collector:
        yield collector
