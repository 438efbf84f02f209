"""This rank's experts: ``num_local_experts`` copies of the user's expert module.

Each copy is re-initialised from a seed drawn once per MoE layer plus its
*global* expert index, so experts differ from each other and global expert e
starts from the same weights whatever ``ep_size`` is (every rank draws the
same seed when ranks are seeded alike).

Expert parameters are marked the way DeepSpeed marks them, so the engine can
keep them out of the data-parallel all_reduce and reduce them over the
expert-data-parallel group instead (trainer.moe.gradients)::

    param.allreduce = False
    param.group_name = "ep_size_<E>"
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def mark_expert_param(param: nn.Parameter, group_name: str) -> None:
    param.allreduce = False
    param.group_name = group_name


def is_expert_param(param: nn.Parameter) -> bool:
    return getattr(param, "allreduce", True) is False


def _reinitialise(module: nn.Module, seed: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()


class Experts(nn.Module):
    def __init__(self, expert: nn.Module, num_local_experts: int, first_expert: int, group_name: str) -> None:
        super().__init__()
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        self.local_experts = nn.ModuleList()
        for i in range(num_local_experts):
            e = copy.deepcopy(expert)
            _reinitialise(e, seed + first_expert + i)
            self.local_experts.append(e)
        self.first_expert = first_expert  # global index of local expert 0
        for p in self.parameters():
            mark_expert_param(p, group_name)

    def forward(self, x: torch.Tensor, fill: list[int] | None = None) -> torch.Tensor:
        """x: [ep, E_local, C, M], the slot buffers from every rank of the expert-parallel group.
        ``fill``: ep * E_local counts of filled slots, block (rank r, expert i) at r * E_local + i.
        Slots fill from 0, so with it each expert computes only its filled prefixes; the empty
        rest of the output stays zero (nobody reads it) instead of costing a matmul row."""
        if fill is None:
            # unbind, not x[:, i]: the gradient of each x[:, i] would be a zero-filled copy of all of x
            # each [ep, C, M]
            outs = [expert(chunk) for chunk, expert in zip(x.unbind(dim=1), self.local_experts)]
            return torch.stack(outs, dim=1)  # [ep, E_local, C, M]
        ep, n, C, M = x.shape
        # Split the flat buffer into (filled, empty) runs per block: one split, one gradient cat.
        runs = x.reshape(-1, M).split([r for f in fill for r in (f, C - f)])
        filled = runs[0::2]
        pad = x.new_zeros(C, M)
        pieces = [None] * len(fill)
        for i, expert in enumerate(self.local_experts):
            blocks = range(i, ep * n, n)  # expert i's block from each rank
            out = expert(torch.cat([filled[b] for b in blocks])).split([fill[b] for b in blocks])
            for b, piece in zip(blocks, out):
                pieces[b] = piece
        return torch.cat([t for b, f in enumerate(fill) for t in (pieces[b], pad[: C - f])]).reshape(ep, n, C, M)

    def forward_packed(self, x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        # x: [sum(sizes), M] -- local expert i's tokens are the i-th run of sizes[i] rows
        return torch.cat([expert(chunk) for chunk, expert in zip(x.split(sizes), self.local_experts)])
