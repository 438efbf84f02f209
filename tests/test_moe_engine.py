"""An MoE model trained by the bundled engine (trainer.initialize) on 2 gloo
ranks with ZeRO stages 0 and 3, against a single-process AdamW reference on
the same per-rank batches. ep_size 1 keeps every expert on every rank, so the
engine's plain data-parallel reduction is already right (larger ep_size needs
the engine to reduce each parameter over trainer.moe.sync_group). No-drop
routing, so each rank's routing does not depend on which other tokens share
its batch.

Expected to fail for now: the engine refuses any expert parameter
(trainer/engine.py ``_reject_expert_params``). With that check bypassed this
test passes for ZeRO 0 and 3; drop the marker when the engine accepts them."""
from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn
from torch.multiprocessing.spawn import ProcessRaisedException

from tests.conftest import free_port

WORLD, D_IN, HIDDEN, D_OUT, EXPERTS, BATCH, STEPS, AUX_COEF = 2, 6, 8, 3, 4, 8, 5, 0.01


class MoENet(nn.Module):
    def __init__(self) -> None:
        from trainer.moe import MoE

        super().__init__()
        self.inp, self.out = nn.Linear(D_IN, HIDDEN), nn.Linear(HIDDEN, D_OUT)
        expert = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN))
        self.moe = MoE(HIDDEN, expert, num_experts=EXPERTS, ep_size=1, k=2, drop_tokens=False,
                       top2_2nd_expert_sampling=False)

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


def reference_losses() -> list[list[float]]:
    """Per step, each rank's loss, from one process training on all ranks' batches."""
    torch.manual_seed(0)
    model = MoENet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    out = []
    for step in range(STEPS):
        losses = [loss_of(model(x), y) for x, y in (batch(step, r) for r in range(WORLD))]
        opt.zero_grad()
        (sum(losses) / WORLD).backward()
        opt.step()
        out.append([loss.item() for loss in losses])
    return out


def worker(rank: int, port: int) -> None:
    import trainer

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    expected = reference_losses()
    for stage in (0, 3):
        torch.manual_seed(0)
        config = {"train_batch_size": BATCH * WORLD, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                  "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
                  "telemetry": {"enabled": False}}
        engine, *_ = trainer.initialize(model=MoENet(), config=config)
        for step in range(STEPS):
            x, y = batch(step, rank)
            loss = loss_of(engine(x), y)
            engine.backward(loss)
            engine.step()
            assert abs(loss.item() - expected[step][rank]) < 1e-5, (stage, step, loss.item(), expected[step][rank])
        engine.close()


@pytest.mark.xfail(strict=True, raises=ProcessRaisedException,
                   reason="the engine refuses MoE expert parameters until it reduces them per trainer.moe.sync_group")
def test_moe_model_trains_under_the_engine_like_the_reference():
    mp.spawn(worker, args=(free_port(),), nprocs=WORLD, join=True)
