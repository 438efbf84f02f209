"""DeepSpeed's module-level API, so a DeepSpeed script runs on this engine with one changed line:

    import trainer as deepspeed          # was: import deepspeed

    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()           # --deepspeed --deepspeed_config ds_config.json
    deepspeed.init_distributed()
    engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model, optimizer=opt)

``initialize`` takes DeepSpeed's arguments with DeepSpeed's meaning and raises where DeepSpeed
raises (a config given two ways, none at all); a DeepSpeed feature this engine does not have
(``mpu``, another library's pipeline module, the config keys in trainer.config.DEEPSPEED_ONLY) is refused here,
before any training, with one message naming it. ``trainer.comm`` stands in for ``deepspeed.comm``.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

from trainer.config import ConfigError, load_config

__all__ = ["DeepSpeedArgumentError", "add_config_arguments", "init_distributed", "initialize"]


class DeepSpeedArgumentError(ConfigError, AssertionError):
    """initialize was called in a way DeepSpeed refuses (with an AssertionError there, so code that
    catches that still catches this)."""


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """DeepSpeed's argument group: ``--deepspeed``, ``--deepspeed_config PATH`` and their
    deprecated ``--deepscale`` spellings. Returns the parser."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="Enable DeepSpeed (for user code)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help="Deprecated: --deepspeed")
    group.add_argument("--deepscale_config", default=None, type=str, help="Deprecated: --deepspeed_config")
    return parser


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: timedelta | None = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config=None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """DeepSpeed's call: join the launcher's process group (torchrun's environment), or make a
    world of one. ``dist_backend`` None picks nccl with CUDA, gloo without. MPI discovery,
    ``rank`` / ``world_size`` without a launcher environment are DeepSpeed's and refused."""
    import os

    from trainer import comm
    from trainer.engine import init_distributed as join

    if dist_init_required is False:
        return
    if not comm.is_initialized() and (rank >= 0 or world_size >= 0) and "RANK" not in os.environ:
        raise DeepSpeedArgumentError(
            "init_distributed(rank=..., world_size=...): rankscope's engine joins the process group from the "
            "launcher's environment (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
        )
    join(dist_backend=dist_backend, timeout=timeout, init_method=init_method)


def _config_from(args, config, config_params):
    """DeepSpeed's rules for where the config comes from: ``config``, else ``config_params``, else
    ``args.deepspeed_config`` (or the deprecated ``args.deepscale_config``); given two ways is an error."""
    if config is None and config_params is not None:
        config = config_params
    if getattr(args, "deepscale_config", None) is not None:
        if getattr(args, "deepspeed_config", None) is not None:
            raise DeepSpeedArgumentError(
                "initialize: args has both deepscale_config and deepspeed_config; keep --deepspeed_config"
            )
        args.deepspeed_config, args.deepscale_config = args.deepscale_config, None
    from_args = getattr(args, "deepspeed_config", None)
    if from_args is not None:
        if config is not None:
            raise DeepSpeedArgumentError(
                "initialize: the config is given twice, as args.deepspeed_config and as config/config_params; pass one"
            )
        config = from_args
    if config is None:
        raise DeepSpeedArgumentError(
            "initialize: no config; pass config= (a dict or a ds_config.json path) or args with --deepspeed_config"
        )
    return load_config(config)


def _refuse_deepspeed_only(model, mpu, mesh_param) -> None:
    """Arguments asking for DeepSpeed features this engine does not have, refused by name."""
    if mpu is not None:
        raise DeepSpeedArgumentError(
            "initialize(mpu=...): Megatron-style model-parallel units are not supported by rankscope's engine; "
            "use the config's tensor_parallel.tp_size for tensor parallelism"
        )
    if mesh_param is not None:
        raise DeepSpeedArgumentError(
            "initialize(mesh_param=...): device meshes (sequence parallelism) are not supported by rankscope's engine"
        )
    from trainer.pipe import PipelineModule

    if not isinstance(model, PipelineModule) and any(
        cls.__name__ in ("PipelineModule", "DualPipeVModule") for cls in type(model).__mro__
    ):
        raise DeepSpeedArgumentError(
            f"initialize(model=...): {type(model).__module__}.{type(model).__name__} is not rankscope's; build "
            "the pipeline with trainer.pipe.PipelineModule (import trainer as deepspeed: deepspeed.pipe)"
        )


def initialize(
    args=None,
    model=None,
    optimizer=None,
    model_parameters=None,
    training_data=None,
    lr_scheduler=None,
    distributed_port: int = 29500,
    mpu=None,
    dist_init_required: bool | None = None,
    collate_fn=None,
    config=None,
    mesh_param=None,
    config_params=None,
):
    """DeepSpeed's ``deepspeed.initialize``: returns ``(engine, optimizer, dataloader, lr_scheduler)``.

    ``args``: reads ``deepspeed_config`` and ``local_rank``; ``optimizer``: a torch optimizer over
    the model's parameters or a callable taking ``model_parameters`` (either replaces the config's
    optimizer block); ``lr_scheduler``: a scheduler over that optimizer or a callable taking the
    optimizer (either replaces the config's scheduler block), stepped once per optimizer step;
    ``training_data`` (+ ``collate_fn``): the engine builds a distributed dataloader.
    ``dist_init_required=False`` needs torch.distributed initialised already."""
    from torch.optim import Optimizer

    from trainer import comm
    from trainer.engine import Engine

    if model is None:
        raise DeepSpeedArgumentError("initialize: model is required")
    _refuse_deepspeed_only(model, mpu, mesh_param)
    if dist_init_required is False and not comm.is_initialized():
        raise DeepSpeedArgumentError(
            "initialize(dist_init_required=False): torch.distributed is not initialized; call "
            "init_distributed() first or leave dist_init_required unset"
        )
    raw = _config_from(args, config, config_params)
    if optimizer is not None and not (isinstance(optimizer, Optimizer) or callable(optimizer)):
        raise DeepSpeedArgumentError(
            f"initialize(optimizer=...): expected a torch.optim.Optimizer or a callable, got {type(optimizer).__name__}"
        )
    if lr_scheduler is not None and hasattr(lr_scheduler, "step") and not isinstance(optimizer, Optimizer):
        raise DeepSpeedArgumentError(
            "initialize(lr_scheduler=...): a scheduler object needs the optimizer object it was built on as "
            "optimizer=; otherwise pass a callable taking the optimizer"
        )
    from trainer.pipe import PipelineModule
    from trainer.pipe.engine import PipelineEngine

    engine = (PipelineEngine if isinstance(model, PipelineModule) else Engine)(
        model,
        raw,
        model_parameters=model_parameters,
        training_data=training_data,
        collate_fn=collate_fn,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        local_rank=getattr(args, "local_rank", None),
    )
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler
