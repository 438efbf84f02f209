"""DeepSpeed's module-level API on the engine (trainer.api), in one process (a world of one):
where the config comes from, the errors DeepSpeed raises, DeepSpeed-only features refused at
initialize by name, client optimizers and schedulers, and the engine surface scripts read.
The same calls against real DeepSpeed are in test_deepspeed_scripts.py.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_deepspeed_api.py."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import trainer as deepspeed
from tests._engine_util import make_model
from trainer.api import DeepSpeedArgumentError
from trainer.config import DEEPSPEED_ONLY, ConfigError

BASE = {"train_micro_batch_size_per_gpu": 2, "telemetry": {"enabled": False}}
WITH_OPT = dict(BASE, optimizer={"type": "AdamW", "params": {"lr": 1e-2}})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"config": WITH_OPT, "config_params": WITH_OPT, "args": "from_args"}, "the config is given twice"),
        ({"config_params": WITH_OPT, "args": "from_args"}, "the config is given twice"),
        ({}, "initialize: no config"),
        ({"args": argparse.Namespace(deepspeed_config=None)}, "initialize: no config"),
    ],
)
def test_where_deepspeed_asserts_initialize_raises_an_assertion_error_too(tmp_path, kwargs, message):
    if kwargs.get("args") == "from_args":
        path = tmp_path / "c.json"
        path.write_text(json.dumps(WITH_OPT))
        kwargs["args"] = argparse.Namespace(deepspeed_config=str(path))
    with pytest.raises(AssertionError, match=message) as e:
        deepspeed.initialize(model=make_model(), **kwargs)
    assert isinstance(e.value, ConfigError)


# How a config asks for each DeepSpeed-only feature (one entry per trainer.config.DEEPSPEED_ONLY key).
ASKING = {
    "amp.enabled": {"amp": {"enabled": True, "opt_level": "O1"}},
    "torch_autocast.enabled": {"torch_autocast": {"enabled": True}},
    "hybrid_engine.enabled": {"hybrid_engine": {"enabled": True}},
    "elasticity.enabled": {"elasticity": {"enabled": True, "max_train_batch_size": 8}},
    "curriculum_learning.enabled": {"curriculum_learning": {"enabled": True}},
    "data_efficiency.enabled": {"data_efficiency": {"enabled": True}},
    "compression_training": {"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": True}}}},
    "sparse_gradients": {"sparse_gradients": True},
    "sequence_parallel_size": {"sequence_parallel_size": 2},
    "zero_optimization.zero_quantized_weights": {"zero_optimization": {"stage": 3, "zero_quantized_weights": True}},
    "zero_optimization.zero_quantized_gradients": {"zero_optimization": {"stage": 3, "zero_quantized_gradients": True}},
    "zero_optimization.zero_hpz_partition_size": {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}},
    "zero_optimization.mics_shard_size": {"zero_optimization": {"stage": 3, "mics_shard_size": 8}},
}


def test_every_deepspeed_only_feature_has_a_case_here():
    assert set(ASKING) == {dotted for dotted, _, _ in DEEPSPEED_ONLY}


class PipelineModule(torch.nn.Sequential):
    """Stands for deepspeed.pipe.PipelineModule (another library's): refused, pointing at trainer.pipe."""


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mpu": object()}, r"initialize\(mpu=...\): Megatron-style model-parallel units are not supported"),
        ({"mesh_param": (2, 1)}, r"initialize\(mesh_param=...\)"),
        (
            {"model": PipelineModule(torch.nn.Linear(2, 2))},
            r"PipelineModule is not rankscope's; build the pipeline with trainer.pipe.PipelineModule",
        ),
    ],
)
def test_deepspeed_only_arguments_fail_at_initialize_naming_them(kwargs, message):
    kwargs.setdefault("model", make_model())
    with pytest.raises(DeepSpeedArgumentError, match=message):
        deepspeed.initialize(config=WITH_OPT, **kwargs)
