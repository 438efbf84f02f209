"""What the corpus scripts share, in plain torch (it is imported under DeepSpeed's venv too):
a tiny seeded model, deterministic per-rank batches, and ``report`` writing what a script
observed to ``OUT/<script>.rank<R>.json`` for the test to compare across engines."""

from __future__ import annotations

import json
import os

import torch
from torch import nn

D_IN, D_HID, D_OUT = 8, 16, 2


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_HID), nn.Tanh(), nn.Linear(D_HID, D_OUT))


def batch(step: int, rank: int, size: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch ``micro`` of step ``step``; targets from a fixed linear teacher."""
    g = torch.Generator().manual_seed(10_000 * step + 100 * micro + rank)
    x = torch.randn(size, D_IN, generator=g)
    teacher = torch.randn(D_IN, D_OUT, generator=torch.Generator().manual_seed(7))
    return x, x @ teacher


class TeacherDataset(torch.utils.data.Dataset):
    """A map-style dataset of ``n`` (x, y) pairs, for ``training_data=``."""

    def __init__(self, n: int = 64):
        self.x, self.y = batch(0, 0, n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def report(out: str, name: str, **observed) -> None:
    """Write this rank's observations (JSON-able values) for the comparison."""
    os.makedirs(out, exist_ok=True)
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
        json.dump(observed, f, indent=1, sort_keys=True)
