"""A training script without rankscope's hook (only the testing kit's busy wait) that records itself
with torch.profiler, as people do: ``tensorboard_trace_handler`` writes one trace per rank, and
``rankscope import`` of that folder is the only way its data reaches us (issue 44: imported traces
judged as hooked runs are).

    torchrun --nproc-per-node 2 -m collector.testing.workloads.profiled_train OUT \\
        [--mode ddp|fsdp2] [--steps S] [--device-ms MS] [--slow-rank R --slow-ms MS]

Each step: ``--device-ms`` asleep (the device's kernels, as in ddp_train.py: a step of realistic
length, so scheduler noise on a shared CPU host is noise against it), a ``--layers``-deep MLP of
``--width`` under DDP or FSDP2's ``fully_shard`` per layer, AdamW, and the loss all_reduced for
the log. ``--slow-rank`` busy-waits ``--slow-ms`` before each
step's forward (a slow device keeps its own time), so the others wait for it in the first
collective. The profiler skips one step and warms up one, then records the rest; the traces land
in ``OUT/traces`` under torch's own names (no rank in them).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from collector.testing.workloads import busy_wait

BATCH = 16
SKIPPED, WARMUP = 1, 1


def _model(mode: str, width: int, layers: int, world: int) -> torch.nn.Module:
    body = []
    for _ in range(layers):
        body += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*body, torch.nn.Linear(width, 1))
    if mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--steps", type=int, default=20, help="training steps, the first two not recorded")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--device-ms", type=float, default=30.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=40.0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = _model(args.mode, args.width, args.layers, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    traces = os.path.join(args.out, "traces")
    plan = schedule(wait=SKIPPED, warmup=WARMUP, active=args.steps - SKIPPED - WARMUP, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=plan,
        on_trace_ready=tensorboard_trace_handler(traces),
    ) as prof:
        for _ in range(args.steps):
            if rank == args.slow_rank:
                busy_wait(args.slow_ms / 1000)
            time.sleep(args.device_ms / 1000)
            x = torch.randn(BATCH, args.width, generator=gen)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
