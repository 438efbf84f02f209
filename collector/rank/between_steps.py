"""The wait between the steps of a hook run: from the end of one step to the next forward pass.

The bundled engine times its own data loader (the ``data`` timer). A script with the hook
attached has no loader rankscope can wrap, but it has a gap: once a step has ended
(``optimizer.step()``, or the engine counter that ended it: collector.rank.steps) the script
fetches its next batch and does whatever host work it does between steps (``zero_grad``,
logging, a learning-rate update) before it calls the model again. That gap is this rank's
``between_steps`` row of the step the forward belongs to (start on the rank's wall clock,
length on its monotonic clock). A rank whose batches come late shows a longer gap than the
others, and the causes analysis (collector.data.findings.causes) names it: as data loading *and*
host work, since both are in the gap. Only the wait before a step's first forward is seen: with
gradient accumulation the loads of the later micro-batches fall inside the step.

How the next forward is seen: at the step's end one global forward pre-hook is registered; its
first call (the outermost module of the forward: DDP's or FSDP's wrapper, DeepSpeed's engine,
the model itself) takes the time and removes it. One register and one remove a step, nothing
per module call after. Any module called between steps (an eval pass, an ``nn.Module``
transform in the main process) ends the gap there: it then reads short, never long. A collective
the script makes between steps (an all_reduce of the loss for logging) puts the wait for a late
rank into the others' gaps, not the late rank's, so it cannot make a straggler look data-bound.

Runs on the training thread: a clock read, a dict insert and delete, one buffered row; never
raises into training, never blocks.
"""

from __future__ import annotations

import logging
import time

from torch.nn.modules.module import register_module_forward_pre_hook

from collector.rank import session, state
from collector.rank.clock import CLOCK

log = logging.getLogger("rankscope.steps")

TABLE = "between_steps"


class BetweenSteps:
    def __init__(self) -> None:
        # The registration of the armed pre-hook, in a list so that taking it is one atomic pop:
        # two threads calling modules at once cannot both record the gap.
        self._armed: list = []
        self._ended_wall_ns = 0
        self._ended_ns = 0

    def step_ended(self) -> None:
        """A step has just ended: the gap starts now (again, if no forward came since the last end)."""
        if session.active() is None:
            return
        self._ended_ns = time.perf_counter_ns()
        self._ended_wall_ns = CLOCK.wall_ns(self._ended_ns)  # the run's time line, immune to clock steps
        if not self._armed:
            self._armed.append(register_module_forward_pre_hook(self._first_forward))

    def _first_forward(self, module, args) -> None:
        now = time.perf_counter_ns()
        try:
            handle = self._armed.pop()
        except IndexError:  # another thread's module call took it first
            return
        try:
            handle.remove()
            row = {"step": state.step, "start_ns": self._ended_wall_ns, "dur_ns": now - self._ended_ns}
            session.emit_rows(TABLE, (row,))
        except Exception:  # telemetry never fails the forward pass
            log.exception("rankscope: recording the wait between steps failed")

    def disarm(self) -> None:
        """Detach: no pre-hook is left behind."""
        while self._armed:
            self._armed.pop().remove()

    def armed(self) -> bool:
        return bool(self._armed)
