"""The per-step analysis (queries.step_analysis_of): interval unions, waiting vs transfer,
overlap with compute and the wait a late rank imposes, checked against a brute-force
reference on small cases and for shape and bounds at 1,024 ranks x 500 steps.

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/test_step_analysis.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from collector.data import queries

MS = 1_000_000


def comm_table(rows: list[tuple]) -> pa.Table:
    """rows: (rank, step, group, seq, op, start_ms, end_ms)."""
    cols = list(zip(*rows, strict=True)) if rows else [[]] * 7
    return pa.table(
        {
            "rank": pa.array(cols[0], pa.int64()),
            "step": pa.array(cols[1], pa.int64()),
            "group_name": pa.array(cols[2], pa.string()),
            "seq": pa.array(cols[3], pa.int64()),
            "op": pa.array(cols[4], pa.string()),
            "start_ns": pa.array([int(x * MS) for x in cols[5]], pa.int64()),
            "end_ns": pa.array([int(x * MS) for x in cols[6]], pa.int64()),
        }
    )


def timer_table(rows: list[tuple]) -> pa.Table:
    """rows: (rank, step, name, start_ms, end_ms)."""
    cols = list(zip(*rows, strict=True))
    return pa.table(
        {
            "rank": pa.array(cols[0], pa.int64()),
            "step": pa.array(cols[1], pa.int64()),
            "name": pa.array(cols[2], pa.string()),
            "start_ns": pa.array([int(x * MS) for x in cols[3]], pa.int64()),
            "end_ns": pa.array([int(x * MS) for x in cols[4]], pa.int64()),
        }
    )


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e <= reach:
            continue
        total += e - max(s, reach)
        reach = e
    return total


def test_overlapping_async_collectives_count_once_and_never_exceed_the_step():
    # Rank 0's step is [0, 100); three async reduce_scatters overlap, one sync all_reduce after,
    # and a start-up broadcast before the step that must not count.
    timers = timer_table([(0, 1, "fwd", 0, 30), (0, 1, "bwd_inner", 30, 60), (0, 1, "step", 60, 100)])
    comm = comm_table(
        [
            (0, 1, "w", 0, "broadcast", -50, -40),
            (0, 1, "w", 1, "reduce_scatter_tensor", 40, 90),
            (0, 1, "w", 2, "reduce_scatter_tensor", 45, 95),
            (0, 1, "w", 3, "reduce_scatter_tensor", 50, 99),
            (0, 1, "w", 4, "all_reduce", 99, 120),  # runs past the step: clipped at 100
        ]
    )
    row = queries.step_analysis_of(comm, timers).iloc[0]
    assert row.step_ms == pytest.approx(100)
    assert row.comm_ms == pytest.approx(60)  # [40, 100)
    assert row.overlapped_ms == pytest.approx(20)  # [40, 60) beside bwd_inner
    assert row.waiting_ms == pytest.approx(0)  # one rank: nobody to wait for
    assert bool(row.timed)


def test_waiting_and_the_wait_a_late_rank_imposes():
    # Two ranks, step [0, 100) each. Rank 1 enters the all_reduce 30 ms after rank 0; both finish at 50.
    timers = timer_table([(r, 1, "fwd", 0, 10) for r in (0, 1)] + [(r, 1, "step", 10, 100) for r in (0, 1)])
    comm = comm_table([(0, 1, "w", 0, "all_reduce", 15, 50), (1, 1, "w", 0, "all_reduce", 45, 50)])
    df = queries.step_analysis_of(comm, timers).set_index("rank")
    assert df.loc[0, "comm_ms"] == pytest.approx(35)
    assert df.loc[0, "waiting_ms"] == pytest.approx(30)  # [15, 45): before rank 1 arrived
    assert df.loc[1, "waiting_ms"] == pytest.approx(0)
    assert df.loc[1, "imposed_ms"] == pytest.approx(30) and df.loc[1, "late_op"] == "all_reduce"
    assert df.loc[0, "imposed_ms"] == 0
    assert df.held_ms.tolist() == pytest.approx([30, 30])


def test_concurrent_late_arrivals_impose_their_union_not_their_sum():
    timers = timer_table([(r, 1, "step", 0, 200) for r in range(3)])
    rows = []
    for seq, (early, late) in enumerate([(10, 60), (20, 70), (30, 75)]):
        rows += [
            (0, 1, "w", seq, "reduce_scatter_tensor", early, 90),
            (1, 1, "w", seq, "reduce_scatter_tensor", early + 1, 90),
        ]
        rows += [(2, 1, "w", seq, "reduce_scatter_tensor", late, 90)]
    df = queries.step_analysis_of(comm_table(rows), timers).set_index("rank")
    # imposed spans [11, 60), [21, 70), [31, 75): union [11, 75)
    assert df.loc[2, "imposed_ms"] == pytest.approx(64)


def test_without_timers_a_step_is_the_span_of_its_communication():
    comm = comm_table([(0, 3, "w", 0, "all_reduce", 10, 20), (1, 3, "w", 0, "all_reduce", 14, 20)])
    empty_timers = timer_table([(0, 0, "x", 0, 0)]).slice(0, 0)
    df = queries.step_analysis_of(comm, empty_timers).set_index("rank")
    assert not df.timed.any()
    assert df.loc[1, "imposed_ms"] == pytest.approx(4)


def test_unions_match_a_brute_force_reference_on_random_steps():
    rng = np.random.default_rng(7)
    rows, timers, expected = [], [], {}
    for rank in range(4):
        for step in range(5):
            timers.append((rank, step, "step", step * 1000, step * 1000 + 500))
            ivs = []
            for seq in range(8):
                s = step * 1000 + rng.uniform(-50, 480)
                e = s + rng.uniform(1, 120)
                rows.append((rank, step, f"g{rank}", step * 8 + seq, "all_reduce", s, e))
                ivs.append((max(s, step * 1000), min(e, step * 1000 + 500)))
            expected[(rank, step)] = union_length([iv for iv in ivs if iv[1] > iv[0]])
    df = queries.step_analysis_of(comm_table(rows), timer_table(timers))
    got = {(int(r.rank), int(r.step)): r.comm_ms for r in df.itertuples()}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-3), key
    assert (df.comm_ms <= df.step_ms + 1e-9).all()


def test_a_rank_late_only_because_its_previous_collective_ended_late_imposes_nothing():
    # Ring order / a slow link: rank 2 leaves all_reduce 0 last (at 60, the others at 30) and enters
    # all_reduce 1 as soon as it can (61, the others at 31): the network held it, not its compute.
    # Rank 1 in a second step leaves on time (30) and then computes 25 ms longer: that is its own.
    timers = timer_table([(r, s, "step", 100 * s, 100 * s + 100) for r in range(3) for s in (1, 2)])
    rows = []
    for r, end in ((0, 30), (1, 30), (2, 60)):
        rows += [(r, 1, "w", 0, "all_reduce", 110, 100 + end), (r, 1, "w", 1, "all_reduce", 101 + end, 170)]
    for r, late in ((0, 0), (1, 25), (2, 0)):
        rows += [(r, 2, "w", 2, "all_reduce", 210, 230), (r, 2, "w", 3, "all_reduce", 231 + late, 270)]
    df = queries.step_analysis_of(comm_table(rows), timers).set_index(["step", "rank"])
    # arrived at 161, 30 ms after the runner-up, its previous one ended at 160: 1 ms is its own
    assert df.loc[(1, 2), "imposed_ms"] == pytest.approx(1)
    assert df.loc[(2, 1), "imposed_ms"] == pytest.approx(25)  # left at 230, came at 256 (runner-up 231)


def test_a_receive_waiting_for_its_producer_imposes_no_lateness():
    # A pipeline: rank 1 waits 40 ms in recv for rank 0's activations (rank 0 computed them), then both
    # all_reduce where rank 1 arrives 30 ms after rank 0. Only the all_reduce's wait is lateness.
    timers = timer_table([(0, 0, "train_batch", 0, 100), (1, 0, "train_batch", 0, 100)])
    comm = comm_table(
        [
            (0, 0, "p2p[0->1]", 0, "isend", 45, 46),
            (1, 0, "p2p[0->1]", 0, "recv", 5, 46),
            (0, 0, "world", 1, "all_reduce", 60, 92),
            (1, 0, "world", 1, "all_reduce", 90, 92),
        ]
    )
    out = queries.step_analysis_of(comm, timers).set_index("rank")
    assert out.loc[0, "imposed_ms"] == 0, "the sender of a p2p op is not late for its receiver"
    assert out.loc[1, "imposed_ms"] == pytest.approx(30) and out.loc[1, "late_op"] == "all_reduce"
    assert list(out.held_ms) == pytest.approx([30, 30])
    assert out.loc[1, "waiting_ms"] == pytest.approx(40 + 0), "the receive's wait is still waiting time"
