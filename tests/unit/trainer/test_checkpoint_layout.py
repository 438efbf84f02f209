"""The checkpoint's layout logic without processes, at scale: fragments written by 1,024
ZeRO ranks cover every parameter exactly once and read back for any other layout; the
index's name order merges every rank's experts; the resumable sampler deals the same global
batches at any world size (1, 2, 4 and 1,024 ranks); zero_to_fp32 as users run it.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_checkpoint_layout.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainer.checkpoint.fragments import runs, writer_span
from trainer.checkpoint.layout import CheckpointError
from trainer.checkpoint.save import build_index, merge_orders
from trainer.data_sampler import ResumableDistributedSampler
from trainer.zero.partition import build_buckets


def _params() -> list[tuple[str, nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    shapes = [(37, 5), (3,), (1000,), (7, 7, 3), (1,), (250, 4)]
    return [(f"p{i}", nn.Parameter(torch.randn(s, generator=g))) for i, s in enumerate(shapes)]


def test_every_element_is_written_once_whatever_the_layout():
    named = _params()
    for world in (1, 2, 3, 1024):
        for shards in (1, world):  # replicated (ZeRO-0: the group splits the writing) or partitioned
            for bucket_numel in (1, 100, 10**6):
                seen = {n: torch.zeros(p.numel(), dtype=torch.int32) for n, p in named}
                for rank in range(world):
                    for b in build_buckets(
                        named,
                        group_index=0,
                        bucket_numel=bucket_numel,
                        num_shards=shards,
                        shard_index=rank if shards > 1 else 0,
                        group_size=world,
                    ):
                        lo, hi = writer_span(b, rank)
                        for s, a, c in runs(b.slots, lo, hi):
                            seen[s.name][a:c] += 1
                assert all(bool((v == 1).all()) for v in seen.values()), (world, shards, bucket_numel)


def test_an_index_with_a_gap_is_refused():
    meta = {
        "tp_rank": 0,
        "file": "shards/rank_00000.pt",
        "state_keys": [],
        "fragments": {"w": (0, 5)},
        "shapes": {"w": ([10], "float32", 0)},
        "buffers": [],
        "frozen": [],
        "aliases": {},
        "order": ["w"],
    }
    with pytest.raises(CheckpointError, match="parameter w: fragments cover 5 of 10 elements"):
        build_index([meta], 1)


def test_name_order_merges_every_ranks_experts_in_module_order():
    rank0 = ["emb", "moe.e.0.w", "moe.e.1.w", "head"]
    rank1 = ["emb", "moe.e.2.w", "moe.e.3.w", "head"]
    assert merge_orders([rank0, rank1]) == ["emb", "moe.e.0.w", "moe.e.1.w", "moe.e.2.w", "moe.e.3.w", "head"]
    ranks = [["emb", f"moe.e.{r}.w", "head"] for r in range(1024)]
    assert merge_orders(ranks) == ["emb", *[f"moe.e.{r}.w" for r in range(1024)], "head"]


def _global_batches(world: int, micro: int, dataset_len: int, resume: dict | None = None, steps: int = 3):
    """The global batches ``world`` samplers deal (each rank's indices cut into micro-batches)."""
    samplers = [ResumableDistributedSampler(range(dataset_len), world, r, seed=3) for r in range(world)]
    for s in samplers:
        if resume:
            s.load_state_dict(resume)
    streams = [list(iter(s)) for s in samplers]
    batches = []
    for k in range(steps):
        batches.append(sorted(i for st in streams for i in st[k * micro : (k + 1) * micro]))
        for s in samplers:
            s.advance(world * micro)
    return batches, samplers[0].state_dict()


def test_the_sampler_deals_the_same_global_batches_on_any_world_size_and_resumes_between_them():
    n, batch = 8192, 1024
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3)).tolist()
    want = [sorted(perm[k * batch : (k + 1) * batch]) for k in range(6)]
    states = {}
    for world in (1, 2, 4, 1024):
        first, states[world] = _global_batches(world, batch // world, n)
        assert first == want[:3], world
        assert states[world]["position"] == 3 * batch
    for saved, resumed in ((2, 4), (4, 1), (1024, 1), (1, 1024)):
        rest, _ = _global_batches(resumed, batch // resumed, n, resume=states[saved])
        assert rest == want[3:], (saved, resumed)
    with pytest.raises(ValueError, match="the checkpoint's dataset had 8192 samples, this one has 10"):
        ResumableDistributedSampler(range(10), 1, 0).load_state_dict(states[1])
