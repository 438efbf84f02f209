"""A plain training script with the hook attached, as users write one: DDP, AdamW, gradient
accumulation, ``hook.log`` after each optimizer step. Started on gloo ranks with
tests.integration.rank._rank_util.spawn; each rank writes what it did to ``out/rank<r>.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

STEPS, ACCUM, WORLD = 5, 4, 2
RUN = "ddp-accum"


def expected_loss(step: int, rank: int) -> float:
    """What rank ``rank`` logs as train_loss at ``step``: a value the test can recompute."""
    return 2.0 / step + rank * 0.01


def lr_at(step: int) -> float:
    return 1e-3 * 0.5 ** (step - 1)


def ddp_accumulation_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """STEPS optimizer steps of ACCUM micro-batches each; DDP all-reduces every micro-batch's
    gradients (no ``no_sync``), so each step has ACCUM bucket all_reduces that must carry its number."""
    from torch.nn.parallel import DistributedDataParallel

    from collector import hook

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    session = hook.attach(run=RUN, endpoint=endpoint)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr_at(1))
    for step in range(1, STEPS + 1):
        for micro in range(ACCUM):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 100 + micro * 10 + rank))
            (model(x).pow(2).mean() / ACCUM).backward()
        optimizer.step()
        optimizer.zero_grad()
        hook.log({"train_loss": expected_loss(step, rank), "lr": optimizer.param_groups[0]["lr"], "grad_norm": 1.0})
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step + 1)
    run_id = session.run_id
    hook.detach()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"run_id": run_id}))


STRAGGLER_RANK, STRAGGLE_S, MAX_RUN_S = 1, 0.02, 120.0


def straggler_until_stopped_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """A live run for scrapers: one all_reduce per step, steps set with ``hook.step``, rank 1
    arriving STRAGGLE_S late to every collective; runs until ``out/stop`` exists (or MAX_RUN_S)."""
    import time

    from collector import hook

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    session = hook.attach(run="metrics-job", endpoint=endpoint)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    stop, deadline, step = Path(out, "stop"), time.monotonic() + MAX_RUN_S, 0
    flag = torch.zeros(1)
    while True:
        step += 1
        hook.step(step)
        if rank == STRAGGLER_RANK:
            time.sleep(STRAGGLE_S)
        dist.all_reduce(torch.ones(256))
        flag.fill_(float(stop.exists() or time.monotonic() > deadline))
        if rank == STRAGGLER_RANK:
            time.sleep(STRAGGLE_S)
        dist.all_reduce(flag)  # every rank stops at the same step
        if flag.item() > 0:
            break
    run_id = session.run_id
    hook.detach()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"run_id": run_id, "steps": step}))
