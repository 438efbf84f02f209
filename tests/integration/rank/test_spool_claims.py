"""Orphaned spool files on a shared host: claimed by one process at a time.

Two runs spool while their collector is down and exit; then four ranks of a new
run start on the same host and spool dir with the collector up. Each of the four
reaches the collector at about the same moment and goes for the orphans: every
spooled record must be stored exactly once, the new run must be complete, no rank
may print an error about a file another rank took, and one line says what was
resent and for which runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from collector.data import catalog
from collector.testing.ports import free_port
from collector.tools.launch import CollectorProcess

ROWS = 40

SPOOLING_RUN = textwrap.dedent(
    """
    import sys
    from collector import hook
    from collector.rank import session
    active = hook.attach(run=sys.argv[1], endpoint=sys.argv[2])
    active.client.cfg.close_timeout_s = 0.5  # the collector is down: spool on exit without a long wait
    for step in range(ROWS):
        session.emit("timers", step=step, name="fwd", start_ns=step, dur_ns=1000)
""".replace("ROWS", str(ROWS))
)

NEW_RANK = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from collector import hook
    rank, store = int(sys.argv[1]), sys.argv[2]
    hook.attach(run="fresh", endpoint=sys.argv[3])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=4)
    for _ in range(5):
        dist.all_reduce(torch.ones(8))
    dist.barrier()
    import pathlib, time  # the orphans' resend runs on a background thread: let it finish
    spool_dir, deadline = pathlib.Path(os.environ["RANKSCOPE_SPOOL_DIR"]), time.monotonic() + 90
    while any(spool_dir.glob("*.rsspool*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    dist.destroy_process_group()
    hook.detach()
""")


def test_orphans_are_claimed_once_and_resent_once_with_one_summary_line(tmp_path):
    spool_dir = tmp_path / "spool"
    env = {**os.environ, "RANKSCOPE_SPOOL_DIR": str(spool_dir), "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    for name in ("old-a", "old-b"):
        proc = subprocess.run(
            [sys.executable, "-c", SPOOLING_RUN, name, endpoint], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
    assert len(list(spool_dir.glob("*.rsspool"))) >= 2

    data = tmp_path / "data"
    with CollectorProcess(data, "--flush-interval", "0.05", port=port):
        rank_env = {k: v for k, v in env.items() if k != "WORLD_SIZE"}
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", NEW_RANK, str(r), str(tmp_path / "store"), endpoint],
                env={**rank_env, "RANK": str(r), "WORLD_SIZE": "4"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(4)
        ]
        outputs = [p.communicate(timeout=180) for p in ranks]
    for p, (_, err) in zip(ranks, outputs, strict=True):
        assert p.returncode == 0, err
        assert "skipping spool file" not in err and "No such file" not in err and "Traceback" not in err, err
    summaries = [line for _, err in outputs for line in err.splitlines() if "rankscope: resent" in line]
    assert summaries and all("old-a" in s or "old-b" in s for s in summaries), [err for _, err in outputs]
    assert not list(spool_dir.glob("*")), "every orphan was delivered and deleted"

    con = catalog.connect(data)
    try:
        per_run = dict(
            con.execute("SELECT r.name, count(*) FROM timers t JOIN runs r USING (run_id) GROUP BY r.name").fetchall()
        )
        fresh = con.execute("SELECT count(*) FROM comm c JOIN runs r USING (run_id) WHERE r.name = 'fresh'").fetchone()[
            0
        ]
    finally:
        con.close()
    assert per_run == {"old-a": ROWS, "old-b": ROWS}
    assert fresh == 4 * 6  # 5 all_reduces and a barrier on each of the 4 ranks
