"""DeepSpeed's module-level API on the engine (trainer.api), in one process (a world of one):
where the config comes from, the errors DeepSpeed raises, DeepSpeed-only features refused at
initialize by name, client optimizers and schedulers, and the engine surface scripts read.
The same calls against real DeepSpeed are in test_deepspeed_scripts.py.

Split by tier: the pure-function tests are in tests/unit/trainer/test_deepspeed_api.py."""

from __future__ import annotations

import argparse
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import trainer as deepspeed
from tests._engine_util import D_IN, D_OUT, make_model
from tests.unit.trainer.test_deepspeed_api import ASKING, BASE, WITH_OPT
from trainer.api import DeepSpeedArgumentError
from trainer.config import DEEPSPEED_ONLY, ConfigError


def _train(engine, steps: int = 1) -> list[float]:
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(2, D_IN, generator=g), torch.randn(2, D_OUT, generator=g)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_add_config_arguments_adds_deepspeeds_flags(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(WITH_OPT))
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", str(path)])
    assert args.deepspeed and args.deepspeed_config == str(path) and not args.deepscale
    engine, optimizer, loader, scheduler = deepspeed.initialize(args=args, model=make_model())
    assert optimizer is engine.optimizer and loader is None and scheduler is None
    assert engine.train_micro_batch_size_per_gpu() == 2


def test_deprecated_deepscale_config_is_read_like_deepspeed_config(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(WITH_OPT))
    args = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(["--deepscale_config", str(path)])
    engine, *_ = deepspeed.initialize(args=args, model=make_model())
    assert args.deepspeed_config == str(path) and args.deepscale_config is None
    assert engine.train_batch_size() == 2


def test_config_params_is_the_older_spelling_of_config():
    engine, *_ = deepspeed.initialize(model=make_model(), config_params=WITH_OPT)
    assert engine.get_lr() == [1e-2]


@pytest.mark.parametrize("dotted, what", [(d, w) for d, _, w in DEEPSPEED_ONLY], ids=[d for d, _, _ in DEEPSPEED_ONLY])
def test_each_deepspeed_only_feature_fails_at_initialize_naming_its_key(dotted, what):
    with pytest.raises(ConfigError) as e:
        deepspeed.initialize(model=make_model(), config=dict(WITH_OPT, **ASKING[dotted]))
    message = str(e.value)
    assert message.startswith("not supported by rankscope's engine (DeepSpeed-only features): ")
    assert f"{dotted} ({what})" in message and "\n" not in message


def test_several_deepspeed_only_features_are_named_in_one_message():
    config = dict(WITH_OPT, **ASKING["amp.enabled"], **ASKING["sparse_gradients"])
    with pytest.raises(ConfigError, match=r"amp\.enabled \(NVIDIA Apex AMP.*; sparse_gradients \(sparse"):
        deepspeed.initialize(model=make_model(), config=config)


def test_deepspeed_only_features_turned_off_pass_silently():
    config = dict(
        WITH_OPT,
        amp={"enabled": False, "opt_level": "O1"},
        hybrid_engine={"enabled": False},
        curriculum_learning={"enabled": False},
        zero_optimization={"stage": 1, "zero_quantized_weights": False, "mics_shard_size": -1},
        sequence_parallel_size=1,
        tensor_parallel={"enabled": True, "tp_size": 1},  # seed 002's block (DeepSpeed 0.19.8 itself refuses it)
        zero_allow_untested_optimizer=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine, *_ = deepspeed.initialize(model=make_model(), config=config)
    assert engine.zero_optimization_stage() == 1
    assert engine.config.tensor_parallel.tp_size == 1
    autotp_off = dict(WITH_OPT, tensor_parallel={"autotp_size": 0})  # how DeepSpeed 0.19.8 says it
    engine, *_ = deepspeed.initialize(model=make_model(), config=autotp_off)
    assert engine.config.tensor_parallel.tp_size == 1


def test_a_client_optimizer_needs_no_optimizer_block_and_is_the_one_stepped():
    model = make_model()
    client = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(client, step_size=1, gamma=0.5)
    engine, optimizer, _, sched = deepspeed.initialize(
        model=model, optimizer=client, lr_scheduler=scheduler, config=BASE
    )
    assert optimizer is engine.optimizer and sched is scheduler and engine.optimizer.master.optimizer is client
    assert engine.get_mom() == [0.9] and engine.get_lr() == [0.1]
    assert not engine.was_step_applied()
    _train(engine, 2)
    assert engine.get_lr() == [0.025] and engine.global_steps == 2 and engine.was_step_applied()
    assert engine.global_samples == 4 and engine.global_rank == 0 and engine.local_rank == 0
    assert engine.get_global_grad_norm() > 0  # DeepSpeed's default gradient_clipping 1.0 computes it


def test_a_callable_optimizer_gets_the_parameters_and_a_callable_scheduler_the_optimizer():
    seen = {}

    def make_optimizer(params):
        seen["params"] = list(params)
        return torch.optim.AdamW(seen["params"], lr=0.01)

    def make_scheduler(opt):
        seen["optimizer"] = opt
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))

    model = make_model()
    engine, _, _, sched = deepspeed.initialize(
        model=model, optimizer=make_optimizer, lr_scheduler=make_scheduler, config=WITH_OPT
    )
    assert len(seen["params"]) == len(list(model.parameters()))
    assert seen["optimizer"] is engine.optimizer.master.optimizer and sched.optimizer is seen["optimizer"]
    assert engine.get_mom() == [(0.9, 0.999)]
    _train(engine, 3)
    assert engine.get_lr() == pytest.approx([0.01 / 4])


