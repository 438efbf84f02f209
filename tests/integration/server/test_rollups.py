"""Rollups as steps settle (every collector, no retention asked for): a simulated run streamed into
a live collector gets its per-step comm rollup and step analysis stored by compaction, keeps every
raw record, and answers the health queries exactly as the same run computed from raw records only.
A run that is still going (one rank hung) has its settled steps stored and the rest computed.

Split by tier: the pure-function tests are in tests/unit/server/test_rollups.py."""

from __future__ import annotations

import pandas as pd
import pyarrow.compute as pc
import pytest

from collector.data import catalog, findings, queries
from collector.server.compaction import CompactionConfig
from collector.testing import fake_runs
from collector.testing.collectors import live_collector
from collector.tools import simulate
from collector.tools.importers.sink import GrpcSink

DONE = simulate.Simulation(
    ranks=16, steps=40, stragglers=(simulate.Straggler(5, 30_000_000, 20),), run_id="rolled", seed=1
)
HUNG = simulate.Simulation(ranks=8, steps=40, hang=simulate.Hang(3, 30), run_id="hung", seed=2)
ROLLUPS = CompactionConfig(interval=3600, retention_window=10)  # passes: compact_until
SPLIT_RANK, SPLIT_SEQ, SPLIT_STEPS = 2, 17, 10  # the desync run: rank 2 enters seq 17 with another size


LAGGING = fake_runs.FakeRun(run_id="lagging", world_size=4, steps=60, collectives_per_step=10, status="running")
TIMERS_THROUGH = 20  # rank 1's timers have only arrived up to this step


def lagging_timers_run() -> list[list]:
    """A live run whose rank 1 has sent its collectives up to step 59 but its timers only to step 20."""
    per_rank = []
    for rank in range(LAGGING.world_size):
        client = LAGGING.client_id(rank)
        out = [fake_runs.envelope(client, 1, hello=LAGGING.hello(rank))]
        tables = [("comm", LAGGING.comm_arrow(rank, first, n)) for first, n in LAGGING.comm_chunks(50)]
        others = LAGGING.other_tables(rank)
        if rank == 1:
            others["timers"] = others["timers"].filter(pc.less_equal(others["timers"]["step"], TIMERS_THROUGH))
        for table, rows in [*tables, *others.items()]:
            for batch in fake_runs.table_batches(table, LAGGING.run_id, rank, rows):
                out.append(fake_runs.envelope(client, len(out) + 1, table=batch))
        per_rank.append(out)
    return per_rank


def desync_run() -> list[list]:
    """4 ranks, 3 all_reduces a step for 10 steps; rank 2 enters seq 17 (step 5) with one element more."""
    per_rank = []
    for rank in range(4):
        client = f"desync-{rank}"
        cols = fake_runs.comm_columns(rank, 0, 3 * SPLIT_STEPS, group_size=4)
        cols["step"] = cols["seq"] // 3
        if rank == SPLIT_RANK:
            cols["numel"][SPLIT_SEQ] += 1
        per_rank.append(
            [
                fake_runs.hello(client, 1, "desync", rank, 4),
                fake_runs.envelope(client, 2, table=fake_runs.encode_batch("comm", "desync", rank, cols)),
                fake_runs.run_end(client, 3, "desync", rank),
            ]
        )
    return per_rank


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    simulate.write_data_dir(DONE, raw, rollups=False)
    simulate.write_data_dir(HUNG, raw, rollups=False)
    live = tmp_path_factory.mktemp("live") / "data"
    with live_collector(live, compaction_config=ROLLUPS) as collector:
        simulate.stream(DONE, collector.endpoint, streams=DONE.ranks)
        simulate.stream(HUNG, collector.endpoint, streams=HUNG.ranks)
        with GrpcSink(collector.endpoint) as sink:
            sink.send(desync_run())
            sink.send(lagging_timers_run())
        retention = collector.state.compactor.retention
        collector.compact_until(
            lambda: (
                retention._analysed_through(DONE.run_id) >= DONE.steps - 1
                and retention._analysed_through(HUNG.run_id) >= 0
                and retention._analysed_through("desync") >= SPLIT_STEPS - 1
                and retention._analysed_through(LAGGING.run_id) >= 0
            ),
            "the step analysis of every run",
        )
    catalog.ensure_catalog(live)
    return raw, live


def query(d, fn, *args, **kwargs):
    cat = queries.Catalog(d)
    try:
        return fn(cat, *args, **kwargs)
    finally:
        cat.close()


def stored_steps(d, run_id: str) -> tuple[int, int, int]:
    return query(
        d,
        lambda cat: cat.con.execute(
            "SELECT count(DISTINCT step), max(step), count(*) FROM step_analysis WHERE run_id = ?", [run_id]
        ).fetchone(),
    )


