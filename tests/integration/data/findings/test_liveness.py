"""The hang, desync and silent-rank rules as pure functions of their query results (fire on the
fault, silent on healthy frames, one line each at 1,024 ranks), and the catalog views that feed
them over a 1,024-rank stuck run written by the testing kit.

Split by tier: the pure-function tests are in tests/unit/data/findings/test_liveness.py."""

from __future__ import annotations

import time

from collector.data import findings, queries
from collector.testing.fake_runs import FakeRun, write_run
from collector.testing.liveness import write_hang


def test_the_views_find_a_1024_rank_hang_and_nothing_in_a_healthy_run(tmp_path):
    run = FakeRun(run_id="big-stuck", world_size=1024, steps=2, status="running", with_moe=False)
    seq = write_hang(tmp_path / "d", run, stuck_rank=700)
    cat = queries.Catalog(tmp_path / "d")
    try:
        started = time.perf_counter()
        hangs = queries.hangs(cat, run.run_id)
        found = findings.liveness_findings(
            hangs, queries.desyncs(cat, run.run_id), queries.rank_liveness(cat, run.run_id)
        )
        wave = queries.wavefront(cat, run.run_id)
        elapsed = time.perf_counter() - started
    finally:
        cat.close()
    [row] = hangs.itertuples(index=False)
    assert (row.group_name, row.seq, list(row.missing_ranks)) == ("world", seq, [700])
    assert len(row.waiting_ranks) == 1023
    critical = [f for f in found if f.severity == "critical"]
    assert [f.kind for f in critical] == ["hang"] and findings.exit_code(found) == 2
    assert len(wave) <= queries.WAVEFRONT_MAX_ROWS and wave.groupby("group_name").ranks.sum().eq(1024).all()
    print(f"1,024-rank liveness queries: {elapsed:.2f} s")

    write_run(tmp_path / "h", FakeRun(run_id="healthy", steps=2, with_moe=False))
    cat = queries.Catalog(tmp_path / "h")
    try:
        assert queries.hangs(cat, "healthy").empty and queries.desyncs(cat, "healthy").empty
        assert not [f for f in findings.for_run(cat, "healthy") if f.severity == "critical"]
    finally:
        cat.close()
