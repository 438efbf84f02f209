"""ZeRO-3 parameter life cycle in one process (the world-of-one path is the distributed path):
parameters are empty outside their module's forward/backward, prefetching changes neither the
gathers issued nor the numbers, and tied weights stay resident.

Split by tier: the pure-function tests are in tests/unit/trainer/test_engine_stage3.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainer
from trainer import comm
from trainer.examples._common import Block
from trainer.examples.gpt import GPT, synthetic_batch
from trainer.zero import set_z3_leaf_modules
from trainer.zero.leaf import mark_by_granularity


def _run(prefetch: int, steps: int = 3, zero_extra: dict | None = None, leaf_classes=None, setup=None):
    torch.manual_seed(0)
    model = GPT(dim=32, layers=2)
    if leaf_classes:
        set_z3_leaf_modules(model, leaf_classes)
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "telemetry": {"enabled": False},
        "comms_logger": {"enabled": True, "prof_ops": ["all_gather_into_tensor"]},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 100,
            "stage3_prefetch_bucket_size": prefetch,
            **(zero_extra or {}),
        },
    }
    engine, *_ = trainer.initialize(model=model, config=cfg)
    if setup is not None:
        setup(engine)
    comm.reset_summary()
    losses, sizes_between_steps = [], set()
    for step in range(steps):
        for micro in range(2):
            x, y = synthetic_batch(step, micro, 0, 4, 128, 32, "cpu")
            loss = nn.functional.cross_entropy(engine(x).reshape(-1, 128), y.reshape(-1))
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        sizes_between_steps |= {p.numel() for n, p in model.named_parameters() if n.endswith("qkv.weight")}
    comm.flush()
    by_size = comm.log_summary(return_dict=True).get("zero3.all_gather_params", {})
    return model, losses, sizes_between_steps, sum(v["count"] for v in by_size.values())


def test_engine_stage3_prefetch_is_transparent_and_params_are_released():
    model, base, sizes, gathers = _run(prefetch=1)
    _, prefetched, _, gathers_prefetched = _run(prefetch=10**8)
    assert prefetched == base
    # 9 partitioned units (8 block linears + wpe), each gathered once in forward and once in backward
    assert gathers == gathers_prefetched == 3 * 2 * 9 * 2
    assert sizes == {0}  # qkv weights (3072 elements) are partitioned: empty outside their module
    assert model.wte.weight.numel() == 128 * 32  # tied with lm_head: kept whole on every rank
    assert model.blocks[0].ln1.weight.numel() == 32  # below the persistence threshold


def test_leaf_modules_gather_a_whole_block_as_one_unit_with_the_same_numbers():
    _, base, _, _ = _run(prefetch=1)
    _, losses, sizes, gathers = _run(prefetch=1, leaf_classes=[Block])
    assert losses == base
    # 3 units (2 blocks + wpe) instead of 9, once in forward and once in backward per micro-step
    assert gathers == 3 * 2 * 3 * 2
    assert sizes == {0}  # still partitioned: empty outside the block's forward/backward
    # DeepSpeed's threshold rule: a block's granularity is its parameters // 7 modules with parameters
    # (ln1, ln2, qkv, proj, fc, out and the block itself); the root's is its 34688 (tied weight counted
    # under both owners) // 19 = 1825, so thresholds from 1814 to 1824 mark exactly the blocks
    threshold = sum(p.numel() for p in GPT(dim=32, layers=2).blocks[0].parameters()) // 7
    assert [type(m) for m in mark_by_granularity(GPT(dim=32, layers=2), threshold)] == [Block, Block]
    _, losses, _, gathers = _run(prefetch=1, zero_extra={"stage3_module_granularity_threshold": threshold})
    assert losses == base and gathers == 3 * 2 * 3 * 2
    _, losses, _, gathers = _run(prefetch=1, zero_extra={"stage3_module_granularity_threshold": 1825})
    assert losses == base and gathers == 3 * 2 * 1 * 2  # the whole model is one unit


class _ReadsChildWeight(nn.Module):
    """A parent whose forward uses its child's weight directly, as nn.MultiheadAttention does."""

    def __init__(self):
        super().__init__()
        self.child = nn.Linear(16, 16)

    def forward(self, x):
        return nn.functional.linear(x, self.child.weight).square().mean()


def _train(model, stage: int, steps: int = 3) -> list[float]:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "telemetry": {"enabled": False},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 10},
    }
    engine, *_ = trainer.initialize(model=model, config=cfg)
    losses = []
    try:
        for step in range(steps):
            x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(step))
            loss = engine(x)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
    finally:
        engine.close()
    return losses


def test_a_parent_reading_its_childs_weight_gets_a_hint_and_works_as_a_leaf():
    torch.manual_seed(0)
    with pytest.raises(RuntimeError) as info:
        _train(_ReadsChildWeight(), stage=3)
    assert any("set_z3_leaf_modules" in note for note in getattr(info.value, "__notes__", []))
    torch.manual_seed(0)
    reference = _train(_ReadsChildWeight(), stage=0)
    torch.manual_seed(0)
    model = _ReadsChildWeight()
    set_z3_leaf_modules(model, [_ReadsChildWeight])
    torch.testing.assert_close(_train(model, stage=3), reference, rtol=1e-6, atol=0)


def test_multihead_attention_is_one_unit_under_zero3_without_being_told():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0].square().mean()

    torch.manual_seed(0)
    reference = _train(Net(), stage=0)
    torch.manual_seed(0)
    torch.testing.assert_close(_train(Net(), stage=3), reference, rtol=1e-6, atol=0)


def test_nvme_parameter_reads_run_ahead_and_each_unit_waits_for_its_own_read(tmp_path):
    """With offload_param nvme, every partition read after the first forward was started before its
    unit needed it, and taking it waited for that read only: reads of later units were still in
    flight (uncollected) after some loads. Same numbers as without offload."""
    _, base, _, _ = _run(prefetch=1)
    events = []

    def spy(engine):
        swap = engine.optimizer.param_swap
        prefetch, load = swap.prefetch, swap.load

        def record_prefetch(shards):
            events.extend(("prefetch", id(t)) for t in shards if not swap.resident(t))
            prefetch(shards)

        def record_load(shards):
            missing = [id(t) for t in shards if not swap.resident(t)]
            load(shards)
            events.extend(("load", key, swap.swapper.handle.pending()) for key in missing)

        swap.prefetch, swap.load = record_prefetch, record_load

    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    _, losses, _, _ = _run(prefetch=10**8, zero_extra={"offload_param": nvme}, setup=spy)
    torch.testing.assert_close(losses, base, rtol=1e-6, atol=0)
    first_pass = 9  # the first forward has no trace to prefetch along
    loads = [(i, e[1], e[2]) for i, e in enumerate(events) if e[0] == "load"][first_pass:]
    late = [key for i, key, _ in loads if ("prefetch", key) not in events[:i]]
    assert loads and not late, f"{len(late)} of {len(loads)} reads were not started ahead"
    assert max(pending for *_, pending in loads) > 0, "every load waited for all reads in flight"
