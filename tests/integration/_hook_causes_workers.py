"""A plain DDP training script with the hook attached, as users write one (a torch DataLoader,
DDP, AdamW, ``zero_grad``), on WORLD gloo ranks, with one rank slowed down on purpose. Started
with tests.integration.rank._rank_util.spawn; each run is one hook session in the same processes, so the
runs differ only in the fault. Rank r writes ``{run: run_id}`` to ``out/rank<r>.json``.

Runs (``RUNS``): ``healthy``; ``data``, the slow rank's data loader sleeping ``DELAY_S`` before
each batch (slow storage, an expensive transform); ``compute``, the slow rank busy for
``DELAY_S`` inside its forward pass (a slow device): a straggler too, but not for its data."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from collector.testing.workloads import busy_wait

WORLD, SLOW_RANK, STEPS, DELAY_S = 4, 3, 24, 0.04
# Every rank's forward also waits WORK_S, as for a device's kernels (the CPU stays free): a real step
# is not 10 ms of Python. Without it 4 ranks on 2 cores spent the step competing for the CPU, and in
# CI one healthy rank came 1 ms (10%) late on most of the 24 steps, a straggler by the 5% floor.
WORK_S = 0.03
RUNS = ("healthy", "data", "compute")


def _train(run: str, rank: int, endpoint: str) -> str:
    from collector import hook

    slow = rank == SLOW_RANK and run != "healthy"

    def collate(items):
        if slow and run == "data":
            time.sleep(DELAY_S)
        xs, ys = zip(*items, strict=True)
        return torch.stack(xs), torch.stack(ys)

    session = hook.attach(run=f"hook-{run}", endpoint=endpoint)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    net.register_forward_pre_hook(lambda module, args: time.sleep(WORK_S))
    if slow and run == "compute":
        net.register_forward_pre_hook(lambda module, args: busy_wait(DELAY_S))
    model = DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    data = TensorDataset(
        torch.randn(STEPS * 8, 32, generator=generator), torch.randn(STEPS * 8, 1, generator=generator)
    )
    for x, y in DataLoader(data, batch_size=8, collate_fn=collate):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    run_id = session.run_id
    hook.detach()
    return run_id


def hook_runs_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    run_ids = {run: _train(run, rank, endpoint) for run in RUNS}
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(run_ids))
