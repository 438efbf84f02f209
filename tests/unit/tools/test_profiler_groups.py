"""collector.tools.importers.profiler_groups on hand-made traces' pending collectives: which of a
rank's process groups each worker thread serves, decided across ranks (the real-trace check against
the hook is tests/integration/tools/test_import_torch_profiler.py)."""

from __future__ import annotations

from collector.tools.importers import profiler_groups
from collector.tools.importers.base import Parsed

WORLD = profiler_groups.Group("0", 4, (0, 1, 2, 3), True)
TP = {0: profiler_groups.Group("1", 2, (0, 1), False), 2: profiler_groups.Group("2", 2, (2, 3), False)}
DP = {0: profiler_groups.Group("3", 2, (0, 2), False), 1: profiler_groups.Group("4", 2, (1, 3), False)}


def _row(op: str, numel: int) -> dict:
    return dict(group_name=None, group_size=None, seq=None, op=op, numel=numel, bytes=4 * numel, start_ns=0, end_ns=10)


def _trace(rank: int, calls: list[tuple[str, int, int]]) -> Parsed:
    """A rank's trace: its groups (world, TP pair, DP pair, created in that order) and its
    collectives as (op, elements, worker thread), threads numbered as each rank's groups make them."""
    p = Parsed(sources=[f"rank{rank}.json"])
    pending = profiler_groups.Pending(rank, [WORLD, TP[rank // 2 * 2], DP[rank % 2]])
    for op, numel, thread in calls:
        row = _row(op, numel)
        p.rows[("comm", rank)].append(row)
        pending.add(row, 100 * rank + thread, op == "all_gather")
    p.hints[profiler_groups.HINT] = pending
    return p


def _steps(n: int, tp_numel: int = 8) -> list[tuple[str, int, int]]:
    """n steps' collectives. Threads 1-2 are the world's, 3-4 the TP pair's, 5-6 the DP pair's (two
    per group, in creation order); a group's collectives go to either of its threads, as gloo's
    queue hands them out."""
    calls = []
    for k in range(n):
        odd = k % 2
        calls += [("all_reduce", tp_numel, 3 + odd), ("all_gather", 4, 4 - odd), ("all_reduce", 8, 5 + odd)]
        calls += [("all_reduce", 1, 1 + odd)]
    return calls


def test_every_collective_takes_the_group_whose_threads_ran_it_though_tp_pairs_do_the_same_in_step():
    traces = [_trace(r, _steps(3)) for r in range(4)]
    notes = profiler_groups.settle(traces)
    assert (
        notes and "12 collectives" not in notes[0] and "on 5 groups (g[0,2], g[0-1], g[1,3], g[2-3], world)" in notes[0]
    )
    rows = traces[3].rows[("comm", 3)]
    assert [(r["group_name"], r["group_size"], r["seq"]) for r in rows[:4]] == [
        ("g[2-3]", 2, 1),
        ("g[2-3]", 2, 2),
        ("g[1,3]", 2, 1),
        ("world", 4, 1),
    ]
    assert rows[1]["numel"] == 8 and rows[1]["bytes"] == 32  # a list all_gather's count times its group's size
    assert rows[-1]["seq"] == 3 and rows[-2]["seq"] == 3


def test_collectives_that_fit_no_reading_are_left_out_and_said_why():
    traces = [_trace(r, _steps(2, tp_numel=16 if r == 3 else 8)) for r in range(4)]  # rank 3's TP op differs
    notes = profiler_groups.settle(traces)
    assert (
        notes
        == [
            "32 collectives not imported: their ranks are in several process groups, and the traces do not tell "
            "which one each ran on (rank 2's collectives match no member's of the same groups)"
        ]
        or "match no member's" in notes[0]
    )
    assert all(not t.rows[("comm", r)] for r, t in enumerate(traces))


def test_one_ranks_trace_is_decided_by_its_threads_alone_only_where_they_leave_one_reading():
    whole = [_trace(0, _steps(2))]  # every group's two threads seen: one reading
    assert profiler_groups.settle(whole)[0].startswith("process groups inferred: 8 collectives on 3 groups")
    one_dp_thread = [(op, n, 5 if t == 6 else t) for op, n, t in _steps(2)]
    alone = [_trace(0, one_dp_thread)]  # 5 threads over 3 groups, no member's trace to match: not guessed
    notes = profiler_groups.settle(alone)
    assert "(the worker threads of 1 of 1 ranks fit their groups more than one way)" in notes[0]
    assert not alone[0].rows[("comm", 0)]


def test_traces_of_one_group_are_not_touched():
    assert profiler_groups.settle([Parsed(sources=["rank0.json"])]) == []
