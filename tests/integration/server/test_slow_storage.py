"""Slow storage under a real collector (issue 49): every fsync of the collector takes 0.2-2 s
(seeded), its own (collector.testing.slow_fsync wraps the process's ``os.fsync``) or its disk's
(a FUSE passthrough whose fsyncs sleep, collector.testing.slow_dir, where libfuse 2 and fusepy
are installed), while
a real rank (``collector.hook``) trains and exits. Acks still mean durable (they come only after
the slow commits), the rank's exit stays prompt (what is not acked by its close timeout goes to its
spool), a reader of the catalog still answers while the commits crawl, and once the spool is
resent every record is stored exactly once. Figures: benches/slow_storage.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from collector.data import catalog, queries
from collector.rank.resend import resend_spooled
from collector.testing.collectors import live_collector

ROOT = Path(__file__).resolve().parents[3]
STEPS, ROWS_PER_STEP = 150, 20
SLOW_COLLECTOR = [sys.executable, "-m", "collector.testing.slow_fsync", "0.2", "2.0", "49", "collect"]
PLAIN_COLLECTOR = [sys.executable, "-m", "collector.tools.cli", "collect"]


def _no_slow_dir() -> str | None:
    """Why a FUSE slow directory cannot be mounted here, or None."""
    from collector.testing import slow_dir

    if slow_dir.MISSING:
        return slow_dir.MISSING
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return "mounting a FUSE directory needs root and /dev/fuse"
    return None


@contextlib.contextmanager
def _disk(tmp_path: Path, device: str):
    """Where the slow collector's data dir goes: tmp_path itself (its own os.fsync sleeps), or a
    FUSE passthrough of tmp_path/disk whose fsyncs sleep 0.2-2 s (collector.testing.slow_dir)."""
    if device == "wrap":
        yield tmp_path, SLOW_COLLECTOR
        return
    (tmp_path / "disk").mkdir()
    mount = tmp_path / "mnt"
    mount.mkdir()
    argv = [sys.executable, "-m", "collector.testing.slow_dir", str(tmp_path / "disk"), str(mount), "0.2", "2.0", "49"]
    fuse = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(mount):
            assert fuse.poll() is None and time.monotonic() < deadline, f"not mounted: {fuse.stderr.read()[-2000:]}"
            time.sleep(0.1)
        yield mount, PLAIN_COLLECTOR
    finally:
        # lazily: a collector a failed test left behind may still hold files there
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        try:
            fuse.wait(30)
        except subprocess.TimeoutExpired:
            fuse.kill()
            fuse.wait()


RANK = textwrap.dedent("""
    import sys, time
    from collector import hook
    from collector.rank import session
    active = hook.attach(run="slow-disk", endpoint=sys.argv[1])
    STEPS, ROWS = int(sys.argv[2]), int(sys.argv[3])
    for step in range(STEPS):
        for i in range(ROWS):
            session.emit("timers", step=step, name=f"t{i}", start_ns=step * 1000 + i, dur_ns=1000)
        time.sleep(0.01)
    t0 = time.monotonic()
    hook.detach()
    print(f"closed in {time.monotonic() - t0:.1f} s; acked {active.client.acked}", flush=True)
""")


@pytest.mark.slow  # ~80 s at load 30: fsync of 0.2-2 s each is slow on purpose
@pytest.mark.parametrize("device", ["wrap", "fuse"])
def test_slow_fsync_keeps_acks_durable_training_prompt_and_readers_answering(tmp_path, device):
    if device == "fuse" and _no_slow_dir():
        pytest.skip(_no_slow_dir())
    with _disk(tmp_path, device) as (disk, slow_collector):
        _slow_storage(disk / "data", tmp_path / "spool", slow_collector)


def _slow_storage(data: Path, spool_dir: Path, slow_collector: list[str]) -> None:
    stderr = tempfile.TemporaryFile(mode="w+")
    collector = subprocess.Popen(
        [*slow_collector, "--data-dir", str(data), "--port", "0", "--no-auto-profile"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        line = collector.stdout.readline()
        match = re.match(r"rankscope collector listening on \S+:(\d+) ", line)
        stderr.seek(0)
        assert match, f"the slow collector did not start: {line!r} {stderr.read()[-2000:]}"
        endpoint = f"127.0.0.1:{match.group(1)}"
        env = {**os.environ, "RANKSCOPE_SPOOL_DIR": str(spool_dir), "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
        rank = subprocess.Popen(
            [sys.executable, "-c", RANK, endpoint, str(STEPS), str(ROWS_PER_STEP)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # while the rank streams into the crawling commits, a reader (the dashboard's queries) answers
        t0 = time.monotonic()
        cat = queries.Catalog(data)
        try:
            queries.list_runs(cat)
        finally:
            cat.close()
        read_s = time.monotonic() - t0
        assert read_s < 20, f"a catalog read took {read_s:.1f} s while fsync was slow"
        out, err = rank.communicate(timeout=240)
        assert rank.returncode == 0 and "closed in" in out, err
        assert "Traceback" not in err, err
    finally:
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(240) == 0, "the slow collector did not stop cleanly"
        stderr.close()

    # what the rank could not get acked by its close timeout is in its spool, for that endpoint: a
    # later rank resends it to the collector serving there again
    with live_collector(data, port=int(endpoint.rsplit(":", 1)[1])):
        delivered, left = resend_spooled(spool_dir, endpoint)
    assert left == 0, f"{left} spool file(s) not delivered"
    con = catalog.connect(data)
    try:
        total, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (t.step, t.name)) FROM timers t JOIN runs r USING (run_id) "
            "WHERE r.name = 'slow-disk'"
        ).fetchone()
    finally:
        con.close()
    assert total == distinct, f"{total - distinct} timers rows stored twice"
    assert total == STEPS * ROWS_PER_STEP, f"{total} of {STEPS * ROWS_PER_STEP} timers rows stored ({delivered} resent)"
