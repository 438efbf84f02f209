"""The ds_config parser: DeepSpeed's batch-size rule, validation errors naming the dotted key,
unknown-key warnings, and that initialize fails early with one clear message."""
from __future__ import annotations

import json
import warnings

import pytest

import trainer
from trainer.config import EngineConfig
from tests.trainer._engine_util import make_model

OPT = {"type": "Adam", "params": {"lr": 1e-3}}


def _cfg(**kw) -> dict:
    return dict({"train_micro_batch_size_per_gpu": 2, "optimizer": OPT, "telemetry": {"enabled": False}}, **kw)


@pytest.mark.parametrize("given, world, expected", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4}, 2, (8, 4, 1)),
    ({"train_batch_size": 8}, 2, (8, 4, 1)),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 4,
     (24, 3, 2)),
])
def test_engine_config_batch_triple_inferred(given, world, expected):
    cfg = EngineConfig.from_dict(dict(given, optimizer=OPT), dp_world_size=world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == expected


def test_engine_config_defaults_follow_deepspeed():
    cfg = EngineConfig.from_dict(_cfg(), dp_world_size=1)
    z = cfg.zero_optimization
    assert (z.stage, z.reduce_bucket_size, z.overlap_comm, z.contiguous_gradients) == (0, 500_000_000, False, True)
    assert (cfg.fp16.initial_scale_power, cfg.fp16.loss_scale_window, cfg.fp16.hysteresis) == (16, 1000, 2)
    assert cfg.steps_per_print == 10 and cfg.gradient_clipping == 0.0
    assert EngineConfig.from_dict(_cfg(bfloat16={"enabled": True})).bf16.enabled  # older spelling
    big = EngineConfig.from_dict(_cfg(zero_optimization={"stage": 2, "reduce_bucket_size": 5e8}))
    assert big.zero_optimization.reduce_bucket_size == 500_000_000


@pytest.mark.parametrize("config, message", [
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2,
      "optimizer": OPT},
     "train_batch_size=10, train_micro_batch_size_per_gpu=3, gradient_accumulation_steps=2, world size=1"),
    (_cfg(zero_optimization={"stage": 4}), "zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4)"),
    (_cfg(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}),
     "zero_optimization.offload_param: parameter offload needs zero_optimization.stage 3 (got 2)"),
    (_cfg(optimizer={"type": "Adagrad2", "params": {}}),
     "optimizer.type: unknown optimizer; allowed: Adam, AdamW, SGD (got 'Adagrad2')"),
    (_cfg(zero_optimization={"stage": 3, "offload_optimizer": {"device": "nvme"}}),
     "zero_optimization.offload_optimizer.nvme_path: device 'nvme' needs nvme_path"),
    (_cfg(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}),
     "zero_optimization.offload_optimizer: optimizer offload needs zero_optimization.stage 1, 2 or 3"),
    (_cfg(fp16={"enabled": True}, bf16={"enabled": True}), "choose one precision"),
    (_cfg(fp16={"enabled": "yes"}), "fp16.enabled: must be true or false"),
    (_cfg(zero_optimization={"stage": 1, "reduce_bucket_size": -5}), "zero_optimization.reduce_bucket_size: must be >= 1"),
    (_cfg(gradient_clipping="big"), "gradient_clipping: must be a finite number"),
    (_cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "momentum_typo": 0.9}}), "optimizer.params: AdamW rejects"),
    ({"train_micro_batch_size_per_gpu": 2}, "optimizer: the config needs an optimizer block"),
    ({"optimizer": OPT}, "train_batch_size or train_micro_batch_size_per_gpu must be given"),
])
def test_engine_config_bad_values_fail_at_initialize(config, message):
    with pytest.raises(ValueError) as err:
        trainer.initialize(model=make_model(), config=config)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_engine_config_unknown_keys_warn_with_dotted_path():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EngineConfig.from_dict(_cfg(zero_optimizaton={"stage": 2}, zero_optimization={"stage": 1, "bucket": 3},
                                    fp16={"enabled": False, "scale": 2}, prescale_gradients=False))
    text = " ".join(str(w.message) for w in caught)
    assert "zero_optimizaton" in text and "zero_optimization.bucket" in text and "fp16.scale" in text
    assert "prescale_gradients" not in text  # a known DeepSpeed key, accepted


def test_engine_config_from_json_file_and_bad_files(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(_cfg(zero_optimization={"stage": 1})))
    engine, optimizer, loader, scheduler = trainer.initialize(model=make_model(), config=str(path))
    assert engine.zero_optimization_stage() == 1 and loader is None and scheduler is None
    assert optimizer is engine.optimizer and engine.train_batch_size() == 2
    with pytest.raises(ValueError, match="does not exist"):
        trainer.initialize(model=make_model(), config=str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        trainer.initialize(model=make_model(), config=str(tmp_path / "bad.json"))


def test_engine_deepspeed_adam_means_adamw_without_decay():
    engine, *_ = trainer.initialize(model=make_model(), config=_cfg())
    inner = engine.optimizer.master.optimizer
    assert type(inner).__name__ == "AdamW" and inner.param_groups[0]["weight_decay"] == 0.0
    engine, *_ = trainer.initialize(model=make_model(), config=_cfg(
        optimizer={"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}}))
    assert type(engine.optimizer.master.optimizer).__name__ == "Adam"
