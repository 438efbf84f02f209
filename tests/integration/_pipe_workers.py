"""Pipeline runs on the bundled engine streaming into a real collector, for test_pipe_telemetry.

Stages are made of layers that sleep a fixed time in forward and in backward (SleepLayer), so a
stage's time is what the test sets, also on a loaded machine (sleeping needs no CPU). Runs
(``RUNS``), each its own telemetry session in the same processes:

- ``balanced``: 2 stages of equal time, ``MICRO_BATCHES`` micro-batches;
- ``slow``: the same with stage 1 sleeping ``SLOW_S`` more in each micro-batch's forward;
- ``few``: balanced, 2 micro-batches (1F1B idles a third of each step at that ratio);
- ``interleaved``: each stage holding ``VIRTUAL`` model chunks (interleaved 1F1B), each chunk as long as a
  balanced stage;
- ``data_parallel``: no pipeline, the same layers replicated on both ranks, gradients all-reduced in
  small buckets after each backward (``reduce_bucket_size`` ``DP_BUCKET``): exposed, small messages.

Rank r writes ``{run: run_id}`` to ``out/rank<r>.json`` and ``{run: [train_batch wall seconds per
step]}`` (measured around the call) to ``out/walls<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

WORLD, STAGES, STEPS, MICRO_BATCHES = 2, 2, 8, 4
FWD_S, BWD_S, SLOW_S = 0.03, 0.06, 0.03
LAYERS_PER_STAGE = 8
RUNS = {"balanced": (MICRO_BATCHES, 0.0), "slow": (MICRO_BATCHES, SLOW_S), "few": (2, 0.0)}
VIRTUAL = 2  # the interleaved run's model chunks a stage
DP_BUCKET = 64  # elements: each Linear(8, 8)'s 72 parameters take two all_reduces


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class SleepLayer(nn.Module):
    """A linear layer that also sleeps ``fwd_s`` in forward and ``bwd_s`` in backward."""

    def __init__(self, width: int, fwd_s: float, bwd_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.fwd_s, self.bwd_s = fwd_s, bwd_s

    def forward(self, x):
        time.sleep(self.fwd_s)
        return _SleepInBackward.apply(self.linear(x), self.bwd_s)


def layers(slow_s: float, scale: float = 1.0) -> list:
    """The stages' layers, their sleeps ``scale`` times the stage times."""
    from trainer.pipe import LayerSpec

    per = LAYERS_PER_STAGE
    specs = [LayerSpec(SleepLayer, 8, scale * FWD_S / per, scale * BWD_S / per) for _ in range(per * STAGES)]
    if slow_s:  # the last layer of stage 1 (2 stages): the slow one
        specs[-1] = LayerSpec(SleepLayer, 8, scale * FWD_S / per + slow_s, scale * BWD_S / per)
    return specs


def _config(name: str, micro_batches: int, endpoint: str, **blocks) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": micro_batches,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "telemetry": {"enabled": True, "endpoint": endpoint, "run": f"pipe-{name}"},
        "steps_per_print": 1000,
        **blocks,
    }


WALLS: dict[str, list[float]] = {}  # run name -> this rank's train_batch wall seconds per step


def _train(name: str, micro_batches: int, slow_s: float, endpoint: str, virtual_stages: int = 1) -> str:
    import trainer
    from collector.rank import session
    from trainer.pipe import PipelineModule

    torch.manual_seed(0)
    # Interleaved, each model chunk sleeps what a whole stage does in the other runs: the schedule
    # sends a micro-batch across the stages 3 times each way, not once, and on a loaded host each
    # transfer idles a stage; at half-stage chunks, beside two busy loops, 21% measured against
    # the 11% ideal (16% at whole-stage chunks).
    net = PipelineModule(
        layers(slow_s, scale=virtual_stages),
        num_stages=STAGES,
        loss_fn=nn.functional.mse_loss,
        partition_method="uniform",
        virtual_stages=virtual_stages,
    )
    engine, *_ = trainer.initialize(model=net, config=_config(name, micro_batches, endpoint))
    data = iter([(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(STEPS * micro_batches)])
    walls = WALLS.setdefault(name, [])
    for _ in range(STEPS):
        t0 = time.perf_counter()
        engine.train_batch(data)
        walls.append(time.perf_counter() - t0)
    run_id = session.active().run_id
    engine.close()
    return run_id


def _train_data_parallel(endpoint: str) -> str:
    """The ``data_parallel`` run: no pipeline; its gradient all_reduces are the communication."""
    import trainer
    from collector.rank import session

    torch.manual_seed(0)
    net = nn.Sequential(*(SleepLayer(8, FWD_S / LAYERS_PER_STAGE, BWD_S / LAYERS_PER_STAGE) for _ in range(8)))
    zero = {"stage": 0, "reduce_bucket_size": DP_BUCKET, "overlap_comm": False}
    engine, *_ = trainer.initialize(model=net, config=_config("data_parallel", 1, endpoint, zero_optimization=zero))
    for _ in range(STEPS):
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        engine.backward(nn.functional.mse_loss(engine(x), y))
        engine.step()
    run_id = session.active().run_id
    engine.close()
    return run_id


def pipe_runs_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    run_ids = {name: _train(name, m, slow, endpoint) for name, (m, slow) in RUNS.items()}
    run_ids["interleaved"] = _train("interleaved", MICRO_BATCHES, 0.0, endpoint, virtual_stages=VIRTUAL)
    run_ids["data_parallel"] = _train_data_parallel(endpoint)
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(run_ids))
    Path(out, f"walls{rank}.json").write_text(json.dumps(WALLS))


DP_WORLD, SLOW_RANK, DP_STEPS, DP_SLOW_S = 4, 1, 12, 0.04


def pipe_dp_straggler_worker(rank: int, port: int, endpoint: str, out: str) -> None:
    """2 stages x 2 data-parallel replicas; rank ``SLOW_RANK`` (stage 0 of replica 1) sleeps ``DP_SLOW_S``
    more in each micro-batch's forward from step 2 on: a slow replica inside a stage, not a slow stage."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(DP_WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    import trainer
    from collector.rank import session
    from trainer.pipe import PipelineModule

    torch.manual_seed(0)
    net = PipelineModule(layers(0.0), num_stages=STAGES, loss_fn=nn.functional.mse_loss, partition_method="uniform")
    engine, *_ = trainer.initialize(model=net, config=_config("dp-straggler", MICRO_BATCHES, endpoint))
    data = iter([(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(DP_STEPS * MICRO_BATCHES)])
    for step in range(DP_STEPS):
        if step == 2 and rank == SLOW_RANK:
            engine.module.forward_funcs[0].fwd_s += DP_SLOW_S
        engine.train_batch(data)
    run_id = session.active().run_id
    engine.close()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"dp_straggler": run_id}))
