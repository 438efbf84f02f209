"""The engine's configuration: DeepSpeed's ds_config.json schema, parsed into
kw-only dataclasses, one per block, each validated in ``__post_init__`` with
errors that name the dotted key and what is allowed.

    cfg = EngineConfig.from_dict(json.load(open("ds_config.json")), dp_world_size=4)

Unknown keys are warned about by dotted path (a user's ds_config.json keeps
working even when it names features this engine does not implement). Blocks
owned by other parts (scheduler, comms_logger, flops_profiler, monitors, moe)
are kept as dicts and validated by their owners.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from dataclasses import InitVar, dataclass, field
from typing import Any

from collector.rank.session import TelemetryConfig  # the telemetry block belongs to its owner


class ConfigError(ValueError):
    """A config value is invalid; the message names the dotted key."""


# DeepSpeed keys this engine accepts without acting on them (no warning: they
# are common in real configs and harmless to ignore).
_ACCEPTED_TOP_LEVEL = {
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "communication_data_type",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dump_state", "activation_checkpointing",
    "amp", "autotuning", "checkpoint", "data_types", "memory_breakdown", "wandb", "comet",
    "elasticity", "compression_training", "data_efficiency", "curriculum_learning", "sparse_attention",
    "seed", "train_micro_batch_size", "disable_allgather", "gradient_accumulation_dtype",
}
_ACCEPTED_ZERO = {
    "allgather_partitions", "stage3_max_live_parameters", "stage3_max_reuse_distance", "sub_group_size",
    "elastic_checkpoint", "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "ignore_unused_parameters", "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_gradients", "log_trace_cache_warnings", "load_from_fp32_weights", "grad_hooks",
    "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory", "memory_efficient_linear",
    "mics_shard_size", "mics_hierarchical_params_gather", "stage3_model_persistence_threshold",
    "use_multi_rank_bucket_allreduce", "legacy_stage1",
}
_ACCEPTED_OFFLOAD = {"buffer_count", "buffer_size", "max_in_cpu", "fast_init", "ratio",
                     "pipeline_read", "pipeline_write", "pipeline"}


def _fail(key: str, msg: str, value: Any) -> None:
    raise ConfigError(f"{key}: {msg} (got {value!r})")


def _check_bool(key: str, v: Any) -> None:
    if not isinstance(v, bool):
        _fail(key, "must be true or false", v)


def _check_number(key: str, v: Any, *, min_value: float | None = None, integer: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if not ok:
        _fail(key, "must be an integer" if integer else "must be a finite number", v)
    if min_value is not None and v < min_value:
        _fail(key, f"must be >= {min_value}", v)


def _check_dict(key: str, v: Any) -> None:
    if not isinstance(v, dict):
        _fail(key, "must be an object", v)


def _from_dict(cls, d: Any, prefix: str, accepted: set[str] = frozenset(), **extra):
    """Build dataclass ``cls`` from ``d`` (plus ``extra`` init-only values), warning about unknown
    keys by dotted path."""
    if d is None:
        d = {}
    _check_dict(prefix, d)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(k for k in d if k not in names and k not in accepted)
    if unknown:
        warnings.warn("ignoring unknown config keys: " + ", ".join(f"{prefix}.{k}" for k in unknown), stacklevel=3)
    return cls(**{k: v for k, v in d.items() if k in names}, **extra)


@dataclass(kw_only=True)
class FP16Config:
    """``fp16``: loss-scaled half precision (loss_scale 0 = dynamic)."""
    enabled: bool = False
    auto_cast: bool = False
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    consecutive_hysteresis: bool = False
    min_loss_scale: float = 1.0

    def __post_init__(self) -> None:
        for k in ("enabled", "auto_cast", "consecutive_hysteresis"):
            _check_bool(f"fp16.{k}", getattr(self, k))
        _check_number("fp16.loss_scale", self.loss_scale, min_value=0)
        _check_number("fp16.initial_scale_power", self.initial_scale_power, min_value=0, integer=True)
        _check_number("fp16.loss_scale_window", self.loss_scale_window, min_value=1, integer=True)
        _check_number("fp16.hysteresis", self.hysteresis, min_value=1, integer=True)
        _check_number("fp16.min_loss_scale", self.min_loss_scale, min_value=0)


@dataclass(kw_only=True)
class BF16Config:
    """``bf16``: bfloat16 weights/activations, fp32 master weights, no loss scaling."""
    enabled: bool = False

    def __post_init__(self) -> None:
        _check_bool("bf16.enabled", self.enabled)


OPTIMIZER_TYPES = ("Adam", "AdamW", "SGD")


@dataclass(kw_only=True)
class OptimizerConfig:
    """``optimizer``: {type, params}. DeepSpeed's ``Adam`` is AdamW unless params.adam_w_mode is false."""
    type: str = "AdamW"
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        canonical = {t.lower(): t for t in OPTIMIZER_TYPES}
        if not isinstance(self.type, str) or self.type.lower() not in canonical:
            _fail("optimizer.type", f"unknown optimizer; allowed: {', '.join(OPTIMIZER_TYPES)}", self.type)
        self.type = canonical[self.type.lower()]
        _check_dict("optimizer.params", self.params)
        lr = self.params.get("lr", 1e-3)
        _check_number("optimizer.params.lr", lr, min_value=0)


