"""The suite's time guard (a pytest plugin, loaded by tests/conftest.py).

Prints the 20 slowest tests and shared fixtures with their share of the suite's test time and the 10
costliest test files (all of it saved in build/test-durations/, one file per ``-m``), and fails the
session when a test not marked ``slow`` took longer than ``TEST_LIMIT_S``, or a shared (module- or
session-scoped) fixture longer than ``FIXTURE_LIMIT_S``. A test's own time is its setup, call and
teardown less the shared fixtures it happened to set up first: those serve several tests and are
listed, and bounded, on their own. Each round adds tests; the guard keeps one of them from taking
the suite's time unseen (issue #42). Works under pytest-xdist: the workers attach the shared
fixtures' set-up times to the setup report, which the controller adds up.

The limits hold on a machine loaded by the suite alone (its xdist workers, or one process per core).
Beside other work (a CPU hog, another job) every test slows alike, so a limit grows with the 1-minute
load per core over what the suite makes itself, as sampled at the end of the test, and says so: the
guard is there to catch a test that is slow by design, not a busy machine.
``RANKSCOPE_TEST_TIME_LIMIT_S`` sets the test limit by hand, taken as it is (no growth with the load).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

TEST_LIMIT_S = float(os.environ.get("RANKSCOPE_TEST_TIME_LIMIT_S", "60"))
GROWS_WITH_LOAD = "RANKSCOPE_TEST_TIME_LIMIT_S" not in os.environ
FIXTURE_LIMIT_S = 3 * TEST_LIMIT_S  # a fixture that trains the runs a module's tests read
SHOWN = 20
FILES_SHOWN = 10
# every test's and shared fixture's time, per run of pytest (named by its -m), to see where the time goes
DURATIONS_DIR = Path(__file__).resolve().parents[1] / "build" / "test-durations"
_SHARED = "shared_fixtures_s"

# worker side: shared fixtures set up during the setup of the item being set up
_set_up_now: dict[str, float] = {}


def _load_now() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _said(load: float | None) -> str:
    return "load unknown" if load is None else f"load {load:.1f} on {os.cpu_count()} cores"


def _busier_than_the_suite(load: float | None, workers: int) -> float:
    """How many times busier a machine at ``load`` is than the suite alone makes it (>= 1)."""
    if load is None:
        return 1.0
    cores = os.cpu_count() or 1
    return max(1.0, (load / cores) / max(1.0, workers / cores))


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

    def __init__(self, workers: int, marks: str) -> None:
        self.workers = workers
        self.marks = marks
        self.tests: dict[str, float] = {}  # nodeid -> own seconds
        self.slow: set[str] = set()
        self.fixtures: dict[str, float] = {}
        self.load_at: dict[str, float | None] = {}  # test or fixture -> the load at its end

    def pytest_runtest_logreport(self, report) -> None:
        shared = (dict(report.user_properties).get(_SHARED) or {}) if report.when == "setup" else {}
        self.fixtures.update(shared)
        for name in shared:
            self.load_at[name] = _load_now()
        own = report.duration - sum(shared.values())
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + max(own, 0.0)
        if "slow" in report.keywords:
            self.slow.add(report.nodeid)
        if report.when == "teardown":
            self.load_at[report.nodeid] = _load_now()

    def _limit(self, name: str, base: float) -> tuple[float, str]:
        busier = _busier_than_the_suite(self.load_at.get(name), self.workers) if GROWS_WITH_LOAD else 1.0
        if busier <= 1.0:
            return base, f"limit {base:.0f} s"
        return base * busier, f"limit {base * busier:.0f} s: {base:.0f} s x {busier:.1f}, the machine that much busier"

    def offenders(self) -> list[str]:
        found = []
        for nodeid, s in self.tests.items():
            limit, says = self._limit(nodeid, TEST_LIMIT_S)
            if s > limit and nodeid not in self.slow:
                found.append(f"{nodeid}: {s:.0f} s ({says}; {_said(self.load_at.get(nodeid, _load_now()))} at its end)")
        for name, s in self.fixtures.items():
            limit, says = self._limit(name, FIXTURE_LIMIT_S)
            if s > limit and not any(nodeid in name for nodeid in self.slow):
                found.append(f"{name}: {s:.0f} s ({says})")
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
        terminalreporter.section(f"the {SHOWN} slowest of {total / 60:.1f} min of test time ({_said(_load_now())} now)")
        for name, s in entries[:SHOWN]:
            write(f"{s:7.1f} s {100 * s / total:5.1f} %  {name}")
        by_file = self.by_file()
        terminalreporter.section(f"the {FILES_SHOWN} costliest test files (tests and their shared fixtures)")
        for name, s in sorted(by_file.items(), key=lambda e: -e[1])[:FILES_SHOWN]:
            write(f"{s:7.1f} s {100 * s / total:5.1f} %  {name}")
        self._save(by_file)
        offenders = self.offenders()
        if offenders:
            terminalreporter.section("over the time limit (tests/_durations.py)", red=True)
            for line in offenders:
                write(line, red=True)

    def by_file(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for name, s in self.tests.items():
            totals[name.split("::")[0]] = totals.get(name.split("::")[0], 0.0) + s
        for name, s in self.fixtures.items():
            where = re.search(r"fixture of (\S+?)(?:::|\])", name)
            key = where.group(1) if where else name
            totals[key] = totals.get(key, 0.0) + s
        return totals

    def _save(self, by_file: dict[str, float]) -> None:
        slug = re.sub(r"\W+", "-", self.marks).strip("-") or "all"
        try:
            DURATIONS_DIR.mkdir(parents=True, exist_ok=True)
            saved = {"marks": self.marks, "tests": self.tests, "fixtures": self.fixtures, "files": by_file}
            (DURATIONS_DIR / f"{slug}.json").write_text(json.dumps(saved, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only checkout: the summary above is printed all the same


def pytest_configure(config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) judges
        workers = getattr(config.option, "numprocesses", None) or 0
        guard = DurationGuard(workers if isinstance(workers, int) else 0, config.option.markexpr or "")
        config.pluginmanager.register(guard, "rankscope-duration-guard")
