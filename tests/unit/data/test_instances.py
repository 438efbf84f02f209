"""collector.data.instances on hand-made arrivals: the last rank (lowest on a tie) and the
runner-up arrival, checked against sorting each instance's arrivals in Python."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from collector.data.instances import instances_sql


def _instances(rows: list[tuple[str, int, int, int]]) -> dict:
    """rows: (group_name, seq, rank, start_ns) -> {(group, seq): (last_ns, last_rank, runner_up_ns, n_ranks)}."""
    cols = list(zip(*rows, strict=True))
    table = pa.table({"group_name": cols[0], "seq": cols[1], "rank": cols[2], "start_ns": cols[3]})
    con = duckdb.connect()
    con.register("c", table)
    out = con.execute(f"SELECT * FROM ({instances_sql('c', runner_up=True, extra=('count(*) AS rows',))})").fetchall()
    return {(g, s): (last, last_rank, second, n) for g, s, _first, last, last_rank, n, second, _rows in out}


def test_runner_up_and_last_rank_with_ties_and_single_ranks():
    found = _instances(
        [
            ("w", 0, 0, 10), ("w", 0, 1, 40), ("w", 0, 2, 25), ("w", 0, 3, 12),  # rank 1 last, runner-up 25
            ("w", 1, 0, 50), ("w", 1, 1, 50), ("w", 1, 2, 20),  # a tie: rank 0 (lowest) last, imposed nothing
            ("solo", 0, 5, 7),  # one rank: no runner-up
        ]
    )  # fmt: skip
    assert found[("w", 0)] == (40, 1, 25, 4)
    assert found[("w", 1)] == (50, 0, 50, 3)
    assert found[("solo", 0)] == (7, 5, None, 1)


def test_runner_up_matches_a_sort_at_1024_ranks():
    rng = np.random.default_rng(0)
    rows, expected = [], {}
    for seq in range(20):
        starts = rng.integers(0, 1_000_000, 1024)
        rows += [("world", seq, rank, int(s)) for rank, s in enumerate(starts)]
        order = sorted(range(1024), key=lambda r, st=starts: (-st[r], r))
        expected[("world", seq)] = (int(starts[order[0]]), order[0], int(starts[order[1]]), 1024)
    assert _instances(rows) == expected


def test_a_desync_is_two_known_signatures_and_a_field_a_record_leaves_null_agrees_with_anything():
    from collector.data.views import desyncs_sql

    con = duckdb.connect()
    con.execute("CREATE TABLE inflight_latest (run_id VARCHAR, rank INT, group_name VARCHAR, seq BIGINT, "
                "op VARCHAR, dtype VARCHAR, numel BIGINT)")  # fmt: skip
    rows = [
        (0, 0, "all_reduce", "float32", 1024), (1, 0, "all_reduce", None, None),  # an import that does not say
        (0, 1, "all_reduce", "float32", 1024), (1, 1, "all_reduce", "float32", 2048),  # sizes differ
        (0, 2, "broadcast", None, 8), (1, 2, "all_reduce", None, 8),  # ops differ, dtypes unknown
        (0, 3, "all_gather", "bfloat16", 64), (1, 3, None, "bfloat16", 64),  # op unknown on rank 1
    ]  # fmt: skip
    cols = list(zip(*rows, strict=True))
    entered = pa.table({"run_id": ["r"] * len(rows), "rank": cols[0], "group_name": ["world"] * len(rows),
                        "seq": cols[1], "op": cols[2], "dtype": cols[3], "numel": cols[4]})  # fmt: skip
    con.register("entered_rows", entered)
    found = con.execute(
        f"SELECT seq, n_sides FROM ({desyncs_sql('SELECT * FROM entered_rows')}) ORDER BY seq"
    ).fetchall()
    assert found == [(1, 2), (2, 2)]
