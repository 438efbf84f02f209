"""A slow rank and a step clock for the framework scripts (tests/integration/rank/_hf_trainer_script.py and
_lightning_script.py) when the fault suite (benches/faults.py) runs them as users run them:

- ``RANKSCOPE_TEST_FAULT=sleep:RANK:MS[@FROM]``: RANK busy-waits MS ms before each optimizer
  step's first forward (from step FROM, 0-based), as ddp_train's ``--fault sleep`` does;
- ``RANKSCOPE_TEST_STEPS=N``: N optimizer steps instead of the script's own count;
- rank 0 writes ``OUT/times.json``: seconds between consecutive optimizer-step ends, what the
  suite compares a straggler finding's cost with.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from collector.testing.workloads import busy_wait
from collector.testing.workloads.ddp_train import Fault, parse_fault


def steps(default: int) -> int:
    return int(os.environ.get("RANKSCOPE_TEST_STEPS") or default)


class SlowRankAndClock:
    """Call ``before_step(step)`` before an optimizer step's first forward and ``after_step()`` at
    its end; ``write(out, rank)`` once training is over."""

    def __init__(self, rank: int):
        spec = os.environ.get("RANKSCOPE_TEST_FAULT")
        self.fault: Fault | None = parse_fault(spec) if spec else None
        if self.fault is not None and self.fault.kind != "sleep":
            raise SystemExit(f"RANKSCOPE_TEST_FAULT={spec!r}: the framework scripts inject only sleep faults")
        self.rank = rank
        self.ends: list[float] = []

    def before_step(self, step: int) -> None:
        if self.fault is not None and self.fault.on(self.rank, step):
            busy_wait(self.fault.ms / 1e3)

    def after_step(self) -> None:
        self.ends.append(time.perf_counter())

    def write(self, out: Path) -> None:
        if self.rank == 0:
            gaps = [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)]
            (out / "times.json").write_text(json.dumps(gaps))
