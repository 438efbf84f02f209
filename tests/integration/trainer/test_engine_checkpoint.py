"""Checkpoint at step 10, load in fresh processes, steps 11-20 identical to an uninterrupted run."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import trainer
from tests._engine_util import engine_config, make_model, spawn, train
from trainer.checkpoint import CheckpointError

BATCH = 16


def _config(stage: int, fp16: bool = False) -> dict:
    cfg = engine_config(
        stage=stage, batch=BATCH, gas=2, clip=0.05, offload_optimizer={"device": "cpu"} if stage == 2 else {}
    )
    cfg["scheduler"] = {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01, "warmup_num_steps": 15, "warmup_type": "linear"},
    }
    return cfg


STAGES = (1, 2, 3)


def _uninterrupted(rank, world, ckpt_root):
    out = {}
    for stage in STAGES:
        engine, *_ = trainer.initialize(model=make_model(), config=_config(stage))
        first = train(engine, steps=10, batch=BATCH)
        engine.save_checkpoint(os.path.join(ckpt_root, f"zero{stage}"))
        rest = train(engine, steps=10, batch=BATCH, start=10)
        out[stage] = {"first": first, "rest": rest, "lr": engine.get_lr()}
    return out


def _resumed(rank, world, ckpt_root):
    out = {}
    for stage in STAGES:
        engine, *_ = trainer.initialize(model=make_model(seed=123), config=_config(stage))  # other init weights
        path, _ = engine.load_checkpoint(os.path.join(ckpt_root, f"zero{stage}"))
        steps = (engine.global_steps, engine.global_samples)
        rest = train(engine, steps=10, batch=BATCH, start=10)
        out[stage] = {"rest": rest, "lr": engine.get_lr(), "path": path, "steps": steps}
    return out


def test_engine_checkpoint_resume_is_identical(tmp_path):
    """ZeRO 1, 2 (+ CPU offload) and 3, 2 ranks, gradient accumulation, clipping and a WarmupLR schedule."""
    ckpt = str(tmp_path / "ckpt")
    full = spawn(_uninterrupted, 2, tmp_path / "a", ckpt)
    for stage in STAGES:
        root = os.path.join(ckpt, f"zero{stage}")
        assert open(os.path.join(root, "latest")).read() == "global_step10"
        assert sorted(os.listdir(os.path.join(root, "global_step10"))) == [
            "checkpoint.json",
            "client_state.pt",
            "engine_states.pt",
            "shards",
        ]
        assert sorted(os.listdir(os.path.join(root, "global_step10", "shards"))) == ["rank_00000.pt", "rank_00001.pt"]
    resumed = spawn(_resumed, 2, tmp_path / "b", ckpt)
    for stage in STAGES:
        for rank in range(2):
            assert resumed[rank][stage]["steps"] == (10, 10 * BATCH)
            assert resumed[rank][stage]["rest"] == full[rank][stage]["rest"], f"stage {stage} rank {rank}"
            assert resumed[rank][stage]["lr"] == full[rank][stage]["lr"]
        assert full[0][stage]["rest"][-1] < full[0][stage]["first"][0]


def _weights(engine) -> dict:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def test_a_checkpoint_of_another_model_names_the_first_mismatching_parameter(tmp_path):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(1))
    train(engine, steps=2, batch=BATCH)
    engine.save_checkpoint(tmp_path / "ck")
    cases = [  # (model, message): the first difference in module order, counted with the rest
        (
            nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4)),
            r"parameter 0\.weight has shape \[64, 16\] in the checkpoint, \[32, 16\] in this model \(2 more",
        ),
        (
            nn.Sequential(*make_model(), nn.Tanh(), nn.Linear(4, 4)),
            r"parameter 6\.weight of this model is not in the checkpoint \(1 more",
        ),
        (nn.Sequential(*list(make_model())[:3]), r"the checkpoint holds 4\.weight, which this model does not have"),
    ]
    for model, message in cases:
        other, *_ = trainer.initialize(model=model, config=_config(2))
        before = _weights(other)
        with pytest.raises(CheckpointError, match=message):
            other.load_checkpoint(tmp_path / "ck")
        after = _weights(other)
        assert all(torch.equal(before[k], after[k]) for k in before), "a failed load changed the model"
        assert other.global_steps == 0


def test_another_optimizer_type_cannot_resume_but_can_take_the_weights(tmp_path):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(2))
    train(engine, steps=2, batch=BATCH)
    engine.save_checkpoint(tmp_path / "ck")
    cfg = _config(3)
    cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}
    sgd, *_ = trainer.initialize(model=make_model(seed=5), config=cfg)
    with pytest.raises(CheckpointError, match="holds AdamW optimizer state, this engine's optimizer is SGD"):
        sgd.load_checkpoint(tmp_path / "ck")
    path, client = sgd.load_checkpoint(tmp_path / "ck", load_optimizer_states=False)
    assert path == str(tmp_path / "ck" / "global_step2") and client == {}
    gathered = sgd.optimizer.full_state_dict(sgd.module)
    assert all(torch.equal(gathered[k], v) for k, v in _weights(engine).items())
    assert sgd.global_steps == 2 and not sgd.optimizer.master.optimizer.state  # no AdamW moments taken


def test_sgd_momentum_resumes_on_another_stage(tmp_path):
    """Optimizer state without a step count (SGD's momentum_buffer) is kept per element too."""

    def engine(stage):
        cfg = _config(stage)
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}
        cfg.pop("scheduler")
        return trainer.initialize(model=make_model(), config=cfg)[0]

    whole = engine(1)
    train(whole, steps=2, batch=BATCH)
    whole.save_checkpoint(tmp_path / "ck")
    rest = train(whole, steps=2, batch=BATCH, start=2)
    resumed = engine(3)
    resumed.load_checkpoint(tmp_path / "ck")
    assert all(len(s) == 1 for s in resumed.optimizer.master.optimizer.state.values())  # momentum_buffer
    torch.testing.assert_close(train(resumed, steps=2, batch=BATCH, start=2), rest, rtol=1e-6, atol=0)


