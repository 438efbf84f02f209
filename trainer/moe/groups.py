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

from trainer import comm
from trainer.tensor_parallel.groups import process_group


@dataclass(frozen=True)
class ExpertGroups:
    ep_size: int
    tp_size: int
    ep_group: object | None   # this rank's expert-parallel group (None: a single rank)
    edp_group: object | None  # this rank's expert-data-parallel group (None: a single rank)
    edp_size: int

    @property
    def name(self) -> str:
        """What expert parameters carry as ``group_name`` (DeepSpeed's spelling, + tp when used)."""
        return f"ep_size_{self.ep_size}" + (f"_tp_{self.tp_size}" if self.tp_size > 1 else "")


_GROUPS: dict[str, ExpertGroups] = {}  # by name


def validate(num_experts: int, ep_size: int, world_size: int, tp_size: int = 1) -> None:
    """One clear message per bad setting, naming it."""
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"moe.num_experts must be a positive integer, got {num_experts!r}")
    if not isinstance(ep_size, int) or ep_size < 1:
        raise ValueError(f"moe.ep_size must be a positive integer, got {ep_size!r}")
    if world_size % tp_size:
        raise ValueError(f"tensor_parallel.tp_size={tp_size} must divide the world size {world_size}")
    ranks = world_size // tp_size
    where = f"the world size {world_size}" if tp_size == 1 else \
        f"the data-parallel size {ranks} (world {world_size} / tensor_parallel.tp_size {tp_size})"
    if ep_size > ranks:
        raise ValueError(f"moe.ep_size={ep_size} is larger than {where}")
    if ranks % ep_size:
        raise ValueError(f"moe.ep_size={ep_size} must divide {where}")
    if num_experts % ep_size:
        raise ValueError(f"moe.num_experts={num_experts} must be divisible by moe.ep_size={ep_size}")


def expert_groups(ep_size: int, tp_size: int = 1) -> ExpertGroups:
    """This rank's groups for ``ep_size`` under ``tp_size`` (collective on first call for them)."""
    key = ExpertGroups(ep_size, tp_size, None, None, 0).name
    groups = _GROUPS.get(key)
    if groups is not None:
        return groups
    world, rank = comm.get_world_size(), comm.get_rank()
    if world % tp_size or (world // tp_size) % ep_size:
        raise ValueError(f"moe.ep_size={ep_size} must divide the data-parallel size of world {world} / "
                         f"tensor_parallel.tp_size {tp_size}")
    ep_group = edp_group = None
    edp_size = world // tp_size // ep_size
    if comm.is_initialized() and world > 1:
        for t in range(tp_size):
            dp_ranks = list(range(t, world, tp_size))
            for start in range(0, len(dp_ranks), ep_size):
                ranks = dp_ranks[start:start + ep_size]
                g = process_group(ranks)
                if rank in ranks:
                    ep_group = g
            for offset in range(ep_size):
                ranks = dp_ranks[offset::ep_size]
                g = process_group(ranks)
                if rank in ranks:
                    edp_group = g
    groups = _GROUPS[key] = ExpertGroups(ep_size, tp_size, ep_group, edp_group, edp_size)
    return groups


def groups_named(name: str) -> ExpertGroups:
    """The groups an expert parameter's ``group_name`` refers to."""
    return _GROUPS[name]
