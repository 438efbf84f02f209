"""Importers bound what a file may cost: nesting depth, file size and the rows a file
may claim; a file over a bound is reported by name (and the field that broke it) and
skipped, and every other file of the same import still lands (issue #28, item 8).

Measured before these bounds: a 400 KB deeply nested JSON beside a good CSV made
``rankscope import`` die with a RecursionError traceback (the CSV's rows lost), and a
300-byte log_summary claiming a count of 40,000,000 grew to 2 GiB RSS and beyond.

Split by tier: the pure-function tests are in tests/unit/tools/test_import_bounds.py."""

from __future__ import annotations

from tests._cli_child import run_cli
from tests._import_util import query
from tests.unit.tools.test_import_bounds import _csv_rows_landed, _folder, _summary


def _import_in_a_child(src, data) -> tuple[int, str, int]:
    """``rankscope import`` as a process: exit code, stderr, its own peak RSS in bytes."""
    code, _, err, peak = run_cli("import", str(src), "--data-dir", str(data))
    return code, err, peak


def test_a_summary_claiming_forty_million_collectives_costs_only_itself(tmp_path):
    src, data = _folder(tmp_path, comms_summary_rank0__json=_summary(40_000_000))
    assert len(_summary(40_000_000)) < 300
    code, err, maxrss = _import_in_a_child(src, data)
    assert code == 1, err
    where = "summary['all_reduce']['4096'].count"
    assert f"{src / 'comms_summary_rank0.json'}:{where}: " in err and "40,000,000" in err, err
    assert "Traceback" not in err
    assert _csv_rows_landed(data) == 2
    assert query(data, "SELECT count(*) FROM comm")[0][0] == 0  # nothing of the bad file
    # the interpreter, pyarrow and duckdb take ~150 MiB; the claimed rows would take tens of GiB
    assert maxrss < 600 << 20, f"peak RSS {maxrss / 2**20:.0f} MiB"
