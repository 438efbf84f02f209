"""`rankscope import` of torch's Flight Recorder dumps (JSON and pickle) from a real 3-rank gloo
run with the hook attached to a real collector: a hang's dumps give the same ``hangs`` row
(op, seq, waiting and missing ranks) as the hook's live records of the same run, and
``rankscope health`` names it; a healthy run's dumps give the hook's completed collectives
(group, seq, op) and no hang or desync. Bad dumps are named, never executed.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_import_flight_recorder.py."""

from __future__ import annotations

import pickle

import pytest

from tests._import_util import rankscope


def test_a_pickle_naming_a_class_is_refused_unexecuted(tmp_path, capsys):
    class Boom:
        def __reduce__(self):
            return (print, ("EXECUTED",))

    bad = tmp_path / "dumps" / "nccl_trace_rank_0"
    bad.parent.mkdir()
    bad.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [Boom()]}, protocol=4))
    assert rankscope("import", bad.parent, "--data-dir", tmp_path / "data") == 1
    captured = capsys.readouterr()
    assert "EXECUTED" not in captured.out
    assert f"{bad}: not a readable Flight Recorder dump" in captured.err and "builtins.print" in captured.err


# -- what dumps no one here wrote may hold: bad files named and skipped, never a traceback ---------

import json  # noqa: E402
import random  # noqa: E402

from collector.tools.importers.dispatch import parse_path  # noqa: E402
from collector.tools.importers.flight_recorder import WITHOUT_DUMP  # noqa: E402


def _entry(seq: int, pg=("1", "undefined"), op="all_reduce", numel=8) -> dict:
    """An entry as torch 2.13's gloo writes it (no frames in JSON)."""
    return {
        "collective_seq_id": seq,
        "input_dtypes": ["Float"],
        "input_sizes": [[numel]],
        "is_p2p": False,
        "output_dtypes": ["Float"],
        "output_sizes": [[numel]],
        "process_group": list(pg),
        "profiling_name": f"gloo:{op}",
        "record_id": seq - 1,
        "state": "scheduled",
        "thread_id": "140122979535744",
        "thread_name": "python",
        "time_created_ns": 1795830279873302441 + seq,
        "timeout_ms": 120000,
    }


def _dump(entries) -> dict:
    return {"version": "2.10", "pg_config": {"": {"desc": "", "name": "", "ranks": "[]"}}, "entries": entries}


def _write(folder, name: str, data) -> None:
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))


def test_a_subgroup_gloo_does_not_describe_gets_its_members_from_the_dumps_that_hold_it(tmp_path):
    """The issue's crash: pg_config lists only the default group (ranks '[]'); the subgroup's members
    are the ranks whose dumps hold its entries, and the import says so."""
    dumps = tmp_path / "dumps"
    for rank in range(3):
        world = [_entry(s, ("0", "default_pg")) for s in (1, 2)]
        sub = [_entry(s) for s in (1, 2, 3)] if rank < 2 else []
        _write(dumps, f"fr{rank}.json", _dump(world + (sub if rank == 0 else sub[:2])))
    result = parse_path(dumps)
    assert not result.parsed.problems, result.parsed.problems
    assert any("process group 1 (undefined)" in n and "0-1" in n for n in result.notes), result.notes
    rows = result.parsed.rows
    assert {r["group_name"] for r in rows[("comm", 0)]} == {"world", "g[0-1]"}
    (stuck,) = rows[("inflight", 0)]
    assert (stuck["group_name"], stuck["seq"], stuck["group_ranks"], stuck["hang_after_s"]) == ("g[0-1]", 3, "0-1", 0)
    assert result.parsed.world_size == 3 and result.parsed.hints[WITHOUT_DUMP] == []


BAD = {
    "truncated JSON": '{"version": "2.10", "pg_config": {}, "entries": [{"collective_seq_id": 1',
    "entries not a list": {"version": "2.10", "pg_config": {}, "entries": {"a": 1}},
    "pg_config not a map": {"version": "2.10", "pg_config": [1, 2], "entries": []},
    "nested 10,000 deep": '{"pg_config": {}, "entries": ' + "[" * 10_000 + "]" * 10_000 + "}",
    "ranks not a list": {"pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 'x'"}}, "entries": []},
    "a rank past any world": {"pg_config": {"0": {"desc": "default_pg", "ranks": "[10**12]"}}, "entries": []},
    "huge ranks text": {
        "pg_config": {"0": {"desc": "default_pg", "ranks": "[" + "1, " * 500_000 + "1]"}},
        "entries": [],
    },
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_a_bad_dump_is_named_and_skipped(tmp_path, what):
    dumps = tmp_path / "dumps"
    _write(dumps, "fr0.json", BAD[what])
    _write(dumps, "fr1.json", _dump([_entry(1, ("0", "default_pg"))]))
    result = parse_path(dumps)  # never raises
    named = [p for p in result.parsed.problems if p.path.endswith("fr0.json")]
    bad_pg = what in ("pg_config not a map", "ranks not a list", "a rank past any world", "huge ranks text")
    assert named or (bad_pg and not result.parsed.problems), (what, result.parsed.problems)
    assert all("cannot be parsed as" not in str(p) for p in result.parsed.problems), result.parsed.problems
    assert result.parsed.rows.get(("comm", 1)) or result.parsed.rows.get(("inflight", 1)), "the good dump was lost"


