"""A training script as most multi-node jobs are written: one process group, the world, and the
framework's own collectives over it -- plain DDP (``--mode ddp``), FSDP2's ``fully_shard`` per
layer (``--mode fsdp2``) or DeepSpeed's ZeRO stage 2 (``--mode zero2``: run with the DeepSpeed venv's
python, benches/_deepspeed_venv.py, DS_ACCELERATOR=cpu) -- for runs over several hosts
(collector/testing/netns.py); run under the hook, one process per rank:

    RANK=r WORLD_SIZE=n MASTER_ADDR=.. MASTER_PORT=.. python -m collector.hook world_train.py OUT \\
        --ranks-per-host R [--mode ddp|fsdp2|zero2] [--steps S] [--width W] [--control DIR --pause-at K,...] \\
        [--fault sleep:RANK:MS@FROM]

No group inside a host, none across some hosts only: every collective spans every host, so a slow
link slows all of them alike (what findings.links must still see as the network). Each step:
``--device-ms`` asleep (the device's kernels), a ``--layers``-deep MLP of ``--width`` (its
gradients ~ 4 x layers x width^2 bytes), AdamW, and the loss all_reduced for the log, as users do.
``--control``/``--pause-at`` and ``--fault`` as in hosts_train.py (a network change lands on a
known step; a compute straggler busy-waits before its steps). Writes ``OUT/times.json`` (rank 0's
seconds per step).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from collector.testing.workloads.hosts_train import Steps, shared_arguments

BATCH = 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared_arguments(p)
    p.add_argument("--mode", choices=("ddp", "fsdp2", "zero2"), default="ddp")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    steps = Steps(args, "world_train")

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))
    opt = None
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.mode == "zero2":
        import deepspeed

        # a torch optimizer (DeepSpeed's own would build its CPU Adam op first); the hook sees the
        # engine's steps and DeepSpeed's collectives as they are
        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "zero_optimization": {"stage": 2, "reduce_bucket_size": 1 << 20, "allgather_bucket_size": 1 << 20},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30,
        }
        torch_opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model, opt, *_ = deepspeed.initialize(model=model, optimizer=torch_opt, config=config)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        steps.begin(step, rank)
        x = torch.randn(BATCH, args.width, generator=gen)
        loss = model(x).pow(2).mean()
        if args.mode == "zero2":
            model.backward(loss)
            model.step()
        else:
            loss.backward()
            opt.step()
            opt.zero_grad()
        steps.end(loss, world)
    steps.close(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
