"""Liveness stories for tests and benchmarks, written straight into a data dir: a run that is
stuck now (``write_hang``: every rank but one waits in the next all_reduce of "world"), at any
world size (1,024 ranks for the scale rule), with heartbeats that are current, so the hang is the
only thing wrong. Built on collector.testing.fake_runs (the run's own records come from there)."""

from __future__ import annotations

import time
from pathlib import Path

from collector.data.catalog import ensure_catalog
from collector.testing.fake_runs import FakeRun, _stored, _write, write_run


def write_hang(data_dir, run: FakeRun, stuck_rank: int, waited_s: float = 30.0, hang_after_s: float = 2.0) -> int:
    """``run`` (status 'running'), then: rank ``stuck_rank`` never enters the next all_reduce of
    "world", every other rank has waited in it ``waited_s``; all ranks beat now. Returns its seq."""
    data_dir = Path(data_dir)
    write_run(data_dir, run)
    seq = run.instances + 1  # the next instance of every group in the story
    now = time.time_ns()
    n = run.world_size
    waiting = [r for r in range(n) if r != stuck_rank]
    for r in waiting:
        cols = {
            "step": [run.steps],
            "group_name": ["world"],
            "group_size": [n],
            "group_ranks": [f"0-{n - 1}"],
            "seq": [seq],
            "op": ["all_reduce"],
            "dtype": ["float32"],
            "numel": [1024],
            "bytes": [4096],
            "entered_ns": [now - int(waited_s * 1e9)],
            "time_ns": [now],
            "hang_after_s": [hang_after_s],
            "state": ["waiting"],
        }
        _write(data_dir, "inflight", run.run_id, f"rank{r}", _stored("inflight", r, cols))
    for r in range(n):
        beats = {"step": [run.steps], "time_ns": [now], "period_s": [1.0], "inflight": [int(r != stuck_rank)]}
        _write(data_dir, "heartbeats", run.run_id, f"rank{r}", _stored("heartbeats", r, beats))
    ensure_catalog(data_dir)
    return seq
