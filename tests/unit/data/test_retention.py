"""The retention policy (collector/data/retention.py) on hand-made rollups: the sample is
kept, a late step and a slow-bandwidth step are kept, nothing else on a healthy run; deliveries
stay only near a slow-link finding."""

from __future__ import annotations

import pandas as pd
import pytest

from collector.data.retention import DELIVERY_MARGIN_STEPS, LATE_MS, deliveries_kept, steps_to_keep


def rollup(steps: int = 30, ranks: int = 4, late: dict[int, float] | None = None, slow: set[int] = frozenset()):
    rows = []
    for step in range(steps):
        for rank in range(ranks):
            delay_ms = (late or {}).get(step, 0.3) if rank == 1 else 0.2
            bw = 10.0 if step not in slow else 3.0
            rows.append(dict(rank=rank, step=step, op="all_reduce", bytes=1 << 20, n=2, busbw_sum=2 * bw,
                             delay_max_ns=int(delay_ms * 1e6)))  # fmt: skip
    return pd.DataFrame(rows)


def test_a_healthy_run_keeps_only_the_sample():
    assert steps_to_keep(rollup(), 10) == {0, 10, 20}
    assert steps_to_keep(rollup(), 1) == set(range(30))


def test_a_late_step_and_a_slow_step_are_kept():
    kept = steps_to_keep(rollup(late={13: LATE_MS + 1, 14: LATE_MS - 1}, slow={27}), 10)
    assert kept == {0, 10, 20, 13, 27}


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match="raw_every"):
        steps_to_keep(rollup(), 0)
    assert steps_to_keep(rollup().iloc[:0], 5) == set()


def test_deliveries_stay_only_within_the_margin_of_a_slow_link():
    steps = list(range(200))
    kept = deliveries_kept(steps, [(60, 79), (150, 160)])
    m = DELIVERY_MARGIN_STEPS
    expected = set(range(60 - m, 80 + m)) | set(range(150 - m, 161 + m))
    assert {s for s, k in zip(steps, kept, strict=True) if k} == expected
    assert not deliveries_kept(steps, []).any()  # a run without a slow link keeps none
    assert deliveries_kept([], [(1, 2)]).shape == (0,)
