"""The dashboard's query layer: every SQL statement the app runs lives here.

Values from the user or from run names always travel as DuckDB ``?``
parameters. Results come back as pandas frames.

Speed on big runs comes from per-step rollups: one pass over a run's comm
records (grouped per collective instance to find arrival delays) aggregated
to (rank, step, group, op, message size). Page queries then read that rollup,
tens of thousands of rows, instead of millions of raw records. A rollup is
keyed by the run's *data version* (the names, sizes and mtimes of its Parquet
segments), so it is rebuilt exactly when new segments land: segments are
immutable once renamed into place, which makes the version a complete cache
key and lets finished runs stay cached while live ones refresh.
"""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import streamlit as st

from collector.data import catalog, layout
from collector.data.instances import instances_sql, join_condition

# Page queries are keyed by data version, so the TTL only bounds memory.
CACHE_TTL_S = 600
CACHE_ENTRIES = 256


class DataDirError(Exception):
    """The data dir is missing or its catalog cannot be opened."""


# --- connections -------------------------------------------------------------

@st.cache_resource(show_spinner=False)
def _catalog_connection(data_dir: str) -> duckdb.DuckDBPyConnection:
    try:
        con = catalog.connect(data_dir)
        # Segments never change once renamed into place, so their footers can be cached.
        con.execute("SET parquet_metadata_cache = true")
        return con
    except (OSError, duckdb.Error) as exc:
        raise DataDirError(f"cannot open the catalog in {data_dir!r}: {exc}") from None


def _catalog(data_dir: str) -> duckdb.DuckDBPyConnection:
    # A cursor per query: DuckDB connections are not shared across Streamlit's threads.
    cur = catalog.cursor(_catalog_connection(data_dir), data_dir)
    cur.execute("SET enable_progress_bar = false")  # it would print into the server's log
    return cur


# Rollups are small: one thread per query answers faster on a busy machine than many.
_rollup_engine = duckdb.connect(":memory:", config={"threads": 1})
_rollup_lock = threading.Lock()


def _on_rollup(rollup: pa.Table, sql: str, params: list) -> pd.DataFrame:
    """Run SQL that reads the Arrow rollup as the relation ``r``."""
    with _rollup_lock:
        cur = _rollup_engine.cursor()
    try:
        cur.register("r", rollup)
        return cur.execute(sql, params).df()
    finally:
        cur.close()


def _df(data_dir: str, sql: str, params: list) -> pd.DataFrame:
    cur = _catalog(data_dir)
    try:
        # Compaction may unlink a segment between listing and reading: retry then.
        return catalog.with_segment_retry(lambda: cur.execute(sql, params).df())
    finally:
        cur.close()


# --- runs --------------------------------------------------------------------

@st.cache_data(ttl=1, show_spinner=False)
def list_runs(data_dir: str) -> pd.DataFrame:
    """Every run, newest first, with its duration so far. Cached for a second only:
    it tells the pages whether a run is still live."""
    return _df(data_dir, """
        SELECT run_id, name, status, world_size, n_ranks, started_at, ended_at,
               epoch(coalesce(ended_at::TIMESTAMPTZ, now()) - started_at::TIMESTAMPTZ) AS duration_s,
               source, linked_run_id, config
        FROM runs ORDER BY started_at DESC, run_id""", [])


