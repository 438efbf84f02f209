"""Megatron-style tensor parallelism (``tensor_parallel.tp_size``)."""

from trainer.tensor_parallel.groups import ParallelGroups, parallel_groups, validate
from trainer.tensor_parallel.layers import (
    ColumnParallelLinear,
    ParallelMLP,
    ParallelSelfAttention,
    ParallelTransformerBlock,
    RowParallelLinear,
    load_dense_state,
    shard,
)

__all__ = [
    "ColumnParallelLinear",
    "ParallelGroups",
    "ParallelMLP",
    "ParallelSelfAttention",
    "ParallelTransformerBlock",
    "RowParallelLinear",
    "load_dense_state",
    "parallel_groups",
    "shard",
    "validate",
]
