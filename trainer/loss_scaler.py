"""Loss scaling for fp16 training, configured by the config's ``fp16`` block with
DeepSpeed's keys and defaults:

    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
             "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1}

``loss_scale: 0`` selects dynamic scaling (:class:`DynamicLossScaler`), any other
value a fixed scale (:class:`StaticLossScaler`); fp32 and bf16 runs get a
:class:`NoOpLossScaler` (scale 1, never skips), as DeepSpeed does.

The engine's loop per optimizer step::

    flag = has_inf_or_nan(p.grad for p in params)   # bool tensor, no host sync
    comm.all_reduce(flag, op=MAX)                    # every rank must agree
    decision = scaler.update(bool(flag))             # one host sync, once per step
    if not decision.skipped: unscale grads by decision.scale_before, optimizer.step()

Each ``update`` returns a :class:`ScaleDecision` saying what happened and why,
which is what the ``loss_scale`` telemetry table records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from collector.rank.config import ConfigBlock, ConfigError, setting

__all__ = [
    "DynamicLossScaler",
    "FP16Config",
    "LossScaleAtMinimumError",
    "LossScalerConfig",
    "NoOpLossScaler",
    "ScaleDecision",
    "StaticLossScaler",
    "build_loss_scaler",
    "has_inf_or_nan",
]

# ScaleDecision.reason values.
NO_OVERFLOW = "no_overflow"  # good step, scale unchanged
GROW = "grow"  # loss_scale_window good steps in a row: scale *= scale_factor
HYSTERESIS = "hysteresis"  # overflow absorbed by hysteresis: scale unchanged, step skipped
BACKOFF = "backoff"  # overflow: scale /= scale_factor (floored at min_scale), step skipped
AT_MIN_SCALE = "at_min_scale"  # overflow with the scale already at min_loss_scale
STATIC_OVERFLOW = "static_overflow"  # overflow under a fixed scale: step skipped
NOT_SCALED = "not_scaled"  # fp32 / bf16: no scaling, never skipped


@dataclass(frozen=True)
class ScaleDecision:
    scale_before: float  # the scale the gradients of this step were computed with
    scale_after: float  # the scale for the next step
    overflow: bool
    hysteresis_left: int | None  # overflows still tolerated before backing off; None without hysteresis
    skipped: bool  # the optimizer step must be skipped
    reason: str


class LossScaleAtMinimumError(RuntimeError):
    """Overflow while the scale is already at ``min_loss_scale``: DeepSpeed stops
    the run here. ``decision`` is what the step looked like, for the record."""

    def __init__(self, decision: ScaleDecision):
        super().__init__(
            f"loss scale already at fp16.min_loss_scale ({decision.scale_before:g}) and the "
            "gradients still overflow; cannot decrease the scale further, stopping the run"
        )
        self.decision = decision


# The one precision rule the fp16 and bf16 blocks share.
PRECISION_CONFLICT = "fp16.enabled and bf16.enabled: choose one precision, not both"


@dataclass(kw_only=True)
class FP16Config(ConfigBlock):
    """The ``fp16`` block: loss-scaled half precision. ``auto_cast`` is the engine's (inputs cast
    to fp16); the rest configure the scaler. ``fp16_master_weights_and_grads`` is accepted and
    ignored: master weights stay fp32, which only makes the update more exact."""

    SECTION: ClassVar[str] = "fp16"
    ACCEPTED: ClassVar[frozenset[str]] = frozenset({"fp16_master_weights_and_grads"})
    enabled: bool = False
    auto_cast: bool = False
    loss_scale: float = setting(0.0, ge=0)  # 0: dynamic
    initial_scale_power: int = setting(16, ge=0, le=127)  # 2**127: the top of float32 (the scale is a float)
    loss_scale_window: int = setting(1000, ge=1)
    # DeepSpeed only backs off when the counter is exactly 1, so 0 would never back off.
    hysteresis: int = setting(2, ge=1)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = setting(1.0, gt=0)

    def validate(self) -> None:
        if self.loss_scale == 0 and self.min_loss_scale > 2**self.initial_scale_power:
            self.fail(
                "min_loss_scale",
                f"is above the initial scale 2**fp16.initial_scale_power ({2**self.initial_scale_power})",
                self.min_loss_scale,
            )


LossScalerConfig = FP16Config  # the name this module exported before the block moved here


class NoOpLossScaler:
    """fp32 / bf16: scale 1, nothing is ever skipped."""

    dynamic = False
    loss_scale = 1.0

    def update(self, overflow: bool) -> ScaleDecision:
        return ScaleDecision(1.0, 1.0, bool(overflow), None, False, NOT_SCALED)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class StaticLossScaler:
    """A fixed scale (``fp16.loss_scale`` > 0); an overflowing step is skipped."""

    dynamic = False

    def __init__(self, loss_scale: float):
        self.cur_scale = float(loss_scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update(self, overflow: bool) -> ScaleDecision:
        overflow = bool(overflow)
        return ScaleDecision(
            self.cur_scale, self.cur_scale, overflow, None, overflow, STATIC_OVERFLOW if overflow else NO_OVERFLOW
        )

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, sd: dict) -> None:
        # The configured scale wins: a resumed run may have been given a new one.
        pass


class DynamicLossScaler:
    """DeepSpeed's DynamicLossScaler (deepspeed/runtime/fp16/loss_scaler.py).

    On overflow the step is skipped and, if the hysteresis counter is down to 1
    (or ``delayed_shift`` is 1), the scale is divided by ``scale_factor`` (not
    below ``min_scale``); otherwise only the counter is decremented. A good step
    refills the counter when ``consecutive_hysteresis``; every ``scale_window``
    iterations after the last overflow the scale is multiplied by
    ``scale_factor`` (and the counter refilled). Iterations are counted from 0, so
    without overflow the scale first grows on the ``scale_window``-th step.
    Constructor defaults are those of the ``fp16`` config block (DeepSpeed's class
    itself defaults to 2**32 and no hysteresis, which its config never uses).
    """

    dynamic = True

    def __init__(
        self,
        *,
        init_scale: float = 2.0**16,
        scale_factor: float = 2.0,
        scale_window: int = 1000,
        min_scale: float = 1.0,
        delayed_shift: int = 2,
        consecutive_hysteresis: bool = False,
        raise_error_at_min_scale: bool = True,
    ):
        self.cur_scale = float(init_scale)
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.delayed_shift = int(delayed_shift)
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.cur_hysteresis = self.delayed_shift

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update(self, overflow: bool) -> ScaleDecision:
        overflow = bool(overflow)
        before = self.cur_scale
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if before == self.min_scale and self.raise_error_at_min_scale:
                    raise LossScaleAtMinimumError(
                        ScaleDecision(before, before, True, self.cur_hysteresis, True, AT_MIN_SCALE)
                    )
                self.cur_scale = max(before / self.scale_factor, self.min_scale)
                reason = BACKOFF if self.cur_scale < before else AT_MIN_SCALE
            else:
                self.cur_hysteresis -= 1
                reason = HYSTERESIS
            self.last_overflow_iter = self.cur_iter
        else:
            reason = NO_OVERFLOW
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
                reason = GROW
        self.cur_iter += 1
        return ScaleDecision(before, self.cur_scale, overflow, self.cur_hysteresis, overflow, reason)

    def state_dict(self) -> dict:
        return {
            "cur_scale": self.cur_scale,
            "cur_iter": self.cur_iter,
            "last_overflow_iter": self.last_overflow_iter,
            "cur_hysteresis": self.cur_hysteresis,
        }

    def load_state_dict(self, sd: dict) -> None:
        missing = sorted({"cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"} - set(sd))
        if missing:
            raise KeyError(f"loss scaler state_dict lacks {missing}")
        self.cur_scale = float(sd["cur_scale"])
        self.cur_iter = int(sd["cur_iter"])
        self.last_overflow_iter = int(sd["last_overflow_iter"])
        self.cur_hysteresis = int(sd["cur_hysteresis"])


LossScaler = NoOpLossScaler | StaticLossScaler | DynamicLossScaler


def build_loss_scaler(fp16_cfg: FP16Config | Mapping | None, bf16_enabled: bool = False) -> LossScaler:
    """The scaler the ``fp16`` block asks for (a no-op one when fp16 is off)."""
    cfg = FP16Config.from_dict(fp16_cfg)
    if not cfg.enabled:
        return NoOpLossScaler()
    if bf16_enabled:
        raise ConfigError(PRECISION_CONFLICT)
    if cfg.loss_scale > 0:
        return StaticLossScaler(cfg.loss_scale)
    return DynamicLossScaler(
        init_scale=2.0**cfg.initial_scale_power,
        scale_factor=2.0,
        scale_window=cfg.loss_scale_window,
        min_scale=cfg.min_loss_scale,
        delayed_shift=cfg.hysteresis,
        consecutive_hysteresis=cfg.consecutive_hysteresis,
    )


def has_inf_or_nan(tensors: Iterable[torch.Tensor | None], *, device: torch.device | str | None = None) -> torch.Tensor:
    """A 0-d bool tensor, True when any tensor holds an inf or NaN. It stays on the
    tensors' device (no host sync) so ranks can all-reduce it before anyone reads
    it. ``None`` entries (params without grads) are skipped; with no tensors at
    all the flag is False on ``device`` (default CPU)."""
    flags = []
    target = None
    for t in tensors:
        if t is None:
            continue
        if target is None:
            target = t.device
        # isfinite on fp16 is exact: no accumulation that could itself overflow.
        flags.append(torch.isfinite(t).all().logical_not().to(target, non_blocking=True))
    if not flags:
        return torch.zeros((), dtype=torch.bool, device=device or "cpu")
    return torch.stack(flags).any()
