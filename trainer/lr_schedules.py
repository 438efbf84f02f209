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
from dataclasses import MISSING, dataclass, fields
from typing import Any, Sequence

from torch.optim import Optimizer

__all__ = [
    "build_scheduler", "SCHEDULER_TYPES",
    "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
    "LRRangeTestConfig", "OneCycleConfig", "WarmupLRConfig", "WarmupDecayLRConfig", "WarmupCosineLRConfig",
]

_PREFIX = "scheduler.params."
WARMUP_TYPES = ("log", "linear")


# ----------------------------------------------------------------------------- validation helpers

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_number(key: str, v: Any, *, min_value: float | None = None) -> None:
    if not _is_number(v):
        raise ValueError(f"{_PREFIX}{key} must be a finite number, got {v!r}")
    if min_value is not None and v < min_value:
        raise ValueError(f"{_PREFIX}{key} must be >= {min_value}, got {v!r}")


def _check_number_or_list(key: str, v: Any) -> None:
    """A non-negative lr, or one per param group (checked against the optimizer later)."""
    for item in (v if isinstance(v, (list, tuple)) else [v]):
        _check_number(key, item, min_value=0.0)


def _check_int(key: str, v: Any, *, min_value: int) -> None:
    # JSON writers sometimes produce 1000.0 for 1000; accept integral floats.
    ok = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if not ok:
        raise ValueError(f"{_PREFIX}{key} must be an integer, got {v!r}")
    if v < min_value:
        raise ValueError(f"{_PREFIX}{key} must be >= {min_value}, got {v!r}")


def _check_bool(key: str, v: Any) -> None:
    if not isinstance(v, bool):
        raise ValueError(f"{_PREFIX}{key} must be true or false, got {v!r}")


def _check_warmup_type(v: Any) -> None:
    if v not in WARMUP_TYPES:
        raise ValueError(f"{_PREFIX}warmup_type must be one of {list(WARMUP_TYPES)}, got {v!r}")


def _per_group(key: str, value: float | Sequence[float], optimizer: Optimizer) -> list[float]:
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{_PREFIX}{key} has {len(value)} values but the optimizer has {n} param groups")
        return [float(v) for v in value]
    return [float(value)] * n


# ----------------------------------------------------------------------------- configs

@dataclass(kw_only=True, frozen=True)
class LRRangeTestConfig:
    lr_range_test_min_lr: float | list[float] = 1e-3
    lr_range_test_step_size: int = 2000
    lr_range_test_step_rate: float = 1.0
    lr_range_test_staircase: bool = False

    def __post_init__(self):
        _check_number_or_list("lr_range_test_min_lr", self.lr_range_test_min_lr)
        _check_int("lr_range_test_step_size", self.lr_range_test_step_size, min_value=1)
        _check_number("lr_range_test_step_rate", self.lr_range_test_step_rate, min_value=0.0)
        _check_bool("lr_range_test_staircase", self.lr_range_test_staircase)


@dataclass(kw_only=True, frozen=True)
class OneCycleConfig:
    cycle_min_lr: float  # required, as in DeepSpeed
    cycle_max_lr: float  # required
    decay_lr_rate: float = 0.0
    cycle_first_step_size: int = 2000
    cycle_second_step_size: int | None = None  # None: same as the first
    cycle_first_stair_count: int = 0
    cycle_second_stair_count: int | None = None
    decay_step_size: int = 0  # 0: no post-cycle decay
    cycle_momentum: bool = True
    cycle_min_mom: float = 0.8
    cycle_max_mom: float = 0.9
    decay_mom_rate: float = 0.0

    def __post_init__(self):
        _check_number("cycle_min_lr", self.cycle_min_lr, min_value=0.0)
        _check_number("cycle_max_lr", self.cycle_max_lr, min_value=0.0)
        _check_number("decay_lr_rate", self.decay_lr_rate, min_value=0.0)
        _check_int("cycle_first_step_size", self.cycle_first_step_size, min_value=1)
        if self.cycle_second_step_size is not None:
            _check_int("cycle_second_step_size", self.cycle_second_step_size, min_value=1)
        _check_int("cycle_first_stair_count", self.cycle_first_stair_count, min_value=0)
        if self.cycle_second_stair_count is not None:
            _check_int("cycle_second_stair_count", self.cycle_second_stair_count, min_value=0)
        _check_int("decay_step_size", self.decay_step_size, min_value=0)
        _check_bool("cycle_momentum", self.cycle_momentum)
        _check_number("cycle_min_mom", self.cycle_min_mom, min_value=0.0)
        _check_number("cycle_max_mom", self.cycle_max_mom, min_value=0.0)
        _check_number("decay_mom_rate", self.decay_mom_rate)
        if self.cycle_first_stair_count or self.cycle_second_stair_count:
            # DeepSpeed stores the stair counts but its formula never reads them;
            # we keep its lr curve so a ported config trains identically.
            warnings.warn(f"{_PREFIX}cycle_first_stair_count/cycle_second_stair_count are accepted for "
                          "compatibility but, as in DeepSpeed, do not change the schedule", stacklevel=3)


