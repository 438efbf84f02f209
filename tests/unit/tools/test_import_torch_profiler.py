"""How the torch.profiler importer times a collective (collector.tools.importers.torch_profiler), on
a hand-made trace of one rank: a synchronous all_reduce the script called (the c10d op inside
c10d_logger's wrapper, the gloo worker running it) and one issued from C++ (DDP's bucket, no
Python call around it). Real traces are compared with the hook in
tests/integration/tools/test_import_torch_profiler.py."""

from __future__ import annotations

import json

from collector.tools.importers import torch_profiler

BASE_NS = 1_700_000_000_000_000_000
INFO = {"backend": "gloo", "rank": 0, "world_size": 2, "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}
SHAPES = {"Input Dims": [[[4]]], "Input type": ["TensorList"]}


def _x(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", args=None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args or {}}


def _rows(tmp_path, events) -> list[tuple[int, int]]:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": INFO, "baseTimeNanoseconds": BASE_NS, "traceEvents": events}))
    out = torch_profiler.parse(path)
    assert not out.problems, out.problems
    return [((r["start_ns"] - BASE_NS) // 1000, (r["end_ns"] - BASE_NS) // 1000) for r in out.rows[("comm", 0)]]


def _collectives(with_stack: bool) -> list[dict]:
    events = [
        _x("ProfilerStep#0", 0, 5000),
        # the script's dist.all_reduce: the call 100-900 µs, c10d's op 150-200, gloo's work 180-600
        _x("c10d::allreduce_", 150, 50, args=SHAPES),
        _x("gloo:all_reduce", 180, 420, tid=7, args={"Input Dims": [[4]], "Input type": ["float"]}),
        # DDP's bucket from C++: no Python call around it
        _x("c10d::allreduce_", 2000, 30, tid=3, args=SHAPES),
        _x("gloo:all_reduce", 2010, 300, tid=7, args={"Input Dims": [[4]], "Input type": ["float"]}),
    ]
    if with_stack:
        events += [
            _x("torch/distributed/c10d_logger.py(80): wrapper", 100, 800, cat="python_function"),
            _x("torch/distributed/distributed_c10d.py(3155): all_reduce", 110, 780, cat="python_function"),
            _x("torch/distributed/distributed_c10d.py(1394): is_initialized", 120, 5, cat="python_function"),
            # a later call on the bucket's thread that does not hold its op
            _x("torch/distributed/c10d_logger.py(80): wrapper", 1500, 100, tid=3, cat="python_function"),
        ]
    return events


def test_with_python_stacks_a_called_collective_runs_from_the_call_to_its_return(tmp_path):
    assert _rows(tmp_path, _collectives(with_stack=True)) == [(100, 900), (2000, 2310)]


def test_without_stacks_it_runs_from_the_c10d_op_to_the_workers_end(tmp_path):
    assert _rows(tmp_path, _collectives(with_stack=False)) == [(150, 600), (2000, 2310)]
