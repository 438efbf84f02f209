"""A token-by-token reference for an MoE layer, written from the routing rules
(GShard capacity, first choices before second choices, token order) rather
than from trainer.moe's tensor code, so the two can disagree."""

from __future__ import annotations

import math

import torch


def reference_capacity(num_tokens, num_experts, k, capacity_factor, min_capacity):
    return max(min_capacity, math.ceil(k * num_tokens * capacity_factor / num_experts))


def reference_moe(tokens, gate_weight, experts, *, k, capacity):
    """tokens [S, M]; gate_weight [E, M]; experts: E callables (global order).
    Returns (output [S, M], aux_loss, routed [E], dropped [E]); differentiable."""
    S, _ = tokens.shape
    E = gate_weight.shape[0]
    dtype = torch.promote_types(tokens.dtype, torch.float32)  # the gate runs in at least fp32
    probs = torch.softmax(tokens.to(dtype) @ gate_weight.to(dtype).t(), dim=1)  # [S, E]
    choices = []  # per token: list of chosen experts, best first
    for s in range(S):
        order = sorted(range(E), key=lambda e: -probs[s, e].item())
        choices.append(order[:k])
    load = [0] * E
    kept = [[False] * k for _ in range(S)]
    for rank_of_choice in range(k):  # all first choices queue before any second choice
        for s in range(S):
            e = choices[s][rank_of_choice]
            kept[s][rank_of_choice] = load[e] < capacity
            load[e] += 1
    routed = torch.tensor(load)
    dropped = torch.tensor([max(0, n - capacity) for n in load])
    rows = []
    for s in range(S):
        ws = [probs[s, e] if kept[s][i] else probs[s, e] * 0 for i, e in enumerate(choices[s])]
        if k == 2:
            total = torch.clamp(ws[0] + ws[1], min=torch.finfo(probs.dtype).eps)
            ws = [w / total for w in ws]
        out = tokens[s] * 0
        for w, e, keep in zip(ws, choices[s], kept[s]):
            if keep:
                out = out + w.to(tokens.dtype) * experts[e](tokens[s : s + 1])[0]
        rows.append(out)
    first_share = torch.zeros(E)
    for s in range(S):
        first_share[choices[s][0]] += 1.0 / S
    aux = E * sum(probs[:, e].mean() * first_share[e] for e in range(E))
    return torch.stack(rows), aux, routed, dropped
