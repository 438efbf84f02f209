"""Tensor-parallel and data-parallel process groups (Megatron's layout).

``tensor_parallel.tp_size`` T splits the world of W ranks into W/T
tensor-parallel groups of consecutive ranks (they share one model replica,
each holding 1/T of every parallel layer) and T data-parallel groups with
stride T (same shard, different data). World 4, T 2::

    tensor-parallel  [0,1] [2,3]     activations all_reduce here, every layer
    data-parallel    [0,2] [1,3]     gradients all_reduce here, once per step
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from collector.rank.config import ConfigBlock, setting
from trainer import comm


@dataclass(kw_only=True)
class TensorParallelConfig(ConfigBlock):
    """``tensor_parallel``: the tensor-parallel degree (DeepSpeed's AutoTP spells it ``autotp_size``).
    ``enabled: false`` turns it off whatever ``tp_size`` says."""

    SECTION: ClassVar[str] = "tensor_parallel"
    ALIASES: ClassVar[dict[str, str]] = {"autotp_size": "tp_size"}
    enabled: bool = True
    tp_size: int = setting(1, ge=1)

    @classmethod
    def _renamed(cls, d, key):
        if d.get("autotp_size") == 0:  # DeepSpeed's way of saying off
            d = {k: v for k, v in d.items() if k != "autotp_size"}
            d.setdefault("enabled", False)
        return super()._renamed(d, key)

    def validate(self) -> None:
        if not self.enabled:
            self.tp_size = 1

    def check_layout(self, world_size: int, num_heads: int | None = None) -> None:
        """What the degree must divide: the job's ranks, and a model's attention heads."""
        if world_size % self.tp_size:
            self.fail("tp_size", f"must divide the world size {world_size}", self.tp_size)
        if num_heads is not None and num_heads % self.tp_size:
            self.fail("tp_size", f"must divide the number of attention heads {num_heads}", self.tp_size)


@dataclass(frozen=True)
class ParallelGroups:
    tp_size: int
    tp_rank: int
    tp_group: object | None  # None: one rank, nothing to communicate
    dp_size: int
    dp_group: object | None


_GROUPS: dict[int, ParallelGroups] = {}


def validate(tp_size: int, world_size: int, num_heads: int | None = None) -> TensorParallelConfig:
    """One clear message per bad setting, naming it; the settings as checked."""
    cfg = TensorParallelConfig(tp_size=tp_size)
    cfg.check_layout(world_size, num_heads)
    return cfg


_BY_RANKS: dict[tuple[int, ...], object] = {}


def process_group(ranks: list[int], role: str | None = None, *, one_rank: bool = False):
    """The communicator for ``ranks``: None for one rank (a real one with ``one_rank``: where None
    would read as the world), the world's for all of them, else made once per rank set, so layouts
    that coincide (tp 2's data-parallel ranks and MoE's expert-parallel ranks) share one group and
    one name in the comm table. ``role`` (tp, dp, pp, ep...) is the group's description, which
    names it there (``tp[0-1]``; the first role asked for a rank set). Collective the first time:
    every rank asks for every group, in the same order."""
    world = comm.get_world_size()
    if len(ranks) == 1 and not one_rank:
        return None
    if len(ranks) == world:
        return comm.group.WORLD
    key = tuple(ranks)
    if key not in _BY_RANKS:
        _BY_RANKS[key] = comm.new_group(list(ranks), group_desc=role)
    return _BY_RANKS[key]


def own_group(rank_lists: list[list[int]], rank: int, role: str | None = None, *, one_rank: bool = False):
    """Every group of ``rank_lists`` made in order (process_group: collective, every rank passes the
    same lists) and ``rank``'s among them; None where it is in none."""
    mine = None
    for ranks in rank_lists:
        group = process_group(ranks, role, one_rank=one_rank)
        if rank in ranks:
            mine = group
    return mine


def parallel_groups(tp_size: int = 1) -> ParallelGroups:
    """This rank's groups for ``tp_size`` (collective on first call for that size)."""
    groups = _GROUPS.get(tp_size)
    if groups is not None:
        return groups
    world, rank = comm.get_world_size(), comm.get_rank()
    tp_size = validate(tp_size, world).tp_size
    tp_group = dp_group = None
    if comm.is_initialized() and world > 1:
        tp_group = own_group([list(range(s, s + tp_size)) for s in range(0, world, tp_size)], rank, "tp")
        # one replica (tp_size = world): a group of one rank, as None would mean the world to the engine
        dp_group = own_group([list(range(o, world, tp_size)) for o in range(tp_size)], rank, "dp", one_rank=True)
    groups = _GROUPS[tp_size] = ParallelGroups(tp_size, rank % tp_size, tp_group, world // tp_size, dp_group)
    return groups
