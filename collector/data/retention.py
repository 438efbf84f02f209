"""Which steps keep their raw comm records once a run is rolled up (``collect --raw-every N``).

At 10,000 ranks a month-long job writes ~10^12 comm records; nobody reads most of them
one by one, but everyone reads their sums. So the collector keeps, for every step, the
per-(rank, step, group, op, size) rollup the pages read anyway (``comm_steps``), and the raw
records only of

- every Nth step (a regular sample to drill into), and
- every step where something is wrong, so the drill-down is there where it is needed:
  a rank entering a collective LATE_MS or more after the first one (a straggler step), or a
  (op, size) whose bandwidth at that step is below SLOW_BANDWIDTH of its median over the
  window (a slow link, a congested step).

A pure function of the window's rollup, tested both ways (fires on injected faults, keeps
only the sample on a healthy run).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LATE_MS = 5.0
SLOW_BANDWIDTH = 0.5


def steps_to_keep(rollup: pd.DataFrame, raw_every: int) -> set[int]:
    """Steps of ``rollup`` (COMM_STEPS_SCHEMA columns) whose raw rows stay."""
    if raw_every < 1:
        raise ValueError(f"raw_every must be >= 1, got {raw_every}")
    if rollup.empty:
        return set()
    steps = set(int(s) for s in rollup.step.unique())
    keep = {s for s in steps if s % raw_every == 0}
    late = rollup[rollup.delay_max_ns.fillna(0) >= LATE_MS * 1e6]
    keep |= set(int(s) for s in late.step.unique())
    per_step = rollup.groupby(["step", "op", "bytes"], as_index=False)[["busbw_sum", "n"]].sum()
    per_step["busbw"] = per_step.busbw_sum / per_step.n
    median = per_step.groupby(["op", "bytes"]).busbw.transform("median")
    slow = per_step[per_step.busbw < SLOW_BANDWIDTH * median]
    keep |= set(int(s) for s in slow.step.unique())
    return keep


def note(state: dict) -> str:
    """What the pages and ``rankscope health`` say where retention thinned a run out
    (``state`` from queries.retention)."""
    return (
        f"steps 0–{state['through']} read from per-step rollups; raw comm records kept for "
        f"{state['raw_steps']:,} of those {state['steps']:,} steps (every Nth and those with findings)"
    )


# Captured evidence (collector.server.artifacts) is thinned alongside: a run keeps the files and
# rows of its newest ARTIFACT_REQUESTS_KEPT requests (a request: a suspect and its reference, or
# the ranks one command asked). Escalation asks a run at most every 5 min, so this is the last
# ~100 min of a run that keeps finding trouble, and every capture of one that does not.
ARTIFACT_REQUESTS_KEPT = 20


def artifact_requests_to_drop(rows: pd.DataFrame, kept: int = ARTIFACT_REQUESTS_KEPT) -> set[str]:
    """Request ids of ``rows`` (``artifacts`` columns request_id, time_ns) beyond the newest ``kept``,
    a request dated by its first row (when the rank answered it)."""
    if kept < 1:
        raise ValueError(f"kept must be >= 1, got {kept}")
    if rows.empty:
        return set()
    first = rows.groupby("request_id").time_ns.min().sort_values(ascending=False, kind="stable")
    return set(first.index[kept:])


# Telemetry arrival times (``deliveries``: a row per rank per flush, ~5 a second per rank) are read by
# one thing: the slow-link finding's tie-break between hosts (collector.data.findings.link_side), over
# the finding's steps and the flushes just before (its warm-up and the onset's uncertainty). So a
# thinned run keeps the deliveries of each slow-link finding's steps and DELIVERY_MARGIN_STEPS either
# side, and drops the rest. A slowdown is found some steps after it began (the CUSUM's alarm), so rows
# are judged DELIVERY_LAG_STEPS behind the settled steps while the run goes on, all once it ended.
DELIVERY_MARGIN_STEPS = 10
DELIVERY_LAG_STEPS = 50


def deliveries_kept(steps: np.ndarray, slow_link_steps: list[tuple[int, int]]) -> np.ndarray:
    """Which of ``steps`` (deliveries rows' steps, judged now) stay: those within
    DELIVERY_MARGIN_STEPS of a slow-link finding's (first, last) steps."""
    steps = np.asarray(steps, dtype=np.int64)
    keep = np.zeros(len(steps), dtype=bool)
    for first, last in slow_link_steps:
        keep |= (steps >= first - DELIVERY_MARGIN_STEPS) & (steps <= last + DELIVERY_MARGIN_STEPS)
    return keep
