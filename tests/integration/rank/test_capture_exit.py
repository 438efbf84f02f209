"""A script that ends while its capture's trace is still being exported (issue 32): the process
exits 0 and the trace reaches the collector with the session's last flush.

The capture thread exports a stopped profiler through torch's C++ writer; a process that
finalized under it (the interpreter tearing down, the library's globals destroyed) could crash,
and the trace was lost with the session. The script here asks for a one-step capture of its last
step itself, as the ack reader would hand a request over (collector.rank.capture.CAPTURE.handle),
and ends right after that step, under ``python -m collector.hook`` with a real collector."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from collector.data import queries, trace_diff
from collector.testing.collectors import live_collector

ROOT = Path(__file__).resolve().parents[3]
STEPS = 6

SCRIPT = """\
import sys, torch, torch.distributed as dist
from collector.rank import capture
from proto import pb

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps, ops = int(sys.argv[2]), int(sys.argv[3])
for i in range(steps):
    if i == steps - 2:  # profile from the next boundary (this step's end): the last step is captured
        capture.CAPTURE.handle(pb.RankRequest(id="at-exit", kind="profile", steps=1, with_stack=True, role="asked"))
    x = torch.randn(32, 64)
    for _ in range(ops if i == steps - 1 else 1):  # many operators: the trace takes a while to write
        x = torch.tanh(x)
    loss = model(x).pow(2).mean()
    loss.backward()
    dist.all_reduce(model.weight.grad)
    opt.step()
    opt.zero_grad()
print("exporting at the end" if capture.CAPTURE.exporting else "exported before the end", flush=True)
"""


def test_a_script_ending_while_its_trace_is_exported_exits_0_and_the_trace_arrives(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            RANKSCOPE_ENDPOINT=endpoint,
            RANKSCOPE_RUN="capture-at-exit",
            RANKSCOPE_SPOOL_DIR=str(tmp_path / "spool"),
            OMP_NUM_THREADS="1",
            PYTHONFAULTHANDLER="1",  # a crash prints the Python stack of each thread
        )
        argv = ["-m", "collector.hook", "train.py", str(tmp_path / "store"), str(STEPS), "5000"]
        done = subprocess.run(
            [sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "exporting at the end" in done.stdout, done.stdout  # the hazard was set up, not dodged
    cat = queries.Catalog(data_dir)
    try:
        [run_id] = cat.df("select run_id from runs", []).run_id
        rows = trace_diff.captures(cat, run_id)
    finally:
        cat.close()
    captured = rows[(rows.request_id == "at-exit") & (rows.status == "captured")]
    assert len(captured) == 1, rows[["status", "detail"]].to_dict("records")
    [row] = captured.itertuples()
    assert row.step == row.last_step == STEPS  # the script's last step
    trace = trace_diff.load(data_dir / row.path)
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert "aten::tanh" in names and any("train.py" in n for n in names), sorted(names)[:20]
