"""MonitorMaster: DeepSpeed's csv_monitor / tensorboard file layouts, written off
the training thread, flushed on close() and at interpreter exit.

Split by tier: the pure-function tests are in tests/unit/trainer/test_monitor.py."""

import os
import subprocess
import sys

import pytest
import torch

from tests.unit.trainer import test_monitor as unit_tier
from tests.unit.trainer.test_monitor import _csv_cfg
from trainer.monitor import MonitorMaster

_rank0 = unit_tier._rank0  # the unit tier's autouse fixture, shared


def test_events_are_flushed_at_interpreter_exit(tmp_path):
    script = (
        "from trainer.monitor import MonitorMaster\n"
        f"m = MonitorMaster({_csv_cfg(tmp_path, job='exit')!r})\n"
        "for i in range(200):\n"
        "    m.write_events([('Train/loss', float(i), i)])\n"
        # no close(): the atexit hook must drain the queue
    )
    env = {**os.environ, "RANK": "0"}
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60, env=env)
    lines = (tmp_path / "ds_logs" / "exit" / "Train_loss.csv").read_text().splitlines()
    assert lines[0] == "step,loss" and len(lines) == 201 and lines[-1] == "199,199.0"


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_reports_to_telemetry(tmp_path, monkeypatch, rank):
    from collector.rank import session
    from tests.integration.rank._rank_util import serve

    monkeypatch.setenv("RANK", str(rank))
    server, port, col = serve()
    try:
        session.start(run="monitor-test", endpoint=f"127.0.0.1:{port}")
        mon = MonitorMaster(_csv_cfg(tmp_path))
        assert mon.enabled
        session.set_step(5)  # a row's step is the training step it was written at; samples DeepSpeed's x
        mon.write_events([("Train/Samples/train_loss", 0.75, 40), ("Train/Samples/lr", torch.tensor(0.5), 40)])
        session.set_step(10)
        mon.write_events([("Train/Samples/train_loss", 0.5, 80)])
        mon.close()
        session.stop()
        rows = col.rows("monitor").to_pydict()
    finally:
        session.stop()
        session.set_step(0)
        server.stop(0)
    got = sorted(zip(rows["tag"], rows["value"], rows["samples"], rows["step"], rows["rank"]))
    assert got == [
        ("Train/Samples/lr", 0.5, 40, 5, rank),
        ("Train/Samples/train_loss", 0.5, 80, 10, rank),
        ("Train/Samples/train_loss", 0.75, 40, 5, rank),
    ]
    assert all(t > 0 for t in rows["time_ns"])
    # files stay rank 0's, in DeepSpeed's layout
    assert (tmp_path / "ds_logs").exists() == (rank == 0)
