"""`rankscope export`: a Perfetto/Chrome trace with one track per rank and group holding
every timed collective, Parquet files that import back, and clear errors.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_export.py."""

from __future__ import annotations

import json

from tests._import_util import FIXTURE, only_run, query, rankscope


def _validate_trace(path) -> dict:
    """Checks the Trace Event Format's rules for what we write, returns the parsed JSON."""
    trace = json.loads(path.read_text())
    assert isinstance(trace["traceEvents"], list)
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and e["name"]
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["ts"] >= 0 and e["dur"] >= 0
        else:
            assert e["name"] in ("process_name", "process_sort_index", "thread_name") and "args" in e
    return trace


def test_perfetto_of_an_imported_deepspeed_run_counts_untimed_rows(tmp_path):
    data = tmp_path / "data"
    assert rankscope("import", FIXTURE, "--run", "ds", "--data-dir", data) == 0
    out = tmp_path / "ds.json"
    assert rankscope("export", "--perfetto", "ds", out, "--data-dir", data) == 0
    trace = _validate_trace(out)
    run_id = only_run(data)
    timed, untimed = query(
        data, "SELECT count(start_ns), count(*) - count(start_ns) FROM comm WHERE run_id = ?", [run_id]
    )[0]
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "comm"]) == timed > 0
    assert trace["otherData"]["comm_rows_without_times"] == untimed > 0
