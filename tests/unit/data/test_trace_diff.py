"""trace_diff on hand-made Chrome traces, where the answer is known: per-step time is the union of a
name's intervals per thread (a nested call of the same name counts once), the headline names the
suspect's extra Python functions (the innermost two, caller first), and two alike traces give no culprit."""

from __future__ import annotations

import gzip
import json

import pytest

from collector.data import trace_diff

TRAIN, OTHER = 100, 200


def _py(pid_id, parent, name, ts, dur, tid=TRAIN):
    args = {"Python id": pid_id, "Python parent id": parent}
    return {"ph": "X", "cat": "python_function", "name": name, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _op(name, ts, dur, tid=TRAIN, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "tid": tid, "ts": ts, "dur": dur}


def _step_trace(steps: int, slow_us: float) -> dict:
    """``steps`` steps of 100 ms: train() -> [get_batch() -> slow_loader() -> sleep] + mm 20 ms + all_reduce wait."""
    events, ident = [], 1
    for k in range(steps):
        t = k * 100_000.0
        wait = 70_000.0 - slow_us
        events += [
            _py(ident, None, "train.py(10): train", t, 100_000),
            _py(ident + 1, ident, "train.py(20): get_batch", t, 1_000 + slow_us),
            _op("aten::mm", t + 1_000 + slow_us, 20_000),
            _op("aten::mm", t + 5_000 + slow_us, 10_000),  # nested inside the first: counted once
            _py(ident + 4, ident, "c10d_logger.py(80): wrapper", t + 30_000, wait),
            _op("c10d::allreduce_", t + 30_000, wait),
            _py(ident + 5, None, "<built-in method acquire of _thread.lock object at 0x7f00dead>", t, 90_000, OTHER),
        ]
        if slow_us:
            events += [
                _py(ident + 2, ident + 1, "train.py(30): slow_loader", t + 500, slow_us),
                _py(ident + 3, ident + 2, "<built-in function sleep>", t + 600, slow_us - 200),
            ]
        ident += 10
    return {"traceEvents": events}


def test_per_step_time_is_each_names_union_of_intervals_per_step():
    totals, callers = trace_diff.per_step(_step_trace(4, 40_000), 4)
    assert totals["operator"]["aten::mm"] == pytest.approx(20.0)  # 20 ms, the nested 10 ms inside it not added
    assert totals["python"]["train.py(30): slow_loader"] == pytest.approx(40.0)
    assert totals["python"]["sleep"] == pytest.approx(39.8)
    assert "acquire" not in totals["python"]  # another thread's waits are not the step's
    assert callers["sleep"] >= {"train.py(30): slow_loader", "train.py(20): get_batch", "train.py(10): train"}


def test_the_headline_names_the_suspects_extra_functions_caller_first_and_an_equal_operator():
    found = trace_diff.diff(
        _step_trace(3, 40_000), _step_trace(5, 0), suspect_rank=1, reference_rank=0, suspect_steps=3, reference_steps=5
    )
    assert found["headline"].startswith("rank 1 spends +40.0 ms/step in slow_loader → sleep (vs rank 0)")
    assert found["headline"].endswith("; aten::mm equal")
    by_name = {line["name"]: line for line in found["lines"]}
    assert by_name["slow_loader (train.py:30)"]["delta_ms"] == pytest.approx(40.0)
    assert by_name["c10d::allreduce_"]["delta_ms"] == pytest.approx(-40.0)  # the reference waits for it


def test_two_alike_traces_name_no_culprit():
    found = trace_diff.diff(
        _step_trace(3, 0), _step_trace(3, 0), suspect_rank=2, reference_rank=0, suspect_steps=3, reference_steps=3
    )
    assert found["headline"].startswith("rank 2 and rank 0 spend their steps alike")


def test_the_merged_trace_puts_each_rank_in_its_own_process_from_time_zero(tmp_path):
    a, b = _step_trace(2, 40_000), _step_trace(2, 0)
    for e in b["traceEvents"]:
        e["ts"] += 5e9  # another process's clock
    merged = trace_diff.merged([(1, "suspect", a), (0, "reference", b)])
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {1: "rank 1 (suspect)", 0: "rank 0 (reference)"}
    for rank in (0, 1):
        assert min(e["ts"] for e in merged["traceEvents"] if e["pid"] == rank and e["ph"] == "X") == 0
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(a).encode()))
    assert trace_diff.load(path) == a
