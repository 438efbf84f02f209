"""Root-cause signals: what may explain a rank's late arrival (GC, data loading, CPU, tokens) and
its memory trend, read for findings.causes and findings.memory."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from collector.data import layout
from collector.data.queries.connection import Catalog


def _has_segments(data_dir: str, table: str, run_id: str) -> bool:
    part = layout.partition_dir(Path(data_dir), table, run_id)
    return part.is_dir() and any(part.glob(f"*{layout.SEGMENT_SUFFIX}"))


def memory_trend(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank, its resident memory's trend over the second half of its steps (the first half holds
    start-up and the warm-up's allocations; the last step's samples, taken as the session ends after
    the script let go of its objects, are left out): the least-squares slope per second and its r2,
    the RSS at both ends, the steps per second, the host's available memory at the end
    (findings.memory). Empty without host samples."""
    if not _has_segments(cat.data_dir, "host", run_id):
        return pd.DataFrame()
    return cat.df(
        """
        WITH h AS (SELECT rank, step, time_ns, rss_bytes, mem_available_bytes FROM host
                   WHERE run_id = ? AND rss_bytes > 0),
        span AS (SELECT rank, min(step) AS lo, max(step) AS hi FROM h GROUP BY rank),
        w AS (SELECT h.* FROM h JOIN span s USING (rank) WHERE h.step >= s.lo + (s.hi - s.lo) / 2
              AND h.step > s.lo AND h.step < s.hi)
        SELECT rank, regr_slope(rss_bytes, time_ns) * 1e9 AS bytes_per_s, regr_r2(rss_bytes, time_ns) AS r2,
               arg_min(rss_bytes, time_ns) AS first_rss, arg_max(rss_bytes, time_ns) AS last_rss,
               arg_max(mem_available_bytes, time_ns) AS available, min(step) AS first_step,
               max(step) AS last_step, (max(step) - min(step)) / nullif((max(time_ns) - min(time_ns)) / 1e9, 0)
               AS steps_per_s, count(*) AS samples
        FROM w GROUP BY rank ORDER BY rank""",
        [run_id],
    )


# The signal tables signals_by_step joins: table -> (its sums per rank and step, each signal's
# value once joined). GC pauses are 0 in a step without one; the others NULL where not recorded.
_SIGNAL_TABLES = {
    "gc": ("sum(dur_ns) / 1e6 AS gc_ms", {"gc_ms": "coalesce(gc.gc_ms, 0)"}),
    "between_steps": ("sum(dur_ns) / 1e6 AS between_steps_ms", {"between_steps_ms": "between_steps.between_steps_ms"}),
    "host": (
        "sum(runqueue_ns) / 1e6 AS runqueue_ms, sum(cpu_ns) / 1e6 AS cpu_ms, avg(cpu_util) AS cpu_util,"
        " avg(steal) AS steal, arg_max(wall_drift_ns, time_ns) / 1e9 AS wall_drift_s",
        {c: f"host.{c}" for c in ("runqueue_ms", "cpu_ms", "cpu_util", "steal", "wall_drift_s")},
    ),
    "batches": ("sum(tokens)::DOUBLE AS tokens", {"tokens": "batches.tokens"}),
}


def signals_by_step(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and step, what may explain a late arrival: gc_ms (Python GC pauses), data_ms (the
    wait for the batch, the engine's ``data`` timer), between_steps_ms (a hook run's wait from the
    step before's end to this step's first forward: data loading and host work), runqueue_ms and
    cpu_ms (time the process waited for a CPU and ran on one), cpu_util and steal (host shares),
    wall_drift_s (the host's system clock against the run's time line at the step's last sample: a
    change from one step to the next is a clock step), tokens (what the rank trained on).
    A signal the run did not record is NULL; runs recorded
    before a signal existed have no table for it, so it is not queried at all."""
    timers = (
        "SELECT rank, step, sum(dur_ns) FILTER (WHERE name = 'data') / 1e6 AS data_ms FROM timers"
        " WHERE run_id = ? GROUP BY rank, step"
    )
    params: list = [run_id]
    columns = ["t.data_ms"]
    joins = ""
    for table, (aggregates, signals) in _SIGNAL_TABLES.items():
        if _has_segments(cat.data_dir, table, run_id):
            joins += f" FULL JOIN (SELECT rank, step, {aggregates} FROM {table} WHERE run_id = ?"
            joins += f" GROUP BY rank, step) {table} USING (rank, step)"
            params.append(run_id)
            columns += [f"{value} AS {name}" for name, value in signals.items()]
        else:
            columns += [f"NULL::DOUBLE AS {name}" for name in signals]
    return cat.df(f"SELECT rank, step, {', '.join(columns)} FROM ({timers}) t{joins} ORDER BY rank, step", params)
