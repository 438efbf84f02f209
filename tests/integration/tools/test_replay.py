"""`rankscope replay`: a run streamed through a real collector, replayed at 10x (from the
data dir and from an `export --archive` file) reproduces its tables row for row,
except run_id and what the collector stamps on arrival."""

from __future__ import annotations

import time

import pytest

from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import STORY_TABLES, FakeRun, stream
from tests._import_util import query, rankscope

RUN = "source-run"
# two ranks with rows in every table, some NULLs (barriers sent without their group), 8 s long
SOURCE = FakeRun(run_id=RUN, name="src", world_size=2, steps=20, sparse_comm_rows=10)


def _rows(data, table: str, run_id: str) -> list[tuple]:
    return sorted(query(data, f'SELECT * EXCLUDE (run_id) FROM "{table}" WHERE run_id = ?', [run_id]), key=repr)


def _settled_rows(data, table: str, run_id: str, want: list[tuple] | None = None) -> list[tuple]:
    """The rows once they are ``want`` (without it: once two reads in a row agree), reading again
    for up to 5 s: the collector compacts this data dir every 0.05 s here, and a compaction removes
    its inputs just before its output appears (ledger._apply), so a read at that instant misses
    those rows."""
    deadline = time.monotonic() + 5
    rows = _rows(data, table, run_id)
    while rows != want and time.monotonic() < deadline:
        time.sleep(0.1)
        previous, rows = rows, _rows(data, table, run_id)
        if want is None and rows == previous:
            break
    return rows


def _assert_same_run(data, original: str, replayed: str) -> None:
    for table in STORY_TABLES:  # the fake runs carry no watchdog rows and no captured evidence
        rows = _settled_rows(data, table, original)
        assert rows, table
        assert _settled_rows(data, table, replayed, rows) == rows, table
    cols = "name, world_size, status, config, epoch_ns(started_at), epoch_ns(ended_at), n_ranks"
    (src,) = query(data, f"SELECT {cols}, source, linked_run_id FROM runs WHERE run_id = ?", [original])
    (new,) = query(data, f"SELECT {cols}, source, linked_run_id FROM runs WHERE run_id = ?", [replayed])
    assert new[:-2] == src[:-2] and new[-2:] == ("replay", original)
    rank_cols = "rank, host, pid, clock_offset_ns, epoch_ns(started_at), epoch_ns(ended_at), status, dropped_records"
    assert query(data, f"SELECT {rank_cols} FROM ranks WHERE run_id = ? ORDER BY rank", [replayed]) == query(
        data, f"SELECT {rank_cols} FROM ranks WHERE run_id = ? ORDER BY rank", [original]
    )


@pytest.fixture
def source_run(tmp_path):
    data = tmp_path / "data"
    # Replays go into the collector that holds the source: it compacts the new run's segments
    # while replay is still reading the data dir, as a user's `rankscope replay D --endpoint E` would.
    with live_collector(data, compaction_config=CompactionConfig(interval=0.05, min_files=2)) as collector:
        stream(collector.endpoint, SOURCE)
        yield data, collector.endpoint


def test_replay_from_the_data_dir_at_10x(source_run):
    data, endpoint = source_run
    assert rankscope("replay", data, "--run", RUN, "--speed", "10", "--endpoint", endpoint) == 0
    (replayed,) = query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])[0]
    assert replayed != RUN
    _assert_same_run(data, RUN, replayed)


def test_replay_an_archive_by_name_as_fast_as_possible(source_run, tmp_path):
    data, endpoint = source_run
    archive = tmp_path / "src.rsarchive"
    assert rankscope("export", "--archive", "src", archive, "--data-dir", data) == 0
    assert rankscope("replay", archive, "--speed", "0", "--endpoint", endpoint) == 0
    (replayed,) = query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])[0]
    _assert_same_run(data, RUN, replayed)


def test_replay_of_a_partition_folder_and_bad_paths(source_run, tmp_path, capsys):
    data, endpoint = source_run
    assert rankscope("replay", data / "parquet" / "comm" / f"run={RUN}", "--speed", "0", "--endpoint", endpoint) == 0
    assert len(query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])) == 1
    assert rankscope("replay", data, "--endpoint", endpoint) == 1
    assert "say which run with --run" in capsys.readouterr().err
    assert rankscope("replay", data, "--run", "nope", "--endpoint", endpoint) == 1
    assert "no run with id or name 'nope'" in capsys.readouterr().err


def test_replay_reads_each_rank_a_step_range_at_a_time(source_run, monkeypatch):
    """Memory stays bounded: with small chunks the run is read in many step ranges, and the
    replayed run is still the original row for row."""
    from collector.data import catalog
    from collector.tools import replay

    data, endpoint = source_run
    monkeypatch.setattr(replay, "CHUNK_ROWS", 50)
    con = catalog.connect(data)
    try:
        _, ranks = catalog.with_segment_retry(lambda: replay.open_run(con, RUN))  # the collector compacts
    finally:
        con.close()
    assert all(len(r.step_ranges) > 3 for r in ranks), [r.step_ranges for r in ranks]
    assert rankscope("replay", data, "--run", RUN, "--speed", "0", "--endpoint", endpoint) == 0
    (replayed,) = query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])[0]
    _assert_same_run(data, RUN, replayed)
