"""The shipped sample_runs/ data dir, as committed (`make sample-runs` regenerates it;
these tests only read it): it opens through collector.data.catalog.connect from any cwd
and from a copy elsewhere, holds nothing a reader does not need, and each scenario
run of trainer.examples.scenarios shows what it was made to show. Assertions are on
properties of the runs, not exact numbers, so they hold after any regeneration.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_sample_runs.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from collector.data import catalog, layout

SAMPLE_RUNS = Path(__file__).resolve().parents[3] / "sample_runs"
# How each run ended: the hang run was killed once its hang was recorded, so no rank ended it.
STATUS = {
    "zero2-hang-rank2": "running",
    "zero2-slow-rank3": "finished",
    "zero3-fp16-overflows": "finished",
    "moe-skewed-expert": "finished",
    "simulated-256-ranks": "finished",
}
RUN_NAMES = tuple(STATUS)
ENGINE_RUNS = tuple(name for name in RUN_NAMES if not name.startswith("simulated"))
MAX_BYTES = 5_000_000

pytestmark = pytest.mark.skipif(
    not (SAMPLE_RUNS / layout.CATALOG_FILE).exists(), reason="sample_runs/ not generated (make sample-runs)"
)


@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> Path:
    """A copy somewhere else: the catalog's relative paths must follow the data."""
    dest = tmp_path_factory.mktemp("elsewhere") / "copied_runs"
    shutil.copytree(SAMPLE_RUNS, dest)
    return dest


@pytest.fixture(scope="module")
def q(copied):
    con = catalog.connect(copied)
    yield lambda sql, params=(): con.execute(sql, params).fetchall()
    con.close()


def _run_id(q, name: str) -> str:
    rows = q("SELECT run_id FROM runs WHERE name = ?", [name])
    assert len(rows) == 1, f"expected one run named {name!r} in sample_runs, got {len(rows)}"
    return rows[0][0]


