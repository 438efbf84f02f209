"""The per-step analysis (queries.step_analysis_of): interval unions, waiting vs transfer,
overlap with compute and the wait a late rank imposes, checked against a brute-force
reference on small cases and for shape and bounds at 1,024 ranks x 500 steps.

Split by tier: the pure-function tests are in tests/unit/data/test_step_analysis.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.data import queries
from tests.unit.data.test_step_analysis import MS


def scale_tables(n_ranks: int, n_steps: int, per_step: int, late_rank: int, late_ms: float):
    """A synthetic run: every rank's step is [0, 100) ms of its own period; ``per_step`` all_reduces,
    two of them async and overlapping; ``late_rank`` enters the first one ``late_ms`` late."""
    ranks = np.repeat(np.arange(n_ranks), n_steps * per_step)
    steps = np.tile(np.repeat(np.arange(n_steps), per_step), n_ranks)
    j = np.tile(np.arange(per_step), n_ranks * n_steps)
    base = steps * 200.0
    start = base + 40 + j * 5.0 + (ranks % 7) * 0.01
    start = np.where((ranks == late_rank) & (j == 0), start + late_ms, start)
    end = np.maximum(start, base + 40 + late_ms * (j == 0)) + 8
    comm = pa.table(
        {
            "rank": ranks,
            "step": steps,
            "group_name": np.full(len(ranks), "world"),
            "seq": steps * per_step + j,
            "op": np.full(len(ranks), "all_reduce"),
            "start_ns": (start * MS).astype(np.int64),
            "end_ns": (end * MS).astype(np.int64),
        }
    )
    tr = np.repeat(np.arange(n_ranks), n_steps)
    ts = np.tile(np.arange(n_steps), n_ranks)
    timers = pa.table(
        {
            "rank": tr,
            "step": ts,
            "name": np.full(len(tr), "fwd"),
            "start_ns": (ts * 200.0 * MS).astype(np.int64),
            "end_ns": ((ts * 200.0 + 100) * MS).astype(np.int64),
        }
    )
    return comm, timers


def test_at_1024_ranks_by_500_steps():
    comm, timers = scale_tables(1024, 500, per_step=3, late_rank=777, late_ms=20)
    df = queries.step_analysis_of(comm, timers)
    assert len(df) == 1024 * 500
    assert (df.comm_ms <= df.step_ms + 1e-6).all() and (df.waiting_ms <= df.comm_ms + 1e-6).all()
    late = df[df["rank"] == 777]
    assert late.imposed_ms.to_numpy() == pytest.approx(20 - 0.01 * (6 - 777 % 7), abs=0.005)
    others = df[df["rank"] != 777]
    assert others.imposed_ms.max() < 1
