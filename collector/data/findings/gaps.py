"""Gaps in what the collector heard: a partition between ranks and collector, or a collector that
stopped or stalled, while the ranks trained on.

Input: queries.deliveries (rank, step, made_ns, received_ns: one row per flush of a rank's client,
collector.data.deliveries) and, optionally, queries.ranks (its ``dropped_records``, the rows each
rank counted as lost). A rank's deliveries arrive every flush (0.2 s); a gap is a stretch of at
least ``GAP_S`` in which the collector received nothing from it, *after* which the first delivery
is late by at least ``HELD_FRACTION`` of the gap: what it carries was made during the silence and
held back (in the rank's memory or spool) until the link was back. That tells a gap of the network
(or of the collector) from a rank that stopped making records (a frozen or dead process, whose
first delivery afterwards is fresh: the silent and stopped-rank findings speak for it). The
delivery lag is compared with the rank's own usual lag (its median), so a constant offset between
rank 0's time line and the collector's clock cancels.

Ranks whose gaps overlap share one finding: a host cut off, or a collector down, is one line. It is
information (nothing was lost: the ranks resent it all), or a warning when the ranks counted
dropped records (their spool or memory limit was reached, collector.rank.client).
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.clock import span
from collector.data.findings.model import Finding, ranks_label

GAP_S = 10.0  # deliveries come every 0.2 s; a heartbeat period is 1 s, a rank is silent after 3
HELD_FRACTION = 0.5  # the first delivery after the gap is late by at least this share of it


def _gaps(rows: pd.DataFrame) -> list[dict]:
    """One rank's gaps: start and end (collector's clock, ns), the last step heard before, and the
    step it was at when heard live again (its first delivery no longer late by the gap)."""
    rows = rows.sort_values("received_ns")
    received = rows.received_ns.astype("int64").to_numpy()
    lag = received - rows.made_ns.astype("int64").to_numpy()
    steps = rows.step.to_numpy()
    usual = float(pd.Series(lag).median())
    found = []
    for i in range(1, len(rows)):
        gap = received[i] - received[i - 1]
        if gap < GAP_S * 1e9 or lag[i] - usual < HELD_FRACTION * gap:
            continue
        live = next((j for j in range(i, len(rows)) if lag[j] - usual < HELD_FRACTION * gap), len(rows) - 1)
        found.append(
            {
                "start_ns": int(received[i - 1]),
                "end_ns": int(received[i]),
                "from_step": None if pd.isna(steps[i - 1]) else int(steps[i - 1]),
                "to_step": None if pd.isna(steps[live]) else int(steps[live]),
            }
        )
    return found


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
    froms = [g["from_step"] for _, g in group if g["from_step"] is not None]
    tos = [g["to_step"] for _, g in group if g["to_step"] is not None]
    first, last = (min(froms), max(tos)) if froms and tos else (None, None)
    between = f" between steps {first} and {last}" if first is not None else ""
    lost = sum(dropped.get(r, 0) for r in ranks)
    text = (
        f"the collector heard nothing from {ranks_label(ranks)}{between} ({span(end - start)}): a network "
        "partition, or the collector stopped or stalled; the ranks trained on, and what they made meanwhile "
        "arrived after it (resent from their memory and spool)"
    )
    if lost:
        text += f"; {lost} records were dropped over the ranks' limits (telemetry.max_spool_bytes, max_unacked_bytes)"
    return Finding(
        kind="network_gap",
        severity="warning" if lost else "info",
        text=text,
        ranks=ranks,
        steps=(first, last) if first is not None else None,
        evidence={
            "seconds": (end - start) / 1e9,
            "start_ns": start,
            "end_ns": end,
            "dropped_records": lost,
            "ranks": ranks_label(ranks),
        },
    )
