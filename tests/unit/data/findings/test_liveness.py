"""The hang, desync and silent-rank rules as pure functions of their query results (fire on the
fault, silent on healthy frames, one line each at 1,024 ranks), and the catalog views that feed
them over a 1,024-rank stuck run written by the testing kit.

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/findings/test_liveness.py."""

from __future__ import annotations

import pandas as pd

from collector.data import findings, queries
from collector.data.findings.desync import mismatched_collectives
from collector.data.findings.hang import stuck_collectives
from collector.data.findings.silent import silent_ranks
from collector.testing.fake_runs import FakeRun, write_run

HANG_COLUMNS = ["group_name", "seq", "op", "step", "waiting_ranks", "missing_ranks", "waiting_s", "hang_after_s"]


def _hang(waiting, missing, missing_rows=None, **kw) -> pd.DataFrame:
    row = dict(group_name="world", seq=6, op="all_reduce", step=5, waiting_s=3.2, hang_after_s=2.0, **kw)
    row.update(waiting_ranks=waiting, missing_ranks=missing)
    row["missing"] = (
        missing_rows
        if missing_rows is not None
        else [{"rank": r, "last_entered_seq": 5, "last_completed_seq": 5, "step": 5} for r in missing]
    )
    return pd.DataFrame([row])


def _liveness(n: int, **per_rank) -> pd.DataFrame:
    frame = pd.DataFrame(
        {
            "rank": range(n),
            "step": 10,
            "period_s": 1.0,
            "last_beat_ns": 0,
            "silent_s": 0.5,
            "behind_s": 0.0,
            "ended": False,
            "gone": False,
            "gone_ns": None,
            "unresponsive": False,
            "run_status": "running",
        }
    )
    for column, values in per_rank.items():
        for rank, value in values.items():
            frame.loc[frame["rank"] == rank, column] = value
    return frame


def test_a_hang_names_who_waits_who_is_missing_and_where_it_was_last():
    [f] = stuck_collectives(_hang([0, 1, 3], [2]))
    assert (f.kind, f.severity, f.ranks) == ("hang", "critical", (2,))
    assert f.text == (
        "hang: ranks 0-1,3 stuck 3 s in all_reduce #6 of world at step 5, waiting for rank 2 (rank 2 last completed #5)"
    )
    assert findings.exit_code([f]) == 2


def test_no_hang_rows_no_hang_finding():
    assert stuck_collectives(pd.DataFrame(columns=[*HANG_COLUMNS, "missing"])) == []


def test_a_hang_at_1024_ranks_is_one_short_line():
    waiting = [r for r in range(1024) if r != 700]
    [f] = stuck_collectives(_hang(waiting, [700]))
    assert "ranks 0-699,701-1023" in f.text and "waiting for rank 700" in f.text and len(f.text) < 200


def test_a_mismatch_names_both_sides_and_what_differs():
    frame = pd.DataFrame(
        [
            {
                "group_name": "world",
                "seq": 3,
                "n_sides": 2,
                "sides": [
                    {"op": "all_reduce", "dtype": "float32", "numel": 4, "ranks": [0, 2, 3]},
                    {"op": "all_reduce", "dtype": "float32", "numel": 8, "ranks": [1]},
                ],
            }
        ]
    )
    [f] = mismatched_collectives(frame)
    assert f.ranks == (1,) and f.severity == "critical"
    assert f.text == (
        "collective mismatch at world #3 (numel differ): all_reduce float32 x4 on ranks 0,2-3 "
        "vs all_reduce float32 x8 on rank 1"
    )
    assert mismatched_collectives(frame.iloc[0:0]) == []


def test_silent_ranks_fire_only_past_three_periods_behind_the_others():
    healthy = _liveness(1024)
    assert silent_ranks(healthy) == []
    # a little behind (a late batch) is no alarm; a loaded reader (silent_s up, behind_s not) neither
    assert silent_ranks(_liveness(4, behind_s={3: 2.5}, silent_s={0: 6.0, 1: 6.0, 2: 6.0, 3: 8.5})) == []
    [f] = silent_ranks(_liveness(1024, behind_s={3: 4.0}, silent_s={3: 4.5}))
    assert (f.kind, f.ranks, f.severity) == ("silent_rank", (3,), "critical")
    assert f.text == "rank 3 silent for 4 s (no heartbeat since step 10)"


