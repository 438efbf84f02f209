"""collector.testing.fake_runs: the story a fake run tells is really in the data (read
back through the catalog), both ways out give the same rows, a run's values do not
depend on how it is cut, the protocol blocks are exact, 1,024 ranks work, and bad
settings name their field.

Split by tier: what needs processes, sockets or seconds is in tests/integration/testing/test_fake_runs.py."""

from __future__ import annotations

import numpy as np
import pytest

from collector.data import catalog
from collector.data.codec import decode_batch
from collector.testing.fake_runs import (
    COLLECTIVES,
    FINISHED,
    FLOPS_TREE,
    LIVE,
    MOE_EXPERTS,
    STORY_TABLES,
    FakeRun,
    FakeRunError,
    comm_columns,
    comm_envelope,
    rank_envelopes,
    uniform_run,
    write_data_dir,
)


def rows(data, sql: str, params=()) -> list[tuple]:
    con = catalog.connect(data)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_data_dir(tmp_path_factory.mktemp("fake"), FINISHED, LIVE)


def test_the_late_rank_is_last_at_every_all_reduce_by_its_delay(written):
    run = FINISHED
    per_op = rows(
        written,
        """SELECT op, count(*), count(*) FILTER (WHERE last_rank = ?), min(max_delay_ns),
                                     max(max_delay_ns), min(n_ranks) FROM stragglers WHERE run_id = ? GROUP BY op""",
        [run.late_rank, run.run_id],
    )
    by_op = {op: rest for op, *rest in per_op}
    assert set(by_op) == {op for op, _, _ in COLLECTIVES}
    instances, late_last, least, most, n_ranks = by_op["all_reduce"]
    assert instances == late_last == sum(op == "all_reduce" for op, _, _ in COLLECTIVES) * run.steps
    assert run.delay_ns - run.jitter_ns < least and most < run.delay_ns + run.jitter_ns and n_ranks == run.world_size
    # elsewhere only jitter decides who is last: no rank is always last
    for op in ("all_gather", "reduce_scatter"):
        instances, late_last, _, most, _ = by_op[op]
        assert late_last < instances and most < run.jitter_ns
    # every rank ends an instance at the same time, after the last arrival
    assert rows(
        written,
        """SELECT count(*) FROM (SELECT group_name, seq FROM comm WHERE run_id = ?
                            GROUP BY ALL HAVING count(DISTINCT end_ns) > 1 OR max(start_ns) >= min(end_ns))""",
        [run.run_id],
    ) == [(0,)]


def test_overflow_steps_experts_and_flops_tell_the_story(written):
    run = FINISHED
    overflows = rows(
        written,
        """SELECT rank, list(step ORDER BY step), bool_and(scale = scale_before / 2)
                                 FROM loss_scale WHERE run_id = ? AND overflow GROUP BY rank ORDER BY rank""",
        [run.run_id],
    )
    assert overflows == [(r, list(run.overflow_steps), True) for r in range(run.world_size)]
    tokens = rows(
        written,
        """SELECT layer, expert, sum(tokens), sum(dropped) FROM moe WHERE run_id = ?
                              GROUP BY ALL ORDER BY layer, expert""",
        [run.run_id],
    )
    assert len(tokens) == 2 * MOE_EXPERTS
    for layer in (0, 1):
        load = [t for lay, _, t, _ in tokens if lay == layer]
        assert load[0] == max(load) and load[0] > 2 * load[-1]  # expert 0 the busiest, the last far behind
        assert next(d for lay, e, _, d in tokens if lay == layer and e == 0) > 0
    tree = rows(
        written, """SELECT module, parent, flops, latency_ns FROM flops WHERE run_id = ? AND rank = 0""", [run.run_id]
    )
    assert len(tree) == len(FLOPS_TREE)
    flops = {m: f for m, _, f, _ in tree}
    for module, *_ in FLOPS_TREE:
        children = [flops[m] for m, p, *_ in FLOPS_TREE if p == module]
        if children:
            assert flops[module] == sum(children), module
    slow = dict(rows(written, "SELECT rank, max(latency_ns) FROM flops WHERE run_id = ? GROUP BY rank", [run.run_id]))
    assert slow[run.late_rank] == int(slow[0] * 1.3)


def test_every_table_has_rows_and_the_runs_their_status(written):
    for table in STORY_TABLES:
        assert rows(written, f'SELECT count(*) > 0 FROM "{table}" WHERE run_id = ?', [FINISHED.run_id]) == [(True,)]
    assert rows(written, "SELECT count(*) FROM comm WHERE run_id = ?", [FINISHED.run_id]) == [
        (FINISHED.steps * len(COLLECTIVES) * FINISHED.world_size,)
    ]
    runs = rows(written, "SELECT run_id, name, status, world_size, n_ranks FROM runs ORDER BY run_id")
    assert runs == [(FINISHED.run_id, FINISHED.name, "finished", 4, 4), (LIVE.run_id, LIVE.name, "running", 4, 4)]
    assert rows(written, "SELECT count(*) FROM moe WHERE run_id = ?", [LIVE.run_id]) == [(0,)]
    assert rows(written, "SELECT DISTINCT host FROM ranks ORDER BY 1") == [("node-a",), ("node-b",)]


