"""The health summary's per-step analysis as it was before the one-pass rewrite, kept only as the
same-run baseline of benches/health.py: three window passes building interval islands (comm, waiting,
imposed waits) and a second join of the records to their instances for the second-latest arrival."""

from __future__ import annotations

import pandas as pd

from collector.data.instances import instances_sql, join_condition
from collector.data.queries import Catalog

# (rank, step, name, start_ns, end_ns), so the same text runs on the catalog and on Arrow tables.


def _islands(source: str, start: str, end: str) -> str:
    """Per (rank, step), the union of the intervals [start, end) of ``source`` as disjoint islands
    (rank, step, s, e): sorted by start, a new island begins where an interval starts after every
    earlier one has ended. Window functions over the whole relation, no per-record loop."""
    return f"""
        SELECT rank, step, min({start}) AS s, max({end}) AS e FROM (
            SELECT *, sum(CASE WHEN reach IS NULL OR {start} > reach THEN 1 ELSE 0 END)
                          OVER (PARTITION BY rank, step ORDER BY {start}, {end} ROWS UNBOUNDED PRECEDING) AS island
            FROM (SELECT rank, step, {start}, {end},
                         lag(reach_incl) OVER (PARTITION BY rank, step ORDER BY {start}, {end}) AS reach
                  FROM (SELECT rank, step, {start}, {end},
                               max({end}) OVER (PARTITION BY rank, step ORDER BY {start}, {end}
                                                ROWS UNBOUNDED PRECEDING) AS reach_incl
                        FROM {source} WHERE {end} > {start})))
        GROUP BY rank, step, island"""


_STEP_ANALYSIS_BODY = f"""
    timed AS (SELECT EXISTS (SELECT 1 FROM t) AS yes),
    win AS MATERIALIZED (
        SELECT rank, step, min(start_ns) AS w0, max(end_ns) AS w1 FROM t GROUP BY rank, step
        UNION ALL
        SELECT rank, step, min(start_ns), max(end_ns) FROM c WHERE NOT (SELECT yes FROM timed) GROUP BY rank, step),
    cw AS MATERIALIZED (
        SELECT c.rank, c.step, c.group_name, c.seq, c.op, c.start_ns,
               greatest(c.start_ns, w.w0) AS s, least(c.end_ns, w.w1) AS e
        FROM c JOIN win w ON c.rank = w.rank AND c.step = w.step
        WHERE c.end_ns > w.w0 AND c.start_ns < w.w1),
    inst AS MATERIALIZED ({instances_sql("cw")}),
    iv AS MATERIALIZED (
        SELECT cw.rank, cw.step, cw.s, cw.e,
               least(greatest(coalesce(i.last_ns, cw.s), cw.s), cw.e) AS wait_e
        FROM cw LEFT JOIN inst i ON {join_condition("cw", "i")}),
    islands AS MATERIALIZED ({_islands("iv", "s", "e")}),
    comm_u AS (SELECT rank, step, sum(e - s) / 1e6 AS ms FROM islands GROUP BY rank, step),
    wait_u AS (SELECT rank, step, sum(e - s) / 1e6 AS ms FROM ({_islands("iv", "s", "wait_e")}) GROUP BY rank, step),
    overlap AS (
        SELECT u.rank, u.step, sum(greatest(0, least(u.e, t.end_ns) - greatest(u.s, t.start_ns))) / 1e6 AS ms
        FROM islands u JOIN t ON u.rank = t.rank AND u.step = t.step
        WHERE t.name IN ('fwd', 'bwd_inner')
        GROUP BY u.rank, u.step),
    late AS MATERIALIZED (
        SELECT any_value(cw.step) AS step, any_value(i.last_rank) AS rank, any_value(cw.op) AS op,
               max(cw.start_ns) FILTER (WHERE cw.rank <> i.last_rank) AS s, any_value(i.last_ns) AS e
        FROM cw JOIN inst i ON {join_condition("cw", "i")}
        WHERE i.n_ranks > 1
        GROUP BY cw.group_name, cw.seq),
    imposed AS (SELECT rank, step, sum(e - s) / 1e6 AS ms FROM ({_islands("late", "s", "e")}) GROUP BY rank, step),
    late_op AS (SELECT rank, step, arg_max(op, e - s) AS op FROM late GROUP BY rank, step),
    held AS (
        SELECT step, sum(e - s) / 1e6 AS ms
        FROM ({_islands("(SELECT -1 AS rank, step, s, e FROM late)", "s", "e")}) GROUP BY step)
    SELECT w.rank, w.step, (w.w1 - w.w0) / 1e6 AS step_ms,
           coalesce(cu.ms, 0) AS comm_ms, coalesce(wu.ms, 0) AS waiting_ms, coalesce(o.ms, 0) AS overlapped_ms,
           coalesce(im.ms, 0) AS imposed_ms, lo.op AS late_op, coalesce(h.ms, 0) AS held_ms,
           (SELECT yes FROM timed) AS timed
    FROM win w
    LEFT JOIN comm_u cu ON cu.rank = w.rank AND cu.step = w.step
    LEFT JOIN wait_u wu ON wu.rank = w.rank AND wu.step = w.step
    LEFT JOIN overlap o ON o.rank = w.rank AND o.step = w.step
    LEFT JOIN imposed im ON im.rank = w.rank AND im.step = w.step
    LEFT JOIN late_op lo ON lo.rank = w.rank AND lo.step = w.step
    LEFT JOIN held h ON h.step = w.step
    ORDER BY w.step, w.rank"""


def step_analysis(cat: Catalog, run_id: str) -> pd.DataFrame:
    """The old queries.step_analysis (same columns, same results)."""
    return cat.df(
        f"""
        WITH c AS MATERIALIZED (SELECT rank, step, group_name, seq, op, start_ns, end_ns FROM comm WHERE run_id = ?),
        offsets AS (SELECT rank, any_value(clock_offset_ns) AS off FROM ranks WHERE run_id = ? GROUP BY rank),
        t AS MATERIALIZED (
            SELECT tm.rank, tm.step, tm.name, tm.start_ns - coalesce(o.off, 0) AS start_ns,
                   tm.start_ns + tm.dur_ns - coalesce(o.off, 0) AS end_ns
            FROM timers tm LEFT JOIN offsets o ON o.rank = tm.rank
            WHERE tm.run_id = ? AND tm.start_ns IS NOT NULL AND tm.dur_ns IS NOT NULL),
        {_STEP_ANALYSIS_BODY}""",
        [run_id, run_id, run_id],
    )
