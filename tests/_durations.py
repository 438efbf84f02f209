"""The suite's time guard (a pytest plugin, loaded by tests/conftest.py).

Prints the 20 slowest tests and shared fixtures with their share of the suite's test time, and fails the
session when a test not marked ``slow`` took longer than ``TEST_LIMIT_S``, or a shared (module- or
session-scoped) fixture longer than ``FIXTURE_LIMIT_S``. A test's own time is its setup, call and
teardown less the shared fixtures it happened to set up first: those serve several tests and are
listed, and bounded, on their own. Each round adds tests; the guard keeps one of them from taking
the suite's time unseen (issue #42). Works under pytest-xdist: the workers attach the shared
fixtures' set-up times to the setup report, which the controller adds up.

``RANKSCOPE_TEST_TIME_LIMIT_S`` overrides the test limit (a slower machine than CI's, on purpose).
"""

from __future__ import annotations

import os
import time

import pytest

TEST_LIMIT_S = float(os.environ.get("RANKSCOPE_TEST_TIME_LIMIT_S", "60"))
FIXTURE_LIMIT_S = 3 * TEST_LIMIT_S  # a fixture that trains the runs a module's tests read
SHOWN = 20
_SHARED = "shared_fixtures_s"

# worker side: shared fixtures set up during the setup of the item being set up
_set_up_now: dict[str, float] = {}


def _load() -> str:
    try:
        return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "load unknown"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    started = time.perf_counter()
    yield
    if fixturedef.scope != "function" and time.perf_counter() - started >= 0.01:
        where = request.node.nodeid or "session"
        _set_up_now[f"{fixturedef.argname} [{fixturedef.scope} fixture of {where}]"] = time.perf_counter() - started


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "setup":
        report = outcome.get_result()
        report.user_properties.append((_SHARED, dict(_set_up_now)))
        _set_up_now.clear()


class DurationGuard:
    """Controller side: every report's time, by test and by shared fixture."""

    def __init__(self) -> None:
        self.tests: dict[str, float] = {}  # nodeid -> own seconds
        self.slow: set[str] = set()
        self.fixtures: dict[str, float] = {}
        self.load_at: dict[str, str] = {}

    def pytest_runtest_logreport(self, report) -> None:
        shared = (dict(report.user_properties).get(_SHARED) or {}) if report.when == "setup" else {}
        self.fixtures.update(shared)
        own = report.duration - sum(shared.values())
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + max(own, 0.0)
        if "slow" in report.keywords:
            self.slow.add(report.nodeid)
        if report.when == "teardown":
            self.load_at[report.nodeid] = _load()

    def offenders(self) -> list[str]:
        found = [
            f"{nodeid}: {s:.0f} s (limit {TEST_LIMIT_S:.0f} s; {self.load_at.get(nodeid, _load())} at its end)"
            for nodeid, s in self.tests.items()
            if s > TEST_LIMIT_S and nodeid not in self.slow
        ]
        found += [
            f"{name}: {s:.0f} s (limit {FIXTURE_LIMIT_S:.0f} s)"
            for name, s in self.fixtures.items()
            if s > FIXTURE_LIMIT_S and not any(nodeid in name for nodeid in self.slow)
        ]
        return found

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session) -> None:
        if self.offenders() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        entries = sorted([*self.tests.items(), *self.fixtures.items()], key=lambda e: -e[1])
        total = sum(self.tests.values()) + sum(self.fixtures.values())
        if not entries or total <= 0:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"the {SHOWN} slowest of {total / 60:.1f} min of test time ({_load()} now)")
        for name, s in entries[:SHOWN]:
            write(f"{s:7.1f} s {100 * s / total:5.1f} %  {name}")
        offenders = self.offenders()
        if offenders:
            terminalreporter.section("over the time limit (tests/_durations.py)", red=True)
            for line in offenders:
                write(line, red=True)


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) judges
        config.pluginmanager.register(DurationGuard(), "rankscope-duration-guard")
