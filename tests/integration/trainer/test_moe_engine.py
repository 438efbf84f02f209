"""An MoE model trained by the bundled engine (trainer.initialize) on 2 gloo
ranks, against a single-process AdamW reference on the same per-rank batches.

Cases cover ZeRO 0-3 with ep_size 1 (every expert on every rank, expert
buckets synced over the whole data-parallel group) and ep_size 2 (each rank
holds 2 of the 4 experts: expert buckets have an expert-data-parallel group of
one rank, so they are neither reduced nor partitioned, while dense buckets
are), with and without gradient clipping (the norm then counts each expert
once across the world). The reference is the same model built with ep_size 1
in one process: global expert e starts from the same weights whatever ep_size
is (trainer.moe.experts). No-drop routing, so each rank's routing does not
depend on which other tokens share its batch. Tolerance: each rank's loss
within 1e-5 (absolute; losses are ~0.5) of the reference's at every step.

Checkpoints: every case saves after SAVE_AT steps; a fresh engine on a
differently initialised model loads it and repeats the remaining steps with the
same losses (within 1e-6). The checkpoint names experts by global id
(``moe.experts.local_experts.<e>``) whatever ep_size saved them, each once,
holding that expert's weights at the save."""

from __future__ import annotations

import os

import torch
from torch import nn

from collector.testing.gloo import leave_world, run_ranks

WORLD, D_IN, HIDDEN, D_OUT, EXPERTS, BATCH, STEPS, AUX_COEF = 2, 6, 8, 3, 4, 8, 6, 0.01
CLIP = 0.05
TOL = 1e-5
SAVE_AT = 3
# (ep_size, ZeRO stage, gradient_clipping)
CASES = [(1, 0, 0.0), (1, 3, 0.0), (2, 0, 0.0), (2, 0, CLIP), (2, 1, 0.0), (2, 2, CLIP), (2, 3, CLIP)]


class MoENet(nn.Module):
    def __init__(self, ep_size: int = 1) -> None:
        from trainer.moe import MoE

        super().__init__()
        self.inp, self.out = nn.Linear(D_IN, HIDDEN), nn.Linear(HIDDEN, D_OUT)
        expert = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN))
        self.moe = MoE(
            HIDDEN, expert, num_experts=EXPERTS, ep_size=ep_size, k=2, drop_tokens=False, top2_2nd_expert_sampling=False
        )

    def forward(self, x):
        h, aux, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h), aux


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(BATCH, D_IN, generator=g)
    return x, torch.sin(x[:, :D_OUT])


def loss_of(model_out, y):
    pred, aux = model_out
    return nn.functional.mse_loss(pred, y) + AUX_COEF * aux


def reference_losses(clip: float) -> tuple[list[list[float]], list[float]]:
    """Per step, each rank's loss, and the gradient norm before clipping, from one process
    training on all ranks' batches."""
    torch.manual_seed(0)
    model = MoENet(ep_size=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    out, norms = [], []
    for step in range(STEPS):
        losses = [loss_of(model(x), y) for x, y in (batch(step, r) for r in range(WORLD))]
        opt.zero_grad()
        (sum(losses) / WORLD).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))))
        opt.step()
        out.append([loss.item() for loss in losses])
    return out, norms


def worker(rank: int, port: int, tmp: str) -> None:
    import trainer
    from trainer.engine import init_distributed

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    init_distributed()  # expert groups are process groups: join before building an ep_size > 1 model
    expected = {clip: reference_losses(clip) for clip in {c for _, _, c in CASES}}
    # The clipped cases must actually clip, or they would not test the norm.
    assert all(n > CLIP for n in expected[CLIP][1]), expected[CLIP][1]
    for ep, stage, clip in CASES:
        torch.manual_seed(0)
        config = {
            "train_batch_size": BATCH * WORLD,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "gradient_clipping": clip,
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 100},
            "telemetry": {"enabled": False},
        }
        ckpt = os.path.join(tmp, f"ep{ep}-zero{stage}-clip{clip}")
        engine, *_ = trainer.initialize(model=MoENet(ep_size=ep), config=config)
        losses = []
        for step in range(STEPS):
            if step == SAVE_AT:
                engine.save_checkpoint(ckpt)
                check_experts_in_checkpoint(engine, ckpt, ep)
            x, y = batch(step, rank)
            loss = loss_of(engine(x), y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            want = expected[clip][0][step][rank]
            assert abs(loss.item() - want) < TOL, (ep, stage, clip, step, loss.item(), want)
        engine.close()
        # resume on a model initialised differently: the checkpoint must restore every expert
        torch.manual_seed(123)
        engine, *_ = trainer.initialize(model=MoENet(ep_size=ep), config=config)
        engine.load_checkpoint(ckpt)
        assert engine.global_steps == SAVE_AT
        for step in range(SAVE_AT, STEPS):
            x, y = batch(step, rank)
            loss = loss_of(engine(x), y)
            engine.backward(loss)
            engine.step()
            assert abs(loss.item() - losses[step]) < 1e-6, ("resumed", ep, stage, clip, step, loss.item(), losses[step])
        engine.close()
    leave_world()


def check_experts_in_checkpoint(engine, ckpt: str, ep: int) -> None:
    """Every global expert is in the checkpoint once, under its global id, equal to the weights its
    holders have now."""
    import torch.distributed as dist

    from trainer.checkpoint.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from trainer.moe import MoE

    moe = next(m for m in engine.module.modules() if isinstance(m, MoE))
    full = engine.optimizer.full_state_dict(engine.module) if engine.zero_optimization_stage() == 3 else None
    mine = {}
    for i, expert in enumerate(moe.experts.local_experts):
        prefix = f"moe.experts.local_experts.{i}."
        mine[moe.experts.first_expert + i] = {
            k: (full[prefix + k] if full is not None else v).detach().clone() for k, v in expert.state_dict().items()
        }
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, mine)
    saved = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    prefix = "moe.experts.local_experts."
    assert sorted({k[len(prefix) :].split(".")[0] for k in saved if k.startswith(prefix)}) == [
        str(e) for e in range(EXPERTS)
    ]
    for e in range(EXPERTS):
        holders = [d[e] for d in everyone if e in d]
        assert len(holders) == WORLD // ep
        for held in holders:
            for k, v in held.items():
                assert torch.equal(v, saved[f"{prefix}{e}.{k}"]), (e, k)


def test_moe_model_trains_under_the_engine_like_the_reference(tmp_path):
    run_ranks(worker, WORLD, str(tmp_path))
