"""ZeRO: the data-parallel optimizer, one module per stage (stage0..stage3), on
shared flat-bucket partitioning (partition.py) and a shared step (optimizer.py)."""
from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from trainer.config import ZeroConfig
from trainer.zero.optimizer import StepOutcome, ZeroOptimizer
from trainer.zero.partition import FlatBucket, build_buckets
from trainer.zero.stage0 import Stage0Optimizer
from trainer.zero.stage1 import Stage1Optimizer
from trainer.zero.stage2 import Stage2Optimizer
from trainer.zero.stage3 import Stage3Optimizer

__all__ = ["build_zero_optimizer", "ZeroOptimizer", "StepOutcome", "Stage0Optimizer", "Stage1Optimizer",
           "Stage2Optimizer", "Stage3Optimizer"]


def build_zero_optimizer(module: nn.Module, named_groups: list[list[tuple[str, nn.Parameter]]], *,
                         zero: ZeroConfig, rank: int, world_size: int, device: torch.device, group=None,
                         loss_scaler=None, gradient_clipping: float = 0.0) -> ZeroOptimizer:
    """The stage's optimizer over ``named_groups`` (trainable (name, param) lists, one per param group),
    partitioned over the data-parallel ``group`` (None: the world) of which this is rank ``rank``."""
    common = dict(rank=rank, world_size=world_size, device=device, group=group, loss_scaler=loss_scaler,
                  gradient_clipping=gradient_clipping, overlap_comm=zero.overlap_comm,
                  reduce_scatter=zero.reduce_scatter)
    shards = 1 if zero.stage == 0 else world_size

    def buckets_of(groups):
        return [b for g, named in enumerate(groups) if named
                for b in build_buckets(named, group_index=g, bucket_numel=zero.reduce_bucket_size,
                                       num_shards=shards, shard_index=rank if shards > 1 else 0)]

    if zero.stage in (0, 1, 2):
        cls = {0: Stage0Optimizer, 1: Stage1Optimizer, 2: Stage2Optimizer}[zero.stage]
        return cls(buckets_of(named_groups), **common)

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
                m = owners[p][0]
                unit_module[id(m)] = m
                per_unit[(id(m), g)].append((name, p))
    units: dict[nn.Module, list[FlatBucket]] = defaultdict(list)
    for (mid, g), named in per_unit.items():
        units[unit_module[mid]].append(FlatBucket(named, num_shards=world_size, shard_index=rank, group_index=g))
    shard_device = torch.device("cpu") if zero.offload_param.enabled else device
    persistent = buckets_of(persistent_groups)
    return Stage3Optimizer(persistent, dict(units),
                           shard_device=shard_device, prefetch_numel=zero.stage3_prefetch_bucket_size, **common)
