"""collector.testing.fake_runs: the story a fake run tells is really in the data (read
back through the catalog), both ways out give the same rows, a run's values do not
depend on how it is cut, the protocol blocks are exact, 1,024 ranks work, and bad
settings name their field.

Split by tier: the pure-function tests are in tests/unit/testing/test_fake_runs.py."""

from __future__ import annotations

from collector.data.schema import TABLES
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import (
    FakeRun,
    stream,
    write_data_dir,
)
from tests.unit.testing.test_fake_runs import rows


def test_written_and_streamed_through_a_collector_the_run_is_the_same(tmp_path):
    run = FakeRun(run_id="both-ways", world_size=2, steps=12, sparse_comm_rows=5)
    written = write_data_dir(tmp_path / "written", run)
    with live_collector(tmp_path / "streamed") as (endpoint, streamed):
        stream(endpoint, run)
    for table in TABLES:
        sql = f'SELECT * FROM "{table}" ORDER BY ALL'
        assert rows(streamed, sql) == rows(written, sql), table
    assert rows(written, "SELECT count(*) FROM comm WHERE group_name IS NULL") == [(2 * 5,)]  # the sparse barriers
    runs = "SELECT run_id, name, world_size, started_at, ended_at, status, source, config, n_ranks FROM runs"
    assert rows(streamed, runs) == rows(written, runs)
    ranks = "SELECT * FROM ranks ORDER BY rank"
    assert rows(streamed, ranks) == rows(written, ranks)


def test_1024_ranks(tmp_path):
    run = FakeRun(run_id="wide", world_size=1024, steps=2, late_rank=700, with_moe=False)
    data = write_data_dir(tmp_path, run)
    assert rows(
        data, "SELECT count(*), min(n_ranks), bool_and(last_rank = 700) FROM stragglers WHERE op = 'all_reduce'"
    ) == [(2 * 5, 1024, True)]
    assert rows(data, "SELECT status, world_size, n_ranks FROM runs") == [("finished", 1024, 1024)]
    assert rows(data, "SELECT count(DISTINCT rank) FROM memory") == [(1024,)]
