"""The SQL of retention's windows (collector.server.retention): a window's per-step comm rollup,
computed from its raw rows in memory, and the completed rows of its instances that it cannot
settle (odd, or not every rank of the group in it), which the desync check reads later."""

from __future__ import annotations

import duckdb
import pandas as pd
import pyarrow as pa

from collector.data.instances import SIGNATURES_DIFFER
from collector.data.queries.connection import Catalog
from collector.data.queries.rollup import rollup_sql
from collector.data.schema import COMM_STEPS_SCHEMA

ROLLUP_INPUT = "SELECT rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs FROM raw"

UNSETTLED_SQL = f"""
    WITH entered AS (
        SELECT rank, step, group_name, seq, op, dtype, numel, group_size FROM comm
        WHERE run_id = ? AND step > ? AND step <= ?
          AND seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')),
    unsettled AS (
        SELECT group_name, seq FROM entered GROUP BY ALL
        HAVING {SIGNATURES_DIFFER} OR count(DISTINCT rank) < coalesce(max(group_size), 0))
    SELECT rank, step, group_name, seq, op, dtype, numel FROM entered
    SEMI JOIN unsettled USING (group_name, seq) ORDER BY group_name, seq, rank"""


def window_rollup(engine: duckdb.DuckDBPyConnection, raw: pa.Table, through: int, settled: int) -> pa.Table:
    """The comm rollup (COMM_STEPS_SCHEMA) of the steps in (``through``, ``settled``] of ``raw``, a
    window's raw comm rows, on ``engine`` (the caller's own connection: retention runs on one thread)."""
    cur = engine.cursor()
    try:
        cur.register("raw", raw)
        sql = rollup_sql(ROLLUP_INPUT + " WHERE step > ? AND step <= ?")
        rows = cur.sql(f"SELECT * FROM ({sql}) ORDER BY step, rank", params=[through, settled]).to_arrow_table()
    finally:
        cur.close()
    return rows.select(COMM_STEPS_SCHEMA.names).cast(COMM_STEPS_SCHEMA)


def unsettled_rows(cat: Catalog, run_id: str, after: int, through: int) -> pd.DataFrame:
    """The completed rows of the instances of steps (``after``, ``through``] that are odd or not
    whole (UNSETTLED_INSTANCES_SCHEMA's columns)."""
    return cat.df(UNSETTLED_SQL, [run_id, after, through])
