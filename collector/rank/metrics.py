"""The script's own metrics: ``hook.log({"loss": 1.9, "lr": 3e-4}, step=None)``, the W&B habit.

Each key becomes a ``monitor`` row (``tag`` = the key, ``value``, this rank, the step), next to
what the bundled engine's and DeepSpeed's monitors write, so the Overview plots it live: tags
with "loss" in the name on the loss chart, ``lr``/``learning_rate`` on the learning-rate chart.
Without ``step=`` the row gets the step that ended last (collector.rank.steps).

A wrong call (not a mapping, a key that is not a string, a bad ``step``) raises at once, naming
what was wrong, so it shows up on the first call while the script is written. A value that is
not a number is a warning naming its key (once per key) and is skipped; the others are logged:
a metric that cannot be plotted never stops training. 0-dim tensors are accepted; a CUDA tensor
is copied to the host to read it (a synchronize), so pass ``loss.item()`` where the script
has it anyway. NaN and inf are kept: a NaN loss is the signal.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping

from collector.rank import session, steps
from collector.rank.clock import CLOCK

log = logging.getLogger("rankscope.metrics")

_warned: set[str] = set()


def _number(key: str, value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, numbers.Real):
            return float(item)
    if key not in _warned:
        _warned.add(key)
        log.warning("rankscope: hook.log: %r is %s, not a number; not logged", key, type(value).__name__)
    return None


def log_metrics(metrics: Mapping[str, object], step: int | None = None) -> None:
    """Log ``metrics`` (name -> number) for ``step`` (default: the step that ended last)."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"hook.log: metrics must be a mapping of name -> number, got {type(metrics).__name__}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0):
        raise ValueError(f"hook.log: step must be a non-negative int or None, got {step!r}")
    for key in metrics:
        if not isinstance(key, str) or not key:
            raise TypeError(f"hook.log: metric names must be non-empty strings, got {key!r}")
    if session.active() is None:
        return
    at = steps.logged_step() if step is None else int(step)
    now = CLOCK.now_ns()  # on the run's time line (monotonic): an NTP step moves nothing
    rows = []
    for key, value in metrics.items():
        number = _number(key, value)
        if number is not None:
            rows.append({"step": at, "tag": key, "value": number, "time_ns": now})
    session.emit_rows("monitor", rows)