@pytest.mark.parametrize("where", ["in place", "copy"])
def test_opens_from_another_cwd_with_every_run_as_it_ended(where, copied, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data_dir = SAMPLE_RUNS if where == "in place" else copied
    con = catalog.connect(data_dir)
    try:
        runs = dict(con.execute("SELECT name, status FROM runs").fetchall())
        per_rank = con.execute("SELECT count(*) FROM comm").fetchone()[0]
    finally:
        con.close()
    assert runs == STATUS
    assert per_rank > 0


def test_views_read_parquet_by_relative_paths():
    con = catalog.connect(SAMPLE_RUNS)
    try:
        sqls = [s for (s,) in con.execute("SELECT sql FROM duckdb_views() WHERE NOT internal").fetchall()]
    finally:
        con.close()
    scans = [s for s in sqls if "read_parquet" in s]
    # the pinned snapshot's files (relative to D too), or without one the partition folders
    assert scans and all(f"('{layout.PARQUET_DIR}/" in s and "getvariable('rankscope_segments')" in s for s in scans)


def test_holds_only_what_readers_need_and_is_small():
    files = [p for p in SAMPLE_RUNS.rglob("*") if p.is_file()]
    assert not (SAMPLE_RUNS / layout.LEDGER_DIR).exists()
    assert not [p for p in files if p.name.startswith(".") or p.suffix in (layout.TEMP_SUFFIX, ".wal", ".lock")]
    assert sum(p.stat().st_size for p in files) < MAX_BYTES


def test_every_committed_column_has_the_type_the_schema_declares_today():
    """Not stale: a changed column type (the ns -> µs timestamps) means `make sample-runs`
    (or re-running its compact() over sample_runs/ alone) is due; added columns may be absent."""
    for table, schema in layout.stored_schemas().items():
        for path in layout.table_dir(SAMPLE_RUNS, table).rglob(f"*{layout.SEGMENT_SUFFIX}"):
            stale = {f.name: str(f.type) for f in pq.read_schema(path) if f.type != schema.field(f.name).type}
            assert not stale, f"{path.relative_to(SAMPLE_RUNS)}: {stale} (want {schema})"


def test_every_rank_of_every_run_streamed_its_records(q):
    for name in RUN_NAMES:
        run = _run_id(q, name)
        world = q("SELECT world_size FROM runs WHERE run_id = ?", [run])[0][0]
        ranks = {r for (r,) in q("SELECT DISTINCT rank FROM comm WHERE run_id = ?", [run])}
        assert ranks == set(range(world)), name


def test_the_stragglers_view_names_rank_3_at_the_gradient_reductions(q):
    """Rank 3 sleeps before each forward, so it launches every gradient reduce_scatter last."""
    run = _run_id(q, "zero2-slow-rank3")
    last = q(
        """
        SELECT s.last_rank, count(*) AS n FROM stragglers s JOIN comm c USING (run_id, group_name, seq)
        WHERE s.run_id = ? AND c.rank = 0 AND c.log_name = 'zero2.reduce_scatter_grads'
        GROUP BY ALL ORDER BY n DESC""",
        [run],
    )
    assert last, "no gradient reductions recorded"
    assert last[0][0] == 3, last
    assert last[0][1] > 0.5 * sum(n for _, n in last), last  # most of them, not just the plurality


def test_every_engine_run_carries_a_flops_profile(q):
    """The FLOPS page has something to show whichever engine run is open (the newest included)."""
    for name in ENGINE_RUNS:
        run = _run_id(q, name)
        assert q("SELECT count(*) FROM flops WHERE run_id = ?", [run])[0][0] > 0, name


def test_the_hang_run_still_shows_rank_2_missing_and_its_stack():
    """Killed while hung: the in-flight table keeps ranks 0, 1 and 3 waiting in step 20's first
    gradient reduction, rank 2 missing from it, and rank 2's stack in the scenario's stall."""
    from collector.data import queries

    cat = queries.Catalog(SAMPLE_RUNS)
    try:
        run = queries.resolve_run(cat.cursor(), "zero2-hang-rank2")
        hangs = queries.hangs(cat, run)
        stacks = queries.stacks(cat, run, [2])
    finally:
        cat.close()
    assert len(hangs) == 1, hangs
    row = hangs.iloc[0]
    assert list(row.waiting_ranks) == [0, 1, 3] and list(row.missing_ranks) == [2]
    assert row.step == 20 and row.waiting_s >= row.hang_after_s
    main = stacks[stacks.is_main]
    assert len(main) == 1 and "wait_for_a_batch_that_never_comes" in main.iloc[0].stack


def test_the_simulated_run_has_many_ranks_and_one_late(q):
    run = _run_id(q, "simulated-256-ranks")
    assert q("SELECT world_size FROM runs WHERE run_id = ?", [run])[0][0] == 256
    last = q(
        "SELECT last_rank, count(*) AS n FROM stragglers WHERE run_id = ? GROUP BY ALL ORDER BY n DESC LIMIT 1", [run]
    )
    assert last[0][0] == 117, last


def test_fp16_run_overflows_and_the_scale_backs_off(q):
    run = _run_id(q, "zero3-fp16-overflows")
    rows = q(
        """SELECT step, scale_before, scale, overflow FROM loss_scale
                WHERE run_id = ? AND rank = 0 ORDER BY step""",
        [run],
    )
    overflows = [r for r in rows if r[3]]
    assert overflows, "no overflow recorded"
    assert all(after <= before for _, before, after, _ in overflows)
    assert any(after < before for _, before, after, _ in overflows), "the scale never backed off"
    assert rows[-1][2] < rows[0][1], "the scale did not end below where it started"
    # every rank agrees on every step's decision (the overflow vote is an all_reduce)
    disagree = q(
        """SELECT step FROM loss_scale WHERE run_id = ?
                    GROUP BY step HAVING count(DISTINCT overflow) > 1 OR count(DISTINCT scale) > 1""",
        [run],
    )
    assert disagree == []


def test_moe_run_favours_one_expert_and_drops_tokens(q):
    run = _run_id(q, "moe-skewed-expert")
    per_expert = q(
        """SELECT layer, expert, sum(tokens) AS tokens, sum(dropped) AS dropped FROM moe
                      WHERE run_id = ? GROUP BY ALL ORDER BY layer, expert""",
        [run],
    )
    assert per_expert, "no moe rows"
    for layer in {r[0] for r in per_expert}:
        tokens = {e: t for lay, e, t, _ in per_expert if lay == layer}
        top = max(tokens, key=tokens.get)
        assert tokens[top] > 1.5 * max(t for e, t in tokens.items() if e != top), (layer, tokens)
    assert sum(d for *_, d in per_expert) > 0
