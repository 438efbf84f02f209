"""The unit tier's guard must be able to fail a test: each kind of impurity is refused, and a test
that catches the refusal still fails on the way out."""

from __future__ import annotations

import multiprocessing
import socket
import subprocess
import sys

import pytest

from tests.unit._purity import ImpureTest, pure


def _noop() -> None:
    pass


@pytest.mark.parametrize(
    "impure",
    [
        lambda: socket.socket(),
        lambda: socket.create_connection(("127.0.0.1", 9)),
        lambda: subprocess.run([sys.executable, "-c", "pass"]),
        lambda: multiprocessing.get_context("spawn").Process(target=_noop).start(),
    ],
    ids=["socket", "connection", "subprocess", "multiprocessing"],
)
def test_each_impurity_is_refused(impure):
    with pytest.raises(ImpureTest, match="move it to tests/integration"):
        with pure():
            impure()


def test_a_swallowed_refusal_still_fails_the_test():
    with pytest.raises(ImpureTest, match="started a subprocess"):
        with pure():
            try:
                subprocess.run(["true"])
            except Exception:
                pass


def test_a_process_group_is_refused():
    dist = pytest.importorskip("torch.distributed")
    with pytest.raises(ImpureTest, match="init_process_group"):
        with pure():
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:1", rank=0, world_size=1)


def test_pure_code_passes_and_everything_is_restored():
    original = (socket.socket.__init__, subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start)
    with pure() as attempts:
        left, right = socket.socketpair()  # a local pair, as asyncio's event loop opens
        left.close()
        right.close()
    assert attempts == []
    assert (socket.socket.__init__, subprocess.Popen.__init__, multiprocessing.process.BaseProcess.start) == original


def test_this_tier_runs_under_the_guard():
    # the autouse fixture of tests/unit/conftest.py is on: the socket is refused here, outside any
    # explicit pure() block (the fixture's own exit would then fail this test, so catch it inside)
    with pytest.raises(ImpureTest):
        with pure():
            socket.socket()
    assert socket.socket.__init__.__name__ == "checked"


class _Outcomes:
    """Each inner test's outcome, as a pytest plugin sees its reports."""

    def __init__(self):
        self.failed: dict[str, str] = {}
        self.passed: set[str] = set()

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.rpartition("::")[2]
        if report.failed:  # a teardown that fails takes back the call's pass
            self.failed[name] = str(report.longrepr)
            self.passed.discard(name)
        elif report.when == "call":
            self.passed.add(name)


def test_the_tiers_fixture_fails_a_test_that_opens_a_socket_and_passes_a_pure_one(tmp_path):
    # a pytest session in this process, with this tier's conftest fixture and two tests
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text("from tests.unit.conftest import _pure  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(
        "import socket\n\n"
        "def test_opens_a_socket():\n"
        "    try:\n"
        "        socket.socket().close()\n"
        "    except Exception:\n"
        "        pass\n\n"
        "def test_adds():\n"
        "    assert 1 + 1 == 2\n"
    )
    outcomes = _Outcomes()
    code = pytest.main(
        [str(tmp_path), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--import-mode=importlib"],
        plugins=[outcomes],
    )
    assert code == pytest.ExitCode.TESTS_FAILED
    assert list(outcomes.failed) == ["test_opens_a_socket"]
    assert "opened a network socket: move it to tests/integration" in outcomes.failed["test_opens_a_socket"]
    assert outcomes.passed == {"test_adds"}
