"""Silent ranks: no heartbeat for ``SILENT_AFTER_PERIODS`` heartbeat periods while the
rank has not ended (a frozen, stopped or GIL-bound process), and ranks that are gone
without ending the run (their stream closed without RunEnd, or the rest of the run
ended without them).

Silence is measured against the other ranks first (``behind_s``: the run's newest
heartbeat minus the rank's), which is free of delivery delay and of the reader's
clock, so a busy collector or a loaded machine raises no false alarm. When every
rank is quiet (the whole job frozen), only the reader's clock can tell: then the
threshold gets ``DELIVERY_GRACE_S`` more.

Input: queries.rank_liveness (rank, step, period_s, silent_s, behind_s, ended, gone,
unresponsive, run_status), one row per rank that sent heartbeats; ranks that never
did (older clients, imported runs) are not judged. Ranks in the same situation share
one finding, so a 1,024-rank job that lost a node gets one line, not 8.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label

SILENT_AFTER_PERIODS = 3
DELIVERY_GRACE_S = 10.0


def _steps(rows: pd.DataFrame) -> tuple[int, int]:
    return int(rows.step.min()), int(rows.step.max())


def silent_ranks(liveness: pd.DataFrame) -> list[Finding]:
    if liveness.empty:
        return []
    open_ = liveness[~liveness.ended.astype(bool)]
    limit = SILENT_AFTER_PERIODS * open_.period_s.fillna(1.0)
    quiet = (open_.behind_s > limit) | (open_.silent_s > limit + DELIVERY_GRACE_S)
    # gone: its stream closed without RunEnd; or quiet by the reader's clock, grace included,
    # while the rest of the run has ended (a rank whose own RunEnd is still on its way is not)
    run_over = open_.run_status.isin(["finished", "failed"])
    stopped = open_[open_.gone.astype(bool) | (run_over & (open_.silent_s > limit + DELIVERY_GRACE_S))]
    silent = open_[~open_.index.isin(stopped.index) & quiet]
    found = []
    if len(stopped):
        first, last = _steps(stopped)
        at = f"step {first}" if first == last else f"steps {first}-{last}"
        found.append(
            Finding(
                kind="rank_stopped",
                severity="critical",
                ranks=tuple(int(r) for r in stopped["rank"]),
                steps=(first, last),
                text=f"{ranks_label(stopped['rank'])} stopped at {at} without ending the run",
                evidence={"ranks": [int(r) for r in stopped["rank"]], "steps": [first, last]},
                page="liveness",
            )
        )
    if len(silent):
        first, last = _steps(silent)
        unanswered = silent[silent.unresponsive.astype(bool)]
        note = (
            f"; {ranks_label(unanswered['rank'])} did not answer a stack request (process stopped or GIL held)"
            if len(unanswered)
            else ""
        )
        found.append(
            Finding(
                kind="silent_rank",
                severity="critical",
                ranks=tuple(int(r) for r in silent["rank"]),
                steps=(first, last),
                text=f"{ranks_label(silent['rank'])} silent for {silent.silent_s.max():.0f} s "
                f"(no heartbeat since step {first if first == last else f'{first}-{last}'}){note}",
                evidence={
                    "ranks": [int(r) for r in silent["rank"]],
                    "silent_s": float(silent.silent_s.max()),
                    "unresponsive": [int(r) for r in unanswered["rank"]],
                },
                page="liveness",
            )
        )
    return found
