"""The ds_config parser: DeepSpeed's batch-size rule, validation errors naming the dotted key,
unknown-key warnings, and that initialize fails early with one clear message.

Split by tier: what needs processes, sockets or seconds is in tests/integration/trainer/test_engine_config.py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from collector.data.config import ConfigWarning
from trainer.config import ConfigError, EngineConfig, load_config

OPT = {"type": "Adam", "params": {"lr": 1e-3}}


def _cfg(**kw) -> dict:
    return dict({"train_micro_batch_size_per_gpu": 2, "optimizer": OPT, "telemetry": {"enabled": False}}, **kw)


@pytest.mark.parametrize(
    "given, world, expected",
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
        ({"train_micro_batch_size_per_gpu": 4}, 2, (8, 4, 1)),
        ({"train_batch_size": 8}, 2, (8, 4, 1)),
        (
            {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2},
            4,
            (24, 3, 2),
        ),
    ],
)
def test_engine_config_batch_triple_inferred(given, world, expected):
    cfg = EngineConfig.from_dict(dict(given, optimizer=OPT), world_size=world)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == expected


def test_engine_config_defaults_follow_deepspeed():
    cfg = EngineConfig.from_dict(_cfg(), world_size=1)
    z = cfg.zero_optimization
    assert (z.stage, z.reduce_bucket_size, z.overlap_comm, z.contiguous_gradients) == (0, 500_000_000, False, True)
    assert (cfg.fp16.initial_scale_power, cfg.fp16.loss_scale_window, cfg.fp16.hysteresis) == (16, 1000, 2)
    assert cfg.steps_per_print == 10 and cfg.gradient_clipping == 1.0  # DeepSpeed clips at 1.0 unless told
    assert EngineConfig.from_dict(_cfg(bfloat16={"enabled": True})).bf16.enabled  # older spelling
    big = EngineConfig.from_dict(_cfg(zero_optimization={"stage": 2, "reduce_bucket_size": 5e8}))
    assert big.zero_optimization.reduce_bucket_size == 500_000_000


def test_engine_config_unknown_keys_warn_with_dotted_path():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EngineConfig.from_dict(
            _cfg(
                zero_optimizaton={"stage": 2},
                zero_optimization={"stage": 1, "bucket": 3},
                fp16={"enabled": False, "scale": 2},
                prescale_gradients=False,
            )
        )
    text = " ".join(str(w.message) for w in caught)
    assert "zero_optimizaton" in text and "zero_optimization.bucket" in text and "fp16.scale" in text
    assert "prescale_gradients" not in text  # a known DeepSpeed key, accepted
    assert "zero_optimizaton (did you mean zero_optimization?)" in text


def _leaves(d, path=()):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, (*path, k))
        else:
            yield (*path, k)


BAD_VALUES = [[0.9], [], "x", None, {}, {"a": 1}, -1, 1e400, True, [None], 10**30]


def test_every_value_of_a_whole_config_is_checked_under_its_dotted_key():
    """Each value of DeepSpeed's reference config, replaced by values of the wrong type or length:
    the config is refused with a ConfigError naming the key, or taken; never a raw IndexError,
    TypeError, KeyError or AttributeError from deep inside (``"betas": [0.9]`` was an IndexError)."""
    from trainer.engine import optimizer_factory

    base = _reference()
    EngineConfig.from_dict(base, world_size=4)  # as given, it is taken
    raw_errors, unnamed = [], []
    for path in _leaves(base):
        for bad in BAD_VALUES:
            cfg = json.loads(json.dumps(base))
            node = cfg
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = bad
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    built = EngineConfig.from_dict(cfg, world_size=4)
                    if built.optimizer is not None:
                        optimizer_factory(built.optimizer)([{"params": [torch.nn.Parameter(torch.ones(2))]}])
                except ConfigError as e:
                    if not any(part in str(e) for part in path):  # the key, or its block
                        unnamed.append((".".join(path), bad, str(e)))
                except Exception as e:
                    raw_errors.append((".".join(path), bad, f"{type(e).__name__}: {e}"))
    assert raw_errors == []
    assert unnamed == []


# --------------------------------------------------------------------------- whole DeepSpeed configs

FIXTURES = Path(__file__).parents[2] / "fixtures"
EXAMPLE_CONFIGS = sorted((Path(__file__).resolve().parents[3] / "trainer" / "examples" / "configs").glob("*.json"))


def _warned_keys(caught) -> list[str]:
    """Every dotted key named by an unknown-key warning, in order."""
    prefix = "ignoring unknown config keys: "
    keys = [
        k
        for w in caught
        if issubclass(w.category, ConfigWarning)
        for k in str(w.message).removeprefix(prefix).split(", ")
    ]
    return [k.split(" (did you mean ")[0] for k in keys]


def _reference(deepspeed_only: bool = False) -> dict:
    """DeepSpeed's config-JSON reference; unless ``deepspeed_only``, with what it enables that this
    engine does not have (trainer.config.DEEPSPEED_ONLY) turned off, as a user of this engine would."""
    raw = json.loads(json.dumps(load_config(FIXTURES / "deepspeed_config_reference.json")))
    if not deepspeed_only:
        raw["compression_training"]["layer_reduction"]["enabled"] = False
        raw["data_efficiency"]["enabled"] = False
        raw["curriculum_learning"]["enabled"] = False
    return raw


def test_deepspeed_reference_config_loads_without_a_warning():
    """Every section of DeepSpeed's config-JSON reference, with its documented example
    values (the seed docs), in one file: nothing in it is reported as unknown."""
    raw = _reference()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = EngineConfig.from_dict(raw, world_size=4)
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (32, 16, 1)
    assert (cfg.tensor_parallel.tp_size, cfg.dp_world_size) == (2, 2)
    z = cfg.zero_optimization
    assert (z.stage, z.reduce_bucket_size, z.stage3_param_persistence_threshold) == (3, 500_000_000, 1_000_000)
    assert type(z.reduce_bucket_size) is int  # 5e8 in the JSON
    assert (z.offload_param.device, z.offload_optimizer.device, z.offload_optimizer.nvme_path) == (
        "cpu",
        "cpu",
        "/local_nvme",
    )
    assert cfg.aio.intra_op_parallelism == 1  # from DeepSpeed's older thread_count
    assert cfg.fp16.enabled and cfg.fp16.min_loss_scale == 1.0 and cfg.optimizer.type == "Adam"
    assert cfg.scheduler.type == "WarmupLR" and cfg.scheduler.params.warmup_num_steps == 1000
    assert cfg.comms_logger.prof_ops == ["all_reduce", "all_gather"] and not cfg.comms_logger.prof_all
    assert cfg.csv_monitor.job_name == "train_bert" and cfg.tensorboard.enabled
    assert cfg.raw == raw


def test_deepspeed_only_features_of_the_reference_fail_in_one_message_naming_each():
    with pytest.raises(ConfigError) as e:
        EngineConfig.from_dict(_reference(deepspeed_only=True), world_size=4)
    message = str(e.value)
    assert message.startswith("not supported by rankscope's engine (DeepSpeed-only features): ")
    assert "compression_training (compression training)" in message
    assert "data_efficiency.enabled (data efficiency" in message
    assert "curriculum_learning.enabled (curriculum learning)" in message


def test_genuinely_unknown_keys_are_the_only_ones_reported_at_any_depth():
    raw = _reference()
    typos = {
        "zero_optimisation": {},
        "zero_optimization.offload_param.buffer_cnt": 5,
        "aio.queue_dept": 4,
        "scheduler.params.warmup_steps": 10,
        "fp16.loss_scale_windw": 1,
        "bf16.enable": True,
        "optimizer.parameters": {},
        "comms_logger.prof_op": ["all_reduce"],
        "flops_profiler.profile_stp": 2,
        "csv_monitor.outputpath": "x",
        "tensorboard.job": "x",
        "telemetry.endpont": "h:1",
        "tensor_parallel.tp": 2,
    }
    for dotted, value in typos.items():
        *path, name = dotted.split(".")
        block = raw
        for part in path:
            block = block.setdefault(part, {})
        block[name] = value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EngineConfig.from_dict(raw, world_size=4)
    assert sorted(_warned_keys(caught)) == sorted(typos)
    assert all(issubclass(w.category, ConfigWarning) for w in caught)


def test_tensor_parallel_guide_config_from_the_seed_docs():
    """The seed's tensor-parallel guide passes this dict to deepspeed.initialize. Every key is
    known; its one problem (parameter offload under ZeRO stage 2) is named."""
    config = {
        "train_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "fp16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        },
        "tensorboard": {"enabled": True, "output_path": "tensorboard_logs", "job_name": "my_training_job"},
        "tensor_parallel": {"enabled": True, "tp_size": 2},
        "optimizer": OPT,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(
            ConfigError,
            match=r"^zero_optimization\.offload_param: parameter offload needs "
            r"zero_optimization\.stage 3 \(got 2\)$",
        ):
            EngineConfig.from_dict(config, world_size=2)
        del config["zero_optimization"]["offload_param"]
        cfg = EngineConfig.from_dict(config, world_size=2)
    assert (cfg.tensor_parallel.tp_size, cfg.dp_world_size, cfg.train_micro_batch_size_per_gpu) == (2, 1, 32)
    config["tensor_parallel"]["enabled"] = False
    assert EngineConfig.from_dict(config, world_size=2).tensor_parallel.tp_size == 1


@pytest.mark.parametrize("path", EXAMPLE_CONFIGS, ids=lambda p: p.name)
def test_shipped_example_configs_load_without_a_warning(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = EngineConfig.from_dict(load_config(path), world_size=2)
    assert cfg.optimizer.type == "AdamW" and cfg.scheduler.type == "WarmupLR"


@pytest.mark.parametrize(
    "blocks",
    [
        {
            "scheduler": {
                "type": "LRRangeTest",
                "params": {
                    "lr_range_test_min_lr": 0.0001,
                    "lr_range_test_step_size": 200,
                    "lr_range_test_step_rate": 5,
                    "lr_range_test_staircase": False,
                },
            }
        },
        {
            "flops_profiler": {
                "enabled": True,
                "profile_step": 1,
                "module_depth": -1,
                "top_modules": 1,
                "detailed": True,
                "output_file": None,
            }
        },
        {"comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False}},
        {
            "comms_logger": {
                "enabled": True,
                "verbose": False,
                "prof_all": False,
                "debug": False,
                "prof_ops": ["all_reduce", "all_gather"],
            }
        },
        {
            "tensorboard": {"enabled": True, "output_path": "output/ds_logs/", "job_name": "train_bert"},
            "wandb": {"enabled": True, "team": "my_team", "group": "my_group", "project": "my_project"},
            "comet": {"enabled": True, "project": "my_project", "experiment_name": "my_experiment"},
            "csv_monitor": {"enabled": True, "output_path": "output/ds_logs/", "job_name": "train_bert"},
        },
        {
            "aio": {
                "single_submit": False,
                "overlap_events": True,
                "intra_op_parallelism": 8,
                "queue_depth": 32,
                "block_size": 1048576,
            }
        },
    ],
    ids=["lr-range-test", "flops-profiler", "comms-logger", "comms-logger-prof-ops", "monitor", "nvme-tune"],
)
def test_blocks_from_the_seed_tutorials_load_without_a_warning(blocks):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = EngineConfig.from_dict(_cfg(**blocks))
    for name, _block in blocks.items():
        if name not in ("wandb", "comet"):  # accepted; trainer.monitor says they are not bundled
            assert getattr(cfg, name).key() == name


def test_nvme_tune_output_as_deepspeed_prints_it_is_refused_clearly():
    """ds_nvme_tune prints booleans as strings ("false"), which DeepSpeed reads as true.
    Here a string is not a boolean: the error names the key and shows the quotes."""
    printed = {
        "single_submit": "false",
        "overlap_events": "true",
        "intra_op_parallelism": 8,
        "queue_depth": 32,
        "block_size": 1048576,
    }
    with pytest.raises(ConfigError, match=r"^aio\.single_submit: must be true or false \(got 'false'\)$"):
        EngineConfig.from_dict(_cfg(aio=printed))
