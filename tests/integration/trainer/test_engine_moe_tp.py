"""The engine with tensor parallelism (tp 2 x dp 2 on 4 gloo ranks) and gradient
clipping, against the single-process dense GPT of tests.unit.trainer.test_tp_gpt (same
weights, same per-data-parallel-rank batches, torch AdamW + clip_grad_norm_).

Clipping makes the global gradient norm part of the numerics: it must count
each tensor-parallel shard on its own rank and each replicated parameter once
(trainer/zero/optimizer.py), or the clip coefficient -- and so every loss after
the first step -- differs. Tolerance: every rank's loss within 1e-5 (absolute;
losses are ~3.5) of the reference's for its data-parallel rank, 20 steps, with
the clip active at every step (asserted on the reference's norms).

The MoE case puts an MoE block (4 experts, ep_size 2 over the data-parallel
ranks, tp_size 2) after the tensor-parallel block: experts are replicated over
each tensor-parallel pair and held by one rank per expert-parallel group, so
their gradients are not reduced at all and the norm counts them on tp_rank 0
only. Its reference is the same model with one dense block and ep_size 1."""

from __future__ import annotations

import os

import torch
from torch import nn

from collector.testing.gloo import leave_world, run_ranks
from tests.unit.trainer.test_tp_gpt import BATCH, GPT, HEADS, HIDDEN, DenseBlock, batch

WORLD, TP, STEPS, CLIP, LR, TOL = 4, 2, 20, 0.1, 1e-2, 1e-5
STAGES = (0, 1, 2)
MOE_STAGES = (0, 2)
EXPERTS, AUX_COEF = 4, 0.01


class MoEGPT(nn.Module):
    """tests.unit.trainer.test_tp_gpt's GPT with one block, then an MoE block; forward returns CE + coeff * aux."""

    def __init__(self, block, ep_size: int, tp_size: int) -> None:
        from trainer.moe import MoE

        super().__init__()
        self.gpt = GPT(block)
        self.gpt.blocks = self.gpt.blocks[:1]
        self.ln = nn.LayerNorm(HIDDEN)
        torch.manual_seed(1)  # the MoE's gate and experts draw the same weights whatever ep_size / tp_size
        expert = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN))
        self.moe = MoE(
            HIDDEN,
            expert,
            num_experts=EXPERTS,
            ep_size=ep_size,
            k=2,
            drop_tokens=False,
            top2_2nd_expert_sampling=False,
            tp_size=tp_size,
        )

    def forward(self, idx, targets):
        g = self.gpt
        x = g.wte(idx) + g.wpe(torch.arange(idx.shape[1]))
        x = g.blocks[0](x)
        y, aux, _ = self.moe(self.ln(x))
        x = x + y
        logits = g.head(g.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()) + AUX_COEF * aux


def reference(moe: bool = False, dp: int = WORLD // TP) -> tuple[list[list[float]], list[float]]:
    """Per step, the loss of each of ``dp`` data-parallel ranks' batches, and the unclipped norm."""
    torch.manual_seed(0)
    dense = MoEGPT(DenseBlock, 1, 1) if moe else GPT(DenseBlock)
    opt = torch.optim.AdamW(dense.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for step in range(STEPS):
        per_rank = [dense(*batch(step, d)) for d in range(dp)]
        opt.zero_grad()
        (sum(per_rank) / dp).backward()
        norms.append(float(nn.utils.clip_grad_norm_(dense.parameters(), CLIP)))
        opt.step()
        losses.append([loss.item() for loss in per_rank])
    return losses, norms


def parallel_gpt(moe: bool = False):
    from trainer.tensor_parallel import ParallelTransformerBlock, load_dense_state, parallel_groups

    torch.manual_seed(0)
    groups = parallel_groups(TP)
    block = lambda: ParallelTransformerBlock(HIDDEN, HEADS, 4 * HIDDEN, groups)
    if not moe:
        dense = GPT(DenseBlock)
        model = GPT(block)
        load_dense_state(model, dense.state_dict())
        return model
    dense = MoEGPT(DenseBlock, 1, 1)
    model = MoEGPT(block, 2, TP)
    state = dense.state_dict()
    # the MoE seeds its own weights alike in both (global expert e is the same whatever ep_size)
    state.update({k: v for k, v in model.state_dict().items() if k.startswith("moe.")})
    load_dense_state(model, state)
    return model


def worker(rank: int, port: int, world: int = WORLD) -> None:
    from trainer.engine import init_distributed

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    init_distributed()
    if world == TP:  # every rank one tensor-parallel group: one replica, no data parallelism
        run_cases(rank, False, STAGES, dp=1)
    else:
        for moe, stages in ((False, STAGES), (True, MOE_STAGES)):
            run_cases(rank, moe, stages)
    leave_world()


def run_cases(rank: int, moe: bool, stages, dp: int = WORLD // TP) -> None:
    import trainer

    expected, norms = reference(moe, dp)
    assert min(norms) > CLIP, norms  # the clip acts at every step
    for stage in stages:
        config = {
            "train_batch_size": BATCH * dp,
            "gradient_clipping": CLIP,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 500},
            "tensor_parallel": {"tp_size": TP},
            "telemetry": {"enabled": False},
        }
        engine, *_ = trainer.initialize(model=parallel_gpt(moe), config=config)
        assert engine.dp_rank == rank // TP and engine.tp_rank == rank % TP
        for step in range(STEPS):
            loss = engine(*batch(step, engine.dp_rank))
            engine.backward(loss)
            engine.step()
            want = expected[step][engine.dp_rank]
            assert abs(loss.item() - want) < TOL, (moe, stage, rank, step, loss.item(), want)
        engine.close()


def test_engine_tp2_dp2_with_clipping_and_experts_matches_dense_reference():
    run_ranks(worker, WORLD)


def test_engine_tp_over_the_whole_world_matches_dense_reference():
    """tp_size = world size: one replica. Its data-parallel group is a communicator of one rank;
    None would read as the world, and ZeRO would sum the two shards' different gradients (the
    loss was 1e-3 off by step 2)."""
    run_ranks(worker, TP, TP)
