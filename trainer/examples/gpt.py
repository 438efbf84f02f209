"""A small GPT on synthetic next-token data, trained with the bundled engine.

    torchrun --nproc_per_node 4 -m trainer.examples.gpt --config trainer/examples/configs/zero2.json --steps 50
    python -m trainer.examples.gpt --steps 20 --run my-run     # one process, world of one
    torchrun --nproc_per_node 4 -m trainer.examples.gpt --moe --num-experts 4 --ep-size 2 --top-k 2
    torchrun --nproc_per_node 4 -m trainer.examples.gpt --moe --num-experts 4 8 --layers 4   # pyramid
    torchrun --nproc_per_node 4 -m trainer.examples.gpt --tp 2                                # tp 2 x dp 2

``--moe`` makes every other block's MLP a trainer.moe.MoE (blocks 1, 3, ...);
``--num-experts`` gives one count for all of them or one per MoE block (a
pyramid). The blocks return their load-balancing loss and the training loss is
``cross_entropy + --moe-loss-coeff * sum(aux_loss)`` (the engine only
backpropagates what it is given). ``--tp 2`` sets ``tensor_parallel.tp_size``
and builds Megatron-style blocks (trainer.tensor_parallel); each tensor-parallel
group reads the batch of its data-parallel rank (``engine.dp_rank``).

The data is learnable: each sequence counts up by a per-sequence stride (mod the
vocabulary), so the loss falls within a few dozen steps. Set RANKSCOPE_ENDPOINT
to stream telemetry to a collector.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.nn import functional as F

import trainer
from trainer.engine import init_distributed
from trainer.examples._common import Block, init_weights, load_config, parse_args, run_main, train_loop, user_error


class MoEBlock(nn.Module):
    """Pre-norm block whose MLP is a mixture of experts; forward returns (x, aux_loss)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        num_experts: int,
        ep_size: int,
        k: int,
        use_residual: bool,
        tp_size: int = 1,
        groups=None,
    ) -> None:
        super().__init__()
        from trainer.moe import MoE

        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if groups is not None:
            from trainer.tensor_parallel import ParallelSelfAttention

            self.attn = ParallelSelfAttention(dim, heads, groups)
        else:
            self.attn = _Attention(dim, heads)
        expert = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        expert.apply(init_weights)
        self.moe = MoE(
            dim, expert, num_experts=num_experts, ep_size=ep_size, k=k, use_residual=use_residual, tp_size=tp_size
        )

    def forward(self, x: torch.Tensor):
        x = x + self.attn(self.ln1(x))
        y, aux, _ = self.moe(self.ln2(x))
        return x + y, aux


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


@torch.no_grad()
def init_parallel_weights(model: nn.Module) -> None:
    """GPT-2's N(0, 0.02) for tensor-parallel layers too: every rank draws the full dense
    matrix (ranks are seeded alike) and keeps its shard, so the shards are slices of one
    dense layer rather than copies of each other."""
    from trainer.tensor_parallel import ColumnParallelLinear, RowParallelLinear, shard

    for m in model.modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            w, tp, rank = m.weight, m.groups.tp_size, m.groups.tp_rank
            full_shape = list(w.shape)
            full_shape[w.partition_dim] *= tp
            w.copy_(shard(torch.randn(full_shape) * 0.02, w.partition_dim, w.partition_stride, tp, rank))
            if m.bias is not None:
                m.bias.zero_()


class GPT(nn.Module):
    """``moe``: None for a dense GPT, else dict(num_experts=[...], ep_size, k, use_residual) with
    MoE at blocks 1, 3, ...; ``tp_size`` > 1: tensor-parallel blocks. Returns logits, or
    (logits, sum of aux losses) with MoE."""

    def __init__(
        self,
        vocab: int = 128,
        block_size: int = 32,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        moe: dict | None = None,
        tp_size: int = 1,
    ):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(block_size, dim)
        groups = None
        if tp_size > 1:
            from trainer.tensor_parallel import ParallelTransformerBlock, parallel_groups

            groups = parallel_groups(tp_size)
        moe_layers = list(range(1, layers, 2)) if moe else []
        if moe:
            counts = list(moe["num_experts"])
            if len(counts) == 1:
                counts *= len(moe_layers)
            if len(counts) != len(moe_layers):
                raise ValueError(
                    f"--num-experts has {len(counts)} entries but the model has {len(moe_layers)} "
                    f"MoE blocks (--layers {layers}: blocks 1, 3, ...)"
                )
        blocks = []
        for i in range(layers):
            if i in moe_layers:
                blocks.append(
                    MoEBlock(
                        dim,
                        heads,
                        counts[moe_layers.index(i)],
                        moe["ep_size"],
                        moe["k"],
                        moe["use_residual"],
                        tp_size=tp_size,
                        groups=groups,
                    )
                )
            elif groups is not None:
                blocks.append(ParallelTransformerBlock(dim, heads, 4 * dim, groups))
            else:
                blocks.append(Block(dim, heads, causal=True))
        self.blocks = nn.ModuleList(blocks)
        self.moe = bool(moe)
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        from trainer.moe.experts import Experts

        keep = {id(m) for e in self.modules() if isinstance(e, Experts) for m in e.modules()}
        for m in self.modules():  # experts keep their per-expert seeded init (they must differ)
            if id(m) not in keep:
                init_weights(m)
        if groups is not None:
            init_parallel_weights(self)

    def forward(self, idx: torch.Tensor):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # [B, T, C]
        aux = []
        for block in self.blocks:
            x = block(x)
            if isinstance(x, tuple):
                x, a = x
                aux.append(a)
        logits = self.lm_head(self.ln_f(x))  # [B, T, vocab]
        return (logits, torch.stack(aux).sum()) if self.moe else logits


