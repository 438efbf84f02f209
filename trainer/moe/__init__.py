"""Mixture of Experts with expert parallelism (DeepSpeed's deepspeed.moe)."""

from trainer.moe.data_parallel import broadcast_parameters, reduce_gradients, sync_group
from trainer.moe.experts import is_expert_param
from trainer.moe.gating import TopKGate, expert_capacity
from trainer.moe.groups import expert_groups
from trainer.moe.layer import MoE, pyramid_moe

__all__ = [
    "MoE",
    "TopKGate",
    "broadcast_parameters",
    "expert_capacity",
    "expert_groups",
    "is_expert_param",
    "pyramid_moe",
    "reduce_gradients",
    "sync_group",
]
