"""Which rank talks to people, and when: the one place that decides it.

Rank 0 prints the engine's step line (every ``steps_per_print`` steps, with the timers under
``wall_clock_breakdown``), writes the monitor's files (csv_monitor, tensorboard) and prints the
flops profiler's report, as DeepSpeed does. Every rank's telemetry still goes to the collector,
which is where a whole run is read; this only keeps N copies of the same line off the console.
"""

from __future__ import annotations

import os

import torch.distributed as dist

REPORTING_RANK = 0


def global_rank() -> int:
    """This process's rank: torch.distributed's once initialised, else the launcher's ``RANK``, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_reporting_rank(rank: int | None = None) -> bool:
    """Whether ``rank`` (default: this process's) prints reports and writes the monitor's files."""
    return (global_rank() if rank is None else rank) == REPORTING_RANK


def prints_step(rank: int, step: int, steps_per_print: int) -> bool:
    """Whether ``rank`` prints the line of ``step`` (0-based, just finished): the reporting rank,
    every ``steps_per_print`` steps."""
    return rank == REPORTING_RANK and (step + 1) % steps_per_print == 0
