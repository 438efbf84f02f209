"""The ds_config parser: DeepSpeed's batch-size rule, validation errors naming the dotted key,
unknown-key warnings, and that initialize fails early with one clear message.

Split by tier: the pure-function tests are in tests/unit/trainer/test_engine_config.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import trainer
from collector.rank import session
from collector.testing.ports import free_port
from tests._engine_util import make_model
from tests.unit.trainer.test_engine_config import OPT, _cfg, _warned_keys
from trainer.config import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 3,
                "gradient_accumulation_steps": 2,
                "optimizer": OPT,
            },
            "train_batch_size=10, train_micro_batch_size_per_gpu=3, gradient_accumulation_steps=2, world size=1",
        ),
        (_cfg(zero_optimization={"stage": 4}), "zero_optimization.stage: must be one of 0, 1, 2, 3 (got 4)"),
        (
            _cfg(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}),
            "zero_optimization.offload_param: parameter offload needs zero_optimization.stage 3 (got 2)",
        ),
        (
            _cfg(optimizer={"type": "Adagrad2", "params": {}}),
            "optimizer.type: not an optimizer of rankscope's engine; allowed: Adam, AdamW, SGD, or any torch optimizer "
            "passed as trainer.initialize(optimizer=...) (got 'Adagrad2')",
        ),
        (
            _cfg(zero_optimization={"stage": 3, "offload_optimizer": {"device": "nvme"}}),
            "zero_optimization.offload_optimizer.nvme_path: device 'nvme' needs nvme_path",
        ),
        (
            _cfg(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}),
            "zero_optimization.offload_optimizer: optimizer offload needs zero_optimization.stage 1, 2 or 3",
        ),
        (_cfg(fp16={"enabled": True}, bf16={"enabled": True}), "choose one precision"),
        (_cfg(fp16={"enabled": "yes"}), "fp16.enabled: must be true or false"),
        (
            _cfg(zero_optimization={"stage": 1, "reduce_bucket_size": -5}),
            "zero_optimization.reduce_bucket_size: must be >= 1",
        ),
        (_cfg(gradient_clipping="big"), "gradient_clipping: must be a finite number"),
        (
            _cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "momentum_typo": 0.9}}),
            "optimizer.params.momentum_typo: not a parameter of AdamW",
        ),
        (
            _cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9]}}),
            "optimizer.params.betas: must be a list of 2 numbers, each >= 0 and < 1, e.g. [0.9, 0.999] (got [0.9])",
        ),
        (
            _cfg(optimizer={"type": "Adam", "params": {"lr": "1e-3"}}),
            "optimizer.params.lr: must be a finite number (got '1e-3')",
        ),
        (
            _cfg(optimizer={"type": "SGD", "params": {"lr": 0.1, "nesterov": "yes"}}),
            "optimizer.params.nesterov: must be true or false (got 'yes')",
        ),
        (
            _cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-3, "weight_decy": 0.1}}),
            "optimizer.params.weight_decy: not a parameter of AdamW (did you mean optimizer.params.weight_decay?",
        ),
        ({"train_micro_batch_size_per_gpu": 2}, "optimizer: the config needs an optimizer block"),
        ({"optimizer": OPT}, "train_batch_size or train_micro_batch_size_per_gpu must be given"),
    ],
)
def test_engine_config_bad_values_fail_at_initialize(config, message):
    with pytest.raises(ValueError) as err:
        trainer.initialize(model=make_model(), config=config)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_misspelt_section_warns_once_on_the_console_with_a_hint_and_no_source_line(tmp_path):
    """What a person sees: one line, the key's dotted path and the key it is close to; not the
    warnings module's file:line and echoed source line."""
    script = tmp_path / "typo.py"
    script.write_text(
        "import torch, trainer\n"
        "cfg = {'train_micro_batch_size_per_gpu': 2, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}},\n"
        "       'zero_optimisation': {'stage': 2}, 'telemetry': {'enabled': False}}\n"
        "trainer.initialize(model=torch.nn.Linear(4, 4), config=cfg)\n"
        "trainer.initialize(model=torch.nn.Linear(4, 4), config=cfg)\n"
    )
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.pop("PYTHONWARNINGS", None)
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "zero_optimisation" in line]
    assert lines == [
        "ConfigWarning: ignoring unknown config keys: zero_optimisation (did you mean zero_optimization?)"
    ], out.stderr
    assert "EngineConfig.from_dict" not in out.stderr and "engine.py" not in out.stderr


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
    engine, *_ = trainer.initialize(
        model=make_model(), config=_cfg(optimizer={"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}})
    )
    assert type(engine.optimizer.master.optimizer).__name__ == "Adam"


@pytest.mark.parametrize(
    "config, message",
    [
        (_cfg(scheduler={"type": "Cosine"}), "scheduler.type: must be one of 'LRRangeTest', 'OneCycle'"),
        (
            _cfg(scheduler={"type": "WarmupDecayLR", "params": {}}),
            "scheduler.params.total_num_steps: required, not given",
        ),
        (_cfg(flops_profiler={"profile_step": -1}), "flops_profiler.profile_step: must be >= 0 (got -1)"),
        (_cfg(csv_monitor={"job_name": ""}), "csv_monitor.job_name: must be a non-empty string (got '')"),
        (_cfg(comms_logger={"prof_ops": "all_reduce"}), "comms_logger.prof_ops: must be a list of strings"),
        (_cfg(telemetry={"endpoint": " "}), "telemetry.endpoint: must be a non-empty string"),
        (_cfg(tensor_parallel={"tp_size": 2}), "tensor_parallel.tp_size: must divide the world size 1 (got 2)"),
        (
            _cfg(aio={"thread_count": 2, "intra_op_parallelism": 4}),
            "aio.thread_count and aio.intra_op_parallelism: the same setting given twice with different values "
            "(2 and 4)",
        ),
        (
            _cfg(zero_optimization={"offload_optimizer": {"device": "gpu"}}),
            "zero_optimization.offload_optimizer.device: must be one of 'none', 'cpu', 'nvme' (got 'gpu')",
        ),
        (_cfg(fp16={"enabled": True, "initial_scale_power": 1, "min_loss_scale": 4}), "fp16.min_loss_scale: is above"),
        (
            _cfg(train_micro_batch_size_per_gpu=2.5),
            "train_micro_batch_size_per_gpu: must be an integer or null (got 2.5)",
        ),
        (["not", "a", "dict"], "config must be a dict or a path to a JSON file"),
    ],
)
def test_every_block_is_checked_at_initialize(config, message):
    with pytest.raises(ConfigError) as err:
        trainer.initialize(model=make_model(), config=config)
    assert message in str(err.value)


def test_initialize_reports_each_unknown_key_once(tmp_path):
    """The blocks owned by the recorder, the profiler, the monitor, the scheduler and the
    telemetry session are built once, with the engine's config; their owners do not report
    the same key again."""
    telemetry = {"run": "unknown-keys", "endpoint": "127.0.0.1:9", "spool_dir": str(tmp_path), "endpont": "h:1"}
    config = _cfg(
        comms_logger={"enabled": False, "verbos": True},
        flops_profiler={"enabled": False, "depth": 2},
        csv_monitor={"enabled": False, "job": "x"},
        tensorboard={"enabled": False, "path": "x"},
        scheduler={"type": "WarmupLR", "params": {"warmup_steps": 3}, "kind": "x"},
        fp16={"enabled": True, "scale": 2},
        telemetry=telemetry,
        moe={},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, *_ = trainer.initialize(model=make_model(), config=config)
    try:
        assert session.active() is not None and session.active().run_name == "unknown-keys"
    finally:
        engine.close()
        session.stop()
    assert sorted(_warned_keys(caught)) == sorted(
        [
            "comms_logger.verbos",
            "flops_profiler.depth",
            "csv_monitor.job",
            "tensorboard.path",
            "scheduler.params.warmup_steps",
            "scheduler.kind",
            "fp16.scale",
            "telemetry.endpont",
            "moe",
        ]
    )
