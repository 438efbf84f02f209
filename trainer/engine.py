"""The training engine: DeepSpeed's engine API over ZeRO stages 0-3 (``initialize`` is trainer.api).

    engine, optimizer, dataloader, lr_scheduler = trainer.initialize(model=model, config="ds_config.json")
    for x, y in dataloader:
        loss = loss_fn(engine(x), y)
        engine.backward(loss)
        engine.step()

Runs under torchrun (the process group is created from the environment, gloo on
CPU / nccl on CUDA) or as a plain process, which is a world of one on the same
code path. Every collective goes through ``trainer.comm``; telemetry (timers,
memory, loss-scale records, monitor events) is emitted per optimizer step and
never stops training when no collector is reachable.

MoE (trainer.moe) trains under ZeRO 0-3 with any ep_size: expert parameters
(``param.allreduce = False``) are bucketed apart and reduced / partitioned over
their expert-data-parallel group, dense ones over the data-parallel group
(trainer.moe.sync_group); both are divided by the full data-parallel size. Build
the MoE model after ``trainer.engine.init_distributed()`` when ep_size > 1 (its
expert groups are process groups). The load-balancing loss is the model's
business, as in DeepSpeed: ``MoE.forward`` returns ``aux_loss`` and the training
loss is ``task_loss + coeff * sum(aux_loss)`` written by the user (the GPT
example's ``--moe-loss-coeff``); the engine backpropagates whatever loss it is given.
"""

from __future__ import annotations

import os
import socket
import time
import warnings

import torch
from torch import nn

from collector.rank import session
from collector.rank import signals as _signals  # noqa: F401  (GC pauses and host samples follow the session)
from collector.rank.clock import CLOCK
from trainer import comm, reporting
from trainer.batches import BatchCounter
from trainer.config import ConfigError, EngineConfig, OptimizerConfig, load_config
from trainer.loss_scaler import build_loss_scaler
from trainer.lr_schedules import build_scheduler
from trainer.memory import MemoryTracker
from trainer.monitor import MonitorMaster
from trainer.offload import CPUStorage, DeviceStorage, NVMeParamSwap, NVMeStorage
from trainer.profiling import StepProfiler
from trainer.timers import TimedLoader, Timers
from trainer.zero import ZeroOptimizer, build_zero_optimizer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(dist_backend: str | None = None, timeout=None, init_method: str | None = None) -> torch.device:
    """Join the torchrun process group (or make a world of one) and pick this rank's device.
    ``dist_backend`` None: nccl with CUDA, else gloo."""
    cuda = torch.cuda.is_available()
    if not comm.is_initialized():
        backend = dist_backend or ("nccl" if cuda else "gloo")
        extra = {"timeout": timeout} if timeout is not None else {}
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            comm.init_process_group(backend=backend, init_method=init_method, **extra)
        else:
            comm.init_process_group(
                backend=backend,
                init_method=init_method or f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
                **extra,
            )
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


_CPU_ADAM_KEYS = {"lr", "betas", "eps", "weight_decay", "amsgrad"}


def optimizer_factory(cfg: OptimizerConfig, *, host: bool = False):
    """``groups -> torch optimizer`` for the config's optimizer block, with DeepSpeed's meaning:
    ``Adam`` is AdamW unless params.adam_w_mode is false, weight_decay defaults to 0.

    ``host``: the masters live in host memory (offload_optimizer cpu/nvme); Adam/AdamW then run
    as native.CPUAdam (same numerics; it falls back to torch ops itself without a compiler),
    unless params.torch_adam is true or params hold keys CPUAdam does not take. SGD stays torch's."""
    params = dict(cfg.params)
    native_adam = False
    if cfg.type in ("Adam", "AdamW"):
        adam_w_mode = params.pop("adam_w_mode", True) if cfg.type == "Adam" else True
        torch_adam = params.pop("torch_adam", False)
        if params.pop("bias_correction", True) is not True:
            raise ConfigError("optimizer.params.bias_correction: only true is supported")
        params.setdefault("weight_decay", 0.0)
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        native_adam = host and not torch_adam and set(params) <= _CPU_ADAM_KEYS and not params.get("amsgrad", False)
    else:
        cls = torch.optim.SGD

    def make(groups: list[dict]) -> torch.optim.Optimizer:
        if native_adam:
            from native.cpu_adam import CPUAdam

            try:
                opt = CPUAdam(groups, adamw_mode=adam_w_mode, **params)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"optimizer.params: CPUAdam rejects {params}: {e}") from None
            opt.rankscope_fused_copy = True  # OffloadedOptimizer may pass step(copy_to=...)
            return opt
        try:
            return cls(groups, **params)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"optimizer.params: {cls.__name__} rejects {params}: {e}") from None

    return make


