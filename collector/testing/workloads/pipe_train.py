"""A pipeline-parallel run (the bundled engine's, or DeepSpeed's) over several hosts, as 3D-parallel jobs lay it out:
pipeline stages across hosts, each stage's data-parallel replicas across or inside hosts
(trainer.pipe.PipelineModule, 1F1B, AdamW); run under the hook, one process per rank:

    RANK=r WORLD_SIZE=n MASTER_ADDR=.. MASTER_PORT=.. python -m collector.hook pipe_train.py OUT \\
        --ranks-per-host R --stages P [--tp T] [--micro-batches M] [--steps S] [--width W] \\
        [--engine bundled|deepspeed] [--control DIR --pause-at K,...] [--fault sleep:RANK:MS@FROM]

``--engine deepspeed``: DeepSpeed's own PipelineEngine, the same script otherwise (run with the
DeepSpeed venv's python, benches/_deepspeed_venv.py, DS_ACCELERATOR=cpu).

Rank r is stage r // (world / P), data-parallel index r % (world / P) (PipeTopology), and host
r // R: with P = hosts the stages are the hosts and each stage's replicas share one; with 1 rank a
host and P < hosts, a stage's replicas are on different hosts. ``--tp T`` (bundled engine): each
stage's layers are column- then row-parallel pairs sharded over T consecutive ranks
(trainer.tensor_parallel), the Megatron layout: with R = T a tensor-parallel group is one host,
its all_reduces never touch a link, and pipelines and replicas go across hosts (3D parallelism).
The activations a stage sends its next one (``--micro-batch`` x ``--width`` floats a micro-batch)
are big enough for a link's speed to show; each stage's gradients are all-reduced over its
replicas after the last micro-batch.
``--control``/``--pause-at``, ``--fault`` and ``OUT/times.json`` as in hosts_train.py.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.distributed as dist

from collector.testing.workloads.hosts_train import Steps, shared_arguments


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shared_arguments(p)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4, help="linear layers a stage")
    p.add_argument("--engine", choices=("bundled", "deepspeed"), default="bundled")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks a stage (bundled engine)")
    args = p.parse_args()
    if args.tp > 1 and args.engine != "bundled":
        raise SystemExit("pipe_train: --tp is for the bundled engine")
    steps = Steps(args, "pipe_train")

    if args.engine == "deepspeed":  # DeepSpeed's own PipelineEngine (its venv's python)
        import deepspeed as engine_lib
        from deepspeed.pipe import LayerSpec, PipelineModule

        engine_lib.init_distributed(dist_backend="gloo")
    else:
        import trainer as engine_lib
        from trainer.pipe import LayerSpec, PipelineModule

        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.stages:
        raise SystemExit(f"pipe_train: world size {world} is not a multiple of --stages {args.stages}")
    torch.manual_seed(0)
    specs = []
    if args.tp > 1:  # a column-parallel layer, then a row-parallel one: one all_reduce in the pair's group
        from trainer.pipe import stage_groups
        from trainer.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        groups = stage_groups(num_stages=args.stages, tp_size=args.tp)
        for _ in range(args.layers * args.stages // 2):
            specs += [LayerSpec(ColumnParallelLinear, args.width, args.width, groups=groups), LayerSpec(torch.nn.ReLU)]
            specs += [LayerSpec(RowParallelLinear, args.width, args.width, groups=groups), LayerSpec(torch.nn.ReLU)]
    else:
        for _ in range(args.layers * args.stages):
            specs += [LayerSpec(torch.nn.Linear, args.width, args.width), LayerSpec(torch.nn.ReLU)]
    net = PipelineModule(
        specs,
        num_stages=args.stages,
        loss_fn=torch.nn.functional.mse_loss,
        partition_method="uniform",
        **({"tp_size": args.tp} if args.tp > 1 else {}),
    )
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.micro_batches,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 1 << 30,
    }
    if args.tp > 1:
        config["tensor_parallel"] = {"tp_size": args.tp}
    engine, *_ = engine_lib.initialize(model=net, model_parameters=net.parameters(), config=config)
    gen = torch.Generator().manual_seed(rank)

    def batches():
        while True:
            x = torch.randn(args.micro_batch, args.width, generator=gen)
            yield x, torch.randn(args.micro_batch, args.width, generator=gen)

    data = batches()
    for step in range(args.steps):
        steps.begin(step, rank)
        loss = engine.train_batch(itertools.islice(data, args.micro_batches))
        steps.end(loss, world)
    steps.close(rank)
    if hasattr(engine, "close"):  # the bundled engine's: flushes its telemetry
        engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
