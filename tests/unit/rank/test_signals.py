"""The rank-side root-cause signals: GC pauses caught by gc.callbacks into a preallocated ring
and folded per step, host and run-queue samples from /proc, and the sampler following a real
session into a real collector.

Split by tier: what needs processes, sockets or seconds is in tests/integration/rank/test_signals.py."""

from __future__ import annotations

import gc
import sys

import pytest

from collector.rank import signals, state


def test_pauses_are_folded_per_step_and_generation():
    pauses = signals.GcPauses(slots=8)
    for step, generation in ((1, 0), (1, 0), (1, 2), (2, 0)):
        state.set_step(step)
        pauses.callback("start", {"generation": generation})
        pauses.callback("stop", {"generation": generation, "collected": 3})
    rows = {(r["step"], r["generation"]): r for r in pauses.drain()}
    assert set(rows) == {(1, 0), (1, 2), (2, 0)}
    assert rows[(1, 0)]["count"] == 2 and rows[(1, 0)]["collected"] == 6
    assert rows[(1, 0)]["max_ns"] <= rows[(1, 0)]["dur_ns"]
    assert pauses.drain() == []  # nothing twice
    state.set_step(0)


def test_a_ring_overrun_keeps_the_newest_and_counts_the_rest():
    pauses = signals.GcPauses(slots=4)
    for _ in range(10):
        pauses.callback("start", {"generation": 0})
        pauses.callback("stop", {"generation": 0, "collected": 0})
    (row,) = pauses.drain()
    assert row["count"] == 4 and pauses.dropped == 6


def test_a_real_collection_of_cyclic_garbage_is_caught():
    pauses = signals.GcPauses()
    gc.callbacks.append(pauses.callback)
    try:
        cycles = []
        for _ in range(50_000):
            a = []
            a.append(a)
            cycles.append(a)
        del cycles, a  # the loop's last list too: every one of the 50,000 cycles is garbage now
        gc.collect()
    finally:
        gc.callbacks.remove(pauses.callback)
    full = [r for r in pauses.drain() if r["generation"] == 2]
    assert full and sum(r["collected"] for r in full) >= 50_000 and full[0]["dur_ns"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_host_samples_are_shares_and_deltas():
    sampler = signals.HostSampler()
    x = 0
    for i in range(2_000_000):  # some CPU time of our own to see
        x += i
    row = sampler.sample()
    assert 0.0 <= row["cpu_util"] <= 1.0 and 0.0 <= row["steal"] <= 1.0
    assert row["cpu_ns"] > 0 and row["runqueue_ns"] >= 0 and row["rss_bytes"] > 10 << 20
    assert row["interval_ns"] > 0
