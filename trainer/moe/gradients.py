"""Data-parallel gradient averaging that knows about experts.

The training loss is the mean over the W data-parallel ranks of each rank's
local loss. A dense parameter's local gradient covers its own rank's tokens,
so it is summed over the data-parallel group and divided by W. An expert
parameter's local gradient already covers every token of its expert-parallel
group (the all_to_all backward brought them home), so it is summed over its
expert-data-parallel group only -- the other copies of the same expert --
and also divided by W::

    dense  grad = all_reduce(grad, dp group) / W
    expert grad = all_reduce(grad, expert-data-parallel group of its ep_size) / W

``dp_group`` is the data-parallel group: the world without tensor
parallelism, trainer.tensor_parallel.groups' dp group with it.
"""
from __future__ import annotations

from torch import nn

from trainer import comm
from trainer.moe import groups as moe_groups
from trainer.moe.experts import is_expert_param


def reduce_gradients(module: nn.Module, dp_group=None) -> None:
    dp_size = comm.get_world_size(dp_group)
    if dp_size == 1:
        return
    for p in module.parameters():
        if p.grad is None:
            continue
        if is_expert_param(p):
            groups = moe_groups.expert_groups(int(p.group_name.removeprefix("ep_size_")))
            if groups.edp_size > 1:
                comm.all_reduce(p.grad, group=groups.edp_group, log_name="moe.reduce_expert_gradients")
        else:
            comm.all_reduce(p.grad, group=dp_group, log_name="reduce_gradients")
        p.grad.div_(dp_size)
