"""Binning and top-k (collector/data/binning.py) on hand-made frames: a chart never gets more
rows than it can show, the straggler stays visible in its bin, ties are stable."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.data import binning


def ranks(n: int, per_host: int = 8) -> pd.DataFrame:
    return pd.DataFrame({"rank": range(n), "host": [f"node-{r // per_host:04d}" for r in range(n)]})


def grid(n: int, steps: int, late: dict[int, float] | None = None, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    r, s = np.meshgrid(np.arange(n), np.arange(steps), indexing="ij")
    value = rng.uniform(0, 0.3, r.shape)
    for rank, ms in (late or {}).items():
        value[rank] += ms
    return pd.DataFrame({"rank": r.ravel(), "step": s.ravel(), "delay": value.ravel()})


def test_one_bin_per_rank_while_they_fit_grouped_by_host():
    bins = binning.bin_ranks(pd.DataFrame({"rank": [0, 1, 2, 3], "host": ["b", "a", "b", "a"]}))
    assert list(bins.label) == ["a · rank 1", "a · rank 3", "b · rank 0", "b · rank 2"]
    assert set(bins.kind) == {"rank"} and bins.bin.is_unique
    one_host = binning.bin_ranks(pd.DataFrame({"rank": [2, 0, 1], "host": ["x"] * 3}))
    assert list(one_host.label) == ["rank 0", "rank 1", "rank 2"]


def test_by_host_when_hosts_fit():
    bins = binning.bin_ranks(ranks(1024, per_host=16))  # 64 hosts
    assert bins.bin.nunique() == 64 and set(bins.kind) == {"host"}
    assert bins.set_index("rank").label[517] == "node-0032 (ranks 512–527)"


@pytest.mark.parametrize("n", [1024, 8192, 1000])
def test_by_rank_range_when_hosts_do_not_fit(n):
    bins = binning.bin_ranks(ranks(n), max_rows=binning.MAX_ROWS)  # n / 8 hosts > 64
    assert bins.bin.nunique() <= binning.MAX_ROWS and set(bins.kind) == {"range"}
    assert len(bins) == n and bins.groupby("bin")["rank"].apply(lambda r: r.max() - r.min() + 1 == len(r)).all()
    assert bins.label.iloc[0].startswith("ranks 0–")


def test_binned_grid_keeps_the_straggler_on_top_and_orders_worst_first():
    g = grid(1024, 50, late={517: 40.0})
    bins = binning.bin_ranks(ranks(1024))
    out = binning.bin_grid(g, bins, "delay")
    assert out.label.nunique() <= binning.MAX_ROWS
    assert len(out) == out.label.nunique() * 50
    top = out[out.order == 0]
    assert (top.worst_rank == 517).all() and (top["max"] > 40).all()
    assert top.label.iloc[0] == bins.set_index("rank").label[517]
    # one late rank of 16 does not move the bin's p95 the way a slow host would
    assert (top.p95 < 40).all()
    assert out.groupby("order")["max"].max().is_monotonic_decreasing


def test_binned_grid_max_and_p95_match_numpy():
    g = grid(200, 3, seed=3)
    bins = binning.bin_ranks(ranks(200), max_rows=10)
    out = binning.bin_grid(g, bins, "delay")
    for (b, step), cell in out.set_index(["bin", "step"]).iterrows():
        members = g[g["rank"].isin(bins[bins.bin == b]["rank"]) & (g.step == step)].delay
        assert cell["max"] == members.max()
        assert cell["p95"] == pytest.approx(np.quantile(members, 0.95))
        assert cell["ranks"] == len(members)


def test_top_k_names_the_worst_and_summarises_the_rest():
    per_rank = pd.DataFrame({"rank": range(1024), "wait_ms": np.r_[np.ones(1020), [9, 7, 7, 5]]})
    out = binning.top_k(per_rank, "wait_ms", k=3)
    assert list(out.label) == ["rank 1020", "rank 1021", "rank 1022", "median of the other 1021 ranks"]
    assert out.wait_ms.iloc[-1] == 1.0
    assert list(binning.top_k(per_rank.head(2), "wait_ms", k=3).label) == ["rank 0", "rank 1"]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="max_rows"):
        binning.bin_ranks(ranks(4), max_rows=0)
    with pytest.raises(ValueError, match="k must be"):
        binning.top_k(pd.DataFrame({"rank": [0], "x": [1]}), "x", k=0)


def test_steps_are_binned_beyond_max_steps():
    g = grid(32, 500, late={7: 10.0})
    g.loc[(g["rank"] == 3) & (g.step == 333), "delay"] = 99.0
    out = binning.bin_grid(g, binning.bin_ranks(ranks(32)), "delay", max_steps=200)
    assert binning.step_width(g.step, 200) == 3
    assert out.step.nunique() == 167 and set(out.step) == set(range(0, 500, 3))
    spike = out[(out.step == 333) & (out.worst_rank == 3)]
    assert len(spike) == 1 and spike["max"].iloc[0] == 99.0
    assert (out.groupby("step").size() == 32).all()


@pytest.fixture(scope="module")
def simulated_rollup(tmp_path_factory):
    """A real comm rollup: a simulated 96-rank run (12 hosts) of 40 steps, rank 41 late from step 10."""
    from collector.data import queries
    from collector.tools import simulate

    data_dir = tmp_path_factory.mktemp("binned-sql")
    sim = simulate.Simulation(ranks=96, steps=40, stragglers=(simulate.Straggler(41, 20_000_000, 10),), name="b")
    simulate.write_data_dir(sim, data_dir)
    cat = queries.Catalog(data_dir)
    try:
        yield queries.comm_rollup(cat, sim.run_id), queries.ranks(cat, sim.run_id)
    finally:
        cat.close()


@pytest.mark.parametrize("max_rows", [16, 5])  # by host (12 hosts), by rank range
@pytest.mark.parametrize("max_steps", [200, 7])  # a column per step, per range of 6 steps
@pytest.mark.parametrize("value", ["arrival_delay_ms", "wait_ms"])
def test_the_sql_binning_matches_the_pure_one(simulated_rollup, max_rows, max_steps, value):
    """queries.binned_delay (what the Stragglers page draws at scale) gives bin_grid's cells."""
    from collector.data import queries

    rollup, rank_frame = simulated_rollup
    flt = queries.CommFilter()
    bins = binning.bin_ranks(rank_frame, max_rows=max_rows)
    assert bins.kind.iloc[0] == ("host" if max_rows == 16 else "range")
    want = binning.bin_grid(queries.delay_heatmap(rollup, flt), bins, value, max_steps=max_steps)
    got = queries.binned_delay(rollup, flt, bins, value, max_steps=max_steps)
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(
        got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False, rtol=1e-9, atol=1e-12
    )
    if value == "arrival_delay_ms":
        worst = got[got.order == 0]
        # the straggler's bin comes first: 20 ms late at one collective of 7 is ~2.9 ms a step on
        # average, against ~0.2 ms of jitter on the others
        assert 41 in set(worst.worst_rank) and worst["max"].max() > 2