def data_version(data_dir: str, run_id: str) -> str:
    """Fingerprint of every committed segment of ``run_id`` (any table)."""
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise ValueError(f"not a run id: {run_id!r}")
    digest = hashlib.sha1()
    root = Path(data_dir)
    for table in layout.stored_schemas():
        part = layout.partition_dir(root, table, run_id)
        if not part.is_dir():
            continue
        for entry in sorted(os.scandir(part), key=lambda e: e.name):
            if entry.name.endswith(layout.SEGMENT_SUFFIX) and not entry.name.startswith("."):
                st_ = entry.stat()
                digest.update(f"{table}/{entry.name}:{st_.st_size}:{st_.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def latest_step(data_dir: str, run_id: str, version: str) -> int | None:
    """The highest step any rank has reported in comm or timers (Parquet min/max stats make it cheap)."""
    value = _df(data_dir, """
        SELECT max(step) AS step FROM (
            SELECT max(step) AS step FROM comm WHERE run_id = ?
            UNION ALL SELECT max(step) FROM timers WHERE run_id = ?)""", [run_id, run_id]).step.iloc[0]
    return None if pd.isna(value) else int(value)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def ranks(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    return _df(data_dir, """
        SELECT rank, host, pid, status, ended_at, dropped_records
        FROM ranks WHERE run_id = ? ORDER BY rank""", [run_id])


# --- the comm rollup -----------------------------------------------------------

# Arrival delay, wait and "last to arrive" per collective instance (collector.data.instances),
# computed with a per-instance GROUP BY joined back to the records. Records without a group or
# seq keep their bandwidth and get no delay (the LEFT JOIN finds no instance).
COMM_ROLLUP_SQL = f"""
    WITH c AS (
        SELECT rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs
        FROM comm WHERE run_id = ?),
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


@st.cache_resource(ttl=CACHE_TTL_S, max_entries=16, show_spinner="Building per-step rollups…")
def comm_rollup(data_dir: str, run_id: str, version: str) -> pa.Table:
    """Per (rank, step, group, op, bytes) sums of a run's comm records (immutable Arrow)."""
    cur = _catalog(data_dir)
    try:
        return catalog.with_segment_retry(lambda: cur.sql(COMM_ROLLUP_SQL, params=[run_id]).to_arrow_table())
    finally:
        cur.close()


class CommFilter:
    """The Comms/Stragglers filters as a WHERE clause over the rollup ``r``."""

    def __init__(self, ops=(), groups=(), ranks=(), steps: tuple[int, int] | None = None):
        self.ops, self.groups, self.ranks = tuple(ops), tuple(groups), tuple(int(x) for x in ranks)
        self.steps = steps

    def where(self) -> tuple[str, list]:
        clauses, params = ["TRUE"], []
        for column, values in (("op", self.ops), ("group_name", self.groups), ("rank", self.ranks)):
            if values:
                clauses.append(f"{column} IN ({', '.join('?' * len(values))})")
                params += list(values)
        if self.steps is not None:
            clauses.append("step BETWEEN ? AND ?")
            params += [int(self.steps[0]), int(self.steps[1])]
        return " AND ".join(clauses), params

    def key(self) -> tuple:
        return (self.ops, self.groups, self.ranks, self.steps)


def _rollup_query(data_dir: str, run_id: str, version: str, flt: CommFilter, select: str) -> pd.DataFrame:
    where, params = flt.where()
    return _on_rollup(comm_rollup(data_dir, run_id, version), select.format(where=where), params)


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def comm_dimensions(data_dir: str, run_id: str, version: str) -> dict:
    """Ops, groups, ranks and step range present in a run's comm records."""
    df = _on_rollup(comm_rollup(data_dir, run_id, version), """
        SELECT list(DISTINCT op ORDER BY op) AS ops, list(DISTINCT group_name ORDER BY group_name) AS groups,
               list(DISTINCT rank ORDER BY rank) AS ranks, min(step) AS first_step, max(step) AS last_step
        FROM r""", [])
    row = df.iloc[0]
    return {"ops": list(row.ops if row.ops is not None else []), "groups": list(row.groups if row.groups is not None else []),
            "ranks": [int(x) for x in (row.ranks if row.ranks is not None else [])],
            "first_step": None if pd.isna(row.first_step) else int(row.first_step),
            "last_step": None if pd.isna(row.last_step) else int(row.last_step)}


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def log_summary(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    """DeepSpeed's comms log_summary table: op x message size. ``transfer_ms`` is the
    latency less the time spent waiting for the last rank to arrive."""
    return _rollup_query(data_dir, run_id, version, flt, """
        SELECT op, bytes, sum(n)::BIGINT AS count, sum(dur_ns) / 1e6 AS total_latency_ms,
               sum(dur_ns) / 1e6 / sum(n) AS avg_latency_ms,
               (sum(dur_ns) - sum(wait_sum_ns)) / 1e6 AS transfer_ms,
               sum(algbw_sum) / sum(n) AS algbw_gbs, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY op, bytes ORDER BY op, bytes""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def bandwidth_by_step(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    return _rollup_query(data_dir, run_id, version, flt, """
        SELECT step, op, group_name, sum(algbw_sum) / sum(n) AS algbw_gbs, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY step, op, group_name""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def bandwidth_by_size(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    return _rollup_query(data_dir, run_id, version, flt, """
        SELECT op, bytes, sum(n)::BIGINT AS count, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY op, bytes""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def comm_by_rank(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    """Per rank and op: communication time, bandwidth and time spent waiting for peers."""
    return _rollup_query(data_dir, run_id, version, flt, """
        SELECT rank, op, sum(n)::BIGINT AS count, sum(dur_ns) / 1e6 AS total_latency_ms,
               sum(wait_sum_ns) / 1e6 AS wait_ms, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY rank, op""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def delay_heatmap(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    """Per rank and step: mean arrival delay and mean wait per collective (ms)."""
    return _rollup_query(data_dir, run_id, version, flt, """
        SELECT rank, step, sum(n)::BIGINT AS count, sum(delay_sum_ns) / sum(n) / 1e6 AS arrival_delay_ms,
               sum(wait_sum_ns) / sum(n) / 1e6 AS wait_ms, sum(n_last)::BIGINT AS n_last
        FROM r WHERE {where} GROUP BY ALL ORDER BY rank, step""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False,
               hash_funcs={CommFilter: CommFilter.key})
def last_arrivals(data_dir: str, run_id: str, version: str, flt: CommFilter) -> pd.DataFrame:
    """Per op and rank: how often the rank arrived last, and by how much (mean, ms).

    ``share`` is over the op's collective instances (each has exactly one last rank)."""
    return _rollup_query(data_dir, run_id, version, flt, """
        WITH per AS (
            SELECT op, rank, sum(n_last)::BIGINT AS n_last, sum(last_delay_sum_ns) AS last_delay_ns
            FROM r WHERE {where} GROUP BY op, rank)
        SELECT op, rank, n_last, n_last / sum(n_last) OVER (PARTITION BY op) AS share,
               CASE WHEN n_last > 0 THEN last_delay_ns / n_last / 1e6 END AS mean_lead_ms
        FROM per ORDER BY op, rank""")


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def instances_at(data_dir: str, run_id: str, version: str, step: int, rank: int) -> pd.DataFrame:
    """The collective instances behind one heatmap cell (rank, step), with this rank's
    arrival delay and wait and the instance's last rank. Filters on step before grouping
    into instances: all ranks of an instance share its step."""
    return _df(data_dir, f"""
        WITH c AS (
            SELECT group_name, seq, op, bytes, rank, start_ns FROM comm WHERE run_id = ? AND step = ?),
        inst AS ({instances_sql("c")})
        SELECT c.group_name, c.seq, c.op, c.bytes, (c.start_ns - i.first_ns) / 1e6 AS arrival_delay_ms,
               (i.last_ns - c.start_ns) / 1e6 AS wait_ms, i.last_rank
        FROM c JOIN inst i ON {join_condition("c", "i")}
        WHERE c.rank = ? ORDER BY c.group_name, c.seq""", [run_id, int(step), int(rank)])


# --- per-step tables -----------------------------------------------------------

@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def step_times(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Per rank, step and timer: duration (ms). Timer names are whatever the engine sent."""
    return _df(data_dir, """
        SELECT rank, step, name, sum(dur_ns) / 1e6 AS dur_ms
        FROM timers WHERE run_id = ? GROUP BY ALL ORDER BY rank, step, name""", [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def step_wall_ms(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Per rank: total wall time of the timed steps (first timer start to last timer end)."""
    return _df(data_dir, """
        WITH per_step AS (
            SELECT rank, step, max(start_ns + dur_ns) - min(start_ns) AS wall_ns
            FROM timers WHERE run_id = ? GROUP BY rank, step)
        SELECT rank, sum(wall_ns) / 1e6 AS wall_ms, count(*) AS steps FROM per_step GROUP BY rank ORDER BY rank""",
               [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def monitor_series(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Every monitor tag per step (mean over ranks), with samples and time for throughput."""
    return _df(data_dir, """
        SELECT tag, step, avg(value) AS value, max(samples) AS samples, max(time_ns) AS time_ns
        FROM monitor WHERE run_id = ? GROUP BY tag, step ORDER BY tag, step""", [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def loss_scale(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Loss scale per step; a step overflowed if any rank said so."""
    return _df(data_dir, """
        SELECT step, min(scale) AS scale, bool_or(overflow) AS overflow,
               any_value(bad_params) FILTER (WHERE overflow) AS bad_params
        FROM loss_scale WHERE run_id = ? GROUP BY step ORDER BY step""", [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def flops_profile(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Every rank's module tree from the latest profiled step."""
    return _df(data_dir, """
        SELECT rank, step, module, parent, depth, module_type, params, macs, flops, latency_ns, bwd_latency_ns
        FROM flops WHERE run_id = ?
        QUALIFY step = max(step) OVER ()
        ORDER BY rank, depth, module""", [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def memory_by_step(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    return _df(data_dir, """
        SELECT rank, step, kind, max(bytes) AS bytes
        FROM memory WHERE run_id = ? GROUP BY ALL ORDER BY rank, kind, step""", [run_id])


@st.cache_data(ttl=CACHE_TTL_S, max_entries=CACHE_ENTRIES, show_spinner=False)
def moe_load(data_dir: str, run_id: str, version: str) -> pd.DataFrame:
    """Tokens routed to and dropped by each expert per step, summed over ranks."""
    return _df(data_dir, """
        SELECT layer, expert, step, sum(tokens) AS tokens, sum(dropped) AS dropped, max(capacity) AS capacity
        FROM moe WHERE run_id = ? GROUP BY ALL ORDER BY layer, expert, step""", [run_id])


# --- SQL console ---------------------------------------------------------------

def console_query(data_dir: str, sql: str, max_rows: int) -> pd.DataFrame:
    """User SQL through the collector's read-only guard; raises catalog.QueryError."""
    return catalog.run_readonly_query(data_dir, sql, max_rows=max_rows).to_pandas()
