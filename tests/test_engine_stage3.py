"""ZeRO-3 parameter life cycle in one process (the world-of-one path is the distributed path):
parameters are empty outside their module's forward/backward, prefetching changes neither the
gathers issued nor the numbers, and tied weights stay resident."""
from __future__ import annotations

import torch
from torch import nn

import trainer
from trainer import comm
from trainer.examples.gpt import GPT, synthetic_batch


def _run(prefetch: int, steps: int = 3):
    torch.manual_seed(0)
    model = GPT(dim=32, layers=2)
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "telemetry": {"enabled": False},
           "comms_logger": {"enabled": True, "prof_ops": ["all_gather_into_tensor"]},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100,
                                 "stage3_prefetch_bucket_size": prefetch}}
    engine, *_ = trainer.initialize(model=model, config=cfg)
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
    _, prefetched, _, gathers_prefetched = _run(prefetch=10 ** 8)
    assert prefetched == base
    # 9 partitioned units (8 block linears + wpe), each gathered once in forward and once in backward
    assert gathers == gathers_prefetched == 3 * 2 * 9 * 2
    assert sizes == {0}  # qkv weights (3072 elements) are partitioned: empty outside their module
    assert model.wte.weight.numel() == 128 * 32  # tied with lm_head: kept whole on every rank
    assert model.blocks[0].ln1.weight.numel() == 32  # below the persistence threshold
