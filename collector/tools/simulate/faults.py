"""The faults a simulated run can carry, parsed from their options: ``--straggler``, ``--hang``,
``--slow-link``."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


class SimulateError(ValueError):
    """Arguments that cannot describe a run; the message names the option."""


@dataclass(frozen=True)
class Straggler:
    rank: int
    delay_ns: int
    from_step: int = 0

    @classmethod
    def parse(cls, text: str) -> Straggler:
        """``RANK:MS`` or ``RANK:MS@STEP``."""
        match = re.fullmatch(r"(\d+):(\d+(?:\.\d+)?)(?:@(\d+))?", text.strip())
        if not match:
            raise SimulateError(f"--straggler: {text!r} is not RANK:MS or RANK:MS@STEP (e.g. 517:40 or 517:40@100)")
        rank, ms, step = match.groups()
        return cls(int(rank), int(float(ms) * 1e6), int(step or 0))


@dataclass(frozen=True)
class Hang:
    rank: int
    step: int

    @classmethod
    def parse(cls, text: str) -> Hang:
        """``RANK:STEP``."""
        match = re.fullmatch(r"(\d+):(\d+)", text.strip())
        if not match:
            raise SimulateError(f"--hang: {text!r} is not RANK:STEP (e.g. 517:120)")
        return cls(int(match[1]), int(match[2]))


@dataclass(frozen=True)
class SlowLink:
    host: int
    factor: float
    from_step: int
    to_step: int | None = None  # the step it is at speed again (None: never)

    @classmethod
    def parse(cls, text: str) -> SlowLink:
        """``HOST:FACTOR@STEP[-END]``; HOST a host index or its name (``node-0003``)."""
        match = re.fullmatch(r"(?:node-)?(\d+):(\d+(?:\.\d+)?)@(\d+)(?:-(\d+))?", text.strip())
        if not match:
            raise SimulateError(
                f"--slow-link: {text!r} is not HOST:FACTOR@STEP[-END] (e.g. 17:4@100-200 or node-0017:4@100)"
            )
        host, factor, first, end = match.groups()
        link = cls(int(host), float(factor), int(first), int(end) if end else None)
        if link.factor < 1:
            raise SimulateError(f"--slow-link: factor {factor} must be >= 1 (how many times slower)")
        if link.to_step is not None and link.to_step <= link.from_step:
            raise SimulateError(f"--slow-link: END {end} must be after STEP {first}")
        return link

    def on(self, steps: np.ndarray) -> np.ndarray:
        return (steps >= self.from_step) & (steps < (self.to_step if self.to_step is not None else np.inf))