def test_a_rank_number_no_world_has_is_refused(tmp_path):
    _write(tmp_path / "d", "fr99999999999.json", _dump([_entry(1)]))
    result = parse_path(tmp_path / "d")
    assert "rank 99999999999 is out of range" in str(result.parsed.problems[0]), result.parsed.problems


_WRONG = [None, "", "x", -1, 2**70, 1.5, [], {}, [[]], [["a"]], [[-3]], [[1] * 100], {"a": [1]}, True]
_FIELDS = [
    "collective_seq_id",
    "process_group",
    "profiling_name",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "state",
    "time_created_ns",
    "timeout_ms",
    "thread_id",
    "frames",
    "is_p2p",
]


def test_fuzz_wrong_types_in_any_field_never_raise_and_name_the_entry(tmp_path):
    """Every field of real-looking entries set to values of the wrong type or size, 100 dumps of 3 ranks:
    each import finishes; an entry that cannot be read is named (file and entry) and the rest imported."""
    rng = random.Random(44)
    for trial in range(100):
        dumps = tmp_path / f"t{trial}"
        for rank in range(3):
            entries = [_entry(s, ("0", "default_pg")) for s in range(1, 5)] + [_entry(s) for s in (1, 2)]
            for _ in range(rng.randint(1, 4)):
                e = rng.choice(entries)
                e[rng.choice(_FIELDS)] = rng.choice(_WRONG)
            if rng.random() < 0.1:
                entries.append(rng.choice(_WRONG))
            _write(dumps, f"nccl_trace_rank_{rank}.json", _dump(entries))
        result = parse_path(dumps)
        for p in result.parsed.problems:
            assert "cannot be parsed as" not in str(p) and p.where.startswith(("entry", "")), str(p)
        assert result.parsed.row_count("comm") + result.parsed.row_count("inflight") > 0


def _nccl(rank: int, entries: list[dict]) -> bytes:
    """A dump as NCCL's watchdog writes it: a pickle, every group in pg_config with its ranks, tracked states."""
    pg_config = {"0": {"desc": "default_pg", "ranks": "[0, 1, 2, 3]"}, "3": {"desc": "TP", "ranks": "[2, 3]"}}
    return pickle.dumps({"version": "2.10", "pg_config": pg_config, "entries": entries, "rank": rank})


def _tracked(seq: int, state: str, pg=("0", "default_pg"), **more) -> dict:
    e = _entry(seq, pg, **more)
    e.update(state=state, time_discovered_started_ns=10_000 + seq, time_discovered_completed_ns=None)
    e["frames"] = [{"name": "train_step", "filename": "/job/train.py", "line": 40 + seq}]
    return e


def test_nccl_states_decide_and_a_collective_every_member_entered_waits_for_its_timeout(tmp_path):
    """NCCL tracks each entry's state: 'completed' is done; 'started' where every member entered it is a
    stall judged by its timeout (not hung at once); 'scheduled' with a member absent is hung at once; a
    send/recv is a p2p[src->dst] row as the hook writes it (global ranks, seq per direction), a recv whose
    sender never sent hung at once. A 'rank' key beats the file name."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for rank in range(4):
        entries = [_tracked(1, "completed"), _tracked(2, "started")]  # world #2: everyone in it, running
        if rank < 2:  # a pipeline's send and recv, done
            name = "nccl:send 0->1" if rank == 0 else "nccl:recv 1<-0"
            entries.append(dict(_tracked(1, "completed"), is_p2p=True, profiling_name=name))
        if rank == 2:  # rank 2 (TP rank 0) waits for a recv from rank 3, which never sent
            entries.append(dict(_tracked(1, "started", ("3", "TP")), is_p2p=True, profiling_name="nccl:recv 0<-1"))
        if rank in (2, 3):
            entries.append(_tracked(1, "completed", ("3", "TP")))
            if rank == 2:  # rank 3 never enters TP #2
                entries.append(_tracked(2, "scheduled", ("3", "TP")))
        (dumps / f"host-{rank // 2}.example_dump_{rank}").write_bytes(_nccl(rank, entries))
    result = parse_path(dumps)
    assert not result.parsed.problems and not result.notes, (result.parsed.problems, result.notes)
    rows = result.parsed.rows
    assert sorted((r["group_name"], r["seq"]) for r in rows[("comm", 2)]) == [("TP[2-3]", 1), ("world", 1)]
    waiting = {(r["group_name"], r["seq"]): r["hang_after_s"] for r in rows[("inflight", 2)]}
    assert waiting == {("world", 2): 120.0, ("TP[2-3]", 2): 0.0, ("p2p[3->2]", 1): 0.0}
    assert [(r["group_name"], r["seq"], r["op"]) for r in rows[("comm", 1)] if r["group_name"].startswith("p2p")] == [
        ("p2p[0->1]", 1, "recv")
    ]
    assert rows[("stacks", 2)][0]["innermost"].startswith("/job/train.py:42")
    assert result.parsed.world_size == 4
