"""The engine's configuration: DeepSpeed's ds_config.json schema as config blocks
(collector.data.config), one per section, nested under ``EngineConfig``.

    cfg = EngineConfig.from_dict(json.load(open("ds_config.json")), world_size=4)

The engine's own sections are declared here (the batch triple, ``optimizer``,
``bf16``, ``zero_optimization`` with its offload blocks, ``aio``); the others live
beside the code that reads them and are nested here so that one ``from_dict``
checks the whole file and reports each unknown key once: ``fp16``
(trainer.loss_scaler), ``scheduler`` (trainer.lr_schedules), ``tensor_parallel``
(trainer.tensor_parallel.groups), ``comms_logger`` (collector.rank.recorder),
``flops_profiler`` (trainer.profiling.step), ``csv_monitor`` / ``tensorboard``
(trainer.monitor), ``telemetry`` (collector.rank.session). The engine hands those
built blocks to their owners. Unknown keys warn by dotted path; the ``ACCEPTED`` sets
are DeepSpeed keys this engine takes without acting on them, silently, because
real configs are full of them and ignoring them changes nothing that matters
(``prescale_gradients``, ``zero_optimization.sub_group_size``, ...).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from collector.rank.config import ConfigBlock, ConfigError, derived, setting
from collector.rank.recorder import CommsLoggerConfig
from collector.rank.session import TelemetryConfig
from trainer.loss_scaler import PRECISION_CONFLICT, FP16Config
from trainer.lr_schedules import SchedulerConfig
from trainer.monitor import CSVMonitorConfig, TensorBoardConfig
from trainer.profiling.step import FlopsProfilerConfig
from trainer.tensor_parallel.groups import TensorParallelConfig

__all__ = [
    "AioConfig",
    "BF16Config",
    "ConfigError",
    "EngineConfig",
    "FP16Config",
    "OffloadConfig",
    "OptimizerConfig",
    "TensorParallelConfig",
    "ZeroConfig",
    "load_config",
]


@dataclass(kw_only=True)
class BF16Config(ConfigBlock):
    """``bf16``: bfloat16 weights/activations, fp32 master weights, no loss scaling."""

    SECTION: ClassVar[str] = "bf16"
    enabled: bool = False


OPTIMIZER_TYPES = ("Adam", "AdamW", "SGD")

# DeepSpeed's own keys in optimizer.params, taken by the engine (trainer.engine.optimizer_factory)
# before the rest go to the torch optimizer.
_DEEPSPEED_OPTIMIZER_KEYS = {
    "Adam": ("adam_w_mode", "torch_adam", "bias_correction"),
    "AdamW": ("torch_adam", "bias_correction"),
}
# Ranges torch checks with a raw IndexError/TypeError, or later, mid-step.
_NON_NEGATIVE = ("lr", "eps", "weight_decay", "momentum", "dampening")


def _torch_optimizer_defaults(type_: str, params: Mapping) -> dict:
    """The keyword arguments (and their defaults) of the torch optimizer ``type_`` becomes."""
    import inspect

    import torch

    cls = {"AdamW": torch.optim.AdamW, "SGD": torch.optim.SGD}.get(type_)
    if cls is None:  # DeepSpeed's Adam: AdamW unless adam_w_mode is false
        cls = torch.optim.Adam if params.get("adam_w_mode", True) is False else torch.optim.AdamW
    sig = inspect.signature(cls.__init__).parameters
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {n: p.default for n, p in sig.items() if n not in ("self", "params") and p.kind in keyword}


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(kw_only=True)
class OptimizerConfig(ConfigBlock):
    """``optimizer``: {type, params}. DeepSpeed's ``Adam`` is AdamW unless params.adam_w_mode is false.
    Each of ``params`` is checked here under its dotted key (``optimizer.params.betas``): a key the
    optimizer does not take (with the closest one it does), a value of the wrong type or out of range;
    the torch optimizer then checks how they combine (its refusal names ``optimizer.params``)."""

    SECTION: ClassVar[str] = "optimizer"
    type: str = "AdamW"  # any case, as DeepSpeed matches it
    params: dict = field(default_factory=dict)

    def validate(self) -> None:
        canonical = {t.lower(): t for t in OPTIMIZER_TYPES}
        if self.type.lower() not in canonical:
            self.fail(
                "type",
                f"not an optimizer of rankscope's engine; allowed: {', '.join(OPTIMIZER_TYPES)}, or any torch "
                "optimizer passed as trainer.initialize(optimizer=...)",
                self.type,
            )
        self.type = canonical[self.type.lower()]
        self._check_params()

    def _check_params(self) -> None:
        defaults = _torch_optimizer_defaults(self.type, self.params)
        for name in _DEEPSPEED_OPTIMIZER_KEYS.get(self.type, ()):
            defaults[name] = True if name != "torch_adam" else False
        for name, value in self.params.items():
            key = f"params.{name}"
            if name not in defaults:
                close = difflib.get_close_matches(str(name), list(defaults), n=1, cutoff=0.75)
                hint = f"did you mean {self.key('params.' + close[0])}? " if close else ""
                self.fail(key, f"not a parameter of {self.type} ({hint}it takes: {', '.join(defaults)})", value)
            default = defaults[name]
            if name == "betas":
                if not (
                    isinstance(value, (list, tuple))
                    and len(value) == 2
                    and all(_is_number(b) and 0 <= b < 1 for b in value)
                ):
                    self.fail(key, "must be a list of 2 numbers, each >= 0 and < 1, e.g. [0.9, 0.999]", value)
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    self.fail(key, "must be true or false", value)
            elif default is None:
                if value is not None and not isinstance(value, bool):
                    self.fail(key, "must be true, false or null", value)
            elif isinstance(default, (int, float)) or name in _NON_NEGATIVE:
                if not _is_number(value):
                    self.fail(key, "must be a finite number", value)
                if name in _NON_NEGATIVE and value < 0:
                    self.fail(key, "must be >= 0", value)


OFFLOAD_DEVICES = ("none", "cpu", "nvme")


@dataclass(kw_only=True)
class OffloadConfig(ConfigBlock):
    """``zero_optimization.offload_optimizer`` / ``offload_param``: device none / cpu / nvme
    (nvme needs ``nvme_path``, a writable directory; checked when the engine starts)."""

    SECTION: ClassVar[str] = "zero_optimization.offload"  # built under offload_optimizer or offload_param
    # DeepSpeed's buffer-pool and pipelining knobs: this engine sizes its swap buffers itself.
    ACCEPTED: ClassVar[frozenset[str]] = frozenset(
        {
            "buffer_count",
            "buffer_size",
            "max_in_cpu",
            "fast_init",
            "ratio",
            "pipeline_read",
            "pipeline_write",
            "pipeline",
        }
    )
    device: str | None = setting("none", choices=OFFLOAD_DEVICES)  # null: none
    pin_memory: bool = False
    nvme_path: str | os.PathLike | None = None

    def validate(self) -> None:
        if self.device is None:
            self.device = "none"
        if self.device == "nvme" and not self.nvme_path:
            self.fail(
                "nvme_path", "device 'nvme' needs nvme_path, a writable directory for the swap files", self.nvme_path
            )
        if self.nvme_path is not None:
            self.nvme_path = os.fspath(self.nvme_path)

    @property
    def enabled(self) -> bool:
        """Off the accelerator: in host memory (cpu) or swapped to files through host memory (nvme)."""
        return self.device in ("cpu", "nvme")

    @property
    def nvme(self) -> bool:
        return self.device == "nvme"


@dataclass(kw_only=True)
class AioConfig(ConfigBlock):
    """``aio``: the async I/O engine behind nvme offload (DeepSpeed's keys and defaults)."""

    SECTION: ClassVar[str] = "aio"
    ACCEPTED: ClassVar[frozenset[str]] = frozenset({"use_gds"})  # GPUDirect Storage: not bundled
    ALIASES: ClassVar[dict[str, str]] = {"thread_count": "intra_op_parallelism"}  # DeepSpeed's older name
    block_size: int = setting(1048576, ge=1)
    queue_depth: int = setting(8, ge=1)
    single_submit: bool = False
    overlap_events: bool = True
    intra_op_parallelism: int = setting(1, ge=1)

    def handle_kwargs(self) -> dict:
        """The keyword arguments of native.AsyncIOHandle."""
        return self.to_dict()


@dataclass(kw_only=True)
class ZeroConfig(ConfigBlock):
    """``zero_optimization``: stage 0-3, bucket sizes (in elements), overlap, offload."""

    SECTION: ClassVar[str] = "zero_optimization"
    ACCEPTED: ClassVar[frozenset[str]] = frozenset(
        {
            "allgather_partitions",
            "stage3_max_live_parameters",
            "stage3_max_reuse_distance",
            "sub_group_size",
            "elastic_checkpoint",
            "stage3_gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save",
            "ignore_unused_parameters",
            "round_robin_gradients",
            "zero_hpz_partition_size",
            "zero_quantized_weights",
            "zero_quantized_gradients",
            "log_trace_cache_warnings",
            "load_from_fp32_weights",
            "grad_hooks",
            "cpu_offload",
            "cpu_offload_params",
            "cpu_offload_use_pin_memory",
            "memory_efficient_linear",
            "mics_shard_size",
            "mics_hierarchical_params_gather",
            "stage3_model_persistence_threshold",
            "use_multi_rank_bucket_allreduce",
            "legacy_stage1",
        }
    )
    stage: int = setting(0, choices=(0, 1, 2, 3))
    reduce_bucket_size: int = setting(500_000_000, ge=1)
    allgather_bucket_size: int = setting(500_000_000, ge=1)
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    stage3_prefetch_bucket_size: int = setting(50_000_000, ge=1)
    stage3_param_persistence_threshold: int = setting(100_000, ge=0)
    stage3_module_granularity_threshold: int = setting(0, ge=0)  # 0: off; see trainer.zero.leaf
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    offload_param: OffloadConfig = field(default_factory=OffloadConfig)

    def validate(self) -> None:
        if self.offload_optimizer.enabled and self.stage == 0:
            self.fail("offload_optimizer", "optimizer offload needs zero_optimization.stage 1, 2 or 3", self.stage)
        if self.offload_param.enabled and self.stage != 3:
            self.fail("offload_param", "parameter offload needs zero_optimization.stage 3", self.stage)


# DeepSpeed sections and keys this engine accepts without acting on them (no warning: they
# are common in real configs and harmless to ignore). wandb and comet: trainer.monitor
# says so itself when one is enabled.
_ACCEPTED_TOP_LEVEL = frozenset(
    {
        "prescale_gradients",
        "gradient_predivide_factor",
        "sparse_gradients",
        "communication_data_type",
        "zero_force_ds_cpu_optimizer",
        "dump_state",
        "activation_checkpointing",
        "pipeline",  # trainer.pipe.engine reads activation_checkpoint_interval; the rest are GPU-only knobs
        "amp",
        "autotuning",
        "checkpoint",
        "data_types",
        "memory_breakdown",
        "wandb",
        "comet",
        "elasticity",
        "compression_training",
        "data_efficiency",
        "curriculum_learning",
        "sparse_attention",
        "seed",
        "train_micro_batch_size",
        "disable_allgather",
        "gradient_accumulation_dtype",
    }
)


def _enabled(section):
    return isinstance(section, Mapping) and section.get("enabled") is True


def _any_enabled(section) -> bool:
    """Whether any block nested in ``section`` says ``"enabled": true`` (compression_training's shape)."""
    if not isinstance(section, Mapping):
        return False
    return section.get("enabled") is True or any(_any_enabled(v) for v in section.values())


# DeepSpeed features this engine does not have, and how a config asks for them: (dotted key, is it asked
# for?, what it is). Asking for one fails at initialize with every such key named in one message, rather
# than training without it (a silently different run) or failing deep inside a step.
DEEPSPEED_ONLY = (
    ("amp.enabled", lambda c: _enabled(c.get("amp")), "NVIDIA Apex AMP (use bf16 or fp16)"),
    ("torch_autocast.enabled", lambda c: _enabled(c.get("torch_autocast")), "torch.autocast mixed precision"),
    ("hybrid_engine.enabled", lambda c: _enabled(c.get("hybrid_engine")), "the RLHF hybrid engine"),
    ("elasticity.enabled", lambda c: _enabled(c.get("elasticity")), "elastic training"),
    ("curriculum_learning.enabled", lambda c: _enabled(c.get("curriculum_learning")), "curriculum learning"),
    ("data_efficiency.enabled", lambda c: _enabled(c.get("data_efficiency")), "data efficiency (sampling, LTD)"),
    ("compression_training", lambda c: _any_enabled(c.get("compression_training")), "compression training"),
    ("sparse_gradients", lambda c: c.get("sparse_gradients") is True, "sparse gradient reduction"),
    (
        "sequence_parallel_size",
        lambda c: isinstance(c.get("sequence_parallel_size"), int) and c["sequence_parallel_size"] > 1,
        "sequence parallelism (Ulysses)",
    ),
    (
        "zero_optimization.zero_quantized_weights",
        lambda c: _zero(c).get("zero_quantized_weights") is True,
        "ZeRO++ quantized weights",
    ),
    (
        "zero_optimization.zero_quantized_gradients",
        lambda c: _zero(c).get("zero_quantized_gradients") is True,
        "ZeRO++ quantized gradients",
    ),
    (
        "zero_optimization.zero_hpz_partition_size",
        lambda c: isinstance(_zero(c).get("zero_hpz_partition_size"), int) and _zero(c)["zero_hpz_partition_size"] > 1,
        "ZeRO++ hierarchical partitioning",
    ),
    (
        "zero_optimization.mics_shard_size",
        lambda c: isinstance(_zero(c).get("mics_shard_size"), int) and _zero(c)["mics_shard_size"] > 0,
        "MiCS sharding",
    ),
)


def _zero(c) -> Mapping:
    z = c.get("zero_optimization")
    return z if isinstance(z, Mapping) else {}


def check_deepspeed_only(raw: Mapping) -> None:
    """One ConfigError naming every DeepSpeed-only feature ``raw`` asks for (see DEEPSPEED_ONLY)."""
    asked = [f"{key} ({what})" for key, wanted, what in DEEPSPEED_ONLY if wanted(raw)]
    if asked:
        raise ConfigError(
            "not supported by rankscope's engine (DeepSpeed-only features): "
            + "; ".join(asked)
            + ". Remove these keys or turn them off to run on this engine."
        )


@dataclass(kw_only=True)
class EngineConfig(ConfigBlock):
    """The whole ds_config. ``world_size`` (the job's ranks) is supplied by the engine; the
    batch triple is completed by DeepSpeed's rule in ``validate``."""

    # The DeepSpeed-only sections are known too: off, they pass; on, check_deepspeed_only names them.
    ACCEPTED: ClassVar[frozenset[str]] = _ACCEPTED_TOP_LEVEL | {key.split(".")[0] for key, _, _ in DEEPSPEED_ONLY}
    ALIASES: ClassVar[dict[str, str]] = {"bfloat16": "bf16"}  # DeepSpeed's older spelling
    train_batch_size: int | None = setting(None, ge=1)
    train_micro_batch_size_per_gpu: int | None = setting(None, ge=1)
    gradient_accumulation_steps: int | None = setting(None, ge=1)
    optimizer: OptimizerConfig | None = None  # required unless initialize is given an optimizer
    zero_allow_untested_optimizer: bool = False  # a client optimizer other than Adam/AdamW under ZeRO 1-3
    scheduler: SchedulerConfig | None = None
    gradient_clipping: float = setting(1.0, ge=0)  # DeepSpeed's default (its docs and code); 0: off
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16: BF16Config = field(default_factory=BF16Config)
    zero_optimization: ZeroConfig = field(default_factory=ZeroConfig)
    aio: AioConfig = field(default_factory=AioConfig)
    tensor_parallel: TensorParallelConfig = field(default_factory=TensorParallelConfig)
    wall_clock_breakdown: bool = False
    steps_per_print: int = setting(10, ge=1)
    comms_logger: CommsLoggerConfig = field(default_factory=CommsLoggerConfig)
    flops_profiler: FlopsProfilerConfig = field(default_factory=FlopsProfilerConfig)
    csv_monitor: CSVMonitorConfig = field(default_factory=CSVMonitorConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    world_size: int = derived(1)
    client_optimizer: bool = derived(False)  # initialize(optimizer=...): the config's optimizer block is unused
    raw: dict = derived(default_factory=dict, repr=False)  # the config as given: telemetry and checkpoints keep it

    def validate(self) -> None:
        check_deepspeed_only(self.raw)
        self.tensor_parallel.check_layout(self.world_size)
        self._complete_batch()
        if self.fp16.enabled and self.bf16.enabled:
            raise ConfigError(PRECISION_CONFLICT)
        if self.optimizer is None and not self.client_optimizer:
            self.fail(
                "optimizer",
                'the config needs an optimizer block, e.g. {"type": "AdamW", "params": {"lr": 1e-3}}, '
                "or initialize(optimizer=...) a torch optimizer",
            )

    @property
    def dp_world_size(self) -> int:
        """Ranks that hold different data: the world size over the tensor-parallel degree."""
        return self.world_size // self.tensor_parallel.tp_size

    @property
    def precision(self):
        import torch

        return torch.float16 if self.fp16.enabled else torch.bfloat16 if self.bf16.enabled else torch.float32

    @classmethod
    def from_dict(cls, d, *, key: str | None = None, **extra) -> EngineConfig:
        """``extra``: ``world_size``; ``raw`` is ``d`` itself."""
        return super().from_dict(d, key=key, raw=dict(d) if isinstance(d, Mapping) else {}, **extra)

    def _complete_batch(self) -> None:
        """DeepSpeed's rule: train_batch_size = micro * gas * dp; any two given -> the third inferred."""
        batch, micro, gas = self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps
        dp = self.dp_world_size  # the rule counts data-parallel ranks only
        if batch is not None and micro is not None and gas is None:
            gas, rem = divmod(batch, micro * dp)
            if rem or gas < 1:
                raise ConfigError(
                    f"train_batch_size={batch} is not divisible by train_micro_batch_size_per_gpu={micro}"
                    f" * world size={dp}"
                )
        elif batch is not None and gas is not None and micro is None:
            micro, rem = divmod(batch, gas * dp)
            if rem or micro < 1:
                raise ConfigError(
                    f"train_batch_size={batch} is not divisible by gradient_accumulation_steps={gas} * world size={dp}"
                )
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
        if batch != micro * gas * dp:
            raise ConfigError(
                "train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
                f"data-parallel world size, got train_batch_size={batch}, train_micro_batch_size_per_gpu={micro}, "
                f"gradient_accumulation_steps={gas}, world size={dp}"
            )
        self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps = batch, micro, gas


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
