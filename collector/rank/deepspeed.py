"""What a hook run takes from DeepSpeed when the script uses it, with no change to the script.

* steps: after each ``DeepSpeedEngine.step()`` its ``global_steps`` (collector.rank.steps);
  while a DeepSpeed step runs, the inner optimizer's own ``step()`` is not counted again.
* monitor events: every ``MonitorMaster.write_events`` (what DeepSpeed sends to its
  csv_monitor, tensorboard, wandb and comet writers; rank 0 only, as in DeepSpeed) also
  becomes ``monitor`` rows: the tag, the value, and DeepSpeed's x (global samples) as ``samples``.
* fp16 loss scaling: every decision of DeepSpeed's loss scaler (``update_scale``) becomes a
  ``loss_scale`` row on each rank: the scale before and after, whether the step overflowed,
  and the hysteresis left.

* pipelines: every ``PipelineEngine.train_batch`` becomes ``pipe`` rows (collector.rank.pipe_timeline),
  read off its instruction schedule: each ``ForwardPass`` / ``BackwardPass`` (the micro-batch counted in
  schedule order), ``RecvActivation`` / ``RecvGrad`` (the waits for the neighbour stage, the bubbles),
  ``SendActivation`` / ``SendGrad`` (``send_wait``), ``ReduceGrads`` / ``ReduceTiedGrads`` (``reduce``),
  stamped with the step in progress. ``train_batch`` also counts as the engine's step (DeepSpeed's
  pipeline steps its optimizer without ``engine.step()``), so steps follow its ``global_steps``.

DeepSpeed is never imported here. ``install`` patches these classes if their modules are
loaded already and otherwise waits for them: a finder on ``sys.meta_path`` patches each module
right after it is first imported, so ``attach()`` may come before or after ``import deepspeed``.
``uninstall`` restores the originals. A patch that fails (another DeepSpeed version without
these names) logs once and leaves DeepSpeed as it was; nothing here raises into the script.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import sys

from collector.rank import session, state, steps
from collector.rank.clock import CLOCK, perf_ns
from collector.rank.pipe_timeline import StageTimeline

log = logging.getLogger("rankscope.deepspeed")

_originals: dict[tuple[object, str], object] = {}


def _wrap_engine_step(step):
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        steps.engine_in_use()
        result = step(self, *args, **kwargs)
        steps.engine_stepped(getattr(self, "global_steps", 0))
        return result

    return wrapper


def _number(value) -> float | None:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _wrap_write_events(write_events):
    @functools.wraps(write_events)
    def wrapper(self, event_list, *args, **kwargs):
        try:
            now = CLOCK.now_ns()
            rows = []
            for event in event_list:
                value = _number(event[1])
                if value is not None:
                    row = {"tag": str(event[0]), "value": value, "time_ns": now}
                    if len(event) > 2 and event[2] is not None:
                        row["samples"] = int(event[2])  # DeepSpeed's x: global samples
                    rows.append(row)
            session.emit_rows("monitor", rows)
        except Exception:
            log.exception("rankscope: reading DeepSpeed's monitor events failed")
        return write_events(self, event_list, *args, **kwargs)

    return wrapper


def _wrap_update_scale(update_scale):
    @functools.wraps(update_scale)
    def wrapper(self, overflow, *args, **kwargs):
        before = getattr(self, "cur_scale", None)
        result = update_scale(self, overflow, *args, **kwargs)
        try:
            row = {"scale_before": _number(before), "scale": _number(self.cur_scale), "overflow": bool(overflow)}
            if hasattr(self, "cur_hysteresis"):
                row["hysteresis_left"] = int(self.cur_hysteresis)
            session.emit("loss_scale", time_ns=CLOCK.now_ns(), **row)
        except Exception:
            log.exception("rankscope: reading DeepSpeed's loss scale failed")
        return result

    return wrapper


# DeepSpeed's pipeline instructions -> (pipe row kind, which micro-batch counter names it, its offset)
_INSTRUCTIONS = {
    "ForwardPass": ("fwd", "fwd", 0),
    "BackwardPass": ("bwd", "bwd", 0),
    "RecvActivation": ("recv_act", "fwd", 0),  # for the forward that comes next
    "RecvGrad": ("recv_grad", "bwd", 0),
    "SendActivation": ("send_wait", "fwd", -1),  # of the forward just done
    "SendGrad": ("send_wait", "bwd", -1),
    "ReduceGrads": ("reduce", None, 0),
    "ReduceTiedGrads": ("reduce", None, 0),
}


class _PipeStep:
    """One ``train_batch`` of a DeepSpeed PipelineEngine being recorded."""

    def __init__(self, engine) -> None:
        module = engine.module
        self.timeline = StageTimeline(
            stage=int(engine.stage_id),
            stages=int(engine.num_stages),
            data_rank=int(engine.grid.data_parallel_id),
            layers=len(getattr(module, "forward_funcs", ())),
        )
        self.step, self.micro_batches = state.get_step(), int(engine.micro_batches)
        self.done = {"fwd": 0, "bwd": 0}

    def record(self, instruction: str, start: int) -> None:
        kind, counter, offset = _INSTRUCTIONS[instruction]
        micro_batch = -1 if counter is None else self.done[counter] + offset
        self.timeline.record(kind, micro_batch, start)
        if kind in self.done:
            self.done[kind] += 1


def _wrap_instruction(name: str, execute):
    @functools.wraps(execute)
    def wrapper(self, *args, **kwargs):
        step = getattr(self, "_rankscope_pipe", None)
        start = perf_ns()
        result = execute(self, *args, **kwargs)
        if step is not None:
            try:
                step.record(name, start)
            except Exception:
                log.exception("rankscope: recording DeepSpeed's %s failed", name)
        return result

    return wrapper


def _wrap_instruction_map(instruction_map: dict) -> dict:
    return {
        cls: _wrap_instruction(cls.__name__, fn) if cls.__name__ in _INSTRUCTIONS else fn
        for cls, fn in instruction_map.items()
    }


def _wrap_train_batch(train_batch):
    @functools.wraps(train_batch)
    def wrapper(self, *args, **kwargs):
        steps.engine_in_use()
        try:
            self._rankscope_pipe = _PipeStep(self)
        except Exception:
            log.exception("rankscope: DeepSpeed's PipelineEngine is not what rankscope knows; no pipe rows")
            self._rankscope_pipe = None
        try:
            result = train_batch(self, *args, **kwargs)
        finally:
            recorded, self._rankscope_pipe = self._rankscope_pipe, None
        if recorded is not None:
            try:
                recorded.timeline.emit(recorded.step, recorded.micro_batches)
            except Exception:
                log.exception("rankscope: sending DeepSpeed's pipe rows failed")
        steps.engine_stepped(getattr(self, "global_steps", 0))
        return result

    return wrapper


def _patch(owner, name: str, wrap) -> None:
    if (owner, name) not in _originals:
        original = getattr(owner, name)
        _originals[(owner, name)] = original
        setattr(owner, name, wrap(original))


def _patch_engine(module) -> None:
    _patch(module.DeepSpeedEngine, "step", _wrap_engine_step)


def _patch_monitor(module) -> None:
    _patch(module.MonitorMaster, "write_events", _wrap_write_events)


def _patch_loss_scaler(module) -> None:
    for name in ("LossScaler", "DynamicLossScaler"):
        if "update_scale" in vars(getattr(module, name)):
            _patch(getattr(module, name), "update_scale", _wrap_update_scale)


def _patch_pipe_engine(module) -> None:
    _patch(module.PipelineEngine, "train_batch", _wrap_train_batch)
    _patch(module.PipelineEngine, "_INSTRUCTION_MAP", _wrap_instruction_map)


PATCHES = {
    "deepspeed.runtime.engine": _patch_engine,
    "deepspeed.runtime.pipe.engine": _patch_pipe_engine,
    "deepspeed.monitor.monitor": _patch_monitor,
    "deepspeed.runtime.fp16.loss_scaler": _patch_loss_scaler,
}


def _apply(name: str, module) -> None:
    try:
        PATCHES[name](module)
    except Exception as exc:
        log.warning("rankscope: DeepSpeed's %s is not what rankscope knows (%s); not captured", name, exc)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Patches a DeepSpeed module right after its first import (the real finders still find it)."""

    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _apply(name, module)

        loader.exec_module = exec_and_patch
        return spec


_finder = _AfterImport()


def install() -> None:
    for name in PATCHES:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