def test_the_scheduler_steps_once_per_optimizer_step_not_per_micro_step():
    model = make_model()
    client = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(client, lambda s: 1.0 / (1 + s))
    config = dict(BASE, gradient_accumulation_steps=3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=client, lr_scheduler=scheduler, config=config)
    boundaries = []
    for _ in range(6):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        _train(engine, 1)
    assert boundaries == [False, False, True] * 2
    assert engine.global_steps == 2 and scheduler.last_epoch == 2
    assert engine.get_lr() == pytest.approx([0.01 / 3])


def test_zero_with_an_untested_client_optimizer_needs_the_deepspeed_key():
    model = make_model()
    config = dict(BASE, zero_optimization={"stage": 2})
    with pytest.raises(
        ConfigError,
        match=r'^zero_allow_untested_optimizer: ZeRO stage 2 with the client optimizer SGD needs "zero_allow',
    ):
        deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    model = make_model()
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config=dict(config, zero_allow_untested_optimizer=True),
    )
    assert _train(engine, 2)[1] < 10


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"optimizer": "adam"}, DeepSpeedArgumentError, "expected a torch.optim.Optimizer or a callable, got str"),
        ({"optimizer": lambda params: "adam"}, TypeError, "the callable returned str, not a torch.optim.Optimizer"),
        ({"lr_scheduler": "steplr"}, TypeError, "str has no step()"),
    ],
)
def test_wrong_client_objects_fail_at_initialize(kwargs, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        deepspeed.initialize(model=make_model(), config=WITH_OPT, **kwargs)


def test_a_scheduler_object_needs_its_optimizer_passed_too():
    model = make_model()
    stray = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(stray, step_size=1)
    with pytest.raises(DeepSpeedArgumentError, match="needs the optimizer object it was built on"):
        deepspeed.initialize(model=model, lr_scheduler=scheduler, config=WITH_OPT)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="built on another optimizer than the engine's"):
        deepspeed.initialize(model=model, optimizer=other, lr_scheduler=scheduler, config=BASE)


def test_dist_init_required_false_needs_a_process_group():
    with pytest.raises(DeepSpeedArgumentError, match="dist_init_required=False"):
        deepspeed.initialize(model=make_model(), config=WITH_OPT, dist_init_required=False)
    deepspeed.init_distributed()
    assert deepspeed.comm.is_initialized() and deepspeed.comm.get_world_size() == 1
    engine, *_ = deepspeed.initialize(model=make_model(), config=WITH_OPT, dist_init_required=False)
    assert engine.world_size == 1


def test_save_16bit_model_loads_into_the_plain_model_and_train_eval_switch_the_module(tmp_path):
    engine, *_ = deepspeed.initialize(model=make_model(), config=WITH_OPT)
    _train(engine, 2)
    engine.eval()
    assert not engine.module.training
    engine.train()
    assert engine.module.training
    assert engine.save_16bit_model(tmp_path, "model.bin") is True
    plain = make_model(seed=5)
    plain.load_state_dict(torch.load(tmp_path / "model.bin"))
    x = torch.randn(3, D_IN)
    with torch.no_grad():
        assert torch.equal(plain(x), engine(x))


_TEARDOWN_SCRIPT = """
import os, sys, weakref, torch
import trainer as deepspeed
deepspeed.init_distributed(dist_backend="gloo")  # as DeepSpeed scripts do: before the engine
from tests._engine_util import make_model
engine, *_ = deepspeed.initialize(model=make_model(), config={"train_batch_size": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
world = weakref.ref(torch.distributed.group.WORLD)
del engine, _
torch.distributed.destroy_process_group()
import gc; gc.collect()
def name(task):  # a thread may end between the listing and the read (ENOENT or ESRCH)
    try:
        return open(f"/proc/self/task/{task}/comm").read().strip()
    except OSError:
        return ""
threads = sorted(name(t) for t in os.listdir("/proc/self/task"))
print("world group alive:", world() is not None, "gloo threads:", [t for t in threads if "gloo" in t])
"""


def test_destroy_process_group_ends_the_world_group_an_engine_used(tmp_path):
    """Its gloo threads must not outlive destroy_process_group: left to interpreter exit, their
    teardown sometimes aborts a finished rank (seen as SIGABRT in CI)."""
    import os
    import subprocess
    import sys

    from collector.testing.ports import free_port

    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _TEARDOWN_SCRIPT],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for r, proc in enumerate(ranks):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"rank {r}: {err[-2000:]}"
        assert "world group alive: False gloo threads: []" in out, f"rank {r}: {out}"
