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
    if s >= 3600 * 0.995:  # what rounds to 1.0 h is said in hours, not as 60.0 min
        return f"{s / 3600:.1f} h"
    if s >= 60 * 0.995:
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


# A change of the wall clock against the monotonic one this large between two steps is a step of the
# clock: NTP slews at most 500 ppm (0.5 ms a second), so even an hour between steps stays far below it.
STEP_S = 1.0


def clock_steps(signals: pd.DataFrame | None) -> list[Finding]:
    """One warning per clock step (ranks whose host clock jumped by the same amount at the same step
    are one), from signals_by_step's ``wall_drift_s``. Rankscope's own times never move with it (they
    run on each rank's monotonic clock from one anchor), so this is about everything else on the host."""
    if signals is None or signals.empty or "wall_drift_s" not in signals:
        return []
    rows = signals.dropna(subset=["wall_drift_s"]).sort_values(["rank", "step"])
    by_rank = rows.groupby("rank")
    # the step of the sample before: the clock stepped after it, by the first sample that saw it
    rows = rows.assign(jump_s=by_rank.wall_drift_s.diff(), after=by_rank.step.shift())
    jumps = rows[rows.jump_s.abs() >= STEP_S]
    found = []
    for (step, _), same in jumps.groupby([jumps.step, jumps.jump_s.round()]):
        ranks = tuple(sorted(int(r) for r in same["rank"]))
        jump_s, first = float(same.jump_s.median()), int(same.after.max())
        when = f"at step {int(step)}" if first >= step - 1 else f"between steps {first} and {int(step)}"
        whose = f"{ranks_label(ranks)}'s system clock" + ("s" if len(ranks) > 1 else "")
        text = (
            f"{whose} stepped {'back' if jump_s < 0 else 'forward'} {span(jump_s * 1e9)} {when} (the wall "
            "clock against the monotonic one: an NTP step or a manual change); rankscope's times keep the run's "
            "time line, but logs, file times and timeouts read on the wall clock there jump with it"
        )
        found.append(
            Finding(
                kind="clock_step",
                severity="warning",
                text=text,
                ranks=ranks,
                steps=(min(first + 1, int(step)), int(step)),
                evidence={"jump_s": jump_s, "ranks": ranks_label(ranks)},
                page="stragglers",
            )
        )
    return found
