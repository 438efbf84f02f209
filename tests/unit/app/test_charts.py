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


def test_constant_buffers_of_a_few_hundred_kilobytes_draw_in_kib_on_an_axis_that_holds_them():
    """#29: params/grads/optimizer bytes (110-441 KB) drew as flat lines at 0 on a -1..1 GiB axis."""
    rows = pd.DataFrame([{"step": s, "series": f"rank {r}", "bytes": 120_320.0} for r in range(2) for s in range(30)])
    fig = charts.memory_lines(rows, "params per rank")
    assert fig.layout.yaxis.title.text == "KiB"
    assert all(abs(y - 117.5) < 1e-9 for t in fig.data for y in t.y)
    low, high = fig.layout.yaxis.range
    assert low == 0 and 117.5 < high < 2 * 117.5
    assert charts.byte_unit([425_680_896.0]) == ("MiB", 2**20)
    assert charts.byte_unit([3 * 2**30]) == ("GiB", 2**30)
    assert charts.byte_unit([512.0]) == ("bytes", 1)


def test_loss_scale_ticks_are_exact_powers_of_two():
    """#29: a log axis with dtick log10(2) labelled 2^24 as "16,777,220" and 2^23 as "8,388,610"."""
    scales = pd.DataFrame(
        {
            "step": range(9),
            "scale": [2.0**e for e in (24, 23, 22, 21, 20, 19, 18, 17, 16)],
            "overflow": [True] * 8 + [False],
            "bad_params": [""] * 9,
        }
    )
    fig = charts.loss_scale(scales)
    axis = fig.layout.yaxis
    assert axis.type == "log" and axis.tickmode == "array"
    assert list(axis.tickvals) == [2.0**e for e in range(16, 25)]
    assert list(axis.ticktext) == [f"2^{e}" for e in range(16, 25)]
    wide = charts.power_of_two_ticks([1.0, 2.0**40])[0]  # a long range thins out, still exact
    assert len(wide) <= 10 and all(float(v).is_integer() and int(v) & (int(v) - 1) == 0 for v in wide)


def _binned(n_bins: int, worst: int) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "order": b,
                "label": f"node-{b:04d} (ranks {8 * b}–{8 * b + 7})",
                "step": s,
                "max": 50.0 if b == worst else 1.0 + b / 100,
                "p95": 1.0,
                "worst_rank": 8 * b,
            }
            for b in range(n_bins)
            for s in range(5)
        ]
    )


def test_every_binned_heatmap_row_is_labelled_the_worst_first():
    """#29: plotly labelled every other row of the 32-host map, and not the worst one."""
    binned = _binned(32, worst=0)
    fig = charts.binned_heatmap(binned, "arrival")
    labels = binned.drop_duplicates("order").label.tolist()
    assert list(fig.layout.yaxis.tickvals) == labels and list(fig.layout.yaxis.ticktext) == labels
    assert fig.layout.yaxis.tickmode == "array"


def test_a_heatmap_with_more_rows_than_labels_fit_still_names_its_worst_rows():
    binned = _binned(100, worst=77)
    labels = binned.drop_duplicates("order").label.tolist()
    grid = binned.pivot(index="order", columns="step", values="max")
    shown = charts.row_ticks(grid, labels, most=20)
    assert labels[77] in shown and len(shown) <= 40
    assert shown == [lab for lab in labels if lab in shown]  # in row order


def test_the_sql_consoles_default_chart_is_not_a_line_over_the_run_id():
    per_rank = pd.DataFrame(
        {
            "run_id": ["r1"] * 4,
            "op": ["all_reduce", "all_reduce", "all_gather", "all_gather"],
            "rank": [0, 1] * 2,
            "n": [10, 10, 5, 5],
            "busbw_gbs": [1.0, 2.0, 3.0, 4.0],
        }
    )
    kind, x, y, colour = charts.custom_defaults(per_rank)
    assert x != "run_id" and y == "busbw_gbs"
    assert (kind, x, colour) == ("bar", "rank", "op")
    per_step = pd.DataFrame({"step": [0, 1, 2], "op": ["a"] * 3, "busbw_gbs": [1.0, 2.0, 3.0]})
    assert charts.custom_defaults(per_step)[:3] == ("line", "step", "busbw_gbs")
    runs = pd.DataFrame({"run_id": ["a", "b"], "name": ["x", "y"], "world_size": [2, 4]})
    assert charts.custom_defaults(runs)[1] == "run_id"  # several runs: the run id is the label
