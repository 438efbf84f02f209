"""`rankscope health` over the shipped sample runs: findings as lines or JSON, exit codes
a scheduler can act on, and a clear message for a run or data dir that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[3] / "sample_runs"


def health(*args: str, data_dir=SAMPLES) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_slow_rank_is_a_warning_naming_it():
    out = health("zero2-slow-rank3", "--json")
    assert out.returncode == 1, out.stderr
    found = json.loads(out.stdout)
    assert {"kind", "severity", "ranks", "text", "cost_ms_per_step", "evidence"} <= set(found[0])
    stragglers = [f for f in found if f["kind"] == "straggler" and f["ranks"] == [3]]
    assert stragglers and stragglers[0]["severity"] == "warning"
    assert stragglers[0]["cost_ms_per_step"] > 20 and stragglers[0]["evidence"]["op"] == "reduce_scatter_tensor"
    lines = health("zero2-slow-rank3").stdout.splitlines()
    assert any("rank 3 costs" in line and "per step" in line for line in lines)


def test_the_hang_run_is_critical_naming_the_missing_rank():
    out = health("zero2-hang-rank2", "--json")
    assert out.returncode == 2, out.stderr
    hangs = [f for f in json.loads(out.stdout) if f["kind"] == "hang"]
    assert len(hangs) == 1 and hangs[0]["severity"] == "critical", hangs
    assert "waiting for rank 2" in hangs[0]["text"], hangs[0]["text"]


def test_the_simulated_run_names_its_straggler_with_a_cost():
    out = health("simulated-256-ranks", "--json")
    assert out.returncode == 1, out.stderr
    found = json.loads(out.stdout)
    stragglers = [f for f in found if f["kind"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[117]], found
    assert stragglers[0]["cost_ms_per_step"] > 20


def test_the_other_sample_runs_raise_no_straggler_or_communication_warning():
    for run, expected in (("moe-skewed-expert", "moe_imbalance"), ("zero3-fp16-overflows", "loss_scale")):
        out = health(run, "--json")
        assert out.returncode in (0, 1), out.stderr
        found = json.loads(out.stdout)
        warned = [f for f in found if f["severity"] in ("warning", "critical")]
        assert warned and all(f["kind"] == expected for f in warned), (run, warned)
        for f in found:
            shares = [v for k, v in f["evidence"].items() if k in ("comm", "waiting", "transfer", "exposed", "share")]
            assert all(0 <= v <= 1 for v in shares), (run, f)
            # advice names only keys the bundled engine honours
            assert "allgather_bucket_size" not in f["text"], f["text"]


def test_the_skewed_expert_is_named_with_its_dropped_tokens():
    out = health("moe-skewed-expert", "--json")
    assert out.returncode == 1, out.stderr
    found = [f for f in json.loads(out.stdout) if f["kind"] == "moe_imbalance"]
    assert [(f["evidence"]["layer"], f["evidence"]["expert"]) for f in found] == [(0, 0), (1, 0)], found
    assert all(f["evidence"]["share"] > 0.5 and f["evidence"]["dropped"] > 9000 for f in found), found


def test_a_healthy_run_says_so_in_one_line_and_notes_on_request(tmp_path):
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "collector.tools.cli",
            "simulate",
            "--ranks",
            "8",
            "--steps",
            "30",
            "--data-dir",
            tmp_path,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    out = health("simulated", data_dir=tmp_path)
    assert out.returncode == 0
    (line,) = out.stdout.splitlines()
    assert "healthy, nothing to fix" in line and "--all" in line
    noted = health("simulated", "--all", data_dir=tmp_path).stdout.splitlines()
    assert len(noted) > 1 and any("communication is in flight" in n for n in noted)


def test_unknown_run_and_missing_data_dir_exit_3_with_a_message(tmp_path):
    out = health("no-such-run")
    assert out.returncode == 3 and "no run with id or name 'no-such-run'" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", "x", "--data-dir", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3 and "does not exist" in out.stderr and "Traceback" not in out.stderr
