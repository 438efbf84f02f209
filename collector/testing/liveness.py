"""Liveness stories for tests and benchmarks, written straight into a data dir: a run that is
stuck now (``write_hang``: every rank but one waits in the next all_reduce of "world"), at any
world size (1,024 ranks for the scale rule), with heartbeats that are current, so the hang is the
only thing wrong. Built on collector.testing.fake_runs (the run's own records come from there)."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from collector.data.catalog import ensure_catalog
from collector.data.schema import TABLES
from collector.testing.fake_runs import FakeRun, _write, write_run

# A rank's watchdog's tables are not in the fake runs' story (fake_runs.STORY_TABLES), so their
# dashboards show no liveness banner; write_hang adds them.


def write_hang(data_dir, run: FakeRun, stuck_rank: int, waited_s: float = 30.0, hang_after_s: float = 2.0) -> int:
    """``run`` (status 'running'), then: rank ``stuck_rank`` never enters the next all_reduce of
    "world", every other rank has waited in it ``waited_s``; all ranks beat now. Returns its seq."""
    data_dir = Path(data_dir)
    write_run(data_dir, run)
    seq = run.instances + 1  # the next instance of every group in the story
    n = run.world_size
    ensure_catalog(data_dir)
    now = time.time_ns()  # last: the beats are fresh when this returns
    waiting = [r for r in range(n) if r != stuck_rank]
    k = len(waiting)
    inflight = {
        "rank": waiting,
        "step": [run.steps] * k,
        "group_name": ["world"] * k,
        "group_size": [n] * k,
        "group_ranks": [f"0-{n - 1}"] * k,
        "seq": [seq] * k,
        "op": ["all_reduce"] * k,
        "dtype": ["float32"] * k,
        "numel": [1024] * k,
        "bytes": [4096] * k,
        "entered_ns": [now - int(waited_s * 1e9)] * k,
        "time_ns": [now] * k,
        "hang_after_s": [hang_after_s] * k,
        "state": ["waiting"] * k,
    }
    beats = {
        "rank": list(range(n)),
        "step": [run.steps] * n,
        "time_ns": [now] * n,
        "period_s": [1.0] * n,
        "inflight": [int(r != stuck_rank) for r in range(n)],
        "hang_after_s": [hang_after_s] * n,
        "ending": [False] * n,
    }
    for table, columns, segment in (("inflight", inflight, "waiting"), ("heartbeats", beats, "beats")):
        _write(data_dir, table, run.run_id, segment, pa.table(columns, schema=TABLES[table].arrow_schema()))
    return seq
