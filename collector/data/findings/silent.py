"""Silent ranks: no heartbeat for ``SILENT_AFTER_PERIODS`` heartbeat periods while the
rank has not ended (a frozen, stopped or GIL-bound process), and ranks that are gone
without ending the run (their stream closed without RunEnd, or the rest of the run
ended without them).

Silence is measured against the other ranks first (``behind_s``: the run's newest
heartbeat minus the rank's), which is free of delivery delay and of the reader's
clock, so a busy collector or a loaded machine raises no false alarm. When every
rank is quiet (the whole job frozen), only the reader's clock can tell: then the
threshold gets ``DELIVERY_GRACE_S`` more.

Input: queries.rank_liveness (rank, step, period_s, silent_s, behind_s, ended, gone, gone_ns,
unresponsive, run_status), one row per rank that sent heartbeats; ranks that never
did (older clients, imported runs) are not judged. Ranks in the same situation share
one finding, so a 1,024-rank job that lost a node gets one line, not 8.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, ranks_label

SILENT_AFTER_PERIODS = 3
DELIVERY_GRACE_S = 10.0
FIRST_LEAD_S = 0.05


def _steps(rows: pd.DataFrame) -> tuple[int, int]:
    return int(rows.step.min()), int(rows.step.max())


def _first_gone(stopped: pd.DataFrame) -> tuple[list[int], float, list[int]] | None:
    """The ranks whose connections closed first, when they closed at least FIRST_LEAD_S before every
    other stopped rank's: a crash takes its own process at once and the others only after their
    launcher (torchrun) or their next collective notices (100+ ms); a job killed whole closes them
    within a few ms. (ranks, lead in s, the rest), or None."""
    if "gone_ns" not in stopped or stopped.gone_ns.isna().any() or len(stopped) < 2:
        return None
    times = stopped.set_index("rank").gone_ns.astype("int64").sort_values()
    gaps = times.diff().iloc[1:]
    cut = int(gaps.to_numpy().argmax()) + 1  # the largest gap splits the first from the rest
    lead = float(gaps.iloc[cut - 1]) / 1e9
    if lead < FIRST_LEAD_S or cut > len(times) / 2:
        return None
    return [int(r) for r in times.index[:cut]], lead, [int(r) for r in times.index[cut:]]


def silent_ranks(liveness: pd.DataFrame) -> list[Finding]:
    if liveness.empty:
        return []
    open_ = liveness[~liveness.ended.astype(bool)]
    limit = SILENT_AFTER_PERIODS * open_.period_s.fillna(1.0)
    quiet = (open_.behind_s > limit) | (open_.silent_s > limit + DELIVERY_GRACE_S)
    # gone: its stream closed without RunEnd; or quiet by the reader's clock, grace included,
    # while the rest of the run has ended (a rank whose own RunEnd is still on its way is not)
    run_over = open_.run_status.isin(["finished", "failed", "stopped"])
    stopped = open_[open_.gone.astype(bool) | (run_over & (open_.silent_s > limit + DELIVERY_GRACE_S))]
    silent = open_[~open_.index.isin(stopped.index) & quiet]
    found = []
    if len(stopped):
        first, last = _steps(stopped)
        at = f"step {first}" if first == last else f"steps {first}-{last}"
        text = f"{ranks_label(stopped['rank'])} stopped at {at} without ending the run"
        evidence = {"ranks": [int(r) for r in stopped["rank"]], "steps": [first, last]}
        origin = _first_gone(stopped)
        if origin is not None:
            ranks, lead_s, rest = origin
            text = (
                f"{ranks_label(ranks)} stopped first, at step {int(stopped.set_index('rank').step[ranks[0]])} "
                f"(connection closed without ending the run, {1e3 * lead_s:.0f} ms before the others'): "
                f"crashed or killed; {ranks_label(rest)} stopped after it"
            )
            evidence |= {"first_ranks": ranks, "lead_s": lead_s}
        found.append(
            Finding(
                kind="rank_stopped",
                severity="critical",
                ranks=tuple(int(r) for r in stopped["rank"]),
                steps=(first, last),
                text=text,
                evidence=evidence,
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
