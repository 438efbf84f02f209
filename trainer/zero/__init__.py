"""ZeRO: the data-parallel optimizer, one module per stage (stage0..stage3), on
shared flat-bucket partitioning (partition.py) and a shared step (optimizer.py)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from trainer import comm
from trainer.config import ZeroConfig
from trainer.zero.leaf import mark_by_granularity, set_z3_leaf_modules, unit_modules, z3_leaf_module
from trainer.zero.optimizer import StepOutcome, ZeroOptimizer
from trainer.zero.partition import FlatBucket, build_buckets
from trainer.zero.stage0 import Stage0Optimizer
from trainer.zero.stage1 import Stage1Optimizer
from trainer.zero.stage2 import Stage2Optimizer
from trainer.zero.stage3 import Stage3Optimizer

__all__ = [
    "Stage0Optimizer",
    "Stage1Optimizer",
    "Stage2Optimizer",
    "Stage3Optimizer",
    "StepOutcome",
    "ZeroOptimizer",
    "build_zero_optimizer",
    "set_z3_leaf_modules",
    "z3_leaf_module",
]


def _by_sync_group(named: list[tuple[str, nn.Parameter]], dp_group) -> list[tuple[object, int, list]]:
    """``named`` split by the group each parameter is kept in sync over (trainer.moe.sync_group):
    dense parameters over the data-parallel group, MoE experts over their expert-data-parallel
    group. Returns (group, size, named) in first-seen order (the same on every rank)."""
    from trainer.moe import sync_group

    out: dict[tuple[int, int], tuple[object, int, list]] = {}
    for name, p in named:
        group, size = sync_group(p, dp_group)
        out.setdefault((id(group), size), (group, size, []))[2].append((name, p))
    return list(out.values())


def _shard_index(group, size: int) -> int:
    return comm.get_rank(group) if size > 1 else 0


def build_zero_optimizer(
    module: nn.Module,
    named_groups: list[list[tuple[str, nn.Parameter]]],
    *,
    zero: ZeroConfig,
    **optimizer_args,
) -> ZeroOptimizer:
    """The stage's optimizer over ``named_groups`` (trainable (name, param) lists, one per param group),
    partitioned over the data-parallel ``group`` (None: the world) of which this is rank ``rank``.
    ``optimizer_args``: ZeroOptimizer's keywords (``rank``, ``world_size``, ``device``, ``group``,
    ``loss_scaler``, ``gradient_clipping``, ``tp_rank``); ``overlap_comm`` and ``reduce_scatter``
    come from ``zero``.

    Each bucket holds parameters of one sync group only: dense ones are sharded over the
    data-parallel group, MoE expert parameters over their expert-data-parallel group (stages
    1-3 use that group's size as the shard count; stage 0 keeps one shard). Gradients are
    still divided by the full data-parallel ``world_size`` (see trainer.moe.data_parallel)."""
    group = optimizer_args.get("group")
    common = dict(optimizer_args, overlap_comm=zero.overlap_comm, reduce_scatter=zero.reduce_scatter)

    def buckets_of(groups):
        out = []
        for g, named in enumerate(groups):
            for sync, size, part in _by_sync_group(named, group) if named else []:
                shards = 1 if zero.stage == 0 else size
                out += build_buckets(
                    part,
                    group_index=g,
                    bucket_numel=zero.reduce_bucket_size,
                    num_shards=shards,
                    shard_index=_shard_index(sync, size) if shards > 1 else 0,
                    group=sync,
                    group_size=size,
                )
        return out

    if zero.stage in (0, 1, 2):
        cls = {0: Stage0Optimizer, 1: Stage1Optimizer, 2: Stage2Optimizer}[zero.stage]
        return cls(buckets_of(named_groups), **common)

    if zero.stage3_module_granularity_threshold:
        mark_by_granularity(module, zero.stage3_module_granularity_threshold)
    unit_of = unit_modules(module)  # a leaf module's subtree is gathered as one unit (trainer.zero.leaf)
    owners: dict[nn.Parameter, list[nn.Module]] = defaultdict(list)
    for m in module.modules():
        for p in m.parameters(recurse=False):
            owners[p].append(m)
    persistent_groups: list[list] = [[] for _ in named_groups]
    per_unit: dict[tuple[int, int], list] = defaultdict(list)  # (id(module), group) -> params
    unit_module: dict[int, nn.Module] = {}
    for g, named in enumerate(named_groups):
        for name, p in named:
            if p.numel() < zero.stage3_param_persistence_threshold or len(owners[p]) != 1:
                persistent_groups[g].append((name, p))
            else:
                m = unit_of[id(owners[p][0])]
                unit_module[id(m)] = m
                per_unit[(id(m), g)].append((name, p))
    units: dict[nn.Module, list[FlatBucket]] = defaultdict(list)
    for (mid, g), named in per_unit.items():
        for sync, size, part in _by_sync_group(named, group):
            units[unit_module[mid]].append(
                FlatBucket(
                    part,
                    num_shards=size,
                    shard_index=_shard_index(sync, size),
                    group_index=g,
                    group=sync,
                    group_size=size,
                )
            )
    shard_device = torch.device("cpu") if zero.offload_param.enabled else optimizer_args["device"]
    persistent = buckets_of(persistent_groups)
    return Stage3Optimizer(
        persistent, dict(units), shard_device=shard_device, prefetch_numel=zero.stage3_prefetch_bucket_size, **common
    )
