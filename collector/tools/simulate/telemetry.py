"""When each simulated rank's telemetry reached the collector: the ``deliveries`` rows a
collector keeps (collector.data.deliveries: one per flush of a rank's client), for runs written
straight into a data dir (streamed through a collector, it records the real ones).

A rank's client flushes every FLUSH_NS; each flush reaches the collector a little later (the
route, the collector's intake). A rank whose host's link is slow sends its telemetry out through
that link, where it waits behind the training traffic for as long as the queue happens to hold:
a delay drawn afresh for each flush, up to QUEUE_NS times the share of a transfer the slowdown
added (1 - 1/factor: the longer the training traffic holds the link, the deeper the queue it
leaves). One point is measured (collector.data.findings.link_side: behind a real link throttled
to 50 Mbit/s, 20x or more slower, the flushes' spacing jittered by a median 8-9 ms, under 1 ms
elsewhere); QUEUE_NS gives that at 20x, and the shape in between (~7 ms at 4x, ~4.5 ms at 2x)
is this model's, not a measurement.
``telemetry_apart``: the telemetry takes another network than the training traffic (a management
Ethernet beside InfiniBand), which no slow link delays."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa

from collector.data.schema import DELIVERIES_SCHEMA
from collector.tools.simulate.rows import hash_uniform
from collector.tools.simulate.slow_steps import link_factor

FLUSH_NS = 200_000_000  # the client's flush_interval_s
ROUTE_NS = 1_000_000  # a flush's way to the collector
ROUTE_JITTER_NS = 1_000_000  # ... give or take this much
QUEUE_NS = 31_000_000


class TelemetryRun(Protocol):
    seed: int
    telemetry_apart: bool
    ranks_per_host: int
    start_ns: int
    end_ns: int

    def step_starts(self, steps: np.ndarray) -> np.ndarray: ...


def delivery_rows(sim: TelemetryRun, ranks: np.ndarray, steps: int) -> pa.Table:
    """The deliveries of ``ranks``: one row per flush, from the run's start to its end."""
    starts = sim.step_starts(np.arange(steps + 1, dtype=np.int64))  # and the end of the last step
    cols: dict[str, list] = {"rank": [], "step": [], "made_ns": [], "received_ns": []}
    for r in ranks.tolist():
        phase = int(hash_uniform(sim.seed, r, np.array([1 << 43]))[0] * FLUSH_NS)
        made = np.arange(sim.start_ns + phase, min(sim.end_ns, int(starts[-1])), FLUSH_NS, dtype=np.int64)
        step = np.clip(np.searchsorted(starts, made, side="right") - 1, 0, steps - 1)
        index = np.arange(len(made)) + (1 << 44)
        route = ROUTE_NS + (hash_uniform(sim.seed, r, index) * ROUTE_JITTER_NS).astype(np.int64)
        factor = link_factor(sim, np.array([r // sim.ranks_per_host]), np.arange(steps))[0][step]
        reach = QUEUE_NS * (1.0 - 1.0 / factor) * (not sim.telemetry_apart)
        queue = (hash_uniform(sim.seed, r, index + (1 << 20)) * reach).astype(np.int64)
        cols["rank"] += [r] * len(made)
        cols["step"] += step.tolist()
        cols["made_ns"] += made.tolist()
        cols["received_ns"] += (made + route + queue).tolist()
    return pa.table({**cols, "table": ["comm"] * len(cols["rank"])}, schema=DELIVERIES_SCHEMA)