def adopt_client_optimizer(client: torch.optim.Optimizer):
    """``groups -> optimizer`` that re-points the user's own optimizer object at the master shards
    (as DeepSpeed's ZeRO wrappers do), so its class, options and any scheduler already built on it
    keep working: each param group keeps its options, gets the masters of its parameters, and
    state from before initialize is dropped."""

    def adopt(groups: list[dict]) -> torch.optim.Optimizer:
        for mine, group in zip(client.param_groups, groups, strict=True):
            mine["params"] = group["params"]
        client.state.clear()
        return client

    return adopt


def _named_groups(model: nn.Module, model_parameters) -> tuple[list[list], list[dict]]:
    """Trainable (name, param) lists and their options, one per param group."""
    names = {p: n for n, p in model.named_parameters()}
    if model_parameters is None:
        groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    else:
        model_parameters = list(model_parameters)
        if model_parameters and isinstance(model_parameters[0], dict):
            groups = [dict(g, params=list(g["params"])) for g in model_parameters]
        else:
            groups = [{"params": model_parameters}]
    named, options = [], []
    for g in groups:
        for p in g["params"]:
            if p not in names:
                raise ValueError("model_parameters holds a tensor that is not a parameter of the model")
        named.append([(names[p], p) for p in g["params"] if p.requires_grad])
        options.append({k: v for k, v in g.items() if k != "params"})
    return named, options


def _start_telemetry(cfg: EngineConfig) -> None:
    if not cfg.telemetry.enabled:
        return
    try:
        # The config's values come first here, the RANKSCOPE_* environment fills what it leaves out.
        t = cfg.telemetry
        session.start(
            run=t.run, endpoint=t.endpoint, token=t.token, tls_ca=t.tls_ca, config=cfg.raw, source="engine", telemetry=t
        )
    except Exception as e:  # telemetry must never stop training
        warnings.warn(f"telemetry disabled: {e}", stacklevel=3)


def _cast_floats(obj, dtype: torch.dtype):
    """fp16.auto_cast: floating-point tensors in (nested) inputs cast to ``dtype``."""
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_floats(o, dtype) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj


def _env_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


# Client optimizers DeepSpeed's ZeRO runs without zero_allow_untested_optimizer (its ZERO_SUPPORTED_OPTIMIZERS
# that exist here); anything else under ZeRO 1-3 needs that key, as there.
_ZERO_TESTED_OPTIMIZERS = ("Adam", "AdamW", "CPUAdam")


def _client_optimizer(optimizer, module: nn.Module, model_parameters, cfg: EngineConfig):
    """The user's torch optimizer (built now if ``optimizer`` is a callable taking the parameters), or None."""
    if optimizer is None:
        return None
    if not isinstance(optimizer, torch.optim.Optimizer):
        params = list(model_parameters) if model_parameters is not None else list(module.parameters())
        optimizer = optimizer(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"initialize(optimizer=...): the callable returned {type(optimizer).__name__}, "
                "not a torch.optim.Optimizer"
            )
    # DeepSpeed drops param groups without parameters before wrapping the optimizer.
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
    name = type(optimizer).__name__
    if (
        cfg.zero_optimization.stage > 0
        and name not in _ZERO_TESTED_OPTIMIZERS
        and not cfg.zero_allow_untested_optimizer
    ):
        raise ConfigError(
            f"zero_allow_untested_optimizer: ZeRO stage {cfg.zero_optimization.stage} with the client optimizer {name} "
            'needs "zero_allow_untested_optimizer": true in the config (as in DeepSpeed)'
        )
    return optimizer


