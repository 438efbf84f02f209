"""Fixtures shared by the tests of every role (tests/<role>/): a free port, a live
collector, and the isolation every test gets (its own spool dir, no developer's
collector, no process group left over). Helpers are in collector.testing."""

from __future__ import annotations

import os
import sys

import pytest

from collector.testing.ports import free_port
from tests._durations import pytest_configure, pytest_fixture_setup, pytest_runtest_makereport  # noqa: F401 (hooks)

# The test files that run real DeepSpeed: when any is selected, its JIT ops compile in the background
# from the start of the session (nice 19), in the CPU other tests leave idle. A DeepSpeed test that
# starts before that build is done stops it and has its own processes build the rest at their priority:
# on a busy host a nice-19 build would starve while the test waited for it.
_DEEPSPEED_TESTS = {"test_deepspeed_hook.py", "test_deepspeed_scripts.py", "test_import_deepspeed.py"}


def pytest_collection_modifyitems(session, config, items):
    if any(item.path.name in _DEEPSPEED_TESTS for item in items):
        from benches import _deepspeed_venv

        config._deepspeed_ops_build = _deepspeed_venv.build_ops_in_background(_deepspeed_venv.VENV / "jit-ops.log")


def _stop_deepspeed_ops_build(config) -> None:
    build = getattr(config, "_deepspeed_ops_build", None)
    if build is not None:
        from benches import _deepspeed_venv

        _deepspeed_venv.interrupt_build(build)


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_ops_at_full_priority(request):
    if request.path.name in _DEEPSPEED_TESTS:
        _stop_deepspeed_ops_build(request.config)
    yield


def pytest_sessionfinish(session, exitstatus):
    _stop_deepspeed_ops_build(session.config)


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
