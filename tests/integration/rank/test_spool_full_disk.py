"""A rank whose spool disk is full (issue 49): its collector is down and its spool dir sits on a
full tmpfs (root: mounted here, unmounted in teardown). Training goes on and exits 0; the rank
says once that it cannot spool and keeps the records in memory up to max_unacked_bytes, then
drops the oldest (never the Hello), counted for the RunEnd's dropped records and said once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from collector.testing import disks
from collector.testing.ports import free_port

SCRIPT = textwrap.dedent("""
    import sys
    from collector import hook
    from collector.rank import session
    active = hook.attach(run="full-spool", endpoint=sys.argv[1])
    client = active.client
    client.cfg.max_unacked_bytes = 20_000  # a small bound, so the test reaches it quickly
    client.cfg.spool_after_s = 0.0
    client.cfg.close_timeout_s = 0.5
    for step in range(3000):
        session.emit("timers", step=step, name="fwd", start_ns=step, dur_ns=1000)
    hook.detach()
    print("trained; dropped", client.dropped_unspooled, "kept", len(client._unacked), flush=True)
""")


@pytest.fixture
def full_disk(tmp_path):
    try:
        with disks.small_disk(tmp_path / "disk", "64k") as disk:
            (disk / "spool").mkdir(mode=0o700)
            disks.fill(disk / "filler")  # every free byte taken
            yield disk
    except disks.DiskUnavailable as exc:
        pytest.skip(str(exc))


def test_a_full_spool_disk_drops_the_oldest_counted_and_training_goes_on(full_disk):
    env = {**os.environ, "RANKSCOPE_SPOOL_DIR": str(full_disk / "spool"), "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    rank = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"127.0.0.1:{free_port()}"], env=env, capture_output=True, text=True, timeout=180
    )
    assert rank.returncode == 0 and "trained" in rank.stdout, rank.stderr
    assert "Traceback" not in rank.stderr, rank.stderr
    cannot = [line for line in rank.stderr.splitlines() if "cannot spool" in line]
    assert len(cannot) == 1 and "No space left on device" in cannot[0], rank.stderr
    dropping = [line for line in rank.stderr.splitlines() if "dropping the oldest" in line]
    assert len(dropping) == 1, rank.stderr
    dropped = int(rank.stdout.split("dropped")[1].split()[0])
    assert dropped > 0, rank.stdout
    assert not list((full_disk / "spool").iterdir()), "a half-written spool file was left behind"
