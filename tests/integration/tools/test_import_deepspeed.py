"""`rankscope import` of real DeepSpeed outputs into a real data dir, checked through the DuckDB
catalog against the files themselves: the committed ones (tests/fixtures/deepspeed_run, made by its
generate.py with DeepSpeed 0.19.8: ZeRO-2 on 2 CPU ranks) and, where the DeepSpeed venv is there
(benches/_deepspeed_venv.py), a fresh run of the same generate.py with a wide first layer, whose
root module's FLOPS rate DeepSpeed prints in mFLOPS. Every output kind the importers claim (flops
profile, comms summaries, the comms logger's verbose lines, csv_monitor, TensorBoard) imports with
no problem, and every figure DeepSpeed printed is in the data: DeepSpeed's own formatting functions
print the imported values back to the same text.

Split by tier: the pure-function tests are in tests/unit/tools/test_import_deepspeed.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from collector.testing.collectors import live_collector
from tests._import_util import FIXTURE, only_run, query, rankscope

GENERATE = FIXTURE / "generate.py"
WIDE = 32768  # the live run's first layer: the root's rate, ~1.7e7 flops over "1.8 Gs", prints as "10 mFLOPS"


def _live_run(out) -> None:
    from benches import _deepspeed_venv as venv

    have = venv.versions()
    if not have or have["deepspeed"] != venv.DEEPSPEED:
        pytest.skip(
            f"DeepSpeed {venv.DEEPSPEED} is not in {venv.VENV} (found {have}); create it with "
            "`python -m benches._deepspeed_venv` (make test and make ds-venv do, when the network allows)"
        )
    try:
        env = venv.ensure_tensorboard()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(
            f"cannot install tensorboard for DeepSpeed's tensorboard monitor into {venv.TENSORBOARD_SIDE}: {exc}"
        )
    done = subprocess.run(
        [str(venv.PYTHON), str(GENERATE), str(out), str(WIDE)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"{GENERATE} failed:\n{(out / 'console.log').read_text()[-4000:]}"


# the live run costs ~40 s (DeepSpeed's import, a 2-rank job): under -m slow, to keep make test's budget
@pytest.fixture(scope="module", params=["committed", pytest.param("live", marks=pytest.mark.slow)])
def imported(request, tmp_path_factory):
    """(data dir, run id, the DeepSpeed outputs): imported with exit 0 and no problem reported."""
    source = FIXTURE
    if request.param == "live":
        source = tmp_path_factory.mktemp("deepspeed") / "run"
        _live_run(source)
    data = tmp_path_factory.mktemp("data")
    cli = "from collector.tools.cli import main; raise SystemExit(main())"
    cmd = [sys.executable, "-c", cli, "import", str(source), "--run", "tiny-zero2", "--data-dir", str(data)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "problem" not in done.stderr and "skipped" not in done.stderr, done.stderr
    return data, only_run(data), source


def test_run_row(imported):
    data, run_id, _ = imported
    (row,) = query(data, "SELECT name, world_size, source, status, n_ranks FROM runs WHERE run_id = ?", [run_id])
    assert row == ("tiny-zero2", 2, "import", "finished", 2)


def test_monitor_series_match_tensorboard(imported):
    data, run_id, source = imported
    acc = EventAccumulator(str(next((source / "ds_logs" / "tensorboard").rglob("events.out.tfevents*"))))
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
    for csv in (source / "ds_logs" / "csv_monitor").rglob("*.csv"):
        header, *lines = csv.read_text().splitlines()
        tag = "Train/Samples/" + header.split(",")[1]
        for line in lines:
            samples, value = line.split(",")
            assert got[(tag, int(samples))] == pytest.approx(float(value), rel=1e-6)


def test_comm_summary_counts_and_bytes(imported):
    data, run_id, source = imported
    summary = json.loads((source / "comms_summary_rank1.json").read_text())
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
    data, run_id, source = imported
    lines = [line for line in (source / "console.log").read_text().splitlines() if "comm op: " in line]
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
    data, run_id, source = imported
    text = (source / "flops_profile.txt").read_text()
    total = re.search(r"^fwd flops per GPU:\s+([0-9.]+) ([KMG]?)\s*$", text, re.M)
    rows = query(
        data,
        "SELECT module, parent, depth, module_type, flops, macs FROM flops WHERE run_id = ? ORDER BY module",
        [run_id],
    )
    root = rows[0]
    scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[total.group(2)]
    assert root[:4] == ("", None, 0, "Sequential") and root[4] == round(float(total.group(1)) * scale)
    children = [r for r in rows if r[2] == 1]
    assert [r[3] for r in children] == re.findall(r"^  \(\d+\): (\w+)\(", text, re.M)
    for _module, parent, _depth, kind, flops, macs in children:
        assert parent == "" and macs is not None
        if kind == "Linear":  # a Linear's flops are 2 x its MACs; the report rounds to 3 digits
            assert flops == pytest.approx(2 * macs, rel=0.01)


# Prints the figures of JSON rows {module: [params, macs, latency_s, rate]} with DeepSpeed's own functions.
_RENDER = """
import json, sys
from deepspeed.profiling.flops_profiler.profiler import (
    duration_to_string, flops_to_string, macs_to_string, params_to_string)
