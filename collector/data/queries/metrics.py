"""What the collector's /metrics endpoint reads (collector.server.metrics): live runs, and their
ranks' recent steps, bandwidth and share of last arrivals."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from collector.data.queries.connection import Catalog, on_rollup


def live_runs(cat: Catalog, ended_within_s: float, streaming=()) -> pd.DataFrame:
    """Runs still running, those that ended less than ``ended_within_s`` seconds ago, and those in
    ``streaming`` (a rank of them streams to the collector now, whatever their stored times say: a
    replayed or resumed run), newest first."""
    return cat.df(
        """
        SELECT run_id, name, status, world_size, started_at FROM runs
        WHERE status = 'running' OR ended_at::TIMESTAMPTZ >= now() - to_seconds(?::DOUBLE)
              OR list_contains(?::VARCHAR[], run_id)
        ORDER BY started_at DESC, run_id""",
        [float(ended_within_s), sorted(streaming)],
    )


def recent_rank_steps(cat: Catalog, run_id: str, window: int) -> pd.DataFrame:
    """Per rank over its last ``window`` finished steps (the newest step, still running, left out):
    the newest step seen and the mean step time (between the ends of consecutive steps' last
    collectives). Exposed communication is step_analysis's (findings.communication.recent_exposed_share)."""
    return cat.df(
        """
        WITH per_step AS (SELECT rank, step, max(end_ns) AS end_ns FROM comm WHERE run_id = ? GROUP BY rank, step),
        timed AS (
            SELECT rank, step,
                   end_ns - lag(end_ns) OVER (PARTITION BY rank ORDER BY step) AS step_ns,
                   row_number() OVER (PARTITION BY rank ORDER BY step DESC) AS age
            FROM per_step)
        SELECT rank, max(step) AS step, avg(step_ns) FILTER (WHERE age BETWEEN 2 AND ? + 1) / 1e9 AS step_time_s
        FROM timed GROUP BY rank ORDER BY rank""",
        [run_id, int(window)],
    )


def recent_busbw(cat: Catalog, run_id: str, window: int) -> pd.DataFrame:
    """Per rank and op: mean bus bandwidth (GB/s) over the last ``window`` steps."""
    return cat.df(
        """
        SELECT rank, op, avg(busbw_gbs) AS busbw_gbs FROM comm
        WHERE run_id = ? AND step > (SELECT max(step) FROM comm WHERE run_id = ?) - ?
        GROUP BY rank, op ORDER BY rank, op""",
        [run_id, run_id, int(window)],
    )


def last_arrival_share(rollup: pa.Table) -> pd.DataFrame:
    """Per rank: the share of the run's multi-rank collective instances it arrived last to."""
    return on_rollup(
        rollup,
        """
        SELECT rank, sum(n_last) / (SELECT sum(n_last) FROM r) AS share FROM r
        GROUP BY rank HAVING (SELECT sum(n_last) FROM r) > 0 ORDER BY rank""",
        [],
    )