def synthetic_batch(step: int, micro: int, rank: int, batch: int, vocab: int, block_size: int, device):
    g = torch.Generator().manual_seed(step * 1_000_003 + micro * 1009 + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    seq = (start + stride * torch.arange(block_size + 1)) % vocab  # [B, T+1]
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--moe", action="store_true", help="MoE MLP in every other block (1, 3, ...)")
    p.add_argument(
        "--num-experts",
        type=int,
        nargs="+",
        default=[4],
        help="experts per MoE block: one count, or one per MoE block (a pyramid)",
    )
    p.add_argument("--ep-size", type=int, default=1, help="expert-parallel size")
    p.add_argument("--top-k", type=int, default=1, choices=(1, 2), help="experts per token")
    p.add_argument(
        "--mlp-type",
        default="standard",
        choices=("standard", "residual"),
        help="residual: PR-MoE (a dense MLP beside the experts)",
    )
    p.add_argument("--moe-loss-coeff", type=float, default=0.01, help="weight of the load-balancing loss")
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel.tp_size")
    p.add_argument(
        "--straggler",
        default=None,
        metavar="RANK:MS@STEP",
        help="make RANK a straggler from STEP on: it busy-waits MS before each forward (trainer.examples.faults)",
    )


def parse_straggler(spec: str) -> tuple[int, float, int]:
    """``RANK:MS@STEP`` (``1:40@300``) -> (rank, ms, step)."""
    try:
        rank, rest = spec.split(":", 1)
        ms, _, step = rest.partition("@")
        return int(rank), float(ms), int(step or 0)
    except ValueError:
        user_error(f"--straggler {spec!r}: expected RANK:MS@STEP, e.g. 1:40@300")


def stage_straggler(model: nn.Module, engine, spec: str) -> None:
    """The fault ``--straggler`` asks for: from STEP on, RANK busy-waits MS before each forward
    (busy, as trainer.examples.faults' ``sleep`` fault: on a CPU-only host a real sleep would hand
    its core to the other ranks and hide part of the delay). The slowed rank says so once."""
    rank, ms, step = parse_straggler(spec)
    if int(os.environ.get("RANK", 0)) != rank or ms <= 0:
        return
    announced = False

    def before_forward(module, args) -> None:
        nonlocal announced
        if engine.global_steps < step:
            return
        if not announced:
            announced = True
            print(f"[gpt] step {engine.global_steps}: rank {rank} is now a straggler (+{ms:g} ms per step)", flush=True)
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    model.register_forward_pre_hook(before_forward)


def main() -> None:
    args = parse_args("Train a small GPT with the bundled engine.", "zero2.json", add_arguments)
    config = load_config(args)
    if args.tp > 1:
        config["tensor_parallel"] = dict(config.get("tensor_parallel", {}), tp_size=args.tp)
    init_distributed()  # MoE expert groups and tensor-parallel groups are process groups
    torch.manual_seed(args.seed)
    moe = None
    if args.moe:
        moe = dict(
            num_experts=args.num_experts, ep_size=args.ep_size, k=args.top_k, use_residual=args.mlp_type == "residual"
        )
    try:
        model = GPT(layers=args.layers, moe=moe, tp_size=args.tp)
    except ValueError as e:
        user_error(str(e))
    engine, *_ = trainer.initialize(model=model, config=config)
    if args.straggler:
        stage_straggler(model, engine, args.straggler)

    def batches(step, micro):
        x, y = synthetic_batch(
            step, micro, engine.dp_rank, engine.train_micro_batch_size_per_gpu(), 128, 32, engine.device
        )

        def loss_fn(out):
            logits, aux = out if args.moe else (out, None)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            return loss if aux is None else loss + args.moe_loss_coeff * aux

        return x, loss_fn

    train_loop(engine, batches, args, "gpt")


if __name__ == "__main__":
    run_main(main)