def sorted_frame(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values(["step", "rank"]).reset_index(drop=True)
    return frame.astype({"rank": "int64", "step": "int64"})


def test_settled_steps_are_stored_and_no_raw_record_is_dropped(dirs):
    raw, live = dirs
    assert stored_steps(live, DONE.run_id) == (DONE.steps, DONE.steps - 1, DONE.steps * DONE.ranks)
    count = "SELECT count(*) FROM comm WHERE run_id = ?"
    assert query(live, lambda cat: cat.con.execute(count, [DONE.run_id]).fetchone()) == query(
        raw, lambda cat: cat.con.execute(count, [DONE.run_id]).fetchone()
    )
    assert query(live, queries.retention, DONE.run_id) is None  # rolled up, nothing thinned out


def test_stored_analysis_is_what_the_raw_records_give(dirs):
    raw, live = dirs
    stored = sorted_frame(query(live, queries.step_analysis, DONE.run_id))
    from_raw = sorted_frame(query(raw, queries.analyse_steps, DONE.run_id))
    pd.testing.assert_frame_equal(stored, from_raw, check_exact=False, rtol=1e-9)
    late = stored[(stored["rank"] == 5) & (stored.step >= 20)]
    assert late.imposed_ms.median() > 20  # the straggler's cost is in it


def test_a_running_run_reads_its_settled_steps_stored_and_computes_the_rest(dirs):
    raw, live = dirs
    n, through, _ = stored_steps(live, HUNG.run_id)
    assert 0 < n and through < HUNG.hang.step  # nothing past the hung rank's last step is settled
    mixed = sorted_frame(query(live, queries.step_analysis, HUNG.run_id))
    from_raw = sorted_frame(query(raw, queries.analyse_steps, HUNG.run_id))
    assert mixed.step.max() > through
    pd.testing.assert_frame_equal(mixed, from_raw, check_exact=False, rtol=1e-9)


def test_health_says_the_same_from_rollups_as_from_raw_records(dirs):
    raw, live = dirs
    said = [[(f.kind, f.ranks, f.text) for f in query(d, findings.for_run, DONE.run_id)] for d in (raw, live)]
    assert said[0] == said[1]
    assert any(f[0] == "straggler" and f[1] == (5,) for f in said[0])


def test_a_desync_is_found_from_the_instances_compaction_could_not_settle(dirs):
    _, live = dirs
    unsettled = query(
        live, lambda cat: cat.df("SELECT rank, seq FROM unsettled_instances WHERE run_id = ? ORDER BY rank", ["desync"])
    )
    assert unsettled.values.tolist() == [[r, SPLIT_SEQ] for r in range(4)]  # that instance only
    found = query(live, queries.desyncs, "desync")
    everything = query(
        live,
        lambda cat: cat.df("SELECT group_name, seq, sides, n_sides FROM desyncs WHERE run_id = ?", ["desync"]),
    )
    assert found.seq.tolist() == everything.seq.tolist() == [SPLIT_SEQ]
    assert [list(side["ranks"]) for side in found.sides.iloc[0]] == [[0, 1, 3], [SPLIT_RANK]]
    assert query(live, queries.desyncs, DONE.run_id).empty


def test_a_step_is_not_stored_before_every_ranks_timers_of_it(dirs):
    """Rank 1's collectives reached step 59, its timers step 20: steps after 20 stay unsettled (the
    analysis of a step without a rank's timers would be stored wrong for good), and are computed."""
    _, live = dirs
    _, through, _ = stored_steps(live, LAGGING.run_id)
    assert through == TIMERS_THROUGH
    analysis = query(live, queries.step_analysis, LAGGING.run_id)
    # the steps after it are computed from what has arrived: every rank's, and rank 1's up to its timers
    assert analysis.step.max() == LAGGING.steps - 1
    assert analysis[analysis["rank"] == 1].step.max() == TIMERS_THROUGH


def test_a_backlog_is_rolled_up_in_windows_of_bounded_rows(dirs, tmp_path):
    """Rows of a whole run waiting at once (a collector that fell behind, or a data dir written
    without one) are read a window of at most ``max_window_rows`` at a time, and store exactly
    what one big window would have."""
    from collector.server.compaction import Compactor
    from collector.server.store import Store

    raw, _ = dirs
    count = "SELECT count(*) FROM comm WHERE run_id = ?"
    rows_per_step = query(raw, lambda cat: cat.con.execute(count, [DONE.run_id]).fetchone()[0]) // DONE.steps
    backlog = tmp_path / "backlog"
    simulate.write_data_dir(DONE, backlog, rollups=False)
    store = Store(backlog)
    try:
        compactor = Compactor(backlog, store.ledger, CompactionConfig(max_window_rows=5 * rows_per_step))
        compactor.catch_up()
    finally:
        store.close()
    assert compactor.retention.windows >= DONE.steps // 5  # five steps' rows a window at most
    assert stored_steps(backlog, DONE.run_id) == (DONE.steps, DONE.steps - 1, DONE.steps * DONE.ranks)
    stored = sorted_frame(query(backlog, queries.step_analysis, DONE.run_id))
    from_raw = sorted_frame(query(raw, queries.analyse_steps, DONE.run_id))
    pd.testing.assert_frame_equal(stored, from_raw, check_exact=False, rtol=1e-9)
    rollup = "SELECT * FROM comm_steps WHERE run_id = ? ORDER BY ALL"
    assert query(backlog, lambda cat: cat.df(rollup, [DONE.run_id])).equals(
        query(_whole_window(tmp_path), lambda cat: cat.df(rollup, [DONE.run_id]))
    )


def _whole_window(tmp_path):
    """DONE rolled up as one window (the default bound is far above its rows)."""
    whole = tmp_path / "whole"
    simulate.write_data_dir(DONE, whole)
    return whole
