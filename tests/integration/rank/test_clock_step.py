"""A rank's wall clock stepped by an hour mid-run (issue 49), as NTP may: the test moves the rank's
view of time (``time.time`` / ``time.time_ns`` shifted from step 30 of 60) in a real hooked process
with gloo collectives, streaming to a real collector. Every timestamp the rank stores stays on the
run's one time line (collector.rank.clock: perf_counter from one anchor), so no table jumps by the
hour, no duration is negative, nothing is refused, and ``rankscope health`` finds no hang or
silent rank, and names the step: rank 0's system clock stepped back (forward) 1.0 h, at step 30 or between
the steps of the host samples around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from collector.data import catalog
from collector.tools.launch import CollectorProcess

ROOT = Path(__file__).resolve().parents[3]

RANK = textwrap.dedent("""
    import sys, time
    import torch, torch.distributed as dist
    from collector import hook
    endpoint, store, shift_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    hook.attach(run="clock-step", endpoint=endpoint)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    for step in range(60):
        if step == 30:  # NTP steps the wall clock
            real_ns, real = time.time_ns, time.time
            time.time_ns = lambda: real_ns() + int(shift_s * 1e9)
            time.time = lambda: real() + shift_s
        hook.step(step)
        dist.all_reduce(torch.ones(64))
        hook.log({"loss": 1.0 / (step + 1)}, step=step)
        time.sleep(0.02)
    dist.destroy_process_group()
    hook.detach()
    print("trained", flush=True)
""")


def _run(tmp_path, shift_s: float) -> None:
    data = tmp_path / "data"
    with CollectorProcess(data, "--flush-interval", "0.05") as collector:
        env = {**os.environ, "WORLD_SIZE": "1", "RANK": "0", "OMP_NUM_THREADS": "1"}
        rank = subprocess.run(
            [sys.executable, "-c", RANK, collector.address, str(tmp_path / "store"), str(shift_s)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert rank.returncode == 0 and "trained" in rank.stdout, rank.stderr
        assert "rejected" not in rank.stderr and "Traceback" not in rank.stderr, rank.stderr
    con = catalog.connect(data)
    try:
        (run_id,) = con.execute("SELECT run_id FROM runs WHERE name = 'clock-step'").fetchone()
        spans = {}
        for table, column in (("monitor", "time_ns"), ("comm", "start_ns"), ("host", "time_ns"), ("memory", "time_ns")):
            spans[table] = con.execute(
                f"SELECT count(*), max({column}) - min({column}) FROM {table} WHERE run_id = ?", [run_id]
            ).fetchone()
        bad = con.execute("SELECT count(*) FROM comm WHERE run_id = ? AND end_ns < start_ns", [run_id]).fetchone()[0]
        loss = con.execute("SELECT count(*) FROM monitor WHERE run_id = ? AND tag = 'loss'", [run_id]).fetchone()[0]
    finally:
        con.close()
    assert loss == 60, f"{loss} of 60 loss points stored"
    for table, (rows, span_ns) in spans.items():
        assert rows > 0 or table in ("host", "memory"), f"no {table} rows"  # those two: if sampled in time
        assert rows == 0 or span_ns < 600e9, f"{table} timestamps span {span_ns / 1e9:.0f} s: the clock step moved them"
    assert bad == 0, f"{bad} comm rows end before they start"
    health = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--json", "--data-dir", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert health.returncode == 1, health.stdout + health.stderr
    found = json.loads(health.stdout)
    assert not [f for f in found if f["kind"] in ("hang", "stuck", "silent", "crash")], health.stdout
    # the clock finding names the step: the rank, which way, by how much, when
    [step] = [f for f in found if f["kind"] == "clock_step"]
    first, last = step["steps"]  # from the step after the last sample before it to the first sample after it
    assert step["ranks"] == [0] and first <= 30 <= last <= 36, step
    assert abs(step["evidence"]["jump_s"] - shift_s) < 1.0, step
    assert f"stepped {'back' if shift_s < 0 else 'forward'} 1.0 h " in step["text"], step["text"]


def test_a_wall_clock_stepped_back_an_hour_moves_no_timestamp(tmp_path):
    _run(tmp_path, -3600.0)


@pytest.mark.slow
def test_a_wall_clock_stepped_forward_an_hour_moves_no_timestamp(tmp_path):
    _run(tmp_path, 3600.0)
