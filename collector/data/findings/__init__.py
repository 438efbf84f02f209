"""Diagnoses of a run, each a pure function of query results (one module per analysis),
and the front that runs them all for the Overview and ``rankscope health``.

    from collector.data import findings, queries
    cat = queries.Catalog(data_dir)
    for f in findings.for_run(cat, run_id):
        print(f.severity, f.text)

Each analysis module takes the frames collector.data.queries returns and gives
a list of ``Finding`` (collector.data.findings.model), so it can be tested on
hand-made frames, both where it must fire and where it must stay silent.
"""

from __future__ import annotations

import pandas as pd

from collector.data import queries
from collector.data.calibration import load as load_calibration
from collector.data.findings.clock import clock_steps, implausible_clocks
from collector.data.findings.communication import exposed_communication
from collector.data.findings.desync import mismatched_collectives
from collector.data.findings.gaps import network_gaps
from collector.data.findings.hang import stuck_collectives
from collector.data.findings.links import MIN_BYTES as LINK_MIN_BYTES
from collector.data.findings.links import slow_links
from collector.data.findings.loss import loss_anomalies
from collector.data.findings.loss_scale import loss_scale_falls
from collector.data.findings.memory import memory_growth
from collector.data.findings.messages import engine_of, has_point_to_point, small_messages
from collector.data.findings.model import Finding, duration, exit_code, pct, ranked
from collector.data.findings.moe import expert_imbalance
from collector.data.findings.pipeline import pipelined, stage_imbalance, too_few_micro_batches
from collector.data.findings.silent import silent_ranks
from collector.data.findings.stragglers import costly_ranks
from collector.data.findings.whatif import savings, whatif_findings
from collector.data.pipeline import stage_bubbles

__all__ = [
    "ATTENTION_KINDS",
    "Finding",
    "duration",
    "exit_code",
    "for_run",
    "liveness_findings",
    "pct",
    "ranked",
    "summarize",
]

# what the dashboard's banner shows: liveness_findings' kinds, and stuck (the live collector's alone)
ATTENTION_KINDS = ("hang", "stuck", "desync", "rank_stopped", "silent_rank")


def liveness_findings(hangs: pd.DataFrame, desyncs: pd.DataFrame, liveness: pd.DataFrame) -> list[Finding]:
    """The critical, current ones: hangs, collective mismatches, silent and stopped ranks
    (what the dashboard's banner shows on every page)."""
    return ranked(stuck_collectives(hangs) + mismatched_collectives(desyncs) + silent_ranks(liveness))


def summarize(
    *,
    steps: pd.DataFrame,
    log_summary: pd.DataFrame,
    scales: pd.DataFrame,
    world_size: int,
    source: str | None = None,
    config: str | None = None,
    signals: pd.DataFrame | None = None,
    hangs: pd.DataFrame | None = None,
    desyncs: pd.DataFrame | None = None,
    liveness: pd.DataFrame | None = None,
    moe: pd.DataFrame | None = None,
    losses: pd.DataFrame | None = None,
    memory: pd.DataFrame | None = None,
    clock: pd.DataFrame | None = None,
    links: tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame] | None = None,
    pipeline: pd.DataFrame | None = None,
    deliveries: pd.DataFrame | None = None,
    calibration: pd.DataFrame | None = None,
    whatif: dict | None = None,
    probes: pd.DataFrame | None = None,
) -> list[Finding]:
    """Every rule over one run's query results, most urgent first. ``steps`` is
    queries.step_analysis; ``log_summary`` is queries.log_summary over queries.training_filter;
    ``source`` and ``config`` are the run's (they decide which
    configuration keys advice may name); ``signals`` is queries.signals_by_step (what explains
    a straggler); the liveness frames are optional (runs without heartbeats have nothing for them);
    ``moe`` is queries.moe_load (runs without MoE layers have none); ``losses`` queries.loss_series;
    ``memory`` queries.memory_trend; ``clock`` queries.clock_skew (ranks whose clock is off);
    ``links`` (queries.link_transfers, queries.group_members, queries.ranks): slow links, and
    ``deliveries`` (queries.deliveries) which host's link where two explain it alike, ``calibration``
    (collector.data.calibration.load's) what a transfer should cost on the run's hosts, ``probes``
    (queries.probes) the link probes made while it was slow;
    ``pipeline`` (collector.data.pipeline.stage_bubbles): stage imbalance and bubbles; on a pipeline
    run they, not the communication notes, speak for the stages' point-to-point traffic; ``whatif``
    (collector.data.whatif.for_run's result, where the run has ops it models): which cause the
    dependency-graph replay shows (one worker, a slowdown moving across workers, a long last stage)."""
    engine, stage = engine_of(source, config)
    piped = pipelined(pipeline) and has_point_to_point(log_summary)
    empty = pd.DataFrame()
    return _one_story(
        liveness_findings(
            hangs if hangs is not None else empty,
            desyncs if desyncs is not None else empty,
            liveness if liveness is not None else empty,
        )
        + costly_ranks(steps, world_size, signals, savings(whatif))
        + exposed_communication(steps, piped)
        + small_messages(log_summary, engine, stage, piped)
        + loss_scale_falls(scales)
        + expert_imbalance(moe)
        + loss_anomalies(losses)
        + memory_growth(memory)
        + implausible_clocks(clock)
        + clock_steps(signals)
        + (slow_links(*links, steps, deliveries, calibration, signals, probes) if links is not None else [])
        + stage_imbalance(pipeline)
        + too_few_micro_batches(pipeline)
        + whatif_findings(whatif, signals)
        + network_gaps(deliveries, links[2] if links is not None else None)
    )


