"""Top-1 / top-2 gating with expert capacity (GShard, as DeepSpeed's sharded_moe).

For S tokens on this rank and E experts::

    gates    = softmax(x @ Wg)                             # [S, E] fp32
    choice_i = argmax (top-1), then argmax of the rest     # [S] for i < k
    capacity = max(min_capacity, ceil(k * S / E * capacity_factor))
    slot     = the token's position in its expert's buffer, in token order,
               every first choice before any second choice
    kept     = slot < capacity              (drop_tokens=False: capacity = the
               largest expert load over the expert-parallel group, nothing dropped)

so per expert, dropped = max(0, routed - capacity). The combine weight of a
kept choice is its gate probability (top-2: renormalised over the kept
choices). aux_loss = E * sum_e mean_s(gates[:, e]) * fraction of tokens whose
first choice is e, the GShard / Switch load-balancing loss.

Random token selection (``use_rts``, top-1 only, like DeepSpeed): when an
expert overflows, the kept tokens are a uniform random subset instead of the
first ``capacity`` in token order. ``top2_2nd_expert_sampling`` adds Gumbel
noise before picking the second expert (training only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from collector.rank.config import ConfigBlock, setting
from trainer import comm

NOISY_GATE_POLICIES = (None, "Jitter", "RSample")


@dataclass(kw_only=True)
class GateConfig(ConfigBlock):
    """The gate's settings: DeepSpeed's MoE arguments, named ``moe.<argument>`` in errors."""

    SECTION: ClassVar[str] = "moe"
    k: int = setting(1, choices=(1, 2))  # top-1 or top-2 gating
    capacity_factor: float = setting(1.0, gt=0)
    eval_capacity_factor: float = setting(1.0, gt=0)
    min_capacity: int = setting(4, ge=0)
    noisy_gate_policy: str | None = setting(None, choices=NOISY_GATE_POLICIES)
    drop_tokens: bool = True
    use_rts: bool = True
    top2_2nd_expert_sampling: bool = True


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert per rank: ceil(k * tokens / experts * capacity_factor), at least min_capacity."""
    return max(min_capacity, math.ceil(num_tokens / num_experts * (k * capacity_factor)))


class Routing(NamedTuple):
    """What the gate decided for S tokens, E experts, C slots per expert, in sparse form:
    choice i of token s goes to flat slot ``slots[i, s] = e * C + c`` of the [E * C] slot
    buffer with weight ``weights[i, s]``; a dropped choice points at slot E * C (one past
    the buffer: the layer's spare zero row) with weight 0. A tuple, so hooks that walk
    module outputs (ZeRO-3's re-gather before backward) see its tensors."""

    slots: torch.Tensor  # [k, S] int64 flat slot per choice, E * C where dropped
    weights: torch.Tensor  # [k, S] combine weight per choice, 0 where dropped
    aux_loss: torch.Tensor  # [] load-balancing loss
    expert_counts: torch.Tensor  # [E] int64 tokens routed to each expert (before dropping)
    dropped: torch.Tensor  # [E] int64 of those, tokens over capacity
    capacity: int

    def kept(self) -> torch.Tensor:
        """[E] tokens each expert keeps: its filled slots, slots 0 .. kept - 1."""
        return self.expert_counts - self.dropped

    def dispatch_mask(self) -> torch.Tensor:
        """The dense [S, E, C] bool form GShard and DeepSpeed build: token s fills slot c of expert e."""
        return self._dense(torch.ones_like(self.weights)).bool()

    def combine_weights(self) -> torch.Tensor:
        """The dense [S, E, C] form: gate weight of token s in slot c of expert e, else 0."""
        return self._dense(self.weights)

    def _dense(self, values: torch.Tensor) -> torch.Tensor:
        _k, S = self.slots.shape
        E, C = self.expert_counts.numel(), self.capacity
        dense = torch.zeros(S, E * C + 1, dtype=values.dtype, device=values.device)
        dense.scatter_add_(1, self.slots.t(), values.t())
        return dense[:, :-1].reshape(S, E, C)


def _gumbel(shape, device) -> torch.Tensor:
    return -torch.log(-torch.log(torch.rand(shape, device=device).clamp_min(1e-20)).clamp_min(1e-20))