OFFLOAD_DEVICES = ("none", "cpu", "nvme")


@dataclass(kw_only=True)
class OffloadConfig:
    """``zero_optimization.offload_optimizer`` / ``offload_param``: device none / cpu / nvme
    (nvme needs ``nvme_path``, a writable directory; checked when the engine starts)."""
    device: str = "none"
    pin_memory: bool = False
    nvme_path: str | None = None
    key: InitVar[str] = "zero_optimization.offload"  # dotted path for messages; not a config key

    def __post_init__(self, key: str) -> None:
        if self.device is None:
            self.device = "none"
        if self.device not in OFFLOAD_DEVICES:
            _fail(f"{key}.device", f"must be one of {', '.join(OFFLOAD_DEVICES)}", self.device)
        _check_bool(f"{key}.pin_memory", self.pin_memory)
        if self.device == "nvme":
            if self.nvme_path is None or self.nvme_path == "":
                _fail(f"{key}.nvme_path", "device 'nvme' needs nvme_path, a writable directory for the swap files",
                      self.nvme_path)
            if not isinstance(self.nvme_path, (str, os.PathLike)):
                _fail(f"{key}.nvme_path", "must be a directory path (a string)", self.nvme_path)
            self.nvme_path = os.fspath(self.nvme_path)

    @property
    def enabled(self) -> bool:
        """Off the accelerator: in host memory (cpu) or swapped to files through host memory (nvme)."""
        return self.device in ("cpu", "nvme")

    @property
    def nvme(self) -> bool:
        return self.device == "nvme"


@dataclass(kw_only=True)
class AioConfig:
    """``aio``: the async I/O engine behind nvme offload (DeepSpeed's keys and defaults)."""
    block_size: int = 1048576
    queue_depth: int = 8
    single_submit: bool = False
    overlap_events: bool = True
    intra_op_parallelism: int = 1

    def __post_init__(self) -> None:
        for k in ("block_size", "queue_depth", "intra_op_parallelism"):
            _check_number(f"aio.{k}", getattr(self, k), min_value=1, integer=True)
            setattr(self, k, int(getattr(self, k)))
        for k in ("single_submit", "overlap_events"):
            _check_bool(f"aio.{k}", getattr(self, k))

    @classmethod
    def from_dict(cls, d: Any) -> "AioConfig":
        if isinstance(d, dict) and "thread_count" in d and "intra_op_parallelism" not in d:
            d = dict(d, intra_op_parallelism=d["thread_count"])  # DeepSpeed's older name
        return _from_dict(cls, d, "aio", {"thread_count", "use_gds"})

    def handle_kwargs(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(kw_only=True)
class ZeroConfig:
    """``zero_optimization``: stage 0-3, bucket sizes (in elements), overlap, offload."""
    stage: int = 0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_module_granularity_threshold: int = 0  # 0: off; see trainer.zero.leaf
    offload_optimizer: OffloadConfig | dict | None = None
    offload_param: OffloadConfig | dict | None = None

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3) or isinstance(self.stage, bool):
            _fail("zero_optimization.stage", "must be one of 0, 1, 2, 3", self.stage)
        for k in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size"):
            _check_number(f"zero_optimization.{k}", getattr(self, k), min_value=1, integer=True)
            setattr(self, k, int(getattr(self, k)))
        for k in ("stage3_param_persistence_threshold", "stage3_module_granularity_threshold"):
            _check_number(f"zero_optimization.{k}", getattr(self, k), min_value=0, integer=True)
            setattr(self, k, int(getattr(self, k)))
        for k in ("overlap_comm", "contiguous_gradients", "reduce_scatter"):
            _check_bool(f"zero_optimization.{k}", getattr(self, k))
        for k in ("offload_optimizer", "offload_param"):
            v = getattr(self, k)
            if not isinstance(v, OffloadConfig):
                setattr(self, k, _from_dict(OffloadConfig, v, f"zero_optimization.{k}", _ACCEPTED_OFFLOAD,
                                            key=f"zero_optimization.{k}"))
        if self.offload_optimizer.enabled and self.stage == 0:
            _fail("zero_optimization.offload_optimizer", "optimizer offload needs zero_optimization.stage 1, 2 or 3",
                  self.stage)
        if self.offload_param.enabled and self.stage != 3:
            _fail("zero_optimization.offload_param", "parameter offload needs zero_optimization.stage 3",
                  self.stage)


