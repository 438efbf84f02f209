"""Ctrl-C while the demo waits for its run to appear: the poll reads the catalog with DuckDB, and a
SIGINT that lands inside a DuckDB query comes out as DuckDB's RuntimeError, not KeyboardInterrupt.
The poll retries on errors (the catalog not written yet), so it must still stop. Seen beside a CPU
hog: the demo kept training after Ctrl-C, the fresh clone's two Ctrl-C tests ran into their 300 s
timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import duckdb
import pytest

from collector.data import catalog
from collector.tools import demo

LONG_QUERY = "SELECT count(*) FROM range(100000000000) a"  # minutes: a signal lands inside it


def _a_long_query(_data_dir):
    """A real DuckDB query that runs for minutes, in the catalog's place."""
    con = duckdb.connect()
    con.execute(LONG_QUERY)
    return con


@pytest.fixture
def demo_signals():
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, demo._stop_on)
    demo._stop_asked = None
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    demo._stop_asked = None


@pytest.mark.parametrize("sig, stop", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, demo._Stopped)])
def test_a_stop_signal_inside_a_duckdb_query_stops_the_run_id_poll(demo_signals, monkeypatch, tmp_path, sig, stop):
    # what DuckDB makes of the signal (a RuntimeError the poll retries on): the test below
    monkeypatch.setattr(catalog, "connect", _a_long_query)
    training = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), sig)).start()
        with pytest.raises(stop):
            demo._demo_run_id(str(tmp_path), 0.0, training, timeout_s=20.0)
    finally:
        training.kill()
        training.wait()


def test_duckdb_tells_a_signals_stop_from_a_time_limit():
    """What catalog.stopped_by_signal (used by `rankscope profile`'s wait) tells apart, on real queries:
    Ctrl-C inside a query, and interrupt() from another thread (the SQL time limit)."""
    errors = []
    for stop in ("signal", "interrupt"):
        con = duckdb.connect()
        if stop == "signal":
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        else:
            timer = threading.Timer(0.3, con.interrupt)
        timer.start()
        try:
            con.execute(LONG_QUERY).fetchone()
        except Exception as exc:
            errors.append(exc)
        finally:
            if stop == "signal":
                signal.signal(signal.SIGINT, previous)
    assert [catalog.stopped_by_signal(e) for e in errors] == [True, False], errors


@pytest.mark.parametrize("sig, stop", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, demo._Stopped)])
def test_a_stop_signal_while_a_child_starts_waits_until_it_is_started_and_kept(demo_signals, sig, stop):
    """Raised inside subprocess's fork hooks, the stop printed "Exception ignored in _releaseLock";
    raised before the child was assigned, it left the child running. Held, it comes right after."""
    child = None
    try:
        with pytest.raises(stop):
            with demo._starting():
                os.kill(os.getpid(), sig)  # delivered at once, inside the start
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                started = True
            started = False  # not reached: the held stop is raised as the block ends
        assert started and child is not None and child.poll() is None
    finally:
        if child is not None:
            child.kill()
            child.wait()
