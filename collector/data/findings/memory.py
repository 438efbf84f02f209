"""Memory growth heading for an OOM: a rank whose resident memory rises step after step.

Input: queries.memory_trend (per rank: the least-squares slope of RSS over the second half of its
steps, per second, its r2, RSS at both ends of that half, its steps per second, the
host's available memory at the end). The first half is left out: start-up, allocators, caches and
the first batches grow memory at the start of every healthy run, then it holds.

A rank grows when, over that half, its RSS rose by at least ``MIN_GROWTH_BYTES`` and
``MIN_GROWTH_SHARE`` of where it started, along a line (r2 >= ``MIN_R2``: a steady leak, not one
step up). With the host's available memory known, the finding projects when it runs out at that
rate: in how many steps and seconds, and at which step. Ranks growing alike share one finding.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label

MIN_GROWTH_BYTES = 64 * 2**20
MIN_GROWTH_SHARE = 0.05
MIN_R2 = 0.8
MIN_SAMPLES = 6


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def memory_growth(trend: pd.DataFrame | None) -> list[Finding]:
    if trend is None or trend.empty:
        return []
    t = trend.dropna(subset=["bytes_per_s", "r2"])
    t = t[t.samples >= MIN_SAMPLES].assign(bytes_per_step=lambda d: d.bytes_per_s / d.steps_per_s)
    grown = t.last_rss - t.first_rss
    growing = t[
        (t.bytes_per_s > 0)
        & (t.steps_per_s > 0)
        & (grown >= MIN_GROWTH_BYTES)
        & (grown >= MIN_GROWTH_SHARE * t.first_rss)
        & (t.r2 >= MIN_R2)
    ]
    if growing.empty:
        return []
    worst = growing.loc[growing.bytes_per_s.idxmax()]
    ranks = [int(r) for r in growing["rank"]]
    per_step, last_step = float(worst.bytes_per_step), int(worst.last_step)
    text = (
        f"{ranks_label(ranks)}: memory (RSS) grows {_size(per_step)} per step "
        f"({_size(worst.first_rss)} -> {_size(worst.last_rss)} over steps {int(worst.first_step)}-{last_step})"
    )
    evidence = {
        "ranks": ranks,
        "bytes_per_step": per_step,
        "bytes_per_s": float(worst.bytes_per_s),
        "r2": float(worst.r2),
        "rss_bytes": int(worst.last_rss),
    }
    available = worst.get("available")
    if available is not None and not pd.isna(available) and available > 0:
        # the ranks that grow share the host's memory: together they use it up
        rate = float(growing.bytes_per_step.sum())
        steps_left = float(available) / rate
        seconds_left = float(available) / float(growing.bytes_per_s.sum()) if growing.bytes_per_s.sum() > 0 else None
        oom_step = last_step + int(steps_left)
        when = f", ~{seconds_left / 60:.0f} min" if seconds_left else ""
        text += (
            f"; at this rate the host's available memory ({_size(float(available))}) runs out in "
            f"~{steps_left:,.0f} steps{when}, around step {oom_step:,}"
        )
        evidence |= {"available_bytes": int(available), "steps_left": steps_left, "oom_step": oom_step}
    return [
        Finding(
            kind="memory_growth",
            severity="warning",
            ranks=tuple(ranks),
            steps=(int(worst.first_step), last_step),
            text=text,
            evidence=evidence,
            page="memory",
        )
    ]