def test_a_silent_rank_that_does_not_answer_says_so_and_a_whole_node_is_one_line():
    node = {r: 5.0 for r in range(8, 16)}
    [f] = silent_ranks(_liveness(1024, behind_s=node, silent_s=node, unresponsive={9: True}))
    assert f.ranks == tuple(range(8, 16))
    assert f.text.startswith("ranks 8-15 silent for 5 s") and "rank 9 did not answer a stack request" in f.text


def test_a_rank_gone_without_run_end_is_stopped_and_an_ended_one_is_not():
    [f] = silent_ranks(_liveness(4, gone={3: True}, step={3: 41}))
    assert (f.kind, f.text) == ("rank_stopped", "rank 3 stopped at step 41 without ending the run")
    assert silent_ranks(_liveness(4, ended={3: True}, behind_s={3: 30.0}, silent_s={3: 30.0})) == []
    # the rest of the run ended and the rank has been quiet long: stopped too
    over = _liveness(4, run_status={r: "failed" for r in range(4)}, ended={0: True, 1: True, 2: True})
    assert silent_ranks(over.assign(silent_s=[0.0, 0.0, 0.0, 60.0]))[0].kind == "rank_stopped"
    assert silent_ranks(over) == []  # its own RunEnd may still be on its way


def test_the_rank_whose_connection_closed_first_is_named_as_the_one_that_crashed():
    """A crash closes its own connection at once, the others' when torchrun or their next collective
    notices (127 ms later in the DDP crash case); a job killed whole closes them within a few ms."""
    gone = {r: True for r in range(4)}
    crashed = _liveness(
        4, gone=gone, step={2: 26}, gone_ns={0: 10_130_000_000, 1: 10_128_000_000, 2: 10_000_000_000, 3: 10_131_000_000}
    )
    [f] = silent_ranks(crashed)
    assert f.evidence["first_ranks"] == [2] and f.text.startswith("rank 2 stopped first, at step 26")
    assert "128 ms before the others'" in f.text and "ranks 0-1,3 stopped after it" in f.text
    killed = _liveness(4, gone=gone, gone_ns={r: 10_000_000_000 + 3_000_000 * r for r in range(4)})
    [f] = silent_ranks(killed)
    assert "first_ranks" not in f.evidence and f.text == "ranks 0-3 stopped at step 10 without ending the run"


def test_the_sample_runs_report_a_hang_only_in_the_hang_run():
    """The shipped hang run (killed while hung) is critical; every other sample run is silent."""
    from pathlib import Path

    cat = queries.Catalog(Path(__file__).resolve().parents[4] / "sample_runs")
    try:
        for run in queries.list_runs(cat).itertuples():
            critical = {f.kind for f in findings.for_run(cat, run.run_id) if f.severity == "critical"}
            if run.name == "zero2-hang-rank2":
                assert "hang" in critical and "desync" not in critical, critical
            else:
                assert not critical, (run.name, critical)
    finally:
        cat.close()


def test_the_desyncs_view_finds_each_odd_instance_and_only_those(tmp_path):
    # A healthy 4-rank run, plus one segment per rank of three extra instances: seq 900 where
    # rank 2 sends another numel, seq 901 where rank 1 has no dtype (a record that does not say
    # agrees with anything: no side of its own), seq 902 where all agree.
    from collector.testing.fake_runs import _stored, _write

    run = FakeRun(run_id="odd", world_size=4, steps=2, with_moe=False)
    write_run(tmp_path, run)
    for rank in range(4):
        numel = [1024 if rank != 2 else 512, 1024, 1024]
        dtype = ["float32", "float32" if rank != 1 else None, "float32"]
        rows = _stored(
            "comm",
            rank,
            {
                "step": [5, 5, 5],
                "group_name": ["world"] * 3,
                "group_size": [4] * 3,
                "seq": [900, 901, 902],
                "op": ["all_reduce"] * 3,
                "dtype": dtype,
                "numel": numel,
                "start_ns": [10, 20, 30],
                "end_ns": [11, 21, 31],
            },
        )
        _write(tmp_path, "comm", run.run_id, f"odd-rank{rank}", rows)
    cat = queries.Catalog(tmp_path)
    try:
        odd = queries.desyncs(cat, run.run_id)
    finally:
        cat.close()
    assert list(odd.seq) == [900]
    sides = {row.seq: [(s["numel"], s["dtype"], list(s["ranks"])) for s in row.sides] for row in odd.itertuples()}
    assert sides[900] == [(1024, "float32", [0, 1, 3]), (512, "float32", [2])]


