"""wall_clock_breakdown timers: data, fwd, bwd, bwd_inner, bwd_allreduce, step.

Host wall clock only: timing never synchronizes the device (on CUDA the
figures are host-side time, which includes any waits the step itself makes).
Each step's totals become ``timers`` records and, every steps_per_print steps,
one DeepSpeed-style line on rank 0.
"""

from __future__ import annotations

import time
from collections import defaultdict

from collector.rank.clock import CLOCK


class Timers:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._open: dict[str, tuple[int, int]] = {}
        self._first_start: dict[str, int] = {}
        self._total: dict[str, int] = defaultdict(int)

    def start(self, name: str) -> None:
        if self.enabled:
            self._open[name] = (CLOCK.now_ns(), time.perf_counter_ns())
            self._first_start.setdefault(name, self._open[name][0])

    def stop(self, name: str) -> None:
        if self.enabled and name in self._open:
            _, t0 = self._open.pop(name)
            self._total[name] += time.perf_counter_ns() - t0

    def records(self, step: int) -> list[dict]:
        """This step's totals per timer as ``timers`` table rows; resets for the next step."""
        rows = [
            {"step": step, "name": n, "start_ns": self._first_start[n], "dur_ns": d} for n, d in self._total.items()
        ]
        self._total.clear()
        self._first_start.clear()
        return rows

    @staticmethod
    def format(rows: list[dict]) -> str:
        return "time (ms) | " + " | ".join(f"{r['name']}: {r['dur_ns'] / 1e6:.2f}" for r in rows)


class TimedLoader:
    """The engine's training data loader, timing each ``next`` as the ``data`` timer (the time
    the training loop waited for its batch). Everything else is the wrapped loader's."""

    def __init__(self, loader, timers: Timers) -> None:
        self.loader = loader
        self.timers = timers

    def __iter__(self):
        batches = iter(self.loader)
        while True:
            self.timers.start("data")
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                self.timers.stop("data")
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        if name == "loader":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
