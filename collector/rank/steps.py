"""The training step of a hook run: where it comes from, and what happens when one ends.

The bundled engine sets collector.rank.state itself. A script with the hook attached has no
engine to ask, so the step is taken from the first of these sources that speaks, the higher
one winning for the rest of the session once it has spoken:

1. ``hook.step(n)`` (manual): the script says which step it is in; nothing is counted for it after.
2. A training engine's own counter when one is in use: DeepSpeed's ``global_steps`` after each
   ``engine.step()`` (steps it skips on an fp16 overflow count, as DeepSpeed counts them;
   collector.rank.deepspeed), the Hugging Face Trainer's or Lightning's ``global_step`` after each
   optimizer step (collector.integrations).
3. Any ``torch.optim`` optimizer (torch's global optimizer step post-hook): one step per
   ``optimizer.step()``, so micro-batches of gradient accumulation are not counted as steps.

Numbering. A record carries the step it is part of, counted from 1: the collectives of the
backward passes that lead to the k-th optimizer step are step k, exactly DeepSpeed's
``global_steps`` once that step has returned. Everything before the first step (the process
group, DDP's initial broadcast) is step 1 too. When a step ends this rank's memory is sampled
(``memory`` rows of that step: ``rss`` always, ``device``/``device_peak`` from the CUDA caching
allocator's counters where CUDA is in use: host-side reads, no synchronize; cost measured by
``python -m benches.step_hook``) and the step
moves on. ``hook.log`` without ``step=`` stamps the step that ended last (the W&B habit: log
after ``optimizer.step()``), or the step in progress where none has ended yet or where the
script sets steps itself.

When a step ends (by any source: in manual mode, at each ``optimizer.step()``) the wait until the
next forward pass starts: collector.rank.between_steps records it, the hook run's stand-in for
the engine's data-loading timer.

Everything here runs on the training thread inside ``optimizer.step()``: a counter, a
``/proc`` read and a few dict appends, never I/O that can block, never an exception.
"""

from __future__ import annotations

import enum
import logging
import os
import threading

import torch

from collector.rank import session, state
from collector.rank.between_steps import BetweenSteps
from collector.rank.clock import CLOCK

log = logging.getLogger("rankscope.steps")


class Source(enum.IntEnum):
    """Where the step comes from; a higher value wins over a lower one."""

    NONE = 0
    OPTIMIZER = 1
    ENGINE = 2
    MANUAL = 3


class _ResidentSetSize:
    """This process's RSS in bytes. On Linux one pread of /proc/self/statm on a descriptor kept open
    (~10 µs; psutil opens the file each time, ~10x that); reopened after a fork, elsewhere psutil."""

    def __init__(self) -> None:
        self._fd, self._pid = None, None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._statm = os.path.exists("/proc/self/statm")

    def read(self) -> int:
        if self._statm:
            if self._pid != os.getpid():  # the descriptor of a parent names the parent's statm
                self._fd, self._pid = os.open("/proc/self/statm", os.O_RDONLY), os.getpid()
            return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        import psutil

        return psutil.Process().memory_info().rss


class _Counter:
    def __init__(self) -> None:
        self.source = Source.NONE
        self.completed = 0  # steps that have ended (the last one ended is step `completed`)
        self.handle = None  # torch's optimizer post-hook registration
        self.lock = threading.Lock()
        self._rss = _ResidentSetSize()
        self.between = BetweenSteps()

    # ---------------------------------------------------------------- sources

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.source > Source.OPTIMIZER:
            if self.source == Source.MANUAL:  # the script numbers its steps; the optimizer still ends them
                self._between_steps()
            return
        try:
            with self.lock:
                self.source = Source.OPTIMIZER
                self.end_step(self.completed + 1)
        except Exception:  # telemetry never fails the optimizer step
            log.exception("rankscope: counting an optimizer step failed")

    def on_engine_step(self, global_steps: int) -> None:
        if self.source > Source.ENGINE:
            return
        with self.lock:
            self.source = Source.ENGINE
            if global_steps > self.completed:
                self.end_step(global_steps)

    def set_manually(self, step: int) -> None:
        with self.lock:
            self.source = Source.MANUAL
            self.completed = step - 1
            state.set_step(step)

    # ---------------------------------------------------------------- one step ended

    def end_step(self, step: int) -> None:
        """Step ``step`` has just ended: sample memory as of its end, then move on to the next."""
        self.completed = step
        state.set_step(step)
        session.emit_rows("memory", self.memory_rows(step))
        state.set_step(step + 1)
        self.between.step_ended()

    def _between_steps(self) -> None:
        try:
            self.between.step_ended()
        except Exception:
            log.exception("rankscope: timing the wait after a step failed")

    def memory_rows(self, step: int) -> list[dict]:
        if session.active() is None:
            return []
        now = CLOCK.now_ns()  # the run's time line, not the wall clock an NTP step can move
        sizes = {"rss": self._rss.read()}
        if torch.cuda.is_initialized():  # a process that never touched CUDA has no allocator to ask
            device = torch.cuda.current_device()
            sizes["device"] = torch.cuda.memory_allocated(device)
            sizes["device_peak"] = torch.cuda.max_memory_allocated(device)
        return [{"step": step, "kind": kind, "bytes": int(b), "time_ns": now} for kind, b in sizes.items()]

    def logged_step(self) -> int:
        if self.source in (Source.OPTIMIZER, Source.ENGINE) and self.completed > 0:
            return self.completed
        return state.get_step()


_counter = _Counter()


def install() -> None:
    """Start counting (attach): torch's optimizer hook, and step 1 for what comes before the first step."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if _counter.handle is None:
        _counter.handle = register_optimizer_step_post_hook(_counter.on_optimizer_step)
        if state.get_step() == 0:
            state.set_step(1)


def uninstall() -> None:
    """Stop counting (detach); a later session counts from 1 again."""
    global _counter
    if _counter.handle is not None:
        _counter.handle.remove()
        state.set_step(0)
    _counter.between.disarm()
    _counter = _Counter()


def set_step(step: int) -> None:
    """``hook.step(n)``: this is step ``n`` from now on; automatic counting stops for the session."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"hook.step: step must be a non-negative int, got {step!r}")
    _counter.set_manually(step)


def engine_in_use() -> None:
    """An engine (DeepSpeed, a Trainer) drives training: from now on its counter counts, not the optimizer's steps."""
    if _counter.source < Source.ENGINE:
        _counter.source = Source.ENGINE


def engine_stepped(global_steps: int) -> None:
    """The engine's counter after an optimizer step (DeepSpeed's ``global_steps``, a Trainer's ``global_step``)."""
    try:
        _counter.on_engine_step(int(global_steps))
    except Exception:
        log.exception("rankscope: reading the engine's step counter failed")


def source() -> Source:
    return _counter.source


def logged_step() -> int:
    """The step ``hook.log`` stamps when given none (see the module docstring)."""
    return _counter.logged_step()
