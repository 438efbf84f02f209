"""The query layer: every SQL statement the product runs, one module per concept.

Values from the user or from run names always travel as DuckDB ``?`` (or ``$name``)
parameters. Results come back as pandas frames (Arrow for the rollup). Nothing here
caches: the dashboard (app/queries.py) caches these per run *data version*, the health
command calls them once.

- ``connection``: ``Catalog`` (a data dir's catalog; each query on its own cursor, pinned to
  one snapshot) and the in-memory engine the rollup pages run on.
- ``runs``: the run list, a run by id or name, its data version, its ranks.
- ``rollup``: the comm rollup (per rank, step, group, op, message size), stored or fresh.
- ``comm``: the Comms and Stragglers pages over the rollup (``CommFilter``), and the links'.
- ``steps``: step analysis (exposed communication, straggler cost).
- ``series``: per-step series the run recorded (timers, monitor tags, loss scale, memory, MoE).
- ``signals``: root-cause signals and the memory trend.
- ``liveness``: hangs, mismatches, silent ranks, stacks, the wavefront.
- ``metrics``: what the collector's /metrics endpoint reads.
- ``console``: user SQL through the read-only guard.
- ``export``: ``rankscope export``'s statements (Perfetto, archive, Parquet, Flight Recorder).

The catalog's views themselves are collector/data/views.py. Speed on big runs comes from the
per-step rollups (see ``rollup``): a rollup is keyed by the run's *data version* (the names,
sizes and mtimes of its Parquet segments), so it is rebuilt exactly when new segments land:
segments are immutable once renamed into place, which makes the version a complete cache
key and lets finished runs stay cached while live ones refresh.

Callers import the package (``from collector.data import queries``; ``queries.hangs(cat, run)``):
every public name of the modules is here.
"""

from __future__ import annotations

from collector.data.queries.comm import (
    CommFilter,
    bandwidth_by_size,
    bandwidth_by_step,
    binned_delay,
    busbw_by_step_size,
    clock_skew,
    comm_by_rank,
    comm_dimensions,
    delay_heatmap,
    group_members,
    instances_at,
    last_arrivals,
    link_transfers,
    log_summary,
    training_filter,
)
from collector.data.queries.connection import MAX_SKIPPED_PER_QUERY, Catalog, DataDirError
from collector.data.queries.console import console_query
from collector.data.queries.liveness import (
    HANG_COLUMNS,
    WAVEFRONT_MAX_ROWS,
    desyncs,
    hangs,
    rank_liveness,
    stacks,
    wavefront,
)
from collector.data.queries.metrics import last_arrival_share, live_runs, recent_busbw, recent_rank_steps
from collector.data.queries.rollup import (
    COMM_ROLLUP_SQL,
    ROLLUP_COLUMNS,
    comm_rollup,
    comm_rollup_after,
    raw_steps_near,
    retention,
    rolled_through,
    rollup_sql,
)
from collector.data.queries.runs import (
    UnknownRun,
    data_version,
    deliveries,
    latest_step,
    list_runs,
    probes,
    ranks,
    resolve_run,
    run_info,
    runs_with,
)
from collector.data.queries.series import (
    flops_profile,
    loss_scale,
    loss_series,
    memory_lines,
    moe_load,
    monitor_series,
    step_breakdown,
    step_wall_ms,
)
from collector.data.queries.signals import memory_trend, signals_by_step
from collector.data.queries.steps import COMPUTE_TIMERS, analyse_steps, step_analysis, step_analysis_of
from collector.data.queries.whatif import whatif_collectives, whatif_ops, whatif_pipe_ops

__all__ = [
    "COMM_ROLLUP_SQL",
    "COMPUTE_TIMERS",
    "HANG_COLUMNS",
    "MAX_SKIPPED_PER_QUERY",
    "ROLLUP_COLUMNS",
    "WAVEFRONT_MAX_ROWS",
    "Catalog",
    "CommFilter",
    "DataDirError",
    "UnknownRun",
    "analyse_steps",
    "bandwidth_by_size",
    "bandwidth_by_step",
    "binned_delay",
    "busbw_by_step_size",
    "clock_skew",
    "comm_by_rank",
    "comm_dimensions",
    "comm_rollup",
    "comm_rollup_after",
    "console_query",
    "data_version",
    "delay_heatmap",
    "deliveries",
    "desyncs",
    "flops_profile",
    "group_members",
    "hangs",
    "instances_at",
    "last_arrival_share",
    "last_arrivals",
    "latest_step",
    "link_transfers",
    "list_runs",
    "live_runs",
    "log_summary",
    "loss_scale",
    "loss_series",
    "memory_lines",
    "memory_trend",
    "moe_load",
    "monitor_series",
    "probes",
    "rank_liveness",
    "ranks",
    "raw_steps_near",
    "recent_busbw",
    "recent_rank_steps",
    "resolve_run",
    "retention",
    "rolled_through",
    "rollup_sql",
    "run_info",
    "runs_with",
    "signals_by_step",
    "stacks",
    "step_analysis",
    "step_analysis_of",
    "step_breakdown",
    "step_wall_ms",
    "training_filter",
    "wavefront",
    "whatif_collectives",
    "whatif_ops",
    "whatif_pipe_ops",
]
