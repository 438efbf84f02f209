"""Optimizer state in a checkpoint: which optimizer, its per-element state, its step, its groups.

torch's ``optimizer.state_dict()`` keys state by position in the param groups,
and under ZeRO a "parameter" is a rank's flat master shard: both depend on the
layout that trained. The checkpoint keeps instead, per parameter fragment, the
*per-element* state (Adam's ``exp_avg`` / ``exp_avg_sq``, SGD's
``momentum_buffer``: every tensor shaped like the master) and the step count,
and, per param group, its options (lr, betas, eps, weight_decay, ...).

The optimizer *type* is its update rule: torch.optim.AdamW and native.CPUAdam
in AdamW mode are both "AdamW", so a run moved onto or off CPU offload resumes
with its moments. Different types (AdamW moments into SGD) cannot be resumed:
the state means something else, and loading says so.
"""

from __future__ import annotations

import torch

# Options that choose an implementation, not the update: never copied between optimizers.
_IMPLEMENTATION_OPTIONS = {"params", "foreach", "fused", "capturable", "differentiable"}


def optimizer_type(optimizer: torch.optim.Optimizer) -> str:
    """The update rule's name: "AdamW", "Adam" (L2 weight decay), "SGD", or the class name."""
    name = type(optimizer).__name__
    if name == "CPUAdam":
        return "AdamW" if optimizer.defaults.get("adamw_mode", True) else "Adam"
    if name == "Adam" and optimizer.defaults.get("decoupled_weight_decay", False):
        return "AdamW"
    return name


def per_element_state(state: dict, master: torch.Tensor) -> dict[str, torch.Tensor]:
    """The state tensors that have one value per master element."""
    return {k: v for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0 and v.shape == master.shape}


def step_of(state: dict) -> float | None:
    step = state.get("step")
    return None if step is None else float(step)


def step_value(optimizer: torch.optim.Optimizer, step: float):
    """``step`` the way ``optimizer`` keeps it: torch's optimizers a float32 tensor, others an int."""
    if type(optimizer).__module__.startswith("torch.optim"):
        return torch.tensor(float(step), dtype=torch.float32)
    return int(step)


def group_options(optimizer: torch.optim.Optimizer) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def restore_group_options(optimizer: torch.optim.Optimizer, saved: list[dict]) -> None:
    """Each group's saved options that this optimizer also has (lr, betas, eps, weight_decay...)."""
    for group, options in zip(optimizer.param_groups, saved):
        for k, v in options.items():
            if k in group and k not in _IMPLEMENTATION_OPTIONS:
                group[k] = tuple(v) if isinstance(group[k], tuple) else v
