"""The rank-side root-cause signals: GC pauses caught by gc.callbacks into a preallocated ring
and folded per step, host and run-queue samples from /proc, and the sampler following a real
session into a real collector.

Split by tier: the pure-function tests are in tests/unit/rank/test_signals.py."""

from __future__ import annotations

import gc
import threading
import time

from collector.rank import session, signals, state
from collector.testing.collectors import live_collector, stored_rows


def test_the_sampler_follows_a_session_into_the_collector(tmp_path, monkeypatch):
    monkeypatch.setattr(signals, "SAMPLE_INTERVAL_S", 0.02)
    with live_collector(tmp_path) as collector:
        session.start(run="signals", endpoint=collector.endpoint, source="hook")
        try:
            assert any(t.name == "rankscope-signals" for t in threading.enumerate())
            state.set_step(1)
            garbage = []
            for _ in range(20_000):
                a = []
                a.append(a)
                garbage.append(a)
            del garbage
            gc.collect()
            time.sleep(0.2)
        finally:
            session.stop()
            state.set_step(0)
        assert signals.SIGNALS.pauses.callback not in gc.callbacks
    assert stored_rows(tmp_path, "gc") >= 1 and stored_rows(tmp_path, "host") >= 2
