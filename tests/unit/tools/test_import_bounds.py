"""Importers bound what a file may cost: nesting depth, file size and the rows a file
may claim; a file over a bound is reported by name (and the field that broke it) and
skipped, and every other file of the same import still lands (issue #28, item 8).

Measured before these bounds: a 400 KB deeply nested JSON beside a good CSV made
``rankscope import`` die with a RecursionError traceback (the CSV's rows lost), and a
300-byte log_summary claiming a count of 40,000,000 grew to 2 GiB RSS and beyond.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_import_bounds.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collector.tools.importers import base, comms_summary
from collector.tools.importers.dispatch import parse_path
from tests._import_util import query, rankscope

GOOD_CSV = "step,loss\n8,1.0\n16,0.5\n"


def _folder(tmp_path, **files) -> tuple:
    src = tmp_path / "in"
    src.mkdir()
    (src / "Train_Samples_loss.csv").write_text(GOOD_CSV)
    for name, body in files.items():
        path = src / name.replace("__", ".")
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
    return src, tmp_path / "data"


def _csv_rows_landed(data) -> int:
    return query(data, "SELECT count(*) FROM monitor WHERE tag = 'Train/Samples/loss'")[0][0]


def _summary(count, **more) -> str:
    entry = {"count": count, "total_latency_ms": 1.0, "avg_latency_ms": 0.5, "msg_size_bytes": 4096}
    return json.dumps({"summary": {"all_reduce": {"4096": entry, **more}}, "metadata": {"rank": 0, "world_size": 2}})


def test_a_deeply_nested_json_costs_only_itself(tmp_path, capsys):
    deep = "[" * 200_000 + "]" * 200_000  # 400 KB
    src, data = _folder(tmp_path, deep__json=deep)
    assert rankscope("import", src, "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert f"{src / 'deep.json'}: " in err and "nested deeper than" in err, err
    assert "Traceback" not in err and "RecursionError" not in err
    assert _csv_rows_landed(data) == 2


def test_a_nested_summary_named_explicitly_is_one_problem(tmp_path):
    path = tmp_path / "comms_summary_rank0.json"
    path.write_text('{"summary": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + ', "metadata": {}}')
    result = parse_path(path)
    assert not result.parsed.rows
    [problem] = result.parsed.problems
    assert problem.path == str(path) and f"deeper than {base.MAX_JSON_DEPTH} levels" in problem.message


def test_claimed_counts_are_summed_over_the_entries(tmp_path):
    per_entry = base.MAX_CLAIMED_ROWS // 2 + 1  # each entry under the bound, the file over it
    path = tmp_path / "comms_summary_rank0.json"
    path.write_text(_summary(per_entry, **{"8192": {"count": per_entry, "avg_latency_ms": 1.0}}))
    parsed = comms_summary.parse(path)
    assert not parsed.rows
    assert [p.where for p in parsed.problems] == ["summary['all_reduce']['8192'].count"]
    assert "file skipped" in parsed.problems[0].message


def test_a_negative_count_is_a_problem_not_silence(tmp_path):
    path = tmp_path / "comms_summary_rank0.json"
    path.write_text(_summary(-5, **{"8192": {"count": 3, "avg_latency_ms": 1.0}}))
    parsed = comms_summary.parse(path)
    assert len(parsed.rows[("comm", 0)]) == 3
    assert [p.where for p in parsed.problems] == ["summary['all_reduce']['4096']"]


def test_a_summary_within_bounds_still_imports_every_counted_row(tmp_path):
    path = tmp_path / "comms_summary_rank0.json"
    path.write_text(_summary(100_000))
    parsed = comms_summary.parse(path)
    assert len(parsed.rows[("comm", 0)]) == 100_000 and not parsed.problems


def test_a_file_over_its_size_bound_is_named_and_skipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(comms_summary, "MAX_BYTES", 4096)  # 64 MiB in earnest
    big = _summary(1, **{str(n): {"count": 1, "avg_latency_ms": 1.0} for n in range(200)})
    src, data = _folder(tmp_path, comms_summary_rank0__json=big)
    assert rankscope("import", src, "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert f"{src / 'comms_summary_rank0.json'}: " in err and "larger than the 4 KiB" in err, err
    assert _csv_rows_landed(data) == 2


def test_a_parquet_file_claiming_more_rows_than_the_bound_is_skipped_unread(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(base, "MAX_FILE_ROWS", 1000)
    # a constant column compresses to almost nothing: a small file, many decoded rows
    rows = 5000
    table = pa.table({"rank": pa.array([0] * rows, pa.int64()), "step": pa.array([1] * rows, pa.int64())})
    src, data = _folder(tmp_path)
    pq.write_table(table, src / "timers.parquet")
    assert rankscope("import", src, "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert f"{src / 'timers.parquet'}: " in err and "5,000 rows" in err and "1,000" in err, err
    assert _csv_rows_landed(data) == 2


def test_a_file_becoming_more_rows_than_the_bound_is_skipped_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "MAX_FILE_ROWS", 10)
    path = tmp_path / "Train_Samples_loss.csv"
    path.write_text("step,loss\n" + "".join(f"{i},1.0\n" for i in range(50)))
    result = parse_path(path)
    assert not result.parsed.rows
    [problem] = result.parsed.problems
    assert "more than 10 rows" in problem.message and "file skipped" in problem.message


@pytest.mark.parametrize("depth, deep", [(3, False), (64, False), (65, True)])
def test_json_depth_is_measured_outside_strings(depth, deep):
    text = '{"a": "[[[[{{{{"' + ', "b": [' * (depth - 1) + "1" + "]" * (depth - 1) + "}"
    assert base.json_depth(text.encode()) == depth
    assert (base.json_depth(text.encode()) > base.MAX_JSON_DEPTH) is deep


def test_a_claimed_world_size_over_the_bound_is_refused_not_given_a_stream_per_rank(tmp_path):
    path = tmp_path / "comms_summary_rank0.json"
    path.write_text(
        json.dumps(
            {
                "summary": {"all_reduce": {"8": {"count": 1, "avg_latency_ms": 1.0}}},
                "metadata": {"rank": 0, "world_size": 40_000_000},
            }
        )
    )
    result = parse_path(path)
    assert not result.parsed.rows and result.parsed.world_size is None
    assert ["world size of 40,000,000" in p.message for p in result.parsed.problems] == [True]


def test_a_file_of_bad_lines_lists_a_bounded_number_of_problems(tmp_path):
    path = tmp_path / "Train_Samples_loss.csv"
    path.write_text("step,loss\n" + "x,1\n" * 1000 + "8,1.0\n")
    parsed = parse_path(path).parsed
    assert len(parsed.problems) == base.MAX_PROBLEMS + 1
    assert "the rest are not listed" in parsed.problems[-1].message
    assert len(parsed.rows[("monitor", 0)]) == 1
