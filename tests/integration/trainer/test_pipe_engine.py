"""Pipeline parallelism (trainer.pipe) against a one-process torch run of the same layers.

Real gloo ranks run the 1F1B schedule; every per-batch loss and every final weight must equal
single-process AdamW on the whole global batch within 1e-5 (fp32: the pipeline adds the same
micro-batch gradients in another order), with activation checkpointing off and on. Layouts:
2 stages, 4 stages, and 2 stages x 2 data-parallel replicas (ZeRO stage 1) on 4 ranks. A checkpoint
saved per stage resumes the run exactly, on the same stages or on another layout (2 stages into 1 stage x 2
replicas: parameters are found by their global layer names).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests._engine_util import D_IN, D_OUT, LR, global_batch, micro_batches, spawn

HID, STEPS, MICRO, GAS = 32, 3, 4, 4
TOL = 1e-5


def build_layers() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Linear(D_IN, HID),
        nn.Tanh(),
        nn.Linear(HID, HID),
        nn.Tanh(),
        nn.Linear(HID, HID),
        nn.Tanh(),
        nn.Linear(HID, HID),
        nn.Tanh(),
        nn.Linear(HID, D_OUT),
    ]


def reference(batch: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = nn.Sequential(*build_layers())
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, batch)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _config(**blocks) -> dict:
    """The engine config the pipeline runs train with (MICRO x GAS, AdamW at LR, no clipping, no
    telemetry), plus ``blocks``."""
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR}},
        "telemetry": {"enabled": False},
        **blocks,
    }


def _pipe_worker(rank: int, world: int, stages: int, zero_stage: int, intervals, in_config: bool = False) -> list:
    """One run per activation-checkpoint interval, in the same processes."""
    return [_pipe_run(rank, world, stages, zero_stage, interval, in_config) for interval in intervals]


def _pipe_run(rank: int, world: int, stages: int, zero_stage: int, interval: int, in_config: bool) -> dict:
    import trainer
    from trainer.pipe import PipelineModule

    net = PipelineModule(
        layers=build_layers(),
        num_stages=stages,
        loss_fn=nn.functional.mse_loss,
        partition_method="parameters",
        activation_checkpoint_interval=0 if in_config else interval,
    )
    config = _config(
        zero_optimization={"stage": zero_stage},
        steps_per_print=1000,
        pipeline={"activation_checkpoint_interval": interval if in_config else 0},
    )
    engine, _, _, _ = trainer.initialize(model=net, config=config)
    dp = world // stages
    losses = []
    for step in range(STEPS):
        data = iter(micro_batches(step, MICRO * GAS * dp, engine.topology.data_rank, dp, GAS))
        losses.append(float(engine.train_batch(data)))
    return {
        "checkpoint_interval": engine.module.activation_checkpoint_interval,
        "losses": losses,
        "stage": engine.stage_id,
        "state": {k: v.detach().clone() for k, v in engine.module.state_dict().items()},
        "eval": float(engine.eval_batch(iter(micro_batches(0, MICRO * GAS * dp, engine.topology.data_rank, dp, GAS)))),
        "logits": _logit_shapes(engine, dp),
        "micro_batches": engine.micro_batches,
    }


SEED = 1234


def _tied_specs():
    """A weight shared by the first layer (stage 0) and the fifth (stage 1, used transposed)."""
    from trainer.pipe import LayerSpec, TiedLayerSpec

    return [
        TiedLayerSpec("proj", nn.Linear, D_IN, D_IN, bias=False),
        nn.Tanh(),
        LayerSpec(nn.Linear, D_IN, D_IN),
        nn.Tanh(),
        TiedLayerSpec("proj", nn.Linear, D_IN, D_IN, bias=False, forward_fn=lambda m, x: x @ m.weight),
        LayerSpec(nn.Linear, D_IN, D_OUT),
    ]


def _tied_reference(batch: int) -> list[float]:
    """The same model in one process: layer i built right after seeding SEED + i (seed_layers)."""
    built = {}
    for i in (0, 2, 5):
        torch.manual_seed(SEED + i)
        built[i] = _tied_specs()[i].build()
    proj, mid, out = built[0], built[2], built[5]
    params = [*proj.parameters(), *mid.parameters(), *out.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        x, y = global_batch(step, batch)
        pred = out(torch.tanh(mid(torch.tanh(proj(x)))) @ proj.weight)
        loss = nn.functional.mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _tied_run(rank: int, world: int) -> dict:
    import trainer
    from trainer.pipe import PipelineModule

    net = PipelineModule(
        layers=_tied_specs(),
        num_stages=2,
        loss_fn=nn.functional.mse_loss,
        partition_method="uniform",
        seed_layers=True,
        base_seed=SEED,
    )
    config = _config()
    engine, _, _, _ = trainer.initialize(model=net, config=config)
    losses = [float(engine.train_batch(iter(micro_batches(step, MICRO * GAS, 0, 1, GAS)))) for step in range(STEPS)]
    return {"losses": losses, "tied": net.tied_modules["proj"].weight.detach().clone()}


def _two_stage_worker(rank: int, world: int) -> dict:
    return {"plain": _pipe_worker(rank, world, 2, 0, (0, 2)), "tied": _tied_run(rank, world)}


def _logit_shapes(engine, dp: int):
    _, logits = engine.eval_batch(
        iter(micro_batches(0, MICRO * GAS * dp, engine.topology.data_rank, dp, GAS)), return_logits=True
    )
    return None if logits is None else [tuple(t.shape) for t in logits]


def _check(runs: list[list[dict]], dp: int, intervals) -> None:
    for i, interval in enumerate(intervals):
        _check_run([rank_runs[i] for rank_runs in runs], dp, interval)


def _check_run(results: list[dict], dp: int, interval: int) -> None:
    losses, weights = reference(MICRO * GAS * dp)
    assert {r["checkpoint_interval"] for r in results} == {interval}
    seen = set()
    for r in results:
        assert r["micro_batches"] == GAS
        for got, want in zip(r["losses"], losses, strict=True):
            assert got == pytest.approx(want, abs=TOL, rel=TOL), (r["stage"], r["losses"], losses)
        for name, value in r["state"].items():
            torch.testing.assert_close(value, weights[name], atol=TOL, rtol=TOL, msg=f"stage {r['stage']} {name}")
            seen.add(name)
    assert seen == set(weights), "every layer's weights live on some stage"
    # every stage reports the trained model's loss on batch 0; the last stage's outputs come back
    model = nn.Sequential(*build_layers())
    model.load_state_dict(weights)
    x, y = global_batch(0, MICRO * GAS * dp)
    want = nn.functional.mse_loss(model(x), y).item()
    for r in results:
        assert r["eval"] == pytest.approx(want, abs=TOL, rel=TOL)
        last = r["stage"] == max(q["stage"] for q in results)
        assert r["logits"] == ([(MICRO, D_OUT)] * GAS if last else None)


def test_two_stages_equal_torch_with_and_without_activation_checkpointing_and_with_a_tied_weight(tmp_path):
    results = spawn(_two_stage_worker, 2, tmp_path)
    _check([r["plain"] for r in results], dp=1, intervals=(0, 2))
    want = _tied_reference(MICRO * GAS)
    for r in results:
        assert r["tied"]["losses"] == pytest.approx(want, abs=TOL, rel=TOL)
    torch.testing.assert_close(results[0]["tied"]["tied"], results[1]["tied"]["tied"], atol=0, rtol=0)


@pytest.mark.slow
def test_four_stages_equal_torch_with_and_without_activation_checkpointing(tmp_path):
    _check(spawn(_pipe_worker, 4, tmp_path, 4, 0, (0, 1)), dp=1, intervals=(0, 1))


@pytest.mark.slow
def test_two_stages_by_two_replicas_zero1_equal_torch_with_and_without_activation_checkpointing(tmp_path):
    # checkpointing asked for in the config's pipeline section, as DeepSpeed reads it
    _check(spawn(_pipe_worker, 4, tmp_path, 2, 1, (0, 2), True), dp=2, intervals=(0, 2))


def _checkpoint_worker(rank: int, world: int, stages: int, load_stages: int, ckpt: str) -> dict:
    """Train 2 batches, save, train 2 more (the reference); a fresh engine of ``load_stages`` stages
    loads the checkpoint and trains the same 2 global batches (its replicas split each micro-batch)."""
    import trainer
    from trainer.pipe import PipelineModule

    def engine_of(num_stages: int, seed: int):
        replicas = world // num_stages
        torch.manual_seed(seed)
        layers = [nn.Linear(D_IN, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, D_OUT)]
        net = PipelineModule(layers=layers, num_stages=num_stages, loss_fn=nn.functional.mse_loss)
        config = {
            "train_micro_batch_size_per_gpu": MICRO // replicas,
            "gradient_accumulation_steps": GAS,
            "optimizer": {"type": "AdamW", "params": {"lr": LR}},
            "telemetry": {"enabled": False},
            "steps_per_print": 1000,
        }
        return trainer.initialize(model=net, config=config)[0]

    def batches(engine, step):
        dp = engine.dp_world_size
        return iter(micro_batches(step, MICRO * GAS, engine.topology.data_rank, dp, GAS))

    first = engine_of(stages, seed=0)
    for step in range(2):
        first.train_batch(batches(first, step))
    first.save_checkpoint(ckpt, client_state={"note": "after 2"})
    after = [float(first.train_batch(batches(first, step))) for step in (2, 3)]
    resumed = engine_of(load_stages, seed=1)  # other weights until the load
    _, client = resumed.load_checkpoint(ckpt)
    again = [float(resumed.train_batch(batches(resumed, step))) for step in (2, 3)]
    return {"after": after, "again": again, "client": client, "steps": resumed.global_steps}


@pytest.mark.slow
@pytest.mark.parametrize("load_stages", [2, 1], ids=["same-stages", "two-stages-into-one"])
def test_a_pipeline_checkpoint_resumes_the_same_run(tmp_path, load_stages):
    results = spawn(_checkpoint_worker, 2, tmp_path / "out", 2, load_stages, str(tmp_path / "ckpt"))
    for r in results:
        assert r["client"] == {"note": "after 2"} and r["steps"] == 4
        for got, want in zip(r["again"], r["after"], strict=True):
            assert got == pytest.approx(want, abs=TOL, rel=TOL)
