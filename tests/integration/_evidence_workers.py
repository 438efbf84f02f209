"""Rank processes for the evidence tests: 4 gloo ranks with the hook attached, training a small
model (manual gradient all_reduce, one ``optimizer.step()`` per step), one of them late in a named
Python function while ``out/slow`` exists (with ``slow_from_start``: from the first step). They run
until any of them sees ``out/stop`` (or ``max_steps``), then write ``out/rank<r>.json``."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from collector import hook
from collector.rank import session
from collector.testing.gloo import any_rank_sees, leave_world, torchrun_env

WORLD = 4
PG_TIMEOUT_S = 60


def slow_loader(ms: float) -> torch.Tensor:
    """The injected straggler: the function the diff must name."""
    time.sleep(ms / 1000)
    return torch.randn(32, 64)


def load_batch() -> torch.Tensor:
    return torch.randn(32, 64)


def train_worker(
    rank: int, port: int, endpoint: str, out: str, slow_rank: int, slow_ms: float, step_ms: float, max_steps: int
) -> None:
    slow_flag = Path(out, "slow")
    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    hook.attach(run="evidence", endpoint=endpoint, hang_after_s=30.0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    client = session.active().client
    deadline = time.monotonic() + 60
    while client.acked == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(out, f"pid{rank}").write_text(str(os.getpid()))
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    error, step = None, 0
    try:
        while step < max_steps:
            step += 1
            x = slow_loader(slow_ms) if rank == slow_rank and slow_flag.exists() else load_batch()
            time.sleep(step_ms / 1000)  # the rest of a step's work, the same on every rank
            loss = model(x).pow(2).mean()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            if any_rank_sees(Path(out, "stop")):
                break
    except RuntimeError as exc:  # a peer that exited mid-run
        error = str(exc)[:200]
    hook.detach("failed" if error else "finished")
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": step, "error": error}))
    if error:
        os._exit(0)  # no barrier with a dead peer
    leave_world()


def engine_worker(
    rank: int, port: int, endpoint: str, out: str, slow_rank: int, slow_ms: float, max_steps: int
) -> None:
    """The bundled engine (ZeRO-2) instead of the hook; rank ``slow_rank`` late in ``slow_loader``."""
    import trainer
    from tests._engine_util import engine_config, make_model, micro_batches

    torchrun_env(rank, WORLD, port)
    torch.set_num_threads(1)
    trainer.init_distributed("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    cfg = engine_config(stage=2, batch=8, gas=1)
    cfg["telemetry"] = {"run": "evidence-engine", "endpoint": endpoint, "hang_after_s": 30.0}
    engine, *_ = trainer.initialize(model=make_model(), config=cfg)
    stop, step = Path(out, "stop"), 0
    while step < max_steps and not any_rank_sees(stop):
        if rank == slow_rank:
            slow_loader(slow_ms)
        for x, y in micro_batches(step, 8, rank, WORLD, 1):
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        step += 1
    engine.close()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"steps": step, "error": None}))
    leave_world()
