"""Training scripts the tests and benchmarks run under torchrun, with the hook or without it, and
what they share: ``busy_wait``, a slow rank's extra time as a slow device keeps it (busy, not
asleep, so CPU contention does not shorten it)."""

from __future__ import annotations

import time


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
