"""Rank processes for benches.evidence: 4 gloo ranks with the hook attached, an MLP step (forward,
backward, one all_reduce per gradient, SGD), rank ``slow_rank`` late in ``slow_loader`` while
``out/slow`` exists: it spins in Python, the worst case for torch's own Python tracer (a call
recorded per loop turn). Each rank times every step and notes whether a capture was running in
it, or its trace being exported (collector.rank.capture), and writes them to
``out/steps<rank>.json`` once any rank sees ``out/stop``."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector import hook
from collector.rank import capture, session
from collector.testing.gloo import any_rank_sees

WORLD = 4


def slow_loader(ms: float) -> torch.Tensor:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass
    return torch.randn(64, 256)


def load_batch() -> torch.Tensor:
    return torch.randn(64, 256)


def worker(rank: int, port: int, endpoint: str, out: str, slow_rank: int, slow_ms: float, max_steps: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    hook.attach(run="evidence-bench", endpoint=endpoint, hang_after_s=60.0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    client = session.active().client
    deadline = time.monotonic() + 60
    while client.acked == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    slow_flag, stop_flag = Path(out, "slow"), Path(out, "stop")
    steps = []
    for step in range(1, max_steps + 1):
        t0 = time.perf_counter()
        capturing = capture.CAPTURE.profiler is not None
        exporting = capture.CAPTURE.exporting
        x = slow_loader(slow_ms) if rank == slow_rank and slow_flag.exists() else load_batch()
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        capturing = capturing or capture.CAPTURE.profiler is not None
        exporting = exporting or capture.CAPTURE.exporting
        steps.append((step, (time.perf_counter() - t0) * 1000, capturing, exporting and not capturing))
        if any_rank_sees(stop_flag):
            break
    hook.detach()
    Path(out, f"steps{rank}.json").write_text(json.dumps(steps))
    os._exit(0)
