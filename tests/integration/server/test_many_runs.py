"""Many runs (issue 28, item 9): 10,000 Hello-only runs were 20,000+ segment files, a ``runs``
query read a footer per file, and every pass of an idle collector walked a folder per run.

The collector tables' rows (runs, ranks, rank_ends, rank_events) are folded by compaction into one
shared partition per table: these tests check that 1,000 runs become O(1) files read by the
``runs`` and ``ranks`` views, that readers keep their snapshot across the fold, and that what
read those rows from a run's own folder (the store's known runs, rollups, archives) reads them
from the shared one too. The idle collector's liveness and /metrics work stay bounded.

Split by tier: the pure-function tests are in tests/unit/server/test_many_runs.py."""

from __future__ import annotations

from collector.data import catalog, layout
from collector.server.compaction import CompactionConfig, Compactor
from tests.unit.server.test_many_runs import RUNS, _count, _files, _hello_only_runs


def test_a_thousand_hello_only_runs_fold_into_a_few_files_that_the_views_read(tmp_path):
    store = _hello_only_runs(tmp_path)
    try:
        assert len(_files(tmp_path, "runs")) == RUNS and len(_files(tmp_path, "ranks")) == RUNS
        before = catalog.connect(tmp_path)  # pinned to the commit before the fold
        compactor = Compactor(tmp_path, store.ledger, CompactionConfig())
        compactor.run_once()
        for table in ("runs", "ranks", "rank_ends"):
            files = _files(tmp_path, table)
            assert len(files) == 1, (table, len(files))
            assert files[0].parent.name == layout.SHARED_PARTITION
        # the emptied run folders are gone: the next passes walk a few folders, not one per run
        assert [p.name for p in layout.partitions(tmp_path, "runs")] == [layout.SHARED_PARTITION]

        con = catalog.connect(tmp_path)
        try:
            pinned = con.execute(f"SELECT getvariable('{catalog.SEGMENTS_VARIABLE}')").fetchone()[0]
            for table in ("runs", "ranks", "rank_ends"):  # what a `runs` query opens: the placeholder + 1
                assert len(pinned[table].split("\n")) == 2, pinned[table]
            assert _count(con, "SELECT count(*) FROM runs") == RUNS
            assert _count(con, "SELECT count(*) FROM ranks") == RUNS
            assert _count(con, "SELECT count(*) FROM runs WHERE status = 'finished'") == RUNS // 2
            assert _count(con, "SELECT count(*) FROM runs WHERE n_ranks = 1") == RUNS
        finally:
            con.close()
        # a reader that pinned the commit before the fold still reads it whole
        assert _count(before, "SELECT count(*) FROM runs") == RUNS
        assert _count(before, "SELECT count(*) FROM runs WHERE status = 'finished'") == RUNS // 2
        before.close()
        guarded = catalog.run_readonly_query(tmp_path, "SELECT count(*) FROM ranks")
        assert guarded.column(0)[0].as_py() == RUNS
    finally:
        store.close()