def _scheduler(lr_scheduler, optimizer: torch.optim.Optimizer, cfg: EngineConfig):
    """The client's scheduler (an object, or a callable taking the optimizer), else the config's, else None."""
    if lr_scheduler is None:
        return build_scheduler(optimizer, cfg.scheduler)
    if callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        lr_scheduler = lr_scheduler(optimizer)
    if not hasattr(lr_scheduler, "step"):
        raise TypeError(f"initialize(lr_scheduler=...): {type(lr_scheduler).__name__} has no step()")
    bound = getattr(lr_scheduler, "optimizer", optimizer)
    if bound is not optimizer:
        raise ValueError(
            "initialize(lr_scheduler=...): the scheduler was built on another optimizer than the engine's; "
            "build it on the optimizer passed as optimizer=, or pass a callable taking the optimizer"
        )
    return lr_scheduler


# ZeRO-3 gathers a module's own parameters around its forward only; this is the usual
# way to break that, and its fix. Added to errors from the forward, not replacing them.
ZERO3_OWNERSHIP_HINT = (
    "ZeRO-3: parameters are empty outside the forward of the module that owns them. If a module's "
    "forward reads a child's parameter directly (a weight passed to F.linear by its parent), make that "
    "module one unit before trainer.initialize: trainer.zero.set_z3_leaf_modules(model, [ThatModule])."
)