@dataclass(kw_only=True, frozen=True)
class WarmupLRConfig:
    warmup_min_lr: float | list[float] = 0.0
    warmup_max_lr: float | list[float] = 0.001
    warmup_num_steps: int = 1000
    warmup_type: str = "log"

    def __post_init__(self):
        _check_number_or_list("warmup_min_lr", self.warmup_min_lr)
        _check_number_or_list("warmup_max_lr", self.warmup_max_lr)
        _check_int("warmup_num_steps", self.warmup_num_steps, min_value=0)
        _check_warmup_type(self.warmup_type)


@dataclass(kw_only=True, frozen=True)
class WarmupDecayLRConfig(WarmupLRConfig):
    total_num_steps: int  # required, as in DeepSpeed

    def __post_init__(self):
        super().__post_init__()
        _check_int("total_num_steps", self.total_num_steps, min_value=1)
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(f"{_PREFIX}total_num_steps ({self.total_num_steps}) is less than "
                          f"warmup_num_steps ({self.warmup_num_steps})", stacklevel=3)


@dataclass(kw_only=True, frozen=True)
class WarmupCosineLRConfig:
    total_num_steps: int  # required, as in DeepSpeed
    warmup_min_ratio: float = 0.0
    warmup_num_steps: int = 1000
    cos_min_ratio: float = 0.0001
    warmup_type: str = "log"

    def __post_init__(self):
        _check_int("total_num_steps", self.total_num_steps, min_value=1)
        _check_number("warmup_min_ratio", self.warmup_min_ratio, min_value=0.0)
        _check_int("warmup_num_steps", self.warmup_num_steps, min_value=0)
        _check_number("cos_min_ratio", self.cos_min_ratio, min_value=0.0)
        _check_warmup_type(self.warmup_type)
        # The cosine phase divides by (total - warmup); DeepSpeed crashes with ZeroDivisionError there.
        if self.total_num_steps <= max(2, self.warmup_num_steps):
            raise ValueError(f"{_PREFIX}total_num_steps ({self.total_num_steps}) must be greater than "
                             f"warmup_num_steps ({max(2, self.warmup_num_steps)})")


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
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
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
        self.min_lrs = _per_group("lr_range_test_min_lr", cfg.lr_range_test_min_lr, _torch_optimizer(optimizer))
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
        self.min_lrs = _per_group("warmup_min_lr", cfg.warmup_min_lr, torch_opt)
        self.max_lrs = _per_group("warmup_max_lr", cfg.warmup_max_lr, torch_opt)
        # log(1) would divide by zero; DeepSpeed clamps to 2 the same way.
        self.warmup_num_steps = max(2, int(cfg.warmup_num_steps))
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
        self.warmup_num_steps = max(2, int(cfg.warmup_num_steps))
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

    @staticmethod
    def _momentum_key(optimizer: Optimizer) -> str | None:
        if "betas" in optimizer.defaults:
            return "betas"
        if "momentum" in optimizer.defaults:
            return "momentum"
        warnings.warn(f"{_PREFIX}cycle_momentum is ignored: {type(optimizer).__name__} has neither "
                      "'betas' nor 'momentum'", stacklevel=4)
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

SCHEDULER_TYPES: dict[str, tuple[type[_Schedule], type]] = {
    "LRRangeTest": (LRRangeTest, LRRangeTestConfig),
    "OneCycle": (OneCycle, OneCycleConfig),
    "WarmupLR": (WarmupLR, WarmupLRConfig),
    "WarmupDecayLR": (WarmupDecayLR, WarmupDecayLRConfig),
    "WarmupCosineLR": (WarmupCosineLR, WarmupCosineLRConfig),
}


def build_scheduler(optimizer: Optimizer, scheduler_cfg: dict | None):
    """The schedule the config's ``scheduler`` block asks for, or None when there is none."""
    if scheduler_cfg is None:
        return None
    if not isinstance(scheduler_cfg, dict):
        raise ValueError(f"scheduler must be an object with 'type' and 'params', got {scheduler_cfg!r}")
    extra = sorted(set(scheduler_cfg) - {"type", "params"})
    if extra:
        warnings.warn(f"scheduler: ignoring unknown keys {extra}", stacklevel=2)
    kind = scheduler_cfg.get("type")
    if kind not in SCHEDULER_TYPES:
        raise ValueError(f"scheduler.type must be one of {sorted(SCHEDULER_TYPES)}, got {kind!r}")
    params = scheduler_cfg.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ValueError(f"scheduler.params must be an object, got {params!r}")
    schedule_cls, config_cls = SCHEDULER_TYPES[kind]
    known = {f.name for f in fields(config_cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        warnings.warn(f"scheduler.params: ignoring keys unknown to {kind}: "
                      f"{', '.join(_PREFIX + k for k in unknown)}", stacklevel=2)
    # Name missing required params instead of surfacing a TypeError about __init__.
    required = [f.name for f in fields(config_cls) if f.default is MISSING and f.name not in params]
    if required:
        raise ValueError(f"{kind} needs {', '.join(_PREFIX + k for k in required)}")
    cfg = config_cls(**{k: v for k, v in params.items() if k in known})
    return schedule_cls(optimizer, cfg)
