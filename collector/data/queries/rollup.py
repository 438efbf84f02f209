"""The comm rollup: per (rank, step, group, op, message size) sums of a run's comm records.

Speed on big runs comes from it: one pass over a run's comm records (grouped per collective
instance to find arrival delays) aggregated to (rank, step, group, op, message size). Page
queries (collector.data.queries.comm) then read that rollup, tens of thousands of rows, instead
of millions of raw records. Retention stores it (``comm_steps``) for the steps it thins out.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from collector.data import clocks
from collector.data.instances import instances_sql, join_condition
from collector.data.queries.connection import Catalog
from collector.data.schema import COMM_STEPS_SCHEMA


# Arrival delay, wait and "last to arrive" per collective instance (collector.data.instances),
# computed with a per-instance GROUP BY joined back to the records. Records without a group or
# seq keep their bandwidth and get no delay (the LEFT JOIN finds no instance).
def rollup_sql(records: str) -> str:
    """The comm rollup (COMM_STEPS_SCHEMA's columns) of ``records``, a relation with the comm
    columns rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs.
    The dashboard runs it over the raw rows not yet rolled up; retention (compaction) over the
    rows of the steps it is about to thin out, and stores the result as ``comm_steps``. A rank
    whose clock is still off beyond clocks.BOUND_NS has its times moved first (collector.data.clocks)."""
    return f"""
    WITH raw AS MATERIALIZED ({records}),
    fix AS MATERIALIZED ({clocks.fixes_sql("raw")}),
    c AS ({clocks.fixed_sql("raw", "fix")}),
    inst AS ({instances_sql("c")})
    SELECT c.rank, c.step, c.group_name, c.op, c.bytes,
           count(*) AS n, sum(c.end_ns - c.start_ns)::BIGINT AS dur_ns,
           sum(c.algbw_gbs) AS algbw_sum, sum(c.busbw_gbs) AS busbw_sum,
           sum(c.start_ns - i.first_ns)::BIGINT AS delay_sum_ns, max(c.start_ns - i.first_ns) AS delay_max_ns,
           sum(i.last_ns - c.start_ns)::BIGINT AS wait_sum_ns,
           count(*) FILTER (WHERE c.rank = i.last_rank AND i.n_ranks > 1) AS n_last,
           coalesce(sum(c.start_ns - i.first_ns) FILTER (WHERE c.rank = i.last_rank AND i.n_ranks > 1), 0)::BIGINT
               AS last_delay_sum_ns
    FROM c LEFT JOIN inst i ON {join_condition("c", "i")}
    GROUP BY ALL"""


ROLLUP_COLUMNS = ", ".join(f'"{f.name}"' for f in COMM_STEPS_SCHEMA)

# Steps retention rolled up come from the stored rollup (their raw rows are thinned out); the
# steps after them from the raw rows. The two never overlap: raw rows of rolled-up steps that
# retention kept (every Nth step, steps with findings) are only for the drill-down. Only steps
# after the given one are read (Parquet min/max statistics skip the segments of earlier steps).
# Parameters: run_id, run_id, after, run_id, after.
COMM_ROLLUP_SQL = f"""
    WITH rolled AS (SELECT coalesce(max(step), -1) AS through FROM comm_steps WHERE run_id = ?),
    fresh AS ({
    rollup_sql(
        "SELECT rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs "
        "FROM comm WHERE run_id = ? AND step > greatest((SELECT through FROM rolled), ?)"
    )
})
    SELECT {ROLLUP_COLUMNS} FROM comm_steps WHERE run_id = ? AND step > ?
    UNION ALL
    SELECT {ROLLUP_COLUMNS} FROM fresh"""

# Steps count from 0: the rollup never held an earlier one (the raw rows it reads are those after
# ``through``, which is -1 before retention rolled anything up).
BEFORE_FIRST_STEP = -1


def comm_rollup(cat: Catalog, run_id: str) -> pa.Table:
    """Per (rank, step, group, op, bytes) sums of a run's comm records (immutable Arrow)."""
    return comm_rollup_after(cat, run_id, BEFORE_FIRST_STEP)


def comm_rollup_after(cat: Catalog, run_id: str, step: int) -> pa.Table:
    """``comm_rollup``'s rows of the steps after ``step`` only: a live run's new steps, without
    re-reading the old ones (collective instances never span steps, so the steps up to ``step``
    keep the rows the dashboard already holds)."""
    return cat.arrow(COMM_ROLLUP_SQL, [run_id, run_id, int(step), run_id, int(step)])


def rolled_through(cat: Catalog, run_id: str) -> int | None:
    """The last step of the run's stored per-step rollup (``comm_steps``); None before the first."""
    value = cat.df("SELECT max(step) AS step FROM comm_steps WHERE run_id = ?", [run_id]).step.iloc[0]
    return None if pd.isna(value) else int(value)


def retention(cat: Catalog, run_id: str) -> dict | None:
    """Where retention thinned a run out: {"through": last rolled-up step, "steps": rolled-up
    steps, "raw_steps": of those, the ones whose raw rows were kept}; None if it did not."""
    row = cat.df(
        """
        WITH rolled AS (SELECT max(step) AS through, count(DISTINCT step) AS steps FROM comm_steps WHERE run_id = ?)
        SELECT through, steps,
               (SELECT count(DISTINCT step) FROM comm WHERE run_id = ? AND step <= through) AS raw_steps
        FROM rolled""",
        [run_id, run_id],
    ).iloc[0]
    if pd.isna(row.through) or row.raw_steps >= row.steps:
        return None  # rolled up, nothing thinned out
    return {"through": int(row.through), "steps": int(row.steps), "raw_steps": int(row.raw_steps)}


def raw_steps_near(cat: Catalog, run_id: str, step: int, k: int = 5) -> list[int]:
    """The ``k`` steps nearest ``step`` whose raw comm rows are kept (for the drill-down)."""
    return [
        int(x)
        for x in cat.df(
            "SELECT DISTINCT step FROM comm WHERE run_id = ? ORDER BY abs(step - ?), step LIMIT ?",
            [run_id, int(step), int(k)],
        ).step
    ]