class Engine(nn.Module):
    """Wraps the model; forward / backward / step with ZeRO, precision and telemetry."""

    def __init__(
        self,
        model: nn.Module,
        config,
        model_parameters=None,
        training_data=None,
        collate_fn=None,
        *,
        optimizer=None,
        lr_scheduler=None,
        local_rank: int | None = None,
    ):
        """``optimizer``: a torch optimizer over the model's parameters, or a callable taking the
        parameters and returning one (it replaces the config's optimizer block, as in DeepSpeed);
        ``lr_scheduler``: a scheduler over that optimizer, or a callable taking the optimizer (it
        replaces the config's scheduler block). trainer.initialize checks both before this runs."""
        super().__init__()
        raw = load_config(config)
        self.device = init_distributed()
        self.rank, self.world_size = comm.get_rank(), comm.get_world_size()
        self.global_rank = self.rank
        self.local_rank = local_rank if local_rank is not None and local_rank >= 0 else _env_local_rank()
        self.config = cfg = EngineConfig.from_dict(
            raw, world_size=self._batch_world_size(model), client_optimizer=optimizer is not None
        )
        _start_telemetry(cfg)
        comm.configure(cfg.comms_logger)
        self.dp_group, self.tp_rank = self._data_parallel_group(model, cfg)
        self.dp_world_size = cfg.dp_world_size
        self.dp_rank = comm.get_rank(group=self.dp_group) if self.dp_group is not None else self.rank

        self.module = model.to(device=self.device, dtype=cfg.precision)
        self._broadcast_model()
        client = _client_optimizer(optimizer, self.module, model_parameters, cfg)
        named, options = _named_groups(self.module, client.param_groups if client is not None else model_parameters)
        zero = cfg.zero_optimization
        self.loss_scaler = None
        if cfg.fp16.enabled:
            self.loss_scaler = build_loss_scaler(cfg.fp16)
        self.optimizer: ZeroOptimizer = build_zero_optimizer(
            self.module,
            named,
            zero=zero,
            rank=self.dp_rank,
            world_size=self.dp_world_size,
            device=self.device,
            group=self.dp_group,
            loss_scaler=self.loss_scaler,
            gradient_clipping=cfg.gradient_clipping,
            tp_rank=self.tp_rank,
        )
        offload = zero.offload_optimizer
        if offload.nvme:
            storage = NVMeStorage(
                offload.nvme_path, rank=self.rank, aio=cfg.aio.handle_kwargs(), pin_memory=offload.pin_memory
            )
        elif offload.enabled:
            storage = CPUStorage(pin_memory=offload.pin_memory)
        else:
            storage = DeviceStorage(self.device)
        factory = (
            adopt_client_optimizer(client)
            if client is not None
            else optimizer_factory(cfg.optimizer, host=offload.enabled)
        )
        self.optimizer.attach_master(options, factory, storage)
        if zero.offload_param.nvme:
            self.optimizer.attach_param_swap(
                NVMeParamSwap(zero.offload_param.nvme_path, rank=self.rank, aio=cfg.aio.handle_kwargs())
            )
        self.lr_scheduler = _scheduler(lr_scheduler, self.optimizer.master.optimizer, cfg)
        self.timers = Timers(cfg.wall_clock_breakdown or cfg.telemetry.enabled)  # the data loader times its waits
        self.batches = BatchCounter()
        self.data_sampler = None
        self.training_dataloader = self._dataloader(training_data, collate_fn) if training_data is not None else None

        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._step_applied = False
        self._global_grad_norm = None
        self.memory = MemoryTracker(self.module, self.optimizer, self.device)
        # The monitor blocks are already built (and their unknown keys reported) here.
        self.monitor = MonitorMaster(dict(cfg.raw, csv_monitor=cfg.csv_monitor, tensorboard=cfg.tensorboard))
        self.profiler = StepProfiler(cfg.flops_profiler, self.module, tp_size=cfg.tensor_parallel.tp_size)
        self._loss_sum = None
        self._last_step_end = time.perf_counter()
        self.last_records: dict[str, list[dict]] = {}  # this rank's records of the last step, by table
        session.set_step(self.global_steps)

    # ---------------------------------------------------------------- set-up

    def _batch_world_size(self, model: nn.Module) -> int:
        """The ranks the config's batch rule counts (a pipeline's stages share one data-parallel rank)."""
        return self.world_size

    def _data_parallel_group(self, model: nn.Module, cfg: EngineConfig) -> tuple[object, int]:
        """(the group ZeRO partitions and reduces over, None for the world; this rank's tensor-parallel
        rank). With tensor parallelism that is one rank per tensor-parallel group."""
        if cfg.tensor_parallel.tp_size == 1:
            return None, 0
        from trainer.tensor_parallel.groups import parallel_groups

        groups = parallel_groups(cfg.tensor_parallel.tp_size)
        return groups.dp_group, groups.tp_rank

    def _broadcast_model(self) -> None:
        """Start every data-parallel replica from the first replica's weights and buffers: dense
        parameters and buffers over the data-parallel group, MoE experts over their
        expert-data-parallel group only (trainer.moe.broadcast_parameters)."""
        if self.dp_world_size == 1:
            return
        from trainer.moe import broadcast_parameters

        broadcast_parameters(self.module, self.dp_group)
        src = comm.get_global_rank(self.dp_group, 0) if self.dp_group is not None else 0
        for t in self.module.buffers():
            comm.broadcast(t.data, src=src, group=self.dp_group, log_name="engine.broadcast_model")

    def _dataloader(self, dataset, collate_fn):
        """DeepSpeed's training dataloader; its sampler's position is part of a checkpoint."""
        from torch.utils.data import DataLoader

        from trainer.data_sampler import ResumableDistributedSampler

        self.data_sampler = ResumableDistributedSampler(dataset, num_replicas=self.dp_world_size, rank=self.dp_rank)
        loader = DataLoader(
            dataset,
            batch_size=self.train_micro_batch_size_per_gpu(),
            sampler=self.data_sampler,
            collate_fn=collate_fn,
            drop_last=True,
        )
        # The wait for each batch is the ``data`` timer: a rank whose loader is slow shows it.
        return TimedLoader(loader, self.timers)

    # ---------------------------------------------------------------- DeepSpeed accessors

    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self.config.gradient_accumulation_steps

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def zero_optimization_stage(self) -> int:
        return self.config.zero_optimization.stage

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self) -> list:
        """Per param group: Adam's ``betas``, or SGD's ``momentum`` (0.0 where a group has neither)."""
        key = "momentum" if type(self.optimizer.master.optimizer).__name__ in ("SGD", "RMSprop") else "betas"
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """The gradient norm of the last optimizer step over all ranks; computed when the step
        needs it (gradient_clipping > 0), None otherwise."""
        return self._global_grad_norm

    def was_step_applied(self) -> bool:
        """Whether the latest ``step()`` updated the parameters (False between accumulation
        boundaries' micro-steps and on a skipped fp16 overflow step)."""
        return self._step_applied

    @property
    def loss_scale(self) -> float:
        return float(self.loss_scaler.loss_scale) if self.loss_scaler is not None else 1.0

    # ---------------------------------------------------------------- training

    def forward(self, *args, **kwargs):
        if self.micro_steps % self.gradient_accumulation_steps() == 0:
            self.profiler.begin(self.global_steps)
        if hasattr(self.optimizer, "begin_forward") and self.module.training:
            self.optimizer.begin_forward()
        if self.config.fp16.auto_cast:
            args, kwargs = _cast_floats((args, kwargs), torch.float16)
        if self.module.training:
            self.batches.count(args, kwargs)
        self.timers.start("fwd")
        try:
            out = self.module(*args, **kwargs)
        except RuntimeError as exc:
            if self.config.zero_optimization.stage == 3:
                exc.add_note(ZERO3_OWNERSHIP_HINT)
            raise
        self.timers.stop("fwd")
        return out

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """Scale by 1/gradient_accumulation_steps (and the fp16 loss scale), backprop, reduce."""
        detached = loss.detach().float()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        scaled = loss.float() / self.gradient_accumulation_steps()
        if self.loss_scaler is not None:
            scaled = scaled * self.loss_scale
        self.timers.start("bwd")
        self.timers.start("bwd_inner")
        self.optimizer.begin_backward(self.is_gradient_accumulation_boundary())
        scaled.backward(retain_graph=retain_graph)
        self.timers.stop("bwd_inner")
        self.timers.start("bwd_allreduce")
        self.optimizer.after_backward()
        self.timers.stop("bwd_allreduce")
        self.timers.stop("bwd")
        return loss

    def step(self, lr_kwargs: dict | None = None) -> None:
        """Optimizer step at the accumulation boundary; otherwise only counts the micro-step.
        The lr scheduler steps once per applied optimizer step (``lr_kwargs`` go to its step())."""
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            self.timers.start("step")
            outcome = self.optimizer.step()
            self._global_grad_norm = outcome.grad_norm
            self._step_applied = not outcome.skipped
            if outcome.skipped:
                self.skipped_steps += 1
            elif self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
            self.timers.stop("step")
            self._report(outcome)
            self.global_steps += 1
            self.global_samples += self.train_batch_size()
            if self.data_sampler is not None:
                self.data_sampler.advance(self.train_batch_size())
            session.set_step(self.global_steps)
        self.micro_steps += 1

    def _report(self, outcome) -> None:
        """This step's records: timers, memory, batches, loss scale, monitor events; a line every steps_per_print."""
        step, cfg = self.global_steps, self.config
        now = time.perf_counter()
        samples_per_sec = self.train_batch_size() / max(now - self._last_step_end, 1e-9)
        self._last_step_end = now
        records = {
            "timers": self.timers.records(step),
            "memory": self.memory.sample(step),
            "batches": self.batches.records(step),
        }
        if self.loss_scaler is not None:
            records["loss_scale"] = [
                {
                    "step": step,
                    "scale_before": outcome.scale_before,
                    "scale": outcome.scale_after,
                    "overflow": outcome.overflow,
                    "hysteresis_left": outcome.hysteresis_left,
                    "bad_params": ",".join(outcome.bad_params),
                    "first_rank": outcome.first_rank,
                    "time_ns": CLOCK.now_ns(),
                }
            ]
        for table, rows in records.items():
            session.emit_rows(table, rows)
        self.last_records = records
        samples = self.global_samples + self.train_batch_size()
        loss = self._loss_sum / self.gradient_accumulation_steps()
        self._loss_sum = None
        events = [
            ("Train/Samples/train_loss", loss, samples),
            ("Train/Samples/lr", self.get_lr()[0], samples),
            ("Train/Samples/samples_per_sec", samples_per_sec, samples),
        ]
        if self.loss_scaler is not None:
            events.append(("Train/Samples/loss_scale", outcome.scale_after, samples))
        self.monitor.write_events(events)
        if cfg.flops_profiler.enabled:
            ns = {r["name"]: r["dur_ns"] for r in records["timers"]}
            self.profiler.end(
                step,
                fwd_ns=ns.get("fwd"),
                bwd_ns=ns.get("bwd"),
                step_ns=ns.get("step"),
                samples=self.train_batch_size(),
            )
        if reporting.prints_step(self.rank, step, cfg.steps_per_print):
            line = (
                f"[engine] step={step + 1} skipped={self.skipped_steps} lr={self.get_lr()} "
                f"samples/s={samples_per_sec:.1f}"
            )
            if self.loss_scaler is not None:
                line += f" loss_scale={outcome.scale_after:g}"
            print(line, flush=True)
            if cfg.wall_clock_breakdown:
                print(Timers.format(records["timers"]), flush=True)

    # ---------------------------------------------------------------- checkpoints

    def save_checkpoint(self, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True) -> str:
        """DeepSpeed's call (collective): a checkpoint any world size, ZeRO stage and ep_size can
        resume from (trainer.checkpoint), under ``save_dir/tag`` (default ``global_step<N>``);
        ``latest`` names it unless ``save_latest`` is False. Returns the tag folder."""
        from trainer.checkpoint import save_checkpoint

        return save_checkpoint(self, save_dir, tag=tag, client_state=client_state, save_latest=save_latest)

    def load_checkpoint(
        self,
        load_dir,
        tag=None,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
    ):
        """DeepSpeed's call (collective): resume from ``load_dir/tag`` (default: the tag in
        ``load_dir/latest``). Returns ``(tag folder, client_state)``, or ``(None, None)`` when
        there is no checkpoint; raises trainer.checkpoint.CheckpointError naming what does not fit."""
        from trainer.checkpoint import load_checkpoint

        return load_checkpoint(
            self,
            load_dir,
            tag=tag,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only,
        )

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters=False):
        """DeepSpeed's call (collective): the whole model's state_dict in its training precision
        (partitioned ZeRO-3 parameters gathered), written by rank 0 to ``save_dir/save_filename``,
        loadable by the plain model. Returns True."""
        full = getattr(self.optimizer, "full_state_dict", None)
        state = full(self.module) if full is not None else self.module.state_dict()
        if exclude_frozen_parameters:
            frozen = {n for n, p in self.module.named_parameters() if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        error = None
        if self.rank == 0:
            try:
                os.makedirs(save_dir, exist_ok=True)
                torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(save_dir, save_filename))
            except OSError as e:
                error = f"{e.filename}: {e.strerror or e}" if e.filename else str(e)
        from trainer.checkpoint.save import agree

        agree(error, f"saving the 16-bit model to {os.path.join(os.fspath(save_dir), save_filename)}")
        return True

    def after_checkpoint_load(self) -> None:
        session.set_step(self.global_steps)
        self._loss_sum = None

    def close(self) -> None:
        """Flush monitor events and MoE rows, end the telemetry session, and remove nvme swap files."""
        self.optimizer.close()
        self.monitor.flush()
        try:
            from trainer.moe import telemetry as moe_telemetry

            moe_telemetry.flush()
            session.stop()
        except Exception as e:  # telemetry must never fail the run
            warnings.warn(f"telemetry stop failed: {e}", stacklevel=2)