@dataclass(kw_only=True)
class TensorParallelConfig:
    """``tensor_parallel``: accepted now, used by the tensor-parallel part later."""
    tp_size: int = 1
    autotp_size: int | None = None

    def __post_init__(self) -> None:
        if self.autotp_size is not None:
            self.tp_size = self.autotp_size
        _check_number("tensor_parallel.tp_size", self.tp_size, min_value=1, integer=True)
        self.tp_size = int(self.tp_size)


_DICT_BLOCKS = ("scheduler", "comms_logger", "flops_profiler", "csv_monitor", "tensorboard", "moe")


@dataclass(kw_only=True)
class EngineConfig:
    """The whole ds_config. Build with :meth:`from_dict` so the batch triple is resolved."""
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    dp_world_size: int = 1
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: dict | None = None
    gradient_clipping: float = 0.0
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16: BF16Config = field(default_factory=BF16Config)
    zero_optimization: ZeroConfig = field(default_factory=ZeroConfig)
    wall_clock_breakdown: bool = False
    steps_per_print: int = 10
    comms_logger: dict = field(default_factory=dict)
    flops_profiler: dict = field(default_factory=dict)
    csv_monitor: dict = field(default_factory=dict)
    tensorboard: dict = field(default_factory=dict)
    moe: dict = field(default_factory=dict)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    tensor_parallel: TensorParallelConfig = field(default_factory=TensorParallelConfig)
    aio: AioConfig = field(default_factory=AioConfig)
    raw: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            _check_number(k, getattr(self, k), min_value=1, integer=True)
        if self.train_batch_size != (self.train_micro_batch_size_per_gpu * self.gradient_accumulation_steps
                                     * self.dp_world_size):
            raise ConfigError(
                "train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
                f"data-parallel world size, got train_batch_size={self.train_batch_size}, "
                f"train_micro_batch_size_per_gpu={self.train_micro_batch_size_per_gpu}, "
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}, world size={self.dp_world_size}")
        _check_number("gradient_clipping", self.gradient_clipping, min_value=0)
        _check_bool("wall_clock_breakdown", self.wall_clock_breakdown)
        _check_number("steps_per_print", self.steps_per_print, min_value=1, integer=True)
        if self.fp16.enabled and self.bf16.enabled:
            raise ConfigError("fp16.enabled and bf16.enabled: choose one precision, not both")
        for k in _DICT_BLOCKS:
            if getattr(self, k) is not None:
                _check_dict(k, getattr(self, k))

    @property
    def precision(self):
        import torch
        return torch.float16 if self.fp16.enabled else torch.bfloat16 if self.bf16.enabled else torch.float32

    @classmethod
    def from_dict(cls, d: dict, *, dp_world_size: int = 1) -> "EngineConfig":
        _check_dict("config", d)
        d = dict(d)
        if "bfloat16" in d and "bf16" not in d:  # DeepSpeed's older spelling
            d["bf16"] = d.pop("bfloat16")
        names = {f.name for f in dataclasses.fields(cls)} - {"raw", "dp_world_size"}
        unknown = sorted(k for k in d if k not in names and k not in _ACCEPTED_TOP_LEVEL)
        if unknown:
            warnings.warn("ignoring unknown config keys: " + ", ".join(unknown), stacklevel=2)
        tensor_parallel = _from_dict(TensorParallelConfig, d.get("tensor_parallel"), "tensor_parallel")
        if dp_world_size % tensor_parallel.tp_size:
            _fail("tensor_parallel.tp_size", f"must divide the world size {dp_world_size}", tensor_parallel.tp_size)
        dp = dp_world_size // tensor_parallel.tp_size
        batch, micro, gas = _resolve_batch(d.get("train_batch_size"), d.get("train_micro_batch_size_per_gpu"),
                                           d.get("gradient_accumulation_steps"), dp)
        blocks = {k: d[k] for k in _DICT_BLOCKS if k in d}
        optimizer = d.get("optimizer")
        if optimizer is None:
            raise ConfigError("optimizer: the config needs an optimizer block, e.g. "
                              '{"type": "AdamW", "params": {"lr": 1e-3}}')
        return cls(
            train_batch_size=batch, train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas,
            dp_world_size=dp,
            optimizer=_from_dict(OptimizerConfig, optimizer, "optimizer"),
            gradient_clipping=d.get("gradient_clipping", 0.0),
            fp16=_from_dict(FP16Config, d.get("fp16"), "fp16"),
            bf16=_from_dict(BF16Config, d.get("bf16"), "bf16"),
            zero_optimization=_from_dict(ZeroConfig, d.get("zero_optimization"), "zero_optimization",
                                         _ACCEPTED_ZERO),
            wall_clock_breakdown=d.get("wall_clock_breakdown", False),
            steps_per_print=d.get("steps_per_print", 10),
            telemetry=TelemetryConfig.from_dict(d.get("telemetry")),
            tensor_parallel=tensor_parallel,
            aio=AioConfig.from_dict(d.get("aio")),
            raw=d,
            **{k: (v if v is not None or k == "scheduler" else {}) for k, v in blocks.items()},
        )


