"""Gaps in what the collector heard: a partition between ranks and collector, or a collector that
stopped or stalled, while the ranks trained on.

Input: queries.deliveries (rank, step, made_ns, received_ns: one row per flush of a rank's client,
collector.data.deliveries) and, optionally, queries.ranks (its ``dropped_records``, the rows each
rank counted as lost). A rank's deliveries arrive every flush (0.2 s); a gap is a stretch of at
least ``GAP_S`` in which the collector received nothing from it, *after* which the first delivery
is late (by ``HELD_FRACTION`` of the gap, or ``HELD_S``: what it carries was held back in the
rank's memory or spool until the link was back, the oldest perhaps dropped over the spool's limit),
and by the time its deliveries are fresh again the rank is further than before the silence by at
least ``TRAINED`` of the steps its pace before would have made in it: it trained on while nobody
heard it. That tells a gap of the network (or
of the collector) from a rank that stopped (a frozen, stopped or dead process: what it held
arrives late too when it resumes, but its steps did not move; the silent and stopped-rank findings
speak for it). The delivery lag is compared with the rank's own usual lag (its median), so a
constant offset between rank 0's time line and the collector's clock cancels.

Ranks whose gaps overlap share one finding: a host cut off, or a collector down, is one line. It is
information (nothing was lost: the ranks resent it all), or a warning when the ranks counted
dropped records (their spool or memory limit was reached, collector.rank.client).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.data.findings.clock import span
from collector.data.findings.model import Finding, ranks_label

GAP_S = 10.0  # deliveries come every 0.2 s; a heartbeat period is 1 s, a rank is silent after 3
HELD_FRACTION = 0.5  # the first delivery after the gap is late by this share of it ...
HELD_S = 5.0  # ... or by this much (what was made first in the gap may have been dropped)
MIN_STEPS = 2  # steps made while nobody heard the rank: at least this many, and at least
TRAINED = 0.25  # this share of what its pace before the gap would have made in it
PACE_S = 60.0  # its pace: over this long before the gap


def _gaps(rows: pd.DataFrame) -> list[dict]:
    """One rank's gaps: start and end (collector's clock, ns), the last step heard before, and the
    step it was at when heard live again (its first delivery no longer late by the gap). Only the
    silences of GAP_S or more are looked at (a run has few), so a long run's rows cost one diff."""
    rows = rows.sort_values("received_ns")
    received = rows.received_ns.astype("int64").to_numpy()
    lag = received - rows.made_ns.astype("int64").to_numpy()
    steps = rows.step.astype("float64").to_numpy()
    usual = float(np.median(lag))
    found = []
    for i in np.flatnonzero(np.diff(received) >= GAP_S * 1e9) + 1:
        gap = received[i] - received[i - 1]
        late = min(HELD_FRACTION * gap, HELD_S * 1e9)
        if lag[i] - usual < late:
            continue
        fresh = np.flatnonzero(lag[i:] - usual < late)
        live = i + fresh[0] if len(fresh) else len(rows) - 1
        before, after = steps[i - 1], steps[live]
        if (
            np.isnan(before)
            or np.isnan(after)
            or after - before < max(MIN_STEPS, TRAINED * _pace(received, steps, i) * gap)
        ):
            continue
        found.append({"start_ns": int(received[i - 1]), "end_ns": int(received[i]), "from_step": int(before),
                      "to_step": int(after)})  # fmt: skip
    return found


def _pace(received: np.ndarray, steps: np.ndarray, i: int) -> float:
    """Steps per ns the rank made over the PACE_S before its ``i``-th delivery (0: cannot tell)."""
    first = int(np.searchsorted(received, received[i - 1] - PACE_S * 1e9))
    span_ns = float(received[i - 1] - received[first])
    made = steps[i - 1] - steps[first]
    return max(0.0, made / span_ns) if span_ns > 0 and not np.isnan(made) else 0.0


def network_gaps(deliveries: pd.DataFrame | None, ranks: pd.DataFrame | None = None) -> list[Finding]:
    """One finding per stretch of silence (ranks whose gaps overlap are one)."""
    if deliveries is None or deliveries.empty:
        return []
    per_rank = [(int(rank), gap) for rank, rows in deliveries.groupby("rank") for gap in _gaps(rows)]
    groups: list[list[tuple[int, dict]]] = []
    for rank, gap in sorted(per_rank, key=lambda x: x[1]["start_ns"]):
        group = groups[-1] if groups else None
        if group and gap["start_ns"] < max(g["end_ns"] for _, g in group):
            group.append((rank, gap))
        else:
            groups.append([(rank, gap)])
    dropped = {}
    if ranks is not None and not ranks.empty and "dropped_records" in ranks:
        dropped = {int(r.rank): int(r.dropped_records) for r in ranks.itertuples() if pd.notna(r.dropped_records)}
    return [_finding(group, dropped) for group in groups]


def _finding(group: list[tuple[int, dict]], dropped: dict[int, int]) -> Finding:
    ranks = tuple(sorted({rank for rank, _ in group}))
    start = min(g["start_ns"] for _, g in group)
    end = max(g["end_ns"] for _, g in group)
    first, last = min(g["from_step"] for _, g in group), max(g["to_step"] for _, g in group)
    lost = sum(dropped.get(r, 0) for r in ranks)
    text = (
        f"the collector heard nothing from {ranks_label(ranks)} between steps {first} and {last} "
        f"({span(end - start)}): a network "
        "partition, or the collector stopped or stalled; the ranks trained on, and what they made meanwhile "
        "arrived after it (resent from their memory and spool)"
    )
    if lost:  # an upper bound: records stored whose ack the partition swallowed are counted too
        text += (
            f"; the ranks counted {lost} records dropped over their limits (telemetry.max_spool_bytes, "
            "max_unacked_bytes)"
        )
    return Finding(
        kind="network_gap",
        severity="warning" if lost else "info",
        text=text,
        ranks=ranks,
        steps=(first, last),
        evidence={
            "seconds": (end - start) / 1e9,
            "start_ns": start,
            "end_ns": end,
            "dropped_records": lost,
            "ranks": ranks_label(ranks),
        },
    )
