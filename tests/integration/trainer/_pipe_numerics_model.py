"""The model and data of test_pipe_numerics, shared with its DeepSpeed side (_deepspeed_pipe_numerics.py, run in
the DeepSpeed venv, which has no pytest): layer specs from either engine's ``pipe`` module."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

H, MICRO, STEPS, SEED = 16, 2, 20, 1234


def _transposed(module, x):
    return x @ module.weight


def layer_specs(tied: bool, pipe=None) -> list:
    """``pipe``: the module with LayerSpec and TiedLayerSpec (default trainer.pipe; deepspeed.pipe)."""
    if pipe is None:
        import trainer.pipe as pipe
    LayerSpec, TiedLayerSpec = pipe.LayerSpec, pipe.TiedLayerSpec

    first = TiedLayerSpec("proj", nn.Linear, H, H, bias=False) if tied else LayerSpec(nn.Linear, H, H)
    again = (
        TiedLayerSpec("proj", nn.Linear, H, H, bias=False, forward_fn=_transposed)
        if tied
        else LayerSpec(nn.Linear, H, H)
    )
    return [
        first,
        LayerSpec(nn.Tanh),
        LayerSpec(nn.Linear, H, H),
        LayerSpec(nn.Tanh),
        LayerSpec(nn.Linear, H, H),
        LayerSpec(nn.Tanh),
        LayerSpec(nn.Linear, H, H),
        again,
        LayerSpec(nn.Linear, H, 1),
    ]


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh inputs each step; targets of a fixed teacher, large enough that the default clipping bites."""
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(size, H, generator=g)
    teacher = torch.randn(H, 1, generator=torch.Generator().manual_seed(7))
    return x, 3.0 * torch.tanh(x @ teacher)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.float(), y.float())