def test_the_sql_binning_names_a_value_it_does_not_know():
    from collector.data import queries

    with pytest.raises(ValueError, match="value must be one of"):
        queries.binned_delay(None, queries.CommFilter(), binning.bin_ranks(ranks(4)), "step")


def test_a_click_on_a_bin_cell_or_on_a_row_s_handle_points_at_a_rank_and_step():
    binned = binning.bin_grid(grid(1024, 10, late={517: 40.0}), binning.bin_ranks(ranks(1024, per_host=16)), "delay")
    label = binned[binned.worst_rank == 517].label.iloc[0]
    assert binning.cell_at(binned, label, 4) == (517, 4)  # the cell: its worst rank
    other = binned[binned.label != label].label.iloc[0]
    worst = binned[binned.label == other].nlargest(1, "max")
    assert binning.cell_at(binned, other, 10) == (int(worst.worst_rank.iloc[0]), int(worst.step.iloc[0]))
    assert binning.cell_at(binned, "no such bin", 4) is None


def test_a_large_binned_heatmap_is_clickable_by_row_handles_not_a_marker_per_cell():
    from app import charts

    bins = binning.bin_ranks(ranks(1024, per_host=16))  # 64 hosts
    small = binning.bin_grid(grid(1024, 10), bins, "delay")
    (markers,) = charts.binned_heatmap(small, "t", clickable=True).data[1:]
    assert len(markers.x) == 640 and markers.marker.opacity == 0  # one per cell
    large = binning.bin_grid(grid(1024, 300), bins, "delay")
    assert large.label.nunique() * large.step.nunique() > charts.MAX_CLICK_CELLS
    (handles,) = charts.binned_heatmap(large, "t", clickable=True).data[1:]
    steps = sorted(large.step.unique())  # binned by 2: 0, 2, ..., 298; the handles one column past
    assert len(handles.x) == large.label.nunique() and set(handles.x) == {steps[-1] + steps[-1] - steps[-2]}
    assert list(handles.y) == large.drop_duplicates("order").sort_values("order").label.tolist()
    assert binning.cell_at(large, handles.y[0], handles.x[0]) is not None
    assert len(charts.binned_heatmap(large, "t").data) == 1  # not clickable: no markers
