"""Helpers for the engine tests: spawn a gloo group running a worker, a tiny model,
deterministic global batches, and the single-process torch reference."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
from torch import nn

from collector.testing import gloo
from collector.testing.gloo import leave_world
from collector.testing.ports import free_port

D_IN, D_HID, D_OUT = 16, 64, 4
LR = 1e-2


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.Tanh(), nn.Linear(D_HID, D_HID), nn.Tanh(), nn.Linear(D_HID, D_OUT))


def num_params() -> int:
    return sum(p.numel() for p in make_model().parameters())


def global_batch(step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs fresh each step; targets from a fixed linear teacher, so the loss can fall."""
    teacher = torch.randn(D_IN, D_OUT, generator=torch.Generator().manual_seed(7))
    x = torch.randn(batch, D_IN, generator=torch.Generator().manual_seed(1000 + step))
    return x, x @ teacher


def micro_batches(step: int, batch: int, rank: int, world: int, gas: int):
    """This rank's micro-batches of global batch ``step``: [world, gas, micro] split."""
    x, y = global_batch(step, batch)
    micro = batch // (world * gas)
    x, y = x.view(world, gas, micro, -1)[rank], y.view(world, gas, micro, -1)[rank]
    return [(x[k], y[k]) for k in range(gas)]


def reference_losses(steps: int, batch: int, clip: float, lr: float = LR) -> list[float]:
    """Single-process torch.optim.AdamW on the whole global batch."""
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    out = []
    for step in range(steps):
        x, y = global_batch(step, batch)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        out.append(loss.item())
    return out


def engine_config(*, stage: int, batch: int, gas: int, clip: float = 0.0, lr: float = LR, **zero) -> dict:
    return {
        "train_batch_size": batch,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": clip,
        "optimizer": {"type": "AdamW", "params": {"lr": lr}},
        "zero_optimization": dict(
            {"stage": stage, "reduce_bucket_size": 2000, "stage3_param_persistence_threshold": 0}, **zero
        ),
        "steps_per_print": 1000,
        "telemetry": {"enabled": False},
    }


def train(engine, *, steps: int, batch: int, start: int = 0) -> list[float]:
    """Run ``steps`` optimizer steps; returns the global mean loss of each (all ranks agree)."""
    import torch.distributed as dist

    world, gas = dist.get_world_size(), engine.gradient_accumulation_steps()
    out = []
    for step in range(start, start + steps):
        total = torch.zeros(())
        # tensor-parallel peers share a data-parallel rank, so they see the same micro-batches
        for x, y in micro_batches(step, batch, engine.dp_rank, engine.dp_world_size, gas):
            if not engine.config.fp16.auto_cast:
                x = x.to(engine.config.precision)
            loss = nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        out.append(total.item() / (world * gas))
    return out


def _entry(rank: int, world: int, port: int, out_dir: str, fn, args) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    from trainer import comm

    comm.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    try:
        result = fn(rank, world, *args)
    except BaseException:
        result = {"error": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    if isinstance(result, dict) and "error" in result:
        dist.destroy_process_group()  # the other ranks may be stuck in a collective: no barrier
    else:
        leave_world()


def spawn(fn, world: int, tmp_path, *args) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` gloo ranks; returns each rank's result."""
    out_dir = str(tmp_path)
    os.makedirs(out_dir, exist_ok=True)
    gloo.start(_entry, world, (world, free_port(), out_dir, fn, args), join=True)
    results = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    for r, res in enumerate(results):
        if isinstance(res, dict) and "error" in res:
            raise AssertionError(f"rank {r} failed:\n{res['error']}")
    return results