def _resolve_batch(batch, micro, gas, dp: int) -> tuple[int, int, int]:
    """DeepSpeed's rule: train_batch_size = micro * gas * dp; any two given -> the third inferred."""
    for k, v in (("train_batch_size", batch), ("train_micro_batch_size_per_gpu", micro),
                 ("gradient_accumulation_steps", gas)):
        if v is not None:
            _check_number(k, v, min_value=1, integer=True)
    if batch is not None and micro is not None and gas is None:
        gas, rem = divmod(batch, micro * dp)
        if rem or gas < 1:
            raise ConfigError(f"train_batch_size={batch} is not divisible by train_micro_batch_size_per_gpu={micro}"
                              f" * world size={dp}")
    elif batch is not None and gas is not None and micro is None:
        micro, rem = divmod(batch, gas * dp)
        if rem or micro < 1:
            raise ConfigError(f"train_batch_size={batch} is not divisible by gradient_accumulation_steps={gas}"
                              f" * world size={dp}")
    elif batch is None and micro is not None:
        gas = 1 if gas is None else gas
        batch = micro * gas * dp
    elif batch is not None and micro is None and gas is None:
        gas = 1
        micro, rem = divmod(batch, dp)
        if rem or micro < 1:
            raise ConfigError(f"train_batch_size={batch} is not divisible by world size={dp}")
    elif batch is None:
        raise ConfigError("train_batch_size or train_micro_batch_size_per_gpu must be given")
    return int(batch), int(micro), int(gas)


def load_config(config: dict | str | os.PathLike) -> dict:
    """A config dict from a dict or a JSON file path, with a clear error for a bad file."""
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, os.PathLike)):
        raise ConfigError(f"config must be a dict or a path to a JSON file, got {type(config).__name__}")
    try:
        with open(config) as f:
            d = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {os.fspath(config)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {os.fspath(config)!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ConfigError(f"config file {os.fspath(config)!r} must hold a JSON object")
    return d
