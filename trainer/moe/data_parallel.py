"""Data parallelism that knows about experts: which group each parameter is
kept in sync over, the start-of-training broadcast, and gradient averaging.

The training loss is the mean over the W data-parallel ranks of each rank's
local loss. A dense parameter's local gradient covers its own rank's tokens,
so it is summed over the data-parallel group and divided by W. An expert
parameter's local gradient already covers every token of its expert-parallel
group (the all_to_all backward brought them home), so it is summed over its
expert-data-parallel group only -- the other copies of the same expert --
and also divided by W::

    dense  grad = all_reduce(grad, dp group) / W
    expert grad = all_reduce(grad, expert-data-parallel group of its ep_size) / W

Likewise, at start-up a dense parameter is broadcast over the data-parallel
group, an expert parameter only over its expert-data-parallel group (ranks in
one expert-parallel group hold different experts).

``dp_group`` is the data-parallel group: the world (None) without tensor
parallelism, trainer.tensor_parallel.parallel_groups(tp).dp_group with it.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer import comm
from trainer.moe import groups as moe_groups
from trainer.moe.experts import is_expert_param


def sync_group(param: nn.Parameter, dp_group=None) -> tuple[object | None, int]:
    """(group, size) over which ``param`` is replicated; size 1 means nothing to sync."""
    if is_expert_param(param):
        groups = moe_groups.groups_named(param.group_name)
        return groups.edp_group, groups.edp_size
    return dp_group, comm.get_world_size(dp_group)


def _first_rank(group) -> int:
    if group is None or group is comm.group.WORLD:
        return 0
    return comm.get_process_group_ranks(group)[0]


@torch.no_grad()
def broadcast_parameters(module: nn.Module, dp_group=None) -> None:
    """Make every replica of every parameter equal to its group's first rank's."""
    for p in module.parameters():
        group, size = sync_group(p, dp_group)
        if size > 1:
            comm.broadcast(p.data, src=_first_rank(group), group=group, log_name="broadcast_parameters")


def reduce_gradients(module: nn.Module, dp_group=None) -> None:
    """Average gradients over data-parallel ranks (see the module docstring)."""
    dp_size = comm.get_world_size(dp_group)
    if dp_size == 1:
        return
    for p in module.parameters():
        if p.grad is None:
            continue
        group, size = sync_group(p, dp_group)
        if size > 1:
            comm.all_reduce(
                p.grad,
                group=group,
                log_name="moe.reduce_expert_gradients" if is_expert_param(p) else "reduce_gradients",
            )
        p.grad.div_(dp_size)
