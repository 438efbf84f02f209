"""`rankscope health` over the shipped sample runs: findings as lines or JSON, exit codes
a scheduler can act on, and a clear message for a run or data dir that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "sample_runs"


def health(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", "--data-dir", str(SAMPLES), *args],
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
    lines = health("zero2-slow-rank3").stdout.splitlines()
    assert any("rank 3 arrives last" in line for line in lines)


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
