"""Flops and MACs of one ATen operator call.

The profiler sees every operator at the ATen level (a dispatch mode), so a
model's ``F.linear``, ``torch.matmul``, ``a @ b``, ``einsum`` and
``baddbmm`` all arrive here as ``mm`` / ``addmm`` / ``bmm`` / ``baddbmm``, and
``nn.Conv*`` and ``F.conv*`` as ``convolution``. One formula per operator
therefore covers every way of writing the same maths.

Conventions (the flops profiler's, so totals read the same):
- MACs come only from matmul-class operators (mm, bmm, convolution,
  attention); their flops are 2 * MACs, which is exactly what
  ``torch.utils.flop_counter.FlopCounterMode`` counts.
- A bias add (addmm, baddbmm, convolution with bias) adds one flop per output
  element on top.
- Pointwise operators (ATen's ``pointwise`` tag): one flop per output element.
- Reductions (sum, mean, ...), softmax and pooling: one flop per input element.
- Layer/group/batch norm in training: 5 flops per element with an affine
  weight, 4 without; batch norm in eval: 2 (affine) or 1.
- Embedding lookups, views, copies (clone included) and dropout: 0.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import torch

aten = torch.ops.aten

Count = tuple[int, int]  # (flops, macs)
Formula = Callable[[dict, object], Count]

_FORMULAS: dict[object, Formula] = {}


def _formula(*packets):
    def register(fn: Formula) -> Formula:
        for packet in packets:
            _FORMULAS[packet] = fn
        return fn

    return register


def _numel(t) -> int:
    return t.numel() if isinstance(t, torch.Tensor) else 0


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return None


def _matmul(macs: int, bias_out=None) -> Count:
    return 2 * macs + _numel(bias_out), macs


@_formula(aten.mm)
def _mm(a: dict, out) -> Count:
    m, k = a["self"].shape
    n = a["mat2"].shape[-1]
    return _matmul(m * k * n)


@_formula(aten.addmm)
def _addmm(a: dict, out) -> Count:
    m, k = a["mat1"].shape
    n = a["mat2"].shape[-1]
    return _matmul(m * k * n, out)


@_formula(aten.bmm)
def _bmm(a: dict, out) -> Count:
    b, m, k = a["self"].shape
    n = a["mat2"].shape[-1]
    return _matmul(b * m * k * n)


@_formula(aten.baddbmm)
def _baddbmm(a: dict, out) -> Count:
    b, m, k = a["batch1"].shape
    n = a["batch2"].shape[-1]
    return _matmul(b * m * k * n, out)


@_formula(aten.mv, aten.dot, aten.vdot)
def _vector_product(a: dict, out) -> Count:
    # mv: (m, k) @ (k,) -> m*k MACs; dot: (k,) . (k,) -> k MACs
    return _matmul(_numel(a["self"]))


@_formula(aten.convolution, aten._convolution)
def _convolution(a: dict, out) -> Count:
    x, w = a["input"], a["weight"]
    # Every output position of every output channel multiplies a full
    # (in_channels / groups) x kernel window; for a transposed convolution the
    # roles of input and output positions swap, and weight is (in, out/groups, *k).
    positions = x.shape[2:] if a["transposed"] else out.shape[2:]
    macs = x.shape[0] * prod(w.shape) * prod(positions)
    return _matmul(macs, out if a.get("bias") is not None else None)


@_formula(
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
)
def _sdpa(a: dict, out) -> Count:
    q, k, v = a["query"], a["key"], a["value"]
    # q (B, H, Lq, E) @ k^T (B, H, E, Lk), then (B, H, Lq, Lk) @ v (B, H, Lk, Ev):
    # 4 * B * H * Lq * Lk * D flops when E == Ev, FlopCounterMode's formula.
    *batch, lq, e = q.shape
    lk, ev = k.shape[-2], v.shape[-1]
    return _matmul(prod(batch) * lq * lk * (e + ev))


@_formula(aten.native_layer_norm, aten.native_group_norm)
def _norm(a: dict, out) -> Count:
    return _numel(a["input"]) * (5 if a.get("weight") is not None else 4), 0


@_formula(aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training)
def _batch_norm(a: dict, out) -> Count:
    affine = a.get("weight") is not None
    if a.get("training", False):
        return _numel(a["input"]) * (5 if affine else 4), 0
    return _numel(a["input"]) * (2 if affine else 1), 0


@_formula(
    aten._softmax,
    aten._log_softmax,
    aten.sum,
    aten.mean,
    aten.prod,
    aten.amax,
    aten.amin,
    aten.max,
    aten.min,
    aten.var,
    aten.var_mean,
    aten.std,
    aten.std_mean,
    aten.logsumexp,
    aten.linalg_vector_norm,
    aten.norm,
    aten.cumsum,
    aten.max_pool1d,
    aten.max_pool2d_with_indices,
    aten.max_pool3d_with_indices,
    aten.avg_pool1d,
    aten.avg_pool2d,
    aten.avg_pool3d,
    aten._adaptive_avg_pool2d,
    aten._adaptive_avg_pool3d,
    aten.adaptive_max_pool2d,
    aten.adaptive_max_pool3d,
)
def _per_input_element(a: dict, out) -> Count:
    return _numel(a["self"] if "self" in a else a.get("input")), 0


# Tagged pointwise by ATen but only move data.
@_formula(aten.embedding, aten.native_dropout, aten.dropout, aten.clone, aten.positive)
def _free(a: dict, out) -> Count:
    return 0, 0


def _bind(func, args, kwargs) -> dict:
    """Arguments by their schema names, so formulas need not know positions."""
    bound = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    bound.update(kwargs)
    return bound


def count(func, args, kwargs, out) -> Count:
    """(flops, macs) of ``func(*args, **kwargs)`` that returned ``out``."""
    formula = _FORMULAS.get(func.overloadpacket)
    if formula is not None:
        return formula(_bind(func, args, kwargs), out)
    if torch.Tag.pointwise in func.tags:
        result = _first_tensor(out)
        if result is not None and result.is_floating_point():
            return result.numel(), 0
    return 0, 0
