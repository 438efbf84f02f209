"""A small BERT-style encoder trained on synthetic masked-token data with the bundled engine.

    torchrun --nproc_per_node 2 -m trainer.examples.bert --config trainer/examples/configs/zero3.json --steps 30

Sequences count up by a per-sequence stride; 15% of positions are replaced by
[MASK] and the model predicts them from both sides.
"""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F

import trainer
from trainer.examples._common import Block, init_weights, load_config, parse_args, run_main, train_loop

VOCAB, SEQ, MASK = 128, 32, 0


class Bert(nn.Module):
    def __init__(self, vocab: int = VOCAB, seq: int = SEQ, dim: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim, heads, causal=False) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.apply(init_weights)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))  # [B, T, C]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))  # [B, T, vocab]


def masked_batch(step: int, micro: int, rank: int, batch: int, device):
    g = torch.Generator().manual_seed(step * 1_000_003 + micro * 1009 + rank + 17)
    start = torch.randint(1, VOCAB, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    seq = 1 + (start + stride * torch.arange(SEQ)) % (VOCAB - 1)  # tokens 1..VOCAB-1; 0 is [MASK]
    masked = torch.rand(batch, SEQ, generator=g) < 0.15
    masked[:, 0] = True  # at least one target per row
    return seq.masked_fill(masked, MASK).to(device), seq.to(device), masked.to(device)


def main() -> None:
    args = parse_args("Train a small BERT-style encoder with the bundled engine.", "zero2.json")
    torch.manual_seed(args.seed)
    engine, *_ = trainer.initialize(model=Bert(), config=load_config(args))
    rank = int(os.environ.get("RANK", 0))

    def batches(step, micro):
        x, target, masked = masked_batch(step, micro, rank, engine.train_micro_batch_size_per_gpu(), engine.device)
        return x, lambda logits: F.cross_entropy(logits.float()[masked], target[masked])

    train_loop(engine, batches, args, "bert")


if __name__ == "__main__":
    run_main(main)
