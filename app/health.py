"""The Overview's health summary: a few sentences a person can act on, each
computed from the same query results the charts use. Every rule is a small
pure function of DataFrames so it can be tested on its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

# A rank that is last in more than this many times its fair share is a straggler.
STRAGGLER_FAIR_SHARE_FACTOR = 2.0
MIN_INSTANCES = 10
SMALL_MESSAGE_BYTES = 1 << 20
SMALL_MESSAGE_SHARE = 0.5
COMM_SHARE_WARN = 0.3
# Which DeepSpeed knob makes an op's messages bigger.
BUCKET_KNOB = {
    "all_reduce": "reduce_bucket_size", "reduce_scatter": "reduce_bucket_size",
    "reduce_scatter_tensor": "reduce_bucket_size",
    "all_gather": "allgather_bucket_size", "all_gather_into_tensor": "allgather_bucket_size",
}


@dataclass(frozen=True)
class Finding:
    level: str  # "warning" or "ok"
    text: str


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def duration(ms: float) -> str:
    """A lead or wait for people: '41 ms', '0.4 ms', '2 µs'."""
    if ms >= 10:
        return f"{ms:.0f} ms"
    if ms >= 0.1:
        return f"{ms:.1f} ms"
    return f"{ms * 1e3:.0f} µs"


def stragglers(last_arrivals: pd.DataFrame, world_size: int) -> list[Finding]:
    """From queries.last_arrivals: ranks that arrive last far more often than 1/n."""
    found = []
    for op, rows in last_arrivals.groupby("op", sort=True):
        total = rows.n_last.sum()
        if total < MIN_INSTANCES or world_size < 2:
            continue
        worst = rows.loc[rows.share.idxmax()]
        if worst.share * world_size >= STRAGGLER_FAIR_SHARE_FACTOR:
            found.append(Finding("warning", f"rank {int(worst['rank'])} arrives last in {_pct(worst.share)} of "
                                 f"{op}s (+{duration(worst.mean_lead_ms)} on average after the first rank)"))
    return found


def small_messages(log_summary: pd.DataFrame) -> list[Finding]:
    """From queries.log_summary: ops whose transfer time is mostly spent on small messages."""
    found = []
    for op, rows in log_summary.groupby("op", sort=True):
        total = rows.transfer_ms.sum()
        if total <= 0:
            continue
        share = rows.loc[rows.bytes < SMALL_MESSAGE_BYTES, "transfer_ms"].sum() / total
        if share >= SMALL_MESSAGE_SHARE:
            knob = BUCKET_KNOB.get(op)
            advice = f": raise {knob}" if knob else ": batch them into larger messages"
            found.append(Finding("warning", f"{_pct(share)} of {op} time is in messages < 1 MB{advice}"))
    return found


def loss_scale(scales: pd.DataFrame) -> list[Finding]:
    """From queries.loss_scale: how often the fp16 loss scale fell."""
    if scales.empty:
        return []
    falls = int(scales.overflow.sum())
    n_steps = scales.step.nunique()
    last = scales.iloc[-1]
    text = f"loss scale fell {falls} times in {n_steps} steps (now {last.scale:g} at step {int(last.step)})"
    return [Finding("warning" if falls else "ok", text)]


def comm_share(comm_by_rank: pd.DataFrame, step_wall: pd.DataFrame) -> list[Finding]:
    """Share of each rank's step time spent in communication, and how much of it is waiting."""
    if comm_by_rank.empty or step_wall.empty:
        return []
    per_rank = comm_by_rank.groupby("rank")[["total_latency_ms", "wait_ms"]].sum().join(
        step_wall.set_index("rank"), how="inner")
    per_rank = per_rank[per_rank.wall_ms > 0]
    if per_rank.empty:
        return []
    share = per_rank.total_latency_ms / per_rank.wall_ms
    wait = per_rank.wait_ms / per_rank.wall_ms
    worst = share.idxmax()
    text = (f"communication takes {_pct(share.mean())} of step time on average "
            f"(rank {worst}: {_pct(share.loc[worst])}, of which {_pct(wait.loc[worst])} waiting for other ranks)")
    return [Finding("warning" if share.max() >= COMM_SHARE_WARN else "ok", text)]


def summarize(*, last_arrivals: pd.DataFrame, log_summary: pd.DataFrame, scales: pd.DataFrame,
              comm_by_rank: pd.DataFrame, step_wall: pd.DataFrame, world_size: int) -> list[Finding]:
    findings = (stragglers(last_arrivals, world_size) + small_messages(log_summary)
                + loss_scale(scales) + comm_share(comm_by_rank, step_wall))
    return sorted(findings, key=lambda f: f.level != "warning")
