"""Slow storage under a real collector (issue 49): every fsync of the collector process takes
0.2-2 s (seeded; collector.testing.slow_fsync wraps the collector process's ``os.fsync``), while
a real rank (``collector.hook``) trains and exits. Acks still mean durable (they come only after
the slow commits), the rank's exit stays prompt (what is not acked by its close timeout goes to its
spool), a reader of the catalog still answers while the commits crawl, and once the spool is
resent every record is stored exactly once. Figures: benches/slow_storage.py."""

from __future__ import annotations

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
def test_slow_fsync_keeps_acks_durable_training_prompt_and_readers_answering(tmp_path):
    data, spool_dir = tmp_path / "data", tmp_path / "spool"
    stderr = tempfile.TemporaryFile(mode="w+")
    collector = subprocess.Popen(
        [*SLOW_COLLECTOR, "--data-dir", str(data), "--port", "0", "--no-auto-profile"],
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
