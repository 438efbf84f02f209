"""Checkpoint at step 10, load in fresh processes, steps 11-20 identical to an uninterrupted run."""
from __future__ import annotations

import os

import pytest

import trainer
from tests.trainer._engine_util import engine_config, make_model, spawn, train

BATCH = 16


def _config(stage: int, fp16: bool = False) -> dict:
    cfg = engine_config(stage=stage, batch=BATCH, gas=2, clip=0.05,
                        offload_optimizer={"device": "cpu"} if stage == 2 else {})
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                                       "warmup_num_steps": 15, "warmup_type": "linear"}}
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
            "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    resumed = spawn(_resumed, 2, tmp_path / "b", ckpt)
    for stage in STAGES:
        for rank in range(2):
            assert resumed[rank][stage]["steps"] == (10, 10 * BATCH)
            assert resumed[rank][stage]["rest"] == full[rank][stage]["rest"], f"stage {stage} rank {rank}"
            assert resumed[rank][stage]["lr"] == full[rank][stage]["lr"]
        assert full[0][stage]["rest"][-1] < full[0][stage]["first"][0]


def test_engine_checkpoint_missing_dir_and_wrong_layout(tmp_path):
    engine, *_ = trainer.initialize(model=make_model(), config=_config(1))
    assert engine.load_checkpoint(tmp_path / "nothing-here") == (None, None)
    engine.save_checkpoint(tmp_path / "ck", tag="t")
    other, *_ = trainer.initialize(model=make_model(), config=_config(2))
    with pytest.raises(ValueError, match="stage 1 on 1 ranks; this engine runs stage 2"):
        other.load_checkpoint(tmp_path / "ck")
