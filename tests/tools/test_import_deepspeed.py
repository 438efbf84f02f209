"""`rankscope import` of real DeepSpeed outputs (tests/fixtures/deepspeed_run, made by
its generate.py with DeepSpeed 0.19.8: ZeRO-2 on 2 CPU ranks) into a real data dir,
checked through the DuckDB catalog against the files themselves."""

from __future__ import annotations

import json
import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from collector.testing.collectors import live_collector
from tests.tools._import_util import FIXTURE, copy_fixture, only_run, query, rankscope


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    assert rankscope("import", FIXTURE, "--run", "tiny-zero2", "--data-dir", data) == 0
    return data, only_run(data)


def test_run_row(imported):
    data, run_id = imported
    (row,) = query(data, "SELECT name, world_size, source, status, n_ranks FROM runs WHERE run_id = ?", [run_id])
    assert row == ("tiny-zero2", 2, "import", "finished", 2)


def test_monitor_series_match_tensorboard(imported):
    data, run_id = imported
    acc = EventAccumulator(str(next((FIXTURE / "ds_logs" / "tensorboard").rglob("events.out.tfevents*"))))
    acc.Reload()
    expected = {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    got = {
        (tag, samples): value
        for tag, samples, value in query(data, "SELECT tag, samples, value FROM monitor WHERE run_id = ?", [run_id])
    }
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6)
    # csv_monitor wrote the same events: kept once, and they agree with tensorboard's
    for csv in (FIXTURE / "ds_logs" / "csv_monitor").rglob("*.csv"):
        header, *lines = csv.read_text().splitlines()
        tag = "Train/Samples/" + header.split(",")[1]
        for line in lines:
            samples, value = line.split(",")
            assert got[(tag, int(samples))] == pytest.approx(float(value), rel=1e-6)


def test_comm_summary_counts_and_bytes(imported):
    data, run_id = imported
    summary = json.loads((FIXTURE / "comms_summary_rank1.json").read_text())
    world = summary["metadata"]["world_size"]
    rows = query(
        data,
        """SELECT log_name, bytes, count(*), count(start_ns), avg(algbw_gbs) FROM comm
                          WHERE run_id = ? AND rank = 1 GROUP BY ALL""",
        [run_id],
    )
    got = {(name, nbytes): (n, timed, algbw) for name, nbytes, n, timed, algbw in rows}
    expected = {}
    for name, sizes in summary["summary"].items():
        for size, stats in sizes.items():
            gathered = name.startswith("all_gather")  # DeepSpeed logs one rank's piece; S is n times it
            expected[(name, int(size) * world if gathered else int(size))] = stats
    assert got.keys() == expected.keys()
    for key, stats in expected.items():
        n, timed, algbw = got[key]
        assert n == stats["count"] and timed == 0  # a summary has no per-instance times
        assert algbw == pytest.approx(key[1] / (stats["avg_latency_ms"] * 1e6))


def test_verbose_lines_are_one_row_each_with_times(imported):
    data, run_id = imported
    lines = [line for line in (FIXTURE / "console.log").read_text().splitlines() if "comm op: " in line]
    rows = query(
        data,
        """SELECT log_name, end_ns - start_ns FROM comm WHERE run_id = ? AND rank = 0
                          ORDER BY end_ns, log_name""",
        [run_id],
    )
    assert len(rows) == len(lines) > 0
    want = sorted(
        (
            re.search(r"comm op: (.+?) \|", line).group(1),
            round(float(re.search(r"time \(ms\): ([0-9.]+)", line).group(1)) * 1e6),
        )
        for line in lines
    )
    assert sorted(rows) == want


def test_flops_total_and_tree(imported):
    data, run_id = imported
    text = (FIXTURE / "flops_profile.txt").read_text()
    total = re.search(r"^fwd flops per GPU:\s+([0-9.]+) K", text, re.M).group(1)
    rows = query(
        data,
        "SELECT module, parent, depth, module_type, flops, macs FROM flops WHERE run_id = ? ORDER BY module",
        [run_id],
    )
    root = rows[0]
    assert root[:4] == ("", None, 0, "Sequential") and root[4] == round(float(total) * 1000)
    children = [r for r in rows if r[2] == 1]
    assert [r[3] for r in children] == re.findall(r"^  \(\d+\): (\w+)\(", text, re.M)
    for _module, parent, _depth, kind, flops, macs in children:
        assert parent == "" and macs is not None
        if kind == "Linear":  # a Linear's flops are 2 x its MACs; the report rounds to 3 digits
            assert flops == pytest.approx(2 * macs, rel=0.01)


def test_corrupt_files_are_named_and_the_rest_kept(tmp_path, capsys):
    src = copy_fixture(tmp_path / "ds")
    good_csv = next(src.rglob("Train_Samples_lr.csv"))
    bad_csv = good_csv.with_name("Train_Samples_loss.csv")
    bad_csv.write_text("step,loss\n8,0.5\n16,not-a-number\n24,0.25\n")
    events = next(src.rglob("events.out.tfevents*"))
    full = events.read_bytes()
    events.write_bytes(full[: len(full) // 2])
    (src / "table.parquet").write_bytes(b"PAR1" + b"\0" * 100)  # truncated Parquet
    data = tmp_path / "data"
    # imports what it can, and says by its exit status that something was skipped
    assert rankscope("import", src, "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert f"{bad_csv}:line 3: not a number" in err
    assert f"{events}:record" in err and "cut short" in err
    assert f"{src / 'table.parquet'}: unreadable Parquet" in err
    run_id = only_run(data)
    (loss,) = query(
        data,
        "SELECT list(value ORDER BY samples) FROM monitor WHERE run_id = ? AND tag = ?",
        [run_id, "Train/Samples/loss"],
    )
    assert loss[0] == [0.5, 0.25]
    # the half event file's records are kept; the csv files fill in the rest of each series
    tags = dict(query(data, "SELECT tag, count(*) FROM monitor WHERE run_id = ? GROUP BY tag", [run_id]))
    assert all(n == 6 for tag, n in tags.items() if tag != "Train/Samples/loss")
    assert query(data, "SELECT count(*) FROM comm WHERE run_id = ?", [run_id])[0][0] == 47


def test_import_through_a_live_collector(tmp_path):
    data = tmp_path / "data"
    with live_collector(data) as (endpoint, _):
        assert rankscope("import", FIXTURE / "comms_summary_rank1.json", "--endpoint", endpoint) == 0
    run_id = only_run(data)
    n = sum(
        s["count"]
        for sizes in json.loads((FIXTURE / "comms_summary_rank1.json").read_text())["summary"].values()
        for s in sizes.values()
    )
    assert query(data, "SELECT count(*), min(rank), max(rank) FROM comm WHERE run_id = ?", [run_id])[0] == (n, 1, 1)


def test_unknown_file_is_an_error(tmp_path, capsys):
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    assert rankscope("import", odd, "--data-dir", tmp_path / "data") == 1
    assert f"{odd}: not a DeepSpeed output" in capsys.readouterr().err


def test_import_into_a_data_dir_a_collector_holds_says_use_endpoint(tmp_path, capsys):
    data = tmp_path / "data"
    with live_collector(data):
        assert rankscope("import", FIXTURE / "flops_profile.txt", "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert "a collector is running on" in err and "with --endpoint HOST:PORT" in err
