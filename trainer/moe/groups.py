"""Expert-parallel process groups.

Expert parallelism runs over the data-parallel ranks: with W ranks and
tensor-parallel size T (1 without tensor parallelism) each tensor-parallel
rank t has the data-parallel ranks t, t+T, t+2T, ... (D = W/T of them). With
``ep_size`` E (E divides D) those are tiled into D/E expert-parallel groups
of E ranks each; each group holds one full copy of every MoE layer's experts,
``num_experts / E`` per rank. The ranks holding the *same* experts form the
expert-data-parallel groups (stride E), where expert gradients are averaged.

    world 4, T 1, E 2:  expert-parallel [0,1] [2,3]   expert-data-parallel [0,2] [1,3]
    world 4, T 2, E 2:  expert-parallel [0,2] [1,3]   expert-data-parallel [0] [1] [2] [3]

Tokens go all_to_all over the expert-parallel group (dispatch, combine);
expert gradients all_reduce over the expert-data-parallel group. Under tensor
parallelism the ranks of a tensor-parallel group see the same tokens and hold
the same experts (experts are not split), like any other replicated layer.
Groups are made once per (E, T) on first use; every rank must build its MoE
layers in the same order, since ``new_group`` is collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from collector.rank.config import ConfigBlock, derived, setting
from trainer import comm
from trainer.tensor_parallel import groups as tp_groups
from trainer.tensor_parallel.groups import own_group


@dataclass(frozen=True)
class ExpertGroups:
    ep_size: int
    tp_size: int
    ep_group: object | None  # this rank's expert-parallel group (None: a single rank)
    edp_group: object | None  # this rank's expert-data-parallel group (None: a single rank)
    edp_size: int

    @property
    def name(self) -> str:
        """What expert parameters carry as ``group_name`` (DeepSpeed's spelling, + tp when used)."""
        return f"ep_size_{self.ep_size}" + (f"_tp_{self.tp_size}" if self.tp_size > 1 else "")


_GROUPS: dict[str, ExpertGroups] = {}  # by name


@dataclass(kw_only=True)
class ExpertParallelConfig(ConfigBlock):
    """A MoE layer's expert count and expert-parallel size, checked against the job's ranks."""

    SECTION: ClassVar[str] = "moe"
    num_experts: int = setting(1, ge=1)
    ep_size: int = setting(1, ge=1)
    world_size: int = derived(1)
    tp_size: int = derived(1)

    def validate(self) -> None:
        world, tp, ep = self.world_size, self.tp_size, self.ep_size
        tp_groups.validate(tp, world)
        ranks = world // tp
        where = (
            f"the world size {world}"
            if tp == 1
            else f"the data-parallel size {ranks} (world {world} / tensor_parallel.tp_size {tp})"
        )
        if ep > ranks:
            self.fail("ep_size", f"must not exceed {where}", ep)
        if ranks % ep:
            self.fail("ep_size", f"must divide {where}", ep)
        if self.num_experts % ep:
            self.fail("num_experts", f"must be divisible by moe.ep_size ({ep})", self.num_experts)


def validate(num_experts: int, ep_size: int, world_size: int, tp_size: int = 1) -> ExpertParallelConfig:
    """One clear message per bad setting, naming it; the settings as checked."""
    return ExpertParallelConfig(num_experts=num_experts, ep_size=ep_size, world_size=world_size, tp_size=tp_size)


def expert_groups(ep_size: int, tp_size: int = 1) -> ExpertGroups:
    """This rank's groups for ``ep_size`` under ``tp_size`` (collective on first call for them)."""
    key = ExpertGroups(ep_size, tp_size, None, None, 0).name
    groups = _GROUPS.get(key)
    if groups is not None:
        return groups
    world, rank = comm.get_world_size(), comm.get_rank()
    if world % tp_size or (world // tp_size) % ep_size:
        raise ValueError(
            f"moe.ep_size={ep_size} must divide the data-parallel size of world {world} / "
            f"tensor_parallel.tp_size {tp_size}"
        )
    ep_group = edp_group = None
    edp_size = world // tp_size // ep_size
    if comm.is_initialized() and world > 1:
        for t in range(tp_size):
            dp_ranks = list(range(t, world, tp_size))
            ep = own_group([dp_ranks[s : s + ep_size] for s in range(0, len(dp_ranks), ep_size)], rank, "ep")
            edp = own_group([dp_ranks[o::ep_size] for o in range(ep_size)], rank, "edp")
            if rank in dp_ranks:
                ep_group, edp_group = ep, edp
    groups = _GROUPS[key] = ExpertGroups(ep_size, tp_size, ep_group, edp_group, edp_size)
    return groups


def groups_named(name: str) -> ExpertGroups:
    """The groups an expert parameter's ``group_name`` refers to."""
    return _GROUPS[name]