def test_tags_latest_client_state_and_module_only(tmp_path):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(1))
    train(engine, steps=1, batch=BATCH)
    engine.save_checkpoint(tmp_path / "ck", tag="first", client_state={"epoch": 3, "note": ("any", "object")})
    train(engine, steps=1, batch=BATCH, start=1)
    engine.save_checkpoint(tmp_path / "ck", tag="second", save_latest=False)
    assert (tmp_path / "ck" / "latest").read_text() == "first"
    fresh, *_ = trainer.initialize(model=make_model(seed=9), config=_config(2))
    client = {"epoch": 3, "note": ("any", "object")}
    assert fresh.load_checkpoint(tmp_path / "ck") == (str(tmp_path / "ck" / "first"), client)
    assert fresh.global_steps == 1
    fresh.load_checkpoint(tmp_path / "ck" / "second")  # a tag folder given directly
    assert fresh.global_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(_weights(fresh).values(), _weights(engine).values()))
    module_only, *_ = trainer.initialize(model=make_model(seed=9), config=_config(0))
    module_only.load_checkpoint(tmp_path / "ck", tag="second", load_module_only=True)
    assert module_only.global_steps == 0 and not module_only.optimizer.master.optimizer.state
    pairs = zip(_weights(module_only).values(), _weights(engine).values())
    assert all(torch.equal(a, b) for a, b in pairs)


def test_unfinished_corrupt_or_missing_checkpoints_say_what_is_wrong(tmp_path):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(1))
    assert engine.load_checkpoint(tmp_path / "nothing-here") == (None, None)
    engine.save_checkpoint(tmp_path / "ck", tag="t")
    index = tmp_path / "ck" / "t" / "checkpoint.json"
    text = index.read_text()
    index.unlink()
    with pytest.raises(CheckpointError, match=r"has no checkpoint\.json: the save did not finish"):
        engine.load_checkpoint(tmp_path / "ck")
    index.write_text(text[:-40])
    with pytest.raises(CheckpointError, match=r"checkpoint.json:\d+: not valid JSON"):
        engine.load_checkpoint(tmp_path / "ck")
    index.write_text(text)
    shard = tmp_path / "ck" / "t" / "shards" / "rank_00000.pt"
    shard.write_bytes(shard.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint file .*rank_00000\.pt"):
        engine.load_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="must be a plain folder name"):
        engine.save_checkpoint(tmp_path / "ck", tag="a/b")
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"saving checkpoint .* failed on rank 0"):
        engine.save_checkpoint(tmp_path / "file", tag="t")


def _lost_shard(rank, world, root):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(2))
    train(engine, steps=1, batch=BATCH)
    engine.save_checkpoint(root)
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:
        os.unlink(os.path.join(root, "global_step1", "shards", "rank_00001.pt"))
    dist.barrier()
    try:
        engine.load_checkpoint(root)
    except CheckpointError as e:
        return str(e)
    return None


def test_a_shard_lost_on_one_rank_fails_every_rank_with_the_same_cause(tmp_path):
    """Rank 0 reads only its own shard, yet raises too (no rank is left waiting in a collective)."""
    errors = spawn(_lost_shard, 2, tmp_path / "out", str(tmp_path / "ck"))
    assert errors[1] is not None and "rank_00001.pt is missing" in errors[1]
    assert errors[0] == f"loading the checkpoint failed on rank 1: {errors[1]}"


N_SAMPLES = 96


def _dataset():
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(N_SAMPLES, 16, generator=g), torch.randn(N_SAMPLES, 4, generator=g)
    return torch.utils.data.TensorDataset(x, y, torch.arange(N_SAMPLES))


def _global_indices(engine, steps: int) -> list[list[int]]:
    """Train ``steps`` steps from the engine's own dataloader; the sample indices of each global batch."""
    import torch.distributed as dist

    out, batches = [], iter(engine.training_dataloader)
    for _ in range(steps):
        mine = []
        for _ in range(engine.gradient_accumulation_steps()):
            x, y, idx = next(batches)
            engine.backward(nn.functional.mse_loss(engine(x), y))
            engine.step()
            mine += idx.tolist()
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        out.append(sorted(i for part in everyone for i in part))
    return out


def _sampler_save(rank, world, root):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(1), training_data=_dataset())
    seen = _global_indices(engine, 3)
    engine.save_checkpoint(root)
    return seen


def test_the_dataloader_resumes_at_its_position_on_another_world_size(tmp_path):
    """Saved on 2 ranks after 3 steps, resumed on 1: the next global batches are the ones an
    uninterrupted run would draw (global batch k = samples [16k, 16k + 16) of the epoch's permutation)."""
    perm = torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(0)).tolist()
    want = [sorted(perm[k * BATCH : (k + 1) * BATCH]) for k in range(N_SAMPLES // BATCH)]
    seen = spawn(_sampler_save, 2, tmp_path / "out", str(tmp_path / "ck"))
    assert seen[0] == want[:3]
    engine, *_ = trainer.initialize(model=make_model(seed=3), config=_config(2), training_data=_dataset())
    engine.load_checkpoint(tmp_path / "ck")
    assert len(engine.training_dataloader) == (N_SAMPLES - 3 * BATCH) // (BATCH // 2)
    assert _global_indices(engine, 3) == want[3:]
