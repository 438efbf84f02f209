"""The what-if replay's verdict in words (collector.data.whatif): which cause the figures show.

- **one worker** (M_W, the share of the slowdown the top 3% of workers explain, at least
  ``ONE_WORKER_MW``): that worker by rank, dp_rank and stage, and what fixing it alone saves a step;
- **a slowdown that moves across workers** from step to step (the slowest worker of a step is
  a different one in most steps, and M_W is small): sequence-length or data imbalance, not a bad
  machine; a long last stage (M_S at least ``SECOND_CAUSE_MS``) is named as the second cause;
- **a long last stage** (M_S at least ``LONG_STAGE_MS``, and no moving slowdown; or M_S at least
  ``STAGE_ALONE_MS`` whatever moves: the OSDI'25 ST trace's slowest worker alternates between its
  last stage's two replicas): repartition,
  with what an even stage would save a step. Where the last stage explains as much as the worst
  workers (a pipeline of one replica: its last stage *is* one worker), the stage is named, not the
  worker; the one-worker verdict needs M_W above M_S.

- **the hosts' CPUs**: a spread or moving slowdown while every rank waited for a CPU about as long
  as it costs a step (queries.signals_by_step's runqueue): oversubscribed cores delay ops at random,
  the pattern data imbalance also makes; a note, not a warning.

A run whose slowdown S is under ``MIN_SLOWDOWN`` gets no finding: its steps are as fast as its
typical ops allow. On a data-parallel-only run (one stage) the verdict is a note: there the
``straggler`` findings (arrival lateness, with its onset, pattern and chance rules) decide whom to
name, at the replay's saving as their cost (``savings``), and a step's noise on a busy host is
not told as a cause. Pure functions of the replay's result dict.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pandas as pd

from collector.data.findings.model import Finding

MIN_SLOWDOWN = 1.05  # stragglers costing under 5% of a step are noise between steps
ONE_WORKER_MW = 0.5  # the top 3% of workers explain at least half the slowdown
LONG_STAGE_MS = 0.5
SECOND_CAUSE_MS = 0.3
STAGE_ALONE_MS = 0.9  # above it a long last stage is the whole story, however the slowest worker moves
MOVING_TOP_SHARE = 0.5  # the most frequent slowest worker is the slowest in under half the steps
# a spread or moving slowdown whose ranks waited for a CPU at least this share of its cost a step
# is the hosts' oversubscribed cores (ops delayed at random), said as a note
CPU_EXPLAINS = 0.5


def slowest_per_step(result: dict) -> list[int]:
    """The rank with the highest per-step worker slowdown, for each replayed step."""
    out = []
    for row in result["per_step"].values():
        by_worker = row["by_worker"]
        out.append(int(max(by_worker, key=lambda k: (by_worker[k], -int(k)))))
    return out


def describe(result: dict | None) -> Finding | None:
    """The one finding the figures support, or None (no replay, or no slowdown worth a word)."""
    if not result or result["slowdown"] < MIN_SLOWDOWN:
        return None
    s, m_w, m_s = result["slowdown"], result["m_w"], result["m_s"]
    steps = [int(k) for k in result["per_step"]]
    span = (min(steps), max(steps))
    lost_ms = (result["step_time_s"] - result["ideal_step_time_s"]) * 1e3
    evidence = {
        "slowdown": round(s, 4),
        "m_w": None if m_w is None else round(m_w, 4),
        "m_s": None if m_s is None else round(m_s, 4),
        "by_stage": result["by_stage"],
        "top_workers": dict(list(result["by_worker"].items())[:5]),
        "lost_ms_per_step": round(lost_ms, 1),
    }
    head = f"stragglers slow every step {s:.2f}x (what-if replay: {lost_ms:,.0f} ms a step lost)"
    tops = slowest_per_step(result)
    _, most_count = Counter(tops).most_common(1)[0]
    moving = most_count / len(tops) < MOVING_TOP_SHARE
    severity = "info" if result["last_stage"] == 0 else "warning"
    common = dict(severity=severity, steps=span, evidence=evidence, page="stragglers")
    # with one stage, "the last stage" is every worker: no partition to blame
    staged = result["last_stage"] > 0 and m_s is not None
    stage_first = staged and m_s >= LONG_STAGE_MS and (m_w is None or m_s >= m_w - 0.05)
    stage_alone = staged and m_s >= STAGE_ALONE_MS  # the last stage explains (nearly) all of it
    if m_w is not None and m_w >= ONE_WORKER_MW and not stage_first:
        rank = result["m_w_workers"][0]
        where = result["workers"][str(rank)]
        saved = result["m_w_saved_s"] * 1e3
        names = ", ".join(str(r) for r in result["m_w_workers"])
        who = f"rank {rank} (dp_rank {where['dp_rank']}, stage {where['stage']})"
        if len({w["dp_rank"] for w in result["workers"].values()}) == 1:  # one replica: a worker is a stage
            who += ", the only worker of its stage: a slow machine or a heavy stage"
        if len(result["m_w_workers"]) > 1:
            who += f" and its fellow worst ({names})"
        return Finding(
            kind="whatif_worker",
            text=f"{head}: one worker explains {m_w:.0%} of it: {who}; fixing it alone would save "
            f"{saved:,.0f} ms a step",
            ranks=tuple(result["m_w_workers"]),
            cost_ms_per_step=round(saved, 1),
            filters={"rank": rank},
            **common,
        )
    if moving and not stage_alone:
        distinct = len(set(tops))
        text = (
            f"{head}: the slowdown moves across workers from step to step ({distinct} different "
            f"workers are the slowest in {len(tops)} steps; the worst 3% explain only "
            f"{(m_w or 0):.0%}): sequence-length or data imbalance between micro-batches, not one bad worker"
        )
        if staged and m_s >= SECOND_CAUSE_MS:
            text += (
                f"; second cause, the last stage (stage {result['last_stage']}) is long: making it run like "
                f"the others would save {result['m_s_saved_s'] * 1e3:,.0f} ms a step (M_S {m_s:.0%}): repartition"
            )
        return Finding(kind="whatif_moving", text=text, cost_ms_per_step=round(lost_ms, 1), **common)
    if staged and m_s >= LONG_STAGE_MS:
        saved = result["m_s_saved_s"] * 1e3
        return Finding(
            kind="whatif_stage",
            text=f"{head}: the last stage (stage {result['last_stage']}) is long and explains {m_s:.0%} of it "
            f"(S by stage: {_by_stage(result)}): repartition the layers; an even split would save "
            f"{saved:,.0f} ms a step",
            cost_ms_per_step=round(saved, 1),
            filters={"stage": result["last_stage"]},
            **common,
        )
    top = next(iter(result["by_worker"]))
    return Finding(
        kind="whatif_spread",
        text=f"{head}: spread over several workers (the worst 3% explain {(m_w or 0):.0%}, the last stage "
        f"{(m_s or 0):.0%}); the slowest is rank {top} (rankscope whatif shows each)",
        cost_ms_per_step=round(lost_ms, 1),
        **common,
    )


def _by_stage(result: dict) -> str:
    """'3 1.23x, 0 1.00x, ...': each stage's S, largest first."""
    return ", ".join(f"{stage} {value:.2f}x" for stage, value in result["by_stage"].items())


