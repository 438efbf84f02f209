"""`rankscope export`: a Perfetto/Chrome trace with one track per rank and group holding
every timed collective, Parquet files that import back, and clear errors.

Split by tier: the pure-function tests are in tests/unit/tools/test_export.py."""

from __future__ import annotations

from collections import Counter

import pytest

from collector.testing.collectors import live_collector
from collector.testing.fake_runs import FakeRun, stream
from tests._import_util import only_run, query, rankscope
from tests.unit.tools.test_export import _validate_trace

RUN = "traced-run"
# two ranks, comm on two groups (world, zero) and a few barriers without a group
SOURCE = FakeRun(run_id=RUN, world_size=2, steps=20, sparse_comm_rows=10)


@pytest.fixture
def run_dir(tmp_path):
    data = tmp_path / "data"
    with live_collector(data) as collector:
        stream(collector.endpoint, SOURCE)
    return data


def test_perfetto_one_track_per_rank_and_group_with_every_collective(run_dir, tmp_path):
    out = tmp_path / "trace.json"
    assert rankscope("export", "--perfetto", RUN, out, "--data-dir", run_dir) == 0
    trace = _validate_trace(out)
    events = trace["traceEvents"]
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    process_names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert process_names == {0: "rank 0", 1: "rank 1"}
    comm = [e for e in events if e.get("cat") == "comm"]
    tracks = {(e["pid"], thread_names[(e["pid"], e["tid"])]) for e in comm}
    groups = query(run_dir, "SELECT DISTINCT rank, coalesce(group_name, '') FROM comm WHERE run_id = ?", [RUN])
    assert tracks == {(rank, f"comm {g}" if g else "comm") for rank, g in groups}
    assert len({(e["pid"], e["tid"]) for e in comm}) == len(tracks)  # a track is one (pid, tid)
    # every collective is there once, with its seq, on its rank's track for its group
    want = Counter(
        query(
            run_dir,
            """SELECT rank, coalesce(group_name, ''), seq, end_ns - start_ns FROM comm
                                     WHERE run_id = ?""",
            [RUN],
        )
    )
    got = Counter(
        (
            e["pid"],
            thread_names[(e["pid"], e["tid"])].removeprefix("comm").strip(),
            e["args"].get("seq"),
            round(e["dur"] * 1000),
        )
        for e in comm
    )
    assert got == want
    timers = [e for e in events if e.get("cat") == "timer"]
    assert len(timers) == query(run_dir, "SELECT count(*) FROM timers WHERE run_id = ?", [RUN])[0][0]
    assert all(thread_names[(e["pid"], e["tid"])] == "engine timers" for e in timers)
    assert trace["otherData"]["run_id"] == RUN and trace["otherData"]["comm_rows_without_times"] == 0
    first = min(e["ts"] for e in events if e["ph"] == "X")
    assert (
        first == 0
        and trace["otherData"]["t0_unix_ns"]
        == query(run_dir, "SELECT min(start_ns) FROM comm WHERE run_id = ?", [RUN])[0][0]
    )


def test_parquet_export_imports_back(run_dir, tmp_path):
    out = tmp_path / "pq"
    assert rankscope("export", "--parquet", RUN, out, "--data-dir", run_dir) == 0
    assert {p.name for p in out.iterdir()} >= {"comm.parquet", "timers.parquet", "runs.parquet"}
    again = tmp_path / "again"
    assert rankscope("import", out, "--run", "back", "--data-dir", again) == 0
    new = only_run(again)
    cols = "rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs"
    assert sorted(query(again, f"SELECT {cols} FROM comm WHERE run_id = ?", [new]), key=repr) == sorted(
        query(run_dir, f"SELECT {cols} FROM comm WHERE run_id = ?", [RUN]), key=repr
    )
    assert query(again, "SELECT count(*) FROM flops WHERE run_id = ?", [new]) == query(
        run_dir, "SELECT count(*) FROM flops WHERE run_id = ?", [RUN]
    )


def test_unknown_run_is_a_clear_error(run_dir, tmp_path, capsys):
    assert rankscope("export", "--perfetto", "no-such-run", tmp_path / "x.json", "--data-dir", run_dir) == 1
    assert "no run with id or name 'no-such-run'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
