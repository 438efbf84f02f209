"""A collector that stops answering mid-run (issue 49; the nearest thing to a partition without
network namespaces): SIGSTOP the real collector for 20 s while a real hooked rank trains, then
SIGCONT it. The rank's steps go on during the stall (telemetry never blocks the training thread),
it finishes and exits 0, every record arrives exactly once after the collector is back, and
``rankscope health`` does not call the rank hung or silent. A true partition (namespaces and
packet drops for minutes) is not tested yet: docs/reliability.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collector.data import catalog
from collector.tools.launch import CollectorProcess

ROOT = Path(__file__).resolve().parents[3]
STEPS, ROWS = 400, 10
STALL_S = 20

RANK = textwrap.dedent("""
    import sys, time
    from collector import hook
    from collector.rank import session
    hook.attach(run="stalled", endpoint=sys.argv[1])
    for step in range(int(sys.argv[2])):
        hook.step(step)
        for i in range(int(sys.argv[3])):
            session.emit("timers", step=step, name=f"t{i}", start_ns=step * 1000 + i, dur_ns=1000)
        print(step, flush=True)
        time.sleep(0.1)
    hook.detach()
    print("trained", flush=True)
""")


def _read_until(stream, want: int, timeout_s: float) -> int:
    """Lines (step numbers) read until step ``want`` or the timeout; the last step seen."""
    deadline, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        if line.strip().isdigit():
            last = int(line)
            if last >= want:
                break
    return last


@pytest.mark.slow  # a 20 s stall on purpose
def test_a_stalled_collector_never_stops_training_and_loses_nothing(tmp_path):
    data = tmp_path / "data"
    env = {**os.environ, "RANKSCOPE_SPOOL_DIR": str(tmp_path / "spool"), "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    with CollectorProcess(data, "--flush-interval", "0.05") as collector:
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK, collector.address, str(STEPS), str(ROWS)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert _read_until(rank.stdout, 20, 120) >= 20, "the rank did not get going"
            collector.proc.send_signal(signal.SIGSTOP)
            stalled_at = time.monotonic()
            try:
                got = _read_until(rank.stdout, 60, STALL_S + 60)
                assert got >= 60, f"training stalled with the collector: reached step {got} of 60"
                time.sleep(max(0.0, STALL_S - (time.monotonic() - stalled_at)))
            finally:
                collector.proc.send_signal(signal.SIGCONT)
            out, err = rank.communicate(timeout=240)
        finally:
            if rank.poll() is None:
                rank.kill()
        assert rank.returncode == 0 and "trained" in out, err
        assert "Traceback" not in err, err
    con = catalog.connect(data)
    try:
        run_id, total, distinct = con.execute(
            "SELECT r.run_id, count(*), count(DISTINCT (t.step, t.name)) FROM timers t JOIN runs r USING (run_id) "
            "WHERE r.name = 'stalled' GROUP BY 1"
        ).fetchone()
    finally:
        con.close()
    assert total == distinct == STEPS * ROWS, f"{total} rows ({distinct} distinct) of {STEPS * ROWS}"
    health = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run_id, "--data-dir", str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert health.returncode in (0, 1), health.stdout + health.stderr
    assert "silent" not in health.stdout and "hang" not in health.stdout, health.stdout
