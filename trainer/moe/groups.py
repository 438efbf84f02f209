"""Expert-parallel process groups.

With W data-parallel ranks and ``ep_size`` E (E divides W), ranks are tiled
into W/E expert-parallel groups of consecutive ranks; each group holds one
full copy of every MoE layer's experts, ``num_experts / E`` per rank. The
ranks holding the *same* experts form the expert-data-parallel groups (stride
E), where expert gradients are averaged. World 4, E 2:

    expert-parallel       [0,1] [2,3]     tokens all_to_all here (dispatch, combine)
    expert-data-parallel  [0,2] [1,3]     expert grads all_reduce here

Dense (non-expert) parameters are reduced over the whole data-parallel group
as usual. Groups are made once per ``ep_size`` on first use; every rank must
build its MoE layers in the same order, since ``new_group`` is collective.
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer import comm


@dataclass(frozen=True)
class ExpertGroups:
    ep_size: int
    ep_group: object | None   # this rank's expert-parallel group (None: a single rank)
    edp_group: object | None  # this rank's expert-data-parallel group (None: a single rank)
    edp_size: int

    @property
    def name(self) -> str:
        """What expert parameters carry as ``group_name`` (DeepSpeed's spelling)."""
        return f"ep_size_{self.ep_size}"


_GROUPS: dict[int, ExpertGroups] = {}


def validate(num_experts: int, ep_size: int, world_size: int) -> None:
    """One clear message per bad setting, naming it."""
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"moe.num_experts must be a positive integer, got {num_experts!r}")
    if not isinstance(ep_size, int) or ep_size < 1:
        raise ValueError(f"moe.ep_size must be a positive integer, got {ep_size!r}")
    if ep_size > world_size:
        raise ValueError(f"moe.ep_size={ep_size} is larger than the world size {world_size}")
    if world_size % ep_size:
        raise ValueError(f"moe.ep_size={ep_size} must divide the world size {world_size}")
    if num_experts % ep_size:
        raise ValueError(f"moe.num_experts={num_experts} must be divisible by moe.ep_size={ep_size}")


def _new_group(ranks: list[int], world: int):
    """Every rank creates every group, in the same order (new_group is collective).
    A group of one rank needs no communicator; one of all ranks is the world's."""
    if len(ranks) == 1:
        return None
    if len(ranks) == world:
        return comm.group.WORLD
    return comm.new_group(ranks)


def expert_groups(ep_size: int) -> ExpertGroups:
    """This rank's groups for ``ep_size`` (collective on first call for that size)."""
    groups = _GROUPS.get(ep_size)
    if groups is not None:
        return groups
    world, rank = comm.get_world_size(), comm.get_rank()
    if world % ep_size or ep_size > world:
        raise ValueError(f"moe.ep_size={ep_size} must divide the world size {world}")
    ep_group = edp_group = None
    edp_size = world // ep_size
    if comm.is_initialized() and world > 1:
        for start in range(0, world, ep_size):
            ranks = list(range(start, start + ep_size))
            g = _new_group(ranks, world)
            if rank in ranks:
                ep_group = g
        for offset in range(ep_size):
            ranks = list(range(offset, world, ep_size))
            g = _new_group(ranks, world)
            if rank in ranks:
                edp_group = g
    groups = _GROUPS[ep_size] = ExpertGroups(ep_size, ep_group, edp_group, edp_size)
    return groups

