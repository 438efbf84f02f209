"""The rank's watchdog reports a collective in flight the moment it crosses REPORT_AFTER_S, not at
its next heartbeat (a desync is told from those reports), and once per crossing: the rest come
with the beats."""

from __future__ import annotations

import time

import torch

from collector.rank import session, watchdog
from collector.rank.clock import perf_ns
from collector.rank.recorder import REC, SLOT_SINCE, _Group, new_record


def test_a_collective_is_reported_as_it_crosses_report_after_s_not_at_the_next_beat(monkeypatch):
    reported: list[tuple[float, dict]] = []
    monkeypatch.setattr(session, "emit_rows", lambda table, rows: reported.extend((time.monotonic(), r) for r in rows))
    monkeypatch.setattr(session, "emit", lambda table, **row: None)  # the heartbeats
    dog = watchdog.Watchdog()
    dog.start(hang_after_s=600.0, heartbeat_s=60.0)  # its first beat now, the next a minute on
    rec = new_record("all_reduce", _Group("world", 2, "0-1"), 7, torch.float32, 4, 3, perf_ns())
    entered = time.monotonic()
    REC.inflight[id(rec)] = rec
    try:
        deadline = entered + 20.0
        while not reported and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reported, "not reported before the next beat"
        at, row = reported[0]
        assert at - entered >= watchdog.REPORT_AFTER_S - 0.01
        assert (row["op"], row["seq"], row["numel"], row["state"]) == ("all_reduce", 7, 4, "waiting")
        time.sleep(0.5)
        assert len(reported) == 1, "reported again before the next beat"
        assert rec[SLOT_SINCE]
    finally:
        REC.inflight.pop(id(rec), None)
        dog.stop()
