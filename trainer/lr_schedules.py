"""Learning-rate schedules selected by the config's ``scheduler`` block, with
DeepSpeed's types, parameter names, defaults and formulas
(deepspeed/runtime/lr_schedules.py):

    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}}

Every schedule is indexed by ``last_batch_iteration`` (-1 before the first
``step()``); ``step()`` is called once per optimizer step and writes the new lr
(and, for OneCycle, momentum) into every param group. Checkpoints hold only
``{"last_batch_iteration": i}``, as DeepSpeed's do, so they load either way.

Deliberate differences from DeepSpeed, all on paths where DeepSpeed would
silently do something surprising:
- bad values are rejected with an error naming ``scheduler.params.<key>``
  (DeepSpeed falls back to ``log`` for an unknown ``warmup_type``);
- OneCycle momentum keeps each group's own Adam beta2 (DeepSpeed overwrites it
  with 0.99) and also cycles SGD-style ``momentum`` (DeepSpeed disables cycling);
- ``load_state_dict`` re-applies the restored step's lr so ``get_last_lr()`` is
  right straight after a resume.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from torch.optim import Optimizer

from collector.rank.config import ConfigBlock, setting

__all__ = [
    "SCHEDULER_TYPES",
    "LRRangeTest",
    "LRRangeTestConfig",
    "OneCycle",
    "OneCycleConfig",
    "SchedulerConfig",
    "WarmupCosineLR",
    "WarmupCosineLRConfig",
    "WarmupDecayLR",
    "WarmupDecayLRConfig",
    "WarmupLR",
    "WarmupLRConfig",
    "build_scheduler",
]

WARMUP_TYPES = ("log", "linear")


def _per_group(cfg: ScheduleParams, name: str, optimizer: Optimizer) -> list[float]:
    """``cfg.<name>``, one lr or one per param group, as one per param group."""
    value, n = getattr(cfg, name), len(optimizer.param_groups)
    if isinstance(value, list):
        if len(value) != n:
            cfg.fail(name, f"has {len(value)} values but the optimizer has {n} param groups", value)
        return list(value)
    return [value] * n


# ----------------------------------------------------------------------------- configs


@dataclass(kw_only=True)
class ScheduleParams(ConfigBlock):
    """The ``scheduler.params`` block; one subclass per schedule type."""

    SECTION: ClassVar[str] = "scheduler.params"


@dataclass(kw_only=True)
class LRRangeTestConfig(ScheduleParams):
    lr_range_test_min_lr: float | list[float] = setting(1e-3, ge=0)  # one, or one per param group
    lr_range_test_step_size: int = setting(2000, ge=1)
    lr_range_test_step_rate: float = setting(1.0, ge=0)
    lr_range_test_staircase: bool = False


@dataclass(kw_only=True)
class OneCycleConfig(ScheduleParams):
    cycle_min_lr: float = setting(ge=0)  # required, as in DeepSpeed
    cycle_max_lr: float = setting(ge=0)  # required
    decay_lr_rate: float = setting(0.0, ge=0)
    cycle_first_step_size: int = setting(2000, ge=1)
    cycle_second_step_size: int | None = setting(None, ge=1)  # None: same as the first
    cycle_first_stair_count: int = setting(0, ge=0)
    cycle_second_stair_count: int | None = setting(None, ge=0)
    decay_step_size: int = setting(0, ge=0)  # 0: no post-cycle decay
    cycle_momentum: bool = True
    cycle_min_mom: float = setting(0.8, ge=0)
    cycle_max_mom: float = setting(0.9, ge=0)
    decay_mom_rate: float = 0.0

    def validate(self) -> None:
        if self.cycle_first_stair_count or self.cycle_second_stair_count:
            # DeepSpeed stores the stair counts but its formula never reads them;
            # we keep its lr curve so a ported config trains identically.
            warnings.warn(
                f"{self.key('cycle_first_stair_count')}/cycle_second_stair_count are accepted for "
                "compatibility but, as in DeepSpeed, do not change the schedule",
                stacklevel=5,
            )


@dataclass(kw_only=True)
class WarmupLRConfig(ScheduleParams):
    warmup_min_lr: float | list[float] = setting(0.0, ge=0)  # one, or one per param group
    warmup_max_lr: float | list[float] = setting(0.001, ge=0)
    warmup_num_steps: int = setting(1000, ge=0)
    warmup_type: str = setting("log", choices=WARMUP_TYPES)


@dataclass(kw_only=True)
class WarmupDecayLRConfig(WarmupLRConfig):
    total_num_steps: int = setting(ge=1)  # required, as in DeepSpeed

    def validate(self) -> None:
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(
                f"{self.key('total_num_steps')} ({self.total_num_steps}) is less than "
                f"warmup_num_steps ({self.warmup_num_steps})",
                stacklevel=5,
            )


@dataclass(kw_only=True)
class WarmupCosineLRConfig(ScheduleParams):
    total_num_steps: int = setting(ge=1)  # required, as in DeepSpeed
    warmup_min_ratio: float = setting(0.0, ge=0)
    warmup_num_steps: int = setting(1000, ge=0)
    cos_min_ratio: float = setting(0.0001, ge=0)
    warmup_type: str = setting("log", choices=WARMUP_TYPES)

    def validate(self) -> None:
        # The cosine phase divides by (total - warmup); DeepSpeed crashes with ZeroDivisionError there.
        warmup = max(2, self.warmup_num_steps)
        if self.total_num_steps <= warmup:
            self.fail("total_num_steps", f"must be greater than warmup_num_steps ({warmup})", self.total_num_steps)


# ----------------------------------------------------------------------------- schedules


class _Schedule:
    """Shared step/state plumbing; subclasses define ``get_lr()`` for ``last_batch_iteration``."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = _torch_optimizer(optimizer)
        self.last_batch_iteration = -1
        self._last_lr = self._apply()

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The lr per param group written by the latest ``step()`` (or at construction)."""
        return self._last_lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (
            self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        )
        self._last_lr = self._apply()

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict) -> None:
        if "last_batch_iteration" not in sd:
            raise KeyError("scheduler state_dict has no 'last_batch_iteration'")
        self.last_batch_iteration = int(sd["last_batch_iteration"])
        self._last_lr = self._apply()

    def _apply(self) -> list[float]:
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        return [group["lr"] for group in self.optimizer.param_groups]


def _torch_optimizer(optimizer) -> Optimizer:
    # Engines wrap the torch optimizer (fp16 / ZeRO wrappers expose it as .optimizer).
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise TypeError(f"scheduler needs a torch.optim.Optimizer, got {type(optimizer).__name__}")


def _warmup_gamma(iteration: int, warmup_num_steps: int, warmup_type: str) -> float:
    """Fraction of the warmup done after ``iteration``: log(i+1)/log(n) or i/n."""
    if warmup_type == "log":
        return math.log(iteration + 1) / math.log(warmup_num_steps)
    return iteration / warmup_num_steps


class LRRangeTest(_Schedule):
    """lr = min_lr * (1 + step_rate * interval), interval = (i+1)/step_size,
    floored when ``lr_range_test_staircase``."""

    def __init__(self, optimizer: Optimizer, cfg: LRRangeTestConfig):
        self.cfg = cfg
        self.min_lrs = _per_group(cfg, "lr_range_test_min_lr", _torch_optimizer(optimizer))
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        interval = (self.last_batch_iteration + 1) / self.cfg.lr_range_test_step_size
        if self.cfg.lr_range_test_staircase:
            interval = math.floor(interval)
        increase = 1 + self.cfg.lr_range_test_step_rate * interval
        return [lr * increase for lr in self.min_lrs]


class WarmupLR(_Schedule):
    """min_lr + (max_lr - min_lr) * gamma, gamma the warmup fraction, then 1."""

    def __init__(self, optimizer: Optimizer, cfg: WarmupLRConfig):
        self.cfg = cfg
        torch_opt = _torch_optimizer(optimizer)
        self.min_lrs = _per_group(cfg, "warmup_min_lr", torch_opt)
        self.max_lrs = _per_group(cfg, "warmup_max_lr", torch_opt)
        # log(1) would divide by zero; DeepSpeed clamps to 2 the same way.
        self.warmup_num_steps = max(2, cfg.warmup_num_steps)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + (hi - lo) * gamma for lo, hi in zip(self.min_lrs, self.max_lrs)]

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_gamma(self.last_batch_iteration, self.warmup_num_steps, self.cfg.warmup_type)
        return 1.0


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay to 0 at ``total_num_steps``:
    gamma = max(0, (total - i) / max(1, total - warmup))."""

    cfg: WarmupDecayLRConfig

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._gamma()
        total = self.cfg.total_num_steps
        return max(0.0, (total - self.last_batch_iteration) / max(1.0, total - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    """Scales each group's configured lr by a ratio: warmup from ``warmup_min_ratio``
    to 1, then cosine down to ``cos_min_ratio`` at ``total_num_steps``."""

    def __init__(self, optimizer: Optimizer, cfg: WarmupCosineLRConfig):
        self.cfg = cfg
        self.warmup_num_steps = max(2, cfg.warmup_num_steps)
        self.org_lrs = [group["lr"] for group in _torch_optimizer(optimizer).param_groups]
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [lr * self._ratio() for lr in self.org_lrs]

    def _ratio(self) -> float:
        i, cfg = self.last_batch_iteration, self.cfg
        if i < 0:
            return 0.0  # as DeepSpeed: lr 0 until the first step()
        if i < self.warmup_num_steps:
            gamma = _warmup_gamma(i, self.warmup_num_steps, cfg.warmup_type)
            return cfg.warmup_min_ratio + gamma * (1.0 - cfg.warmup_min_ratio)
        progress = (i - self.warmup_num_steps + 1) / (cfg.total_num_steps - self.warmup_num_steps)
        cosine = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, cfg.cos_min_ratio + (1.0 - cfg.cos_min_ratio) * cosine)


class OneCycle(_Schedule):
    """1Cycle: lr rises linearly min→max over ``cycle_first_step_size`` steps, falls
    back over ``cycle_second_step_size``, then decays as min_lr / (1 + decay_lr_rate * d /
    decay_step_size) with d the steps since the cycle ended. Momentum (Adam beta1 or SGD
    momentum) moves inversely between ``cycle_max_mom`` and ``cycle_min_mom`` and after
    the cycle becomes max_mom * (1 + decay_mom_rate * d / decay_step_size)."""

    def __init__(self, optimizer: Optimizer, cfg: OneCycleConfig):
        self.cfg = cfg
        torch_opt = _torch_optimizer(optimizer)
        first = float(cfg.cycle_first_step_size)
        second = float(cfg.cycle_second_step_size) if cfg.cycle_second_step_size is not None else first
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.decays = cfg.decay_step_size > 0
        self.momentum_key = self._momentum_key(torch_opt) if cfg.cycle_momentum else None
        super().__init__(optimizer)

    def _momentum_key(self, optimizer: Optimizer) -> str | None:
        if "betas" in optimizer.defaults:
            return "betas"
        if "momentum" in optimizer.defaults:
            return "momentum"
        warnings.warn(
            f"{self.cfg.key('cycle_momentum')} is ignored: {type(optimizer).__name__} has neither "
            "'betas' nor 'momentum'",
            stacklevel=4,
        )
        return None

    def _scale(self) -> float:
        """Position in the cycle as a 0→1→0 triangle."""
        x = (self.last_batch_iteration + 1) / self.total_size
        x = x - math.floor(x)  # fraction of the current cycle
        return x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)

    def _decay_interval(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.cfg.decay_step_size

    def _in_cycle(self) -> bool:
        return self.last_batch_iteration < self.total_size

    def get_lr(self) -> list[float]:
        cfg = self.cfg
        if self.last_batch_iteration < 0:
            lr = cfg.cycle_min_lr
        elif self._in_cycle():
            lr = cfg.cycle_min_lr + (cfg.cycle_max_lr - cfg.cycle_min_lr) * self._scale()
        elif self.decays and cfg.decay_lr_rate != 0:
            lr = cfg.cycle_min_lr / (1 + cfg.decay_lr_rate * self._decay_interval())
        else:
            lr = cfg.cycle_min_lr
        return [lr] * len(self.optimizer.param_groups)

    def get_mom(self) -> float | None:
        cfg = self.cfg
        if self.momentum_key is None:
            return None
        if self.last_batch_iteration < 0:
            return cfg.cycle_min_mom
        if self._in_cycle():
            return cfg.cycle_max_mom - (cfg.cycle_max_mom - cfg.cycle_min_mom) * self._scale()
        if self.decays and cfg.decay_mom_rate != 0:
            return cfg.cycle_max_mom * (1 + cfg.decay_mom_rate * self._decay_interval())
        return cfg.cycle_max_mom

    def _apply(self) -> list[float]:
        mom = self.get_mom()
        if mom is not None:
            for group in self.optimizer.param_groups:
                if self.momentum_key == "betas":
                    group["betas"] = (mom, group["betas"][1])
                else:
                    group["momentum"] = mom
        return super()._apply()


# ----------------------------------------------------------------------------- factory

SCHEDULER_TYPES: dict[str, tuple[type[_Schedule], type[ScheduleParams]]] = {
    "LRRangeTest": (LRRangeTest, LRRangeTestConfig),
    "OneCycle": (OneCycle, OneCycleConfig),
    "WarmupLR": (WarmupLR, WarmupLRConfig),
    "WarmupDecayLR": (WarmupDecayLR, WarmupDecayLRConfig),
    "WarmupCosineLR": (WarmupCosineLR, WarmupCosineLRConfig),
}


@dataclass(kw_only=True)
class SchedulerConfig(ConfigBlock):
    """The ``scheduler`` block: ``type`` picks the schedule, whose own block checks ``params``."""

    SECTION: ClassVar[str] = "scheduler"
    type: str = setting(choices=tuple(SCHEDULER_TYPES))  # required
    params: ScheduleParams | dict | None = field(default_factory=dict)

    def validate(self) -> None:
        params_type = SCHEDULER_TYPES[self.type][1]
        if not isinstance(self.params, params_type):
            self.params = params_type.from_dict(
                self.params if isinstance(self.params, Mapping) else None, key=self.key("params")
            )


def build_scheduler(optimizer: Optimizer, scheduler_cfg: SchedulerConfig | Mapping | None):
    """The schedule the config's ``scheduler`` block asks for, or None when there is none."""
    if scheduler_cfg is None:
        return None
    cfg = SchedulerConfig.from_dict(scheduler_cfg)
    schedule_cls, _ = SCHEDULER_TYPES[cfg.type]
    return schedule_cls(optimizer, cfg.params)
