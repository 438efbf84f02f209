"""Megatron-style tensor-parallel layers and the attention / MLP blocks of a GPT.

A column-parallel linear holds a slice of the output features, a row-parallel
one a slice of the input features; pairing them (column then row) needs one
all_reduce on the tensor-parallel group per pair in forward and one in
backward. The two conjugate autograd functions:

    copy_to_tp      forward identity      backward all_reduce(grad)
    reduce_from_tp  forward all_reduce    backward identity

For an MLP on x [B, T, H] with T-way tensor parallelism (F = ffn size)::

    x  = copy_to_tp(x)                 # [B, T, H]   replicated
    h  = gelu(x @ W1_r.T + b1_r)       # [B, T, F/T] column-parallel: my F/T features
    y  = reduce_from_tp(h @ W2_r.T)    # [B, T, H]   row-parallel partial sums, all_reduced
    y  = y + b2                        # bias added once, after the reduce

Attention splits heads the same way: the fused qkv projection is
column-parallel over heads (``partition_stride=3``: each rank takes its heads'
rows of q, of k and of v), the output projection row-parallel.

Sharded parameters carry Megatron's attributes (``tensor_model_parallel``,
``partition_dim``, ``partition_stride``); ``load_dense_state`` slices a
single-process model's state dict into this rank's shards with them.
Replicated parameters (layer norms, row-parallel biases) get identical
gradients on every rank of the tensor-parallel group, so only the
data-parallel all_reduce remains (trainer.moe.reduce_gradients with the dp group).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer import comm
from trainer.tensor_parallel.groups import ParallelGroups, parallel_groups, validate


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        comm.all_reduce(grad, group=ctx.group, log_name="tp.copy_to_tp.backward")
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        comm.all_reduce(x, group=group, log_name="tp.reduce_from_tp")
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, groups: ParallelGroups) -> torch.Tensor:
    return x if groups.tp_group is None else _CopyToTP.apply(x, groups.tp_group)


def reduce_from_tp(x: torch.Tensor, groups: ParallelGroups) -> torch.Tensor:
    return x if groups.tp_group is None else _ReduceFromTP.apply(x, groups.tp_group)


def _mark(param: nn.Parameter, dim: int, stride: int) -> None:
    param.tensor_model_parallel = True
    param.partition_dim = dim
    param.partition_stride = stride


def _divide(n: int, parts: int, what: str) -> int:
    if n % parts:
        raise ValueError(f"{what}={n} must be divisible by tensor_parallel.tp_size={parts}")
    return n // parts


def _init_linear(weight: nn.Parameter, bias: nn.Parameter | None, fan_in: int) -> None:
    # nn.Linear's init, on the full layer's fan_in so shards look like slices of a dense layer
    bound = 1 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


class ColumnParallelLinear(nn.Module):
    """y[..., out/T] = x @ W_r.T + b_r: this rank's slice of the output features."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        groups: ParallelGroups | None = None,
        partition_stride: int = 1,
    ) -> None:
        super().__init__()
        self.groups = groups or parallel_groups()
        local_out = _divide(out_features, self.groups.tp_size, "out_features")
        self.weight = nn.Parameter(torch.empty(local_out, in_features))  # [out/T, in]
        self.bias = nn.Parameter(torch.empty(local_out)) if bias else None
        _init_linear(self.weight, self.bias, in_features)
        _mark(self.weight, 0, partition_stride)
        if self.bias is not None:
            _mark(self.bias, 0, partition_stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.groups), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x[..., in/T] @ W_r.T) + b: input already split over the group."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, groups: ParallelGroups | None = None
    ) -> None:
        super().__init__()
        self.groups = groups or parallel_groups()
        local_in = _divide(in_features, self.groups.tp_size, "in_features")
        self.weight = nn.Parameter(torch.empty(out_features, local_in))  # [out, in/T]
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None  # replicated
        _init_linear(self.weight, self.bias, in_features)
        _mark(self.weight, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.groups)
        return y if self.bias is None else y + self.bias


class ParallelSelfAttention(nn.Module):
    """Causal multi-head self-attention with heads split over the tensor-parallel group."""

    def __init__(self, hidden_size: int, num_heads: int, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.groups = groups or parallel_groups()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
        validate(self.groups.tp_size, self.groups.tp_size * self.groups.dp_size, num_heads)
        self.local_heads = num_heads // self.groups.tp_size
        self.head_dim = hidden_size // num_heads
        self.qkv = ColumnParallelLinear(hidden_size, 3 * hidden_size, groups=self.groups, partition_stride=3)
        self.proj = RowParallelLinear(hidden_size, hidden_size, groups=self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, H]
        B, T, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # each [B, T, H/tp]: my heads
        q, k, v = (t.view(B, T, self.local_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, h_local, T, d]
        return self.proj(y.transpose(1, 2).reshape(B, T, self.local_heads * self.head_dim))


class ParallelMLP(nn.Module):
    def __init__(self, hidden_size: int, ffn_size: int, groups: ParallelGroups | None = None) -> None:
        super().__init__()
        self.groups = groups or parallel_groups()
        self.fc1 = ColumnParallelLinear(hidden_size, ffn_size, groups=self.groups)
        self.fc2 = RowParallelLinear(ffn_size, hidden_size, groups=self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelTransformerBlock(nn.Module):
    """Pre-LayerNorm GPT block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(
        self, hidden_size: int, num_heads: int, ffn_size: int | None = None, groups: ParallelGroups | None = None
    ) -> None:
        super().__init__()
        groups = groups or parallel_groups()
        self.ln1 = nn.LayerNorm(hidden_size)
        self.attn = ParallelSelfAttention(hidden_size, num_heads, groups)
        self.ln2 = nn.LayerNorm(hidden_size)
        self.mlp = ParallelMLP(hidden_size, ffn_size or 4 * hidden_size, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def shard(full: torch.Tensor, dim: int, stride: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """This rank's slice of ``full`` along ``dim``; with stride s the dim holds s
    blocks (e.g. q, k, v) and the rank takes its slice of each."""
    blocks = full.unflatten(dim, (stride, full.shape[dim] // stride))
    return blocks.chunk(tp_size, dim=dim + 1)[tp_rank].flatten(dim, dim + 1).contiguous()


@torch.no_grad()
def load_dense_state(module: nn.Module, dense_state: dict[str, torch.Tensor]) -> None:
    """Copy a single-process model's state into ``module``, whose parallel layers
    take their shard (same parameter names, e.g. ``blocks.0.attn.qkv.weight``)."""
    for module_name, m in module.named_modules():
        prefix = module_name + "." if module_name else ""
        for name, p in m.named_parameters(recurse=False):
            full = dense_state[prefix + name]
            if getattr(p, "tensor_model_parallel", False):
                full = shard(full, p.partition_dim, p.partition_stride, m.groups.tp_size, m.groups.tp_rank)
            if full.shape != p.shape:
                raise ValueError(
                    f"{prefix + name}: dense shape {tuple(full.shape)} does not give this rank's shape {tuple(p.shape)}"
                )
            p.copy_(full)
        for name, b in m.named_buffers(recurse=False):
            if prefix + name in dense_state:
                b.copy_(dense_state[prefix + name])
