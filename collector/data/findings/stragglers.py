"""Ranks that arrive last at collectives far more often than their fair share."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, duration, pct

# A rank that is last in more than this many times its fair share (1/n) is a straggler.
FAIR_SHARE_FACTOR = 2.0
MIN_INSTANCES = 10


def late_ranks(last_arrivals: pd.DataFrame, world_size: int) -> list[Finding]:
    """From queries.last_arrivals (op, rank, n_last, share, mean_lead_ms)."""
    found = []
    for op, rows in last_arrivals.groupby("op", sort=True):
        total = rows.n_last.sum()
        if total < MIN_INSTANCES or world_size < 2:
            continue
        worst = rows.loc[rows.share.idxmax()]
        if worst.share * world_size >= FAIR_SHARE_FACTOR:
            rank = int(worst["rank"])
            found.append(
                Finding(
                    kind="straggler",
                    severity="warning",
                    ranks=(rank,),
                    text=f"rank {rank} arrives last in {pct(worst.share)} of {op}s "
                    f"(+{duration(worst.mean_lead_ms)} on average after the first rank)",
                    evidence={
                        "op": op,
                        "share": float(worst.share),
                        "instances": int(total),
                        "mean_lead_ms": float(worst.mean_lead_ms),
                    },
                    page="stragglers",
                    filters={"op": op},
                )
            )
    return found