def whatif_findings(result: dict | None, signals: pd.DataFrame | None = None) -> list[Finding]:
    """``describe``'s finding; ``signals`` (queries.signals_by_step): a slowdown spread over or
    moving across workers while the ranks waited for a CPU as long as it costs is the hosts' CPUs,
    not the data or the workers, and is told as a note that says so."""
    found = describe(result)
    if found is None:
        return []
    waited = _cpu_wait_ms(signals, found.steps)
    lost = found.evidence["lost_ms_per_step"]
    if found.kind in ("whatif_moving", "whatif_spread") and waited is not None and waited >= CPU_EXPLAINS * lost:
        text = (
            f"steps run {found.evidence['slowdown']:.2f}x their what-if ideal ({lost:,.0f} ms a step), spread "
            f"over the workers, while each rank waited {waited:,.0f} ms a step for a CPU: the hosts' cores are "
            "oversubscribed (more busy threads than cores), which delays ops at random; not one bad worker"
        )
        evidence = {**found.evidence, "cpu_wait_ms_per_step": round(waited, 1)}
        found = dataclasses.replace(found, kind="whatif_cpu", severity="info", text=text, evidence=evidence)
    return [found]


def _cpu_wait_ms(signals: pd.DataFrame | None, steps: tuple[int, int] | None) -> float | None:
    """The median over ranks of a rank's median wait for a CPU per step (runqueue) over ``steps``."""
    if signals is None or signals.empty or "runqueue_ms" not in signals or steps is None:
        return None
    rows = signals[(signals.step >= steps[0]) & (signals.step <= steps[1])].dropna(subset=["runqueue_ms"])
    if rows.empty:
        return None
    return float(rows.groupby("rank").runqueue_ms.median().median())


def savings(result: dict | None) -> pd.DataFrame | None:
    """Per step (index) and rank (columns): the ms a step that fixing that rank alone saves, for the
    replay's worst workers (replay.SAVED_WORKERS): the straggler findings' cost. None without a replay."""
    if not result or not result.get("per_step"):
        return None
    rows = {int(step): row.get("saved_s", {}) for step, row in result["per_step"].items()}
    out = pd.DataFrame.from_dict(rows, orient="index").sort_index() * 1e3
    out.columns = [int(c) for c in out.columns]
    return out if len(out.columns) else None