def test_a_runs_values_do_not_depend_on_how_it_is_cut():
    run = FakeRun(run_id="cut")
    whole = run.comm_columns(2, 0, 100)
    parts = [run.comm_columns(2, 0, 37), run.comm_columns(2, 37, 63)]
    for name, values in whole.items():
        assert list(values) == list(parts[0][name]) + list(parts[1][name]), name
    other = FakeRun(run_id="cut", seed=1).comm_columns(2, 0, 100)
    assert list(other["start_ns"]) != list(whole["start_ns"])  # the seed matters, the cut does not
    a, b = FakeRun(run_id="w4").step_columns(1), FakeRun(run_id="w4", world_size=8).step_columns(1)
    assert list(a["timers"]["dur_ns"]) == list(b["timers"]["dur_ns"])  # rank 1's rows ignore the others


def test_protocol_blocks_are_exact():
    cols = comm_columns(2, 30, 20, delay_ns=5000)
    run = uniform_run(late_rank=2, delay_ns=5000)
    assert all(list(v) == list(run.comm_columns(2, 30, 20)[k]) for k, v in cols.items())
    on_time = run.comm_columns(0, 30, 20)
    assert list(cols["seq"]) == list(range(30, 50)) and list(cols["step"]) == [s // 10 for s in range(30, 50)]
    assert set(cols["op"]) == {"all_reduce"} and set(cols["bytes"]) == {1024} and set(cols["group_size"]) == {4}
    assert list(cols["start_ns"] - on_time["start_ns"]) == [5000] * 20
    assert (cols["end_ns"] > cols["start_ns"]).all() and list(cols["end_ns"]) == list(on_time["end_ns"])
    assert comm_columns(10, 0, 2)["op"] == ["all_reduce"] * 2  # a rank outside the group is still a row
    env = comm_envelope("c", 7, "r", 2, 30, 20, delay_ns=5000)
    assert env.seq == 7 and env.client_id == "c"
    decoded = decode_batch(env.table)
    assert decoded["start_ns"].to_pylist() == list(cols["start_ns"]) and env.table.rank == 2


def test_a_rank_sends_hello_then_batches_then_its_end():
    envs = rank_envelopes(FINISHED, 3)
    assert [e.seq for e in envs] == list(range(1, len(envs) + 1))
    assert envs[0].WhichOneof("body") == "hello" and envs[0].hello.rank == 3
    assert envs[-1].WhichOneof("body") == "end" and envs[-1].end.status == "finished"
    assert {e.table.table for e in envs[1:-1]} == STORY_TABLES
    assert rank_envelopes(LIVE, 0)[-1].WhichOneof("body") == "table"  # still running: no end


@pytest.mark.parametrize(
    "settings, field",
    [
        (dict(run_id="../x"), "FakeRun.run_id"),
        (dict(run_id="r", world_size=0), "FakeRun.world_size"),
        (dict(run_id="r", late_rank=4), "FakeRun.late_rank: 4 is not a rank of a world of 4"),
        (dict(run_id="r", status="done"), "FakeRun.status"),
        (dict(run_id="r", collectives=()), "FakeRun.collectives"),
        (dict(run_id="r", jitter_ns=-1), "FakeRun.jitter_ns"),
        (dict(run_id="r", collectives_per_step=10**9), "FakeRun.step_period_ns"),
        (dict(run_id="r", bytes_per_ns=0), "FakeRun.bytes_per_ns"),
    ],
)
def test_bad_settings_name_the_field(settings, field):
    with pytest.raises(FakeRunError, match=field.replace(".", r"\.")):
        FakeRun(**settings)


def test_an_instance_range_outside_the_run_is_an_error():
    run = FakeRun(run_id="r", steps=10, collectives_per_step=50)
    assert len(run.comm_columns(0, 500)["seq"]) == 0  # the end of the run: nothing left
    with pytest.raises(FakeRunError, match=r"FakeRun\.comm_columns: no instances \[600, 500\) in a run of 500"):
        run.comm_columns(0, 600)


def test_default_late_rank_is_the_last_and_none_means_nobody():
    assert FakeRun(run_id="r", world_size=6).late_rank == 5
    cols = FakeRun(run_id="r", late_rank=None, jitter_ns=0).comm_columns(3, 0, 8)
    assert np.array_equal(
        cols["start_ns"], FakeRun(run_id="r", late_rank=None, jitter_ns=0).comm_columns(0, 0, 8)["start_ns"]
    )