def _sides_frame(*sides: dict, seq: int = 3) -> pd.DataFrame:
    return pd.DataFrame([{"group_name": "world", "seq": seq, "n_sides": len(sides), "sides": list(sides)}])


def test_an_unknown_numel_is_unknown_not_a_mismatch():
    """Imported data may not know a collective's element count (numel NULL: None from DuckDB, NaN from
    a frame pandas built): a side that differs only by it is no desync, and a real mismatch beside it
    says 'numel unknown' rather than crashing on int(None)/int(NaN)."""
    for unknown in (None, float("nan")):
        only_unknown = _sides_frame(
            {"op": "all_reduce", "dtype": "float32", "numel": 4, "ranks": [0, 2, 3]},
            {"op": "all_reduce", "dtype": "float32", "numel": unknown, "ranks": [1]},
        )
        assert mismatched_collectives(only_unknown) == [], unknown
        all_unknown = _sides_frame(
            {"op": "all_reduce", "dtype": "float32", "numel": unknown, "ranks": [0, 1]},
            {"op": "all_reduce", "dtype": "float16", "numel": unknown, "ranks": [2]},
        )
        [f] = mismatched_collectives(all_unknown)
        assert f.ranks == (2,) and f.evidence["differs"] == ["dtype"], f
        assert f.text == (
            "collective mismatch at world #3 (dtype differ): all_reduce float32 x? (numel unknown) on ranks 0-1 "
            "vs all_reduce float16 x? (numel unknown) on rank 2"
        )
        assert [s["numel"] for s in f.evidence["sides"]] == [None, None]
        beside_a_real_one = _sides_frame(
            {"op": "all_reduce", "dtype": "float32", "numel": 4, "ranks": [0, 1]},
            {"op": "all_reduce", "dtype": "float32", "numel": 8, "ranks": [2]},
            {"op": "all_reduce", "dtype": "float32", "numel": unknown, "ranks": [3]},
        )
        [f] = mismatched_collectives(beside_a_real_one)
        assert f.ranks == (2,) and f.evidence["differs"] == ["numel"], f
        assert [s["numel"] for s in f.evidence["sides"]] == [4, 8, None]


def test_a_null_numel_in_the_data_dir_is_no_desync_finding(tmp_path):
    """The same through DuckDB over Parquet: rank 1 enters seq 910 with numel NULL (no instance of the
    view: an unknown agrees), rank 3 enters seq 911 with numel NULL and rank 2 with another dtype."""
    from collector.testing.fake_runs import _stored, _write

    run = FakeRun(run_id="nonumel", world_size=4, steps=2, with_moe=False)
    write_run(tmp_path, run)
    for rank in range(4):
        rows = _stored(
            "comm",
            rank,
            {
                "step": [5, 5],
                "group_name": ["world"] * 2,
                "group_size": [4] * 2,
                "seq": [910, 911],
                "op": ["all_reduce"] * 2,
                "dtype": ["float32", "float16" if rank == 2 else "float32"],
                "numel": [None if rank == 1 else 1024, None if rank == 3 else 1024],
                "start_ns": [10, 20],
                "end_ns": [11, 21],
            },
        )
        _write(tmp_path, "comm", run.run_id, f"nonumel-rank{rank}", rows)
    cat = queries.Catalog(tmp_path)
    try:
        odd = queries.desyncs(cat, run.run_id)
        assert list(odd.seq) == [911]
        [f] = mismatched_collectives(odd)
        assert [x.kind for x in findings.for_run(cat, run.run_id) if x.kind == "desync"] == ["desync"]
    finally:
        cat.close()
    assert f.evidence["seq"] == 911 and f.evidence["differs"] == ["dtype"] and f.ranks == (2,), f
    assert "x? (numel unknown) on rank 3" in f.text, f.text
