"""Tensor parallelism in one process: the tiny GPT of trainer.tensor_parallel blocks at tp 1 is the dense
model, shard gives each rank its heads of q, k and v, and bad tp settings name the key. The module's
models and training loop serve the 4-rank tp 2 x dp 2 test too.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_tp_gpt.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainer.tensor_parallel import ParallelTransformerBlock, load_dense_state, parallel_groups, shard, validate

VOCAB, SEQ, HIDDEN, HEADS, LAYERS, BATCH, STEPS = 32, 8, 16, 4, 2, 2, 20


class DenseAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(HIDDEN, 3 * HIDDEN), nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, HEADS, HIDDEN // HEADS).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, HIDDEN))


class DenseMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class DenseBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = (
            nn.LayerNorm(HIDDEN),
            DenseAttention(),
            nn.LayerNorm(HIDDEN),
            DenseMLP(),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, block) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
        self.blocks = nn.ModuleList(block() for _ in range(LAYERS))
        self.ln_f, self.head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(self.ln_f(x)).flatten(0, 1), targets.flatten())


def batch(step: int, dp_rank: int):
    g = torch.Generator().manual_seed(100 * step + dp_rank)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def train_and_compare(groups, steps: int) -> list[float]:
    """Train the TP model and the dense reference side by side; returns max |loss diff| per step."""
    from trainer.moe import reduce_gradients

    torch.manual_seed(0)
    dense = GPT(DenseBlock)
    parallel = GPT(lambda: ParallelTransformerBlock(HIDDEN, HEADS, 4 * HIDDEN, groups))
    load_dense_state(parallel, dense.state_dict())
    opt_dense = torch.optim.AdamW(dense.parameters(), lr=1e-2)
    opt_parallel = torch.optim.AdamW(parallel.parameters(), lr=1e-2)
    dp_rank = comm_rank() // groups.tp_size
    diffs = []
    for step in range(steps):
        from collector.rank import session

        session.set_step(step)
        ref_losses = [dense(*batch(step, d)) for d in range(groups.dp_size)]
        sum(ref_losses).div(groups.dp_size).backward()  # the data-parallel mean
        loss = parallel(*batch(step, dp_rank))
        loss.backward()
        reduce_gradients(parallel, dp_group=groups.dp_group)
        diffs.append(abs(loss.item() - ref_losses[dp_rank].item()))
        for opt in (opt_dense, opt_parallel):
            opt.step()
            opt.zero_grad()
    return diffs


def comm_rank() -> int:
    from trainer import comm

    return comm.get_rank()


def test_single_rank_tp_model_is_the_dense_model():
    diffs = train_and_compare(parallel_groups(1), steps=3)
    assert max(diffs) == 0.0


def test_shard_takes_each_ranks_heads_of_q_k_and_v():
    full = torch.arange(12.0).reshape(12, 1)  # rows: q0..q3, k0..k3, v0..v3
    assert shard(full, 0, 3, 2, 1).flatten().tolist() == [2, 3, 6, 7, 10, 11]
    assert shard(torch.arange(8.0).reshape(2, 4), 1, 1, 2, 0).tolist() == [[0, 1], [4, 5]]


@pytest.mark.parametrize(
    "args,message",
    [
        ((3, 4), r"^tensor_parallel\.tp_size: must divide the world size 4 \(got 3\)$"),
        ((2, 4, 3), r"^tensor_parallel\.tp_size: must divide the number of attention heads 3 \(got 2\)$"),
        ((0, 4), r"^tensor_parallel\.tp_size: must be >= 1 \(got 0\)$"),
        ((True, 4), r"^tensor_parallel\.tp_size: must be an integer \(got True\)$"),
    ],
)
def test_bad_tp_settings_name_the_key(args, message):
    with pytest.raises(ValueError, match=message):
        validate(*args)