rows = json.load(sys.stdin)
print(json.dumps({m: [params_to_string(p), macs_to_string(c), duration_to_string(t),
                      flops_to_string(round(r, 2)) if r is not None else None]
                  for m, (p, c, t, r) in rows.items()}))
"""


def test_every_module_figure_prints_back_as_deepspeed_printed_it(imported):
    from benches import _deepspeed_venv as venv

    data, run_id, source = imported
    if not venv.PYTHON.exists():
        pytest.skip(f"DeepSpeed's formatting functions are in {venv.VENV}, which is missing (make ds-venv)")
    text = (source / "flops_profile.txt").read_text()
    tree = text[text.index("Detailed Profile per GPU") :]
    # each module's figures: the line after 'Sequential(' for the root, the rest of '(i): Type(' otherwise
    printed = {"": re.search(r"^Sequential\(\n\s+(.*)$", tree, re.M).group(1)}
    printed |= {m: rest for m, rest in re.findall(r"^  \((\d+)\): \w+\((.*)\)$", tree, re.M)}
    rows = query(data, "SELECT module, params, macs, latency_ns, flops FROM flops WHERE run_id = ?", [run_id])
    assert {r[0] for r in rows} == printed.keys()
    figures = {m: [p, c, t / 1e9, f / (t / 1e9) if m and t else None] for m, p, c, t, f in rows}
    done = subprocess.run(
        [str(venv.PYTHON), "-c", _RENDER], input=json.dumps(figures), env=venv.env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for module, (params, macs, latency, rate) in json.loads(done.stdout).items():
        items = printed[module].split(", ")
        assert items[0].split(" = ")[0] == params and items[1].split(" = ")[0] == macs, (module, items)
        assert items[2].split(" = ")[0] == latency, (module, items)
        if rate is not None:  # the root's flops are the summary's total, not its printed rate
            # flops = rate x latency stored as a whole number: the rate back within half a flop of it
            (want, unit), (got, got_unit) = items[3].split(" "), rate.split(" ")
            flops = next(f for m, _, _, _, f in rows if m == module)
            assert got_unit == unit and float(got) == pytest.approx(float(want), rel=1e-3 + 0.5 / flops), items
    root_rate = printed[""].split(", ")[3]
    assert root_rate.endswith("FLOPS") and (source.name != "run" or root_rate.endswith("mFLOPS"))


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


def test_import_into_a_data_dir_a_collector_holds_says_use_endpoint(tmp_path, capsys):
    data = tmp_path / "data"
    with live_collector(data):
        assert rankscope("import", FIXTURE / "flops_profile.txt", "--data-dir", data) == 1
    err = capsys.readouterr().err
    assert "a collector is running on" in err and "with --endpoint HOST:PORT" in err
