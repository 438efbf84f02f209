"""The live dashboard's cheap refresh: a live run's comm rollup grows by its new steps only
(app.queries._Rollups over collector.data.queries.comm_rollup_after) and still equals the
rollup of the whole run; a table's version moves only when that table gets a segment."""

from __future__ import annotations

import shutil

import pyarrow as pa

from app import queries as app_queries
from collector.data import layout
from collector.data import queries as q
from collector.testing.fake_runs import FakeRun, write_data_dir

RUN = FakeRun(run_id="growing", world_size=4, steps=40, status="running", with_moe=False)


def _sorted(table: pa.Table) -> list[dict]:
    keys = ["rank", "step", "group_name", "op", "bytes"]
    return table.sort_by([(k, "ascending") for k in keys]).to_pylist()


def test_the_rollup_after_a_step_completes_the_rollup_up_to_it(tmp_path):
    write_data_dir(tmp_path, RUN, steps_per_segment=10)
    cat = q.Catalog(tmp_path)
    try:
        whole = q.comm_rollup(cat, RUN.run_id)
        for step in (-1, 9, 23, 39):
            before = whole.filter(pa.compute.less_equal(whole["step"], step))
            after = q.comm_rollup_after(cat, RUN.run_id, step)
            assert after.num_rows == 0 or min(after["step"].to_pylist()) > step
            assert _sorted(pa.concat_tables([before, after.cast(whole.schema)])) == _sorted(whole)
    finally:
        cat.close()


def test_a_growing_run_is_rolled_up_incrementally_and_equals_the_whole(tmp_path):
    full = write_data_dir(tmp_path / "full", RUN, steps_per_segment=10)
    grow = tmp_path / "grow"
    shutil.copytree(full, grow)
    comm = layout.partition_dir(grow, "comm", RUN.run_id)
    first_segment = "-000000000" + layout.SEGMENT_SUFFIX  # each rank's steps 0-9 (write_run's names)
    later = sorted(
        p for p in comm.iterdir() if p.name.endswith(layout.SEGMENT_SUFFIX) and not p.name.endswith(first_segment)
    )
    held = tmp_path / "held"
    held.mkdir()
    for path in later:  # the first segment of each rank (steps 0-9) is there; the rest lands later
        shutil.move(path, held / path.name)

    rollups = app_queries._Rollups()
    cat = q.Catalog(full)
    try:
        whole = q.comm_rollup(cat, RUN.run_id)
    finally:
        cat.close()
    first = rollups.rollup(str(grow), RUN.run_id)
    assert set(first["step"].to_pylist()) == set(range(10))
    (frozen, through) = rollups._frozen[(str(grow), RUN.run_id)]
    assert through == 9 - rollups.MARGIN_STEPS and set(frozen["step"].to_pylist()) == set(range(through + 1))

    for path in held.iterdir():
        shutil.move(path, comm / path.name)
    grown = rollups.rollup(str(grow), RUN.run_id)
    assert _sorted(grown) == _sorted(whole)
    assert rollups._frozen[(str(grow), RUN.run_id)][1] == 39 - rollups.MARGIN_STEPS


def test_a_table_version_moves_only_with_that_table(tmp_path):
    write_data_dir(tmp_path, RUN, steps_per_segment=10)
    d = str(tmp_path)
    monitor, comm = (
        app_queries.table_version(d, RUN.run_id, ("monitor",)),
        app_queries.table_version(d, RUN.run_id, ("comm",)),
    )
    part = layout.partition_dir(tmp_path, "comm", RUN.run_id)
    src = next(p for p in part.iterdir() if p.name.endswith(layout.SEGMENT_SUFFIX))
    shutil.copy(src, part / ("zz-new" + layout.SEGMENT_SUFFIX))
    assert app_queries.table_version(d, RUN.run_id, ("monitor",)) == monitor
    assert app_queries.table_version(d, RUN.run_id, ("comm",)) != comm
    assert app_queries.table_version(d, RUN.run_id, ("monitor", "comm")) != app_queries.table_version(
        d, RUN.run_id, ("monitor",)
    )


def test_a_long_runs_clickable_heatmap_has_a_handle_per_row_not_a_marker_per_cell():
    import pandas as pd

    from app import charts

    def grid(steps: int) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"rank": r, "step": s, "arrival_delay_ms": float(r), "wait_ms": 0.0}
                for r in range(4)
                for s in range(steps)
            ]
        )

    small = charts.heatmap(grid(100), "arrival_delay_ms", "t", clickable=True)
    assert len(small.data[1].x) == 400  # a marker per cell: a click names (step, rank)
    big = charts.heatmap(grid(1000), "arrival_delay_ms", "t", clickable=True)
    assert list(big.data[1].x) == [1000] * 4  # one handle per row, one column past the last step
