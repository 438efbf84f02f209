"""The engine with tensor parallelism (tp 2 x dp 2 on 4 gloo ranks) and gradient
clipping, against the single-process dense GPT of tests.test_tp_gpt (same
weights, same per-data-parallel-rank batches, torch AdamW + clip_grad_norm_).

Clipping makes the global gradient norm part of the numerics: it must count
each tensor-parallel shard on its own rank and each replicated parameter once
(trainer/zero/optimizer.py), or the clip coefficient -- and so every loss after
the first step -- differs. Tolerance: every rank's loss within 1e-5 (absolute;
losses are ~3.5) of the reference's for its data-parallel rank, 20 steps, with
the clip active at every step (asserted on the reference's norms)."""
from __future__ import annotations

import os

import torch
import torch.multiprocessing as mp
from torch import nn

from tests.conftest import free_port
from tests.test_tp_gpt import GPT, HEADS, HIDDEN, BATCH, DenseBlock, batch

WORLD, TP, STEPS, CLIP, LR, TOL = 4, 2, 20, 0.1, 1e-2, 1e-5
DP = WORLD // TP
STAGES = (0, 1, 2)


def reference() -> tuple[list[list[float]], list[float]]:
    """Per step, the loss of each data-parallel rank's batch, and the unclipped norm."""
    torch.manual_seed(0)
    dense = GPT(DenseBlock)
    opt = torch.optim.AdamW(dense.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        per_rank = [dense(*batch(step, d)) for d in range(DP)]
        opt.zero_grad()
        (sum(per_rank) / DP).backward()
        norms.append(float(nn.utils.clip_grad_norm_(dense.parameters(), CLIP)))
        opt.step()
        losses.append([loss.item() for loss in per_rank])
    return losses, norms


def parallel_gpt():
    from trainer.tensor_parallel import ParallelTransformerBlock, load_dense_state, parallel_groups

    torch.manual_seed(0)
    dense = GPT(DenseBlock)
    groups = parallel_groups(TP)
    model = GPT(lambda: ParallelTransformerBlock(HIDDEN, HEADS, 4 * HIDDEN, groups))
    load_dense_state(model, dense.state_dict())
    return model


def worker(rank: int, port: int) -> None:
    import trainer
    from trainer.engine import init_distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_distributed()
    expected, norms = reference()
    assert min(norms) > CLIP, norms  # the clip acts at every step
    for stage in STAGES:
        config = {"train_batch_size": BATCH * DP, "gradient_clipping": CLIP,
                  "optimizer": {"type": "AdamW", "params": {"lr": LR}},
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
                  "tensor_parallel": {"tp_size": TP}, "telemetry": {"enabled": False}}
        engine, *_ = trainer.initialize(model=parallel_gpt(), config=config)
        assert engine.dp_rank == rank // TP and engine.tp_rank == rank % TP
        for step in range(STEPS):
            loss = engine(*batch(step, engine.dp_rank))
            engine.backward(loss)
            engine.step()
            want = expected[step][engine.dp_rank]
            assert abs(loss.item() - want) < TOL, (stage, rank, step, loss.item(), want)
        engine.close()


def test_engine_tp2_dp2_with_clipping_matches_dense_reference():
    mp.spawn(worker, args=(free_port(),), nprocs=WORLD, join=True)
