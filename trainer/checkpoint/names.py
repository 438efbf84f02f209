"""How a model's tensors are named in a checkpoint, whatever the layout that trained it.

Names are the module's own ``state_dict`` keys with one change: MoE experts are
named by *global* expert id. A rank with ``ep_size`` E holds experts
``first_expert .. first_expert + num_experts/E - 1`` as ``local_experts.0, 1, ...``;
in a checkpoint local expert i is ``local_experts.<first_expert + i>``. With
ep_size 1 the two agree, so a consolidated state dict (zero_to_fp32) loads into
the plain single-process model, and a checkpoint saved with ep_size 2 resumes
with ep_size 4: each rank looks its experts up by global id.

Every state_dict key is one of:
- a trainable parameter the optimizer steps (its fp32 master and moments are in
  the shards, split into fragments);
- an alias: the same Parameter under a second name (tied weights: GPT's
  ``lm_head.weight`` is ``wte.weight``), kept once under its first name;
- a frozen parameter (``requires_grad=False`` or not given to the optimizer) or a
  buffer: saved whole, as the module holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


def _expert_lists(module: nn.Module) -> list[tuple[str, object]]:
    """(prefix of its ``local_experts`` list, MoE layer) for every MoE layer of ``module``."""
    from trainer.moe import MoE

    return [
        (f"{name}.experts.local_experts." if name else "experts.local_experts.", m)
        for name, m in module.named_modules()
        if isinstance(m, MoE)
    ]


def expert_renames(module: nn.Module) -> list[tuple[str, str, object]]:
    """(module prefix, checkpoint prefix, expert-data-parallel group) for every local expert."""
    return [
        (f"{base}{i}.", f"{base}{moe.experts.first_expert + i}.", moe.groups.edp_group)
        for base, moe in _expert_lists(module)
        for i in range(len(moe.experts.local_experts))
    ]


def rename(key: str, renames: list[tuple[str, str, object]]) -> tuple[str, tuple | None]:
    """``key``'s checkpoint name, and the rename that applied (None for a non-expert key)."""
    for r in renames:
        if key.startswith(r[0]):
            return r[1] + key[len(r[0]) :], r
    return key, None


@dataclass
class ModelNames:
    """The checkpoint names of one model's state (see the module docstring)."""

    params: dict[int, str] = field(default_factory=dict)  # id(trainable parameter) -> name
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> name it is kept under
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    frozen: dict[str, torch.Tensor] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # every state_dict key, in module order
    expert_groups: dict[str, object] = field(default_factory=dict)  # expert name -> its expert-data-parallel group
    expert_layers: dict[str, int] = field(default_factory=dict)  # "<moe>.experts.local_experts." -> experts

    def is_other_ranks_expert(self, name: str) -> bool:
        """Whether ``name`` (not one of this rank's names) is an expert of one of this model's MoE
        layers, held by another rank."""
        for base, count in self.expert_layers.items():
            if name.startswith(base):
                head = name[len(base) :].split(".", 1)[0]
                return head.isdigit() and int(head) < count
        return False


def model_names(module: nn.Module, trainable: set[int]) -> ModelNames:
    """Names for ``module``'s state; ``trainable`` holds id() of the parameters the optimizer steps."""
    renames = expert_renames(module)
    out = ModelNames(expert_layers={base: moe.num_experts for base, moe in _expert_lists(module)})
    first_name: dict[int, str] = {}
    for key, value in module.state_dict(keep_vars=True).items():
        name, expert = rename(key, renames)
        out.order.append(name)
        if expert is not None:
            out.expert_groups[name] = expert[2]
        if isinstance(value, nn.Parameter):
            if id(value) in first_name:
                out.aliases[name] = first_name[id(value)]
                continue
            first_name[id(value)] = name
            if id(value) in trainable:
                out.params[id(value)] = name
            else:
                out.frozen[name] = value.detach()
        else:
            out.buffers[name] = value.detach()
    return out