class TopKGate(nn.Module):
    def __init__(
        self,
        model_dim: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        top2_2nd_expert_sampling: bool = True,
        ep_group=None,
    ) -> None:
        super().__init__()
        cfg = GateConfig(
            k=k,
            capacity_factor=capacity_factor,
            eval_capacity_factor=eval_capacity_factor,
            min_capacity=min_capacity,
            noisy_gate_policy=noisy_gate_policy,
            drop_tokens=drop_tokens,
            use_rts=use_rts,
            top2_2nd_expert_sampling=top2_2nd_expert_sampling,
        )
        # A parameter of the gate itself (not a child Linear), so it is used in the forward of the
        # module that owns it -- what ZeRO-3's per-module gather relies on. Init as nn.Linear's.
        self.weight = nn.Parameter(torch.empty(num_experts, model_dim))  # [E, M]
        nn.init.uniform_(self.weight, -1 / math.sqrt(model_dim), 1 / math.sqrt(model_dim))
        self.num_experts, self.k = num_experts, cfg.k
        self.capacity_factor, self.eval_capacity_factor = cfg.capacity_factor, cfg.eval_capacity_factor
        self.min_capacity = cfg.min_capacity
        self.noisy_gate_policy = cfg.noisy_gate_policy
        self.drop_tokens, self.use_rts = cfg.drop_tokens, cfg.use_rts
        self.top2_2nd_expert_sampling = cfg.top2_2nd_expert_sampling
        self.ep_group = ep_group

    def forward(self, tokens: torch.Tensor) -> Routing:  # tokens: [S, M]
        # Routing in half precision flips argmaxes: gate in at least fp32, as DeepSpeed does.
        dtype = torch.promote_types(self.weight.dtype, torch.float32)
        x = tokens.to(dtype)
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = x * torch.empty_like(x).uniform_(1.0 - 1e-2, 1.0 + 1e-2)
        logits = F.linear(x, self.weight.to(dtype))  # [S, E]
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return self.route(logits, factor)

    def route(self, logits: torch.Tensor, capacity_factor: float) -> Routing:
        S, E = logits.shape
        gates = F.softmax(logits, dim=1)  # [S, E]
        first_by = (
            logits + _gumbel(logits.shape, logits.device)
            if self.noisy_gate_policy == "RSample" and self.training
            else gates
        )
        masks = [F.one_hot(first_by.argmax(dim=1), E)]  # [S, E] int64, one per choice
        if self.k == 2:
            second_by = (
                logits + _gumbel(logits.shape, logits.device)
                if self.top2_2nd_expert_sampling and self.training
                else logits
            )
            masks.append(F.one_hot(second_by.masked_fill(masks[0].bool(), float("-inf")).argmax(dim=1), E))
        counts = sum(masks).sum(dim=0)  # [E]
        aux_loss = (gates.mean(dim=0) * masks[0].float().mean(dim=0)).sum() * E

        if self.drop_tokens:
            capacity = expert_capacity(S, E, self.k, capacity_factor, self.min_capacity)
        else:  # every rank of the expert-parallel group must agree: all_to_all needs equal buffers
            largest = counts.max().reshape(1)
            if self.ep_group is not None:
                comm.all_reduce(largest, op=comm.ReduceOp.MAX, group=self.ep_group, log_name="moe.no_drop_capacity")
            capacity = max(1, int(largest.item()))

        if self.k == 1 and self.use_rts and self.drop_tokens and self.training:
            # keep a random `capacity` of each expert's tokens, then slot them in token order
            score = masks[0] * torch.rand(S, E, device=logits.device)
            keep = torch.zeros_like(masks[0]).scatter_(0, score.topk(min(capacity, S), dim=0).indices, 1)
            masks[0] = masks[0] * keep
        slots, offset = [], torch.zeros(1, E, dtype=torch.long, device=logits.device)
        expert_base = torch.arange(E, device=logits.device) * capacity  # [E] first flat slot of each expert
        for i, mask in enumerate(masks):
            slot = torch.cumsum(mask, dim=0) - 1 + offset  # [S, E]
            offset = offset + mask.sum(dim=0, keepdim=True)  # second choices queue behind all first choices
            masks[i] = mask * (slot < capacity)
            kept = masks[i].sum(dim=1).bool()  # [S]
            flat = ((slot + expert_base) * masks[i]).sum(dim=1)  # [S] e * C + c of the chosen expert
            slots.append(torch.where(kept, flat, E * capacity))
        dropped = counts - sum(masks).sum(dim=0)

        weights = [(gates * m).sum(dim=1) for m in masks]  # [S] per choice, 0 where dropped
        if self.k == 2:
            denom = (weights[0] + weights[1]).clamp_min(torch.finfo(gates.dtype).eps)
            weights = [w / denom for w in weights]
        return Routing(torch.stack(slots), torch.stack(weights), aux_loss, counts, dropped, capacity)
