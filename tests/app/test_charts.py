"""Chart rules that decide what a reader sees (app/charts.py), on hand-made frames."""

from __future__ import annotations

import pandas as pd

from app import charts


def test_a_timer_that_holds_others_is_not_stacked_on_them():
    """DeepSpeed's bwd = bwd_inner + bwd_allreduce: stacking all three read ~116 ms for a ~75 ms step."""
    assert charts.leaf_timers(["bwd", "bwd_allreduce", "bwd_inner", "fwd", "step"]) == [
        "bwd_allreduce",
        "bwd_inner",
        "fwd",
        "step",
    ]
    assert charts.leaf_timers(["bwd", "fwd", "step"]) == ["bwd", "fwd", "step"]
    mean = pd.DataFrame(
        [
            {"rank": r, "name": n, "dur_ms": d}
            for r in range(2)
            for n, d in (("fwd", 20.0), ("bwd", 40.0), ("bwd_inner", 30.0), ("bwd_allreduce", 10.0), ("step", 15.0))
        ]
    )
    fig = charts.step_breakdown(mean)
    per_rank = {}
    for trace in fig.data:
        for x, y in zip(trace.x, trace.y, strict=True):
            per_rank[x] = per_rank.get(x, 0) + y
    assert per_rank == {"rank 0": 75.0, "rank 1": 75.0}


def test_the_warm_up_step_does_not_set_the_heatmaps_colour_scale():
    rows = [
        {"rank": r, "step": s, "ms": 200.0 if s == 0 else (40.0 if r == 3 else 1.0)}
        for r in range(4)
        for s in range(10)
    ]
    fig = charts.heatmap(pd.DataFrame(rows), "ms", "arrival")
    assert fig.data[0].zmax == 40.0 and fig.data[0].zmin == 1.0
    calm = [{"rank": r, "step": s, "ms": 40.0 if r == 3 else 1.0} for r in range(4) for s in range(10)]
    assert charts.heatmap(pd.DataFrame(calm), "ms", "arrival").data[0].zmax is None
