"""A small GPT on synthetic next-token data, trained with the bundled engine.

    torchrun --nproc_per_node 4 -m trainer.examples.gpt --config trainer/examples/configs/zero2.json --steps 50
    python -m trainer.examples.gpt --steps 20 --run my-run     # one process, world of one

The data is learnable: each sequence counts up by a per-sequence stride (mod the
vocabulary), so the loss falls within a few dozen steps. Set RANKSCOPE_ENDPOINT
to stream telemetry to a collector.
"""
from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F

import trainer
from trainer.examples._common import Block, init_weights, load_config, parse_args, train_loop


class GPT(nn.Module):
    def __init__(self, vocab: int = 128, block_size: int = 32, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(block_size, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, causal=True) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(init_weights)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # [B, T, vocab]


def synthetic_batch(step: int, micro: int, rank: int, batch: int, vocab: int, block_size: int, device):
    g = torch.Generator().manual_seed(step * 1_000_003 + micro * 1009 + rank)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    seq = (start + stride * torch.arange(block_size + 1)) % vocab  # [B, T+1]
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def main() -> None:
    args = parse_args("Train a small GPT with the bundled engine.", "zero2.json")
    torch.manual_seed(args.seed)
    model = GPT()
    engine, *_ = trainer.initialize(model=model, config=load_config(args))
    rank = int(os.environ.get("RANK", 0))

    def batches(step, micro):
        x, y = synthetic_batch(step, micro, rank, engine.train_micro_batch_size_per_gpu(), 128, 32, engine.device)
        return x, lambda logits: F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))

    train_loop(engine, batches, args, "gpt")


if __name__ == "__main__":
    main()