def _one_story(found: list[Finding]) -> list[Finding]:
    """Most urgent first, and each rank's trouble told once: a rank a hang waits for is named
    by the hang, not again as a straggler for the steps it was late before it stopped; ranks
    late because their link was slow are the slow link's, not stragglers."""
    hung = {r for f in found if f.kind == "hang" for r in f.evidence.get("missing_ranks", ())}
    link = [f for f in found if f.kind == "slow_link"]
    # where the what-if replay modelled the steps (a 3D-parallel trace, a pipeline), its verdict
    # tells the story: a slowdown moving across workers step by step is no straggler per rank, and
    # of a slow worker's stragglers only the one naming that worker alone stays (arrival lateness
    # also names the ranks waiting downstream of it: AR's last stage at the clip's all_reduce)
    # (a data-parallel-only run's verdict is a note: there the stragglers name the ranks, at the
    # replay's saving as their cost, and a note naming the worker a straggler names says it twice)
    moving = any(f.kind == "whatif_moving" and f.severity == "warning" for f in found)
    worst = [set(f.ranks) for f in found if f.kind == "whatif_worker" and f.severity == "warning"]
    named = {f.ranks for f in found if f.kind == "straggler"}
    return ranked(
        [
            f
            for f in found
            if not (f.kind == "whatif_worker" and f.severity == "info" and f.ranks in named)
            and not (f.kind == "straggler" and hung and set(f.ranks) <= hung)
            and not (f.kind == "straggler" and any(_explained_by(f, x) for x in link))
            and not (f.kind == "straggler" and (moving or any(not set(f.ranks) <= w for w in worst)))
            and not (f.kind in _WHATIF_STRAGGLERS and any(_replayed_link(f, x) for x in link))
        ]
    )


# the what-if verdicts a slow link's stretched collectives make (the replay cannot tell them from slow ops)
_WHATIF_STRAGGLERS = ("whatif_worker", "whatif_spread", "whatif_moving", "whatif_stage")


def _replayed_link(whatif: Finding, link: Finding) -> bool:
    """A what-if straggler verdict whose slowest worker used the slow link: the replay sees the
    link's stretched collectives as that worker's slow ops (a slow pipeline stage's DP all_reduce
    over it, say); the link tells the story, and ``rankscope whatif`` still shows the figures."""
    workers = list(whatif.evidence.get("top_workers") or {})
    affected = set(link.evidence.get("affected_ranks", ()))
    return bool(workers) and int(workers[0]) in affected


def _explained_by(straggler: Finding, link: Finding) -> bool:
    """A straggler whose ranks all used the slow link, late while it was slow: a rank still
    moving data over a slow link arrives late at its next collective (a compute straggler on
    such a host at the same time is told as the link: one story per rank)."""
    affected = set(link.evidence.get("affected_ranks", ()))
    if not affected or not set(straggler.ranks) <= affected or straggler.steps is None or link.steps is None:
        return False
    return straggler.steps[0] <= link.steps[1] and link.steps[0] <= straggler.steps[1]


_REPLAY = object()  # for_run's default: replay the run here


def for_run(
    cat: queries.Catalog,
    run_id: str,
    world_size: int | None = None,
    rollup=None,
    steps: pd.DataFrame | None = None,
    replay=_REPLAY,
) -> list[Finding]:
    """Run the queries and every rule for one run (``rollup``: its comm rollup, ``steps``: its
    queries.step_analysis, ``replay``: its what-if replay as whatif.replay_or_none gives it, where
    the caller has them)."""
    from collector.data import whatif

    run = queries.run_info(cat, run_id) or {}
    if world_size is None:
        world_size = int(run.get("world_size") or 1)
    if rollup is None:
        rollup = queries.comm_rollup(cat, run_id)
    ranks = queries.ranks(cat, run_id)

    def written(table: str, query) -> pd.DataFrame:  # a table the run never wrote needs no query
        return query(cat, run_id) if cat.has_rows(table, run_id) else pd.DataFrame()

    return summarize(
        steps=steps if steps is not None else queries.step_analysis(cat, run_id),
        log_summary=queries.log_summary(rollup, queries.training_filter(queries.comm_dimensions(rollup))),
        scales=written("loss_scale", queries.loss_scale),
        world_size=world_size,
        source=run.get("source"),
        config=run.get("config"),
        signals=queries.signals_by_step(cat, run_id),
        hangs=queries.hangs(cat, run_id),
        desyncs=queries.desyncs(cat, run_id),
        liveness=queries.rank_liveness(cat, run_id),
        moe=written("moe", queries.moe_load),
        losses=queries.loss_series(cat, run_id),
        memory=queries.memory_trend(cat, run_id),
        clock=queries.clock_skew(cat, run_id),
        links=(queries.link_transfers(rollup, LINK_MIN_BYTES), queries.group_members(rollup), ranks),
        pipeline=stage_bubbles(cat, run_id),
        deliveries=queries.deliveries(cat, run_id),
        probes=queries.probes(cat, run_id),
        calibration=load_calibration(cat.data_dir, ranks.host.dropna().unique()),
        whatif=whatif.replay_or_none(cat, run_id) if replay is _REPLAY else replay,
    )
