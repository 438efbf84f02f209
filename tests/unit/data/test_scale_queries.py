"""The page queries that aggregate per rank in SQL so a page gets a few rows, not one per
rank-step: checked against pandas over the raw rows of a simulated 40-rank run."""

from __future__ import annotations

import numpy as np
import pytest

from collector.data import queries
from collector.tools import simulate

SIM = simulate.Simulation(ranks=40, steps=12, stragglers=(simulate.Straggler(7, 30_000_000),), run_id="agg")


@pytest.fixture(scope="module")
def cat(tmp_path_factory):
    d = tmp_path_factory.mktemp("agg")
    simulate.write_data_dir(SIM, d)
    cat = queries.Catalog(d)
    yield cat
    cat.close()


def test_memory_lines_top_k_median_and_max(cat):
    raw = SIM.block(0, SIM.ranks)["memory"].to_pandas()
    lines = queries.memory_lines(cat, SIM.run_id, 3)
    for kind, rows in raw.groupby("kind"):
        got = lines[lines.kind == kind]
        peaks = rows.groupby("rank").bytes.max().sort_values(ascending=False, kind="stable")
        top = {f"rank {r}" for r in peaks.index[:3]}
        assert set(got.series) == top | {"median of 40 ranks", "max of 40 ranks"}
        median = got[got.series == "median of 40 ranks"].set_index("step").bytes
        np.testing.assert_allclose(median, rows.groupby("step").bytes.median())
        assert (got[got.series == "max of 40 ranks"].set_index("step").bytes == rows.groupby("step").bytes.max()).all()
    few = queries.memory_lines(cat, SIM.run_id, 40)
    assert few.series.nunique() == 40 and not few.series.str.startswith("median").any()


def test_step_breakdown_is_the_mean_per_rank_and_timer(cat):
    raw = SIM.block(0, SIM.ranks)["timers"].to_pandas()
    got = queries.step_breakdown(cat, SIM.run_id).set_index(["rank", "name"]).dur_ms
    want = raw.groupby(["rank", "name"]).dur_ns.mean() / 1e6
    np.testing.assert_allclose(got.sort_index(), want.sort_index())
    slowest = got.groupby(level="rank").sum().idxmax()
    assert slowest == 7  # the straggler's forward pass
