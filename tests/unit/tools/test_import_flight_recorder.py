"""`rankscope import` of torch's Flight Recorder dumps (JSON and pickle) from a real 3-rank gloo
run with the hook attached to a real collector: a hang's dumps give the same ``hangs`` row
(op, seq, waiting and missing ranks) as the hook's live records of the same run, and
``rankscope health`` names it; a healthy run's dumps give the hook's completed collectives
(group, seq, op) and no hang or desync. Bad dumps are named, never executed.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_import_flight_recorder.py."""

from __future__ import annotations

import pickle

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
