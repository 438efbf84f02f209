"""Moving tokens into expert slot buffers and expert results back, by index.

GShard and older DeepSpeed do both with dense [S, E, C] one-hot einsums, which
cost S*E*C*M multiply-adds each -- as much as the experts themselves at
capacity_factor 1. These cost k*S*M copies. Each is an autograd Function with
a hand-written backward so that neither direction pays for padding rows, slice
gradients or clones the generic ops would add (together ~6% of a CPU step).

``slots`` is ``Routing.slots`` flattened choice-major: [k*S] flat slot
``e * C + c`` per choice, ``E * C`` (one past the buffer) for a dropped choice.
"""

from __future__ import annotations

import torch


def dispatch(tokens: torch.Tensor, slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """[S, M] tokens -> [num_slots, M] buffer; row slots[i*S + s] holds token s, unused rows are 0."""
    return _Dispatch.apply(tokens, slots, num_slots)


def combine(outputs: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[num_slots, M] expert results -> [S, M]: sum over choices i of weights[i, s] * outputs[slot of (i, s)].
    A dropped choice has weight 0 and contributes nothing."""
    return _Combine.apply(outputs, slots, weights)


def _kept_slots(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    # Dropped choices read the last real row instead of a padding row; their weight or mask zeroes it.
    return slots.clamp_max(num_slots - 1)


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tokens: torch.Tensor, slots: torch.Tensor, num_slots: int) -> torch.Tensor:
        S, M = tokens.shape
        k = slots.numel() // S
        ctx.save_for_backward(slots)
        ctx.num_slots, ctx.k = num_slots, k
        # One spare row takes every dropped choice, so the copy needs no filtering (and no host sync).
        buffer = tokens.new_zeros(num_slots + 1, M)
        buffer.index_copy_(0, slots, tokens.expand(k, S, M).reshape(k * S, M))
        return buffer[:num_slots]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (slots,) = ctx.saved_tensors
        picked = grad.index_select(0, _kept_slots(slots, ctx.num_slots))  # [k*S, M]
        picked.masked_fill_((slots == ctx.num_slots).unsqueeze(1), 0)  # a dropped token got no gradient
        grad_tokens = picked.view(ctx.k, -1, grad.shape[1]).sum(dim=0) if ctx.k > 1 else picked
        return grad_tokens, None, None


class _Combine(torch.autograd.Function):
    # The weighting and the sum over choices run in the gate's fp32 even for half-precision
    # experts: summing top-2 choices in bf16 measurably loses precision.
    @staticmethod
    def forward(ctx, outputs: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        num_slots, M = outputs.shape
        k, S = weights.shape
        picked = outputs.index_select(0, _kept_slots(slots, num_slots)).view(k, S, M)
        ctx.save_for_backward(slots, weights, picked)
        ctx.num_slots = num_slots
        w = weights.unsqueeze(2)  # [k, S, 1]
        out = (picked * w).sum(dim=0) if k > 1 else picked[0] * w[0]
        return out.to(outputs.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # grad [S, M]
        slots, weights, picked = ctx.saved_tensors
        k, S = weights.shape
        grad_weights = grad_outputs = None
        if ctx.needs_input_grad[2]:
            grad_weights = (picked * grad.unsqueeze(0)).sum(dim=2, dtype=weights.dtype)  # [k, S]
        if ctx.needs_input_grad[0]:
            per_choice = (grad.unsqueeze(0) * weights.unsqueeze(2)).to(grad.dtype).reshape(k * S, -1)
            # dropped choices add into a spare row, so a non-finite grad cannot leak into a real slot
            padded = grad.new_zeros(ctx.num_slots + 1, grad.shape[1])
            grad_outputs = padded.index_add_(0, slots, per_choice)[: ctx.num_slots]
        return grad_outputs, None, grad_weights
