"""The share of each rank's step time spent communicating, and how much of it is waiting."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, pct

COMM_SHARE_WARN = 0.3


def comm_share(comm_by_rank: pd.DataFrame, step_wall: pd.DataFrame) -> list[Finding]:
    """From queries.comm_by_rank (rank, op, total_latency_ms, wait_ms) and queries.step_wall_ms (rank, wall_ms)."""
    if comm_by_rank.empty or step_wall.empty:
        return []
    per_rank = (
        comm_by_rank.groupby("rank")[["total_latency_ms", "wait_ms"]]
        .sum()
        .join(step_wall.set_index("rank"), how="inner")
    )
    per_rank = per_rank[per_rank.wall_ms > 0]
    if per_rank.empty:
        return []
    share = per_rank.total_latency_ms / per_rank.wall_ms
    wait = per_rank.wait_ms / per_rank.wall_ms
    worst = int(share.idxmax())
    text = (
        f"communication takes {pct(share.mean())} of step time on average "
        f"(rank {worst}: {pct(share.loc[worst])}, of which {pct(wait.loc[worst])} waiting for other ranks)"
    )
    return [
        Finding(
            kind="comm_share",
            severity="warning" if share.max() >= COMM_SHARE_WARN else "ok",
            text=text,
            ranks=(worst,),
            evidence={"mean_share": float(share.mean()), "max_share": float(share.max())},
            page="comms",
        )
    ]
