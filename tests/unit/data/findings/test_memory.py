"""Memory growth (collector/data/findings/memory.py): a leaking rank is named with its growth and
when it runs out; flat, small or stepwise memory is not growth."""

from __future__ import annotations

import pandas as pd

from collector.data.findings import memory


def memory_rows(rank: int, per_step: float, steps: int = 100, start: float = 800e6) -> dict:
    return {
        "rank": rank,
        "bytes_per_s": per_step * 50,
        "r2": 0.99 if per_step else 0.1,
        "first_rss": start,
        "last_rss": start + per_step * steps / 2,
        "available": 20 * 2**30,
        "first_step": steps // 2,
        "last_step": steps,
        "steps_per_s": 50.0,
        "samples": 20,
    }


def test_a_leaking_rank_is_named_with_its_growth_and_the_step_it_runs_out():
    trend = pd.DataFrame([memory_rows(0, 0.0), memory_rows(1, 3 * 2**20)])
    (found,) = memory.memory_growth(trend)
    assert found.kind == "memory_growth" and found.ranks == (1,)
    assert "grows 3.0 MiB per step" in found.text and "runs out in ~6,827 steps" in found.text
    assert found.evidence["oom_step"] == 100 + 6826


def test_flat_or_small_or_stepwise_memory_is_not_growth():
    assert memory.memory_growth(pd.DataFrame([memory_rows(0, 0.0), memory_rows(1, 0.0)])) == []
    small = memory_rows(1, 0.5 * 2**20)  # 25 MiB over the window: under MIN_GROWTH_BYTES
    assert memory.memory_growth(pd.DataFrame([small])) == []
    jump = dict(memory_rows(1, 3 * 2**20), r2=0.4)  # one step up, not a line
    assert memory.memory_growth(pd.DataFrame([jump])) == []
