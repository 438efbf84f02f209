"""Ranks whose clock is off rank 0's beyond what their start-up offset covered.

``queries.clock_skew`` gives, per rank, the offset it measured at start (its Hello's) and the
residual left over, measured from when synchronising collectives ended (collector.data.clocks).
Beyond ``clocks.BOUND_NS`` the rank's comm and step times have been corrected by the residual
before anyone was judged late (step analysis, the comm rollup), so its lateness is its real one;
this finding says so, with the offset measured, since the start-up estimate failed and times
outside those analyses (sample timelines, stacks) still carry the error. A warning: the run is
not "healthy" with a clock hours off, and the fix (NTP on that host, or the offset estimate
skipped for it) is the user's to make.
"""

from __future__ import annotations

import pandas as pd

from collector.data import clocks
from collector.data.findings.model import Finding, ranks_label

NAMED = 3  # ranks named with their offset in the sentence; more are counted


def span(ns: float) -> str:
    """A clock offset for people: '3.0 h', '12.5 min', '4.2 s'."""
    s = abs(ns) / 1e9
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def implausible_clocks(skew: pd.DataFrame | None) -> list[Finding]:
    """One warning naming every rank whose residual is beyond the bound (empty frame: none)."""
    if skew is None or skew.empty:
        return []
    off = skew[skew.residual_ns.abs() > clocks.BOUND_NS].sort_values("residual_ns", key=abs, ascending=False)
    if off.empty:
        return []
    ranks = tuple(sorted(int(r) for r in off["rank"]))
    parts = [
        f"rank {int(r.rank)}'s clock is {span(r.residual_ns)} {'ahead of' if r.residual_ns > 0 else 'behind'} rank 0's"
        for r in off.head(NAMED).itertuples()
    ]
    more = f" (and {len(off) - NAMED} more ranks)" if len(off) > NAMED else ""
    what = "its" if len(off) == 1 else "their"
    text = (
        f"{'; '.join(parts)}{more}, beyond the offset measured at start (judged from when collectives "
        f"ended): {what} times are corrected by that before judging who is late"
    )
    return [
        Finding(
            kind="clock",
            severity="warning",
            text=text,
            ranks=ranks,
            evidence={
                # each rank's clock minus rank 0's, in s: the start-up offset plus the residual
                "offsets_s": {str(int(r.rank)): (r.hello_offset_ns + r.residual_ns) / 1e9 for r in off.itertuples()},
                "residual_s": {str(int(r.rank)): r.residual_ns / 1e9 for r in off.itertuples()},
                "instances": {str(int(r.rank)): int(r.instances) for r in off.itertuples()},
                "bound_s": clocks.BOUND_NS / 1e9,
                "ranks": ranks_label(ranks),
            },
            page="stragglers",
        )
    ]
