"""The query layer: every SQL statement the dashboard and ``rankscope health`` run.

Values from the user or from run names always travel as DuckDB ``?``
parameters. Results come back as pandas frames (Arrow for the rollup). Nothing
here caches: the dashboard (app/queries.py) caches these per run *data version*,
the health command calls them once.

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
import warnings
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from collector.data import binning, catalog, clocks, layout
from collector.data.instances import instances_sql, join_condition
from collector.data.schema import COMM_STEPS_SCHEMA, STEP_ANALYSIS_SCHEMA


class DataDirError(Exception):
    """The data dir is missing or its catalog cannot be opened."""


# --- connections -------------------------------------------------------------


MAX_SKIPPED_PER_QUERY = 8


class Catalog:
    """One data dir's catalog, shared by threads: each query runs on its own cursor
    (DuckDB connections are not shared across threads), pinned to the snapshot of D
    as the query starts (``catalog.pin``: every view of it sees one commit), and run
    again on the next snapshot if a file of its snapshot was deleted under it (a query
    slower than the collector's ``delete_after_s``)."""

    def __init__(self, data_dir) -> None:
        self.data_dir = str(data_dir)
        self.skipped: set[str] = set()  # segments found unreadable, left out of every later query
        try:
            self.con = catalog.connect(self.data_dir)
            # Segments never change once renamed into place, so their footers can be cached.
            self.con.execute("SET parquet_metadata_cache = true")
        except (OSError, duckdb.Error) as exc:
            raise DataDirError(f"cannot open the catalog in {self.data_dir!r}: {exc}") from None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        cur = catalog.cursor(self.con, self.data_dir, self.skipped)
        cur.execute("SET enable_progress_bar = false")  # it would print into a server's log
        return cur

    def df(self, sql: str, params: list) -> pd.DataFrame:
        return self._run(lambda cur: cur.execute(sql, params).df())

    def arrow(self, sql: str, params: list) -> pa.Table:
        return self._run(lambda cur: cur.sql(sql, params=params).to_arrow_table())

    def _run(self, fetch):
        """``fetch(cursor)``; a segment that turns out unreadable is left out from then on, with a
        warning naming it (the collector quarantines it), instead of failing every query."""
        for _ in range(MAX_SKIPPED_PER_QUERY):
            try:  # each attempt on a fresh cursor: a retry takes the snapshot of D as it is then
                return catalog.with_segment_retry(lambda: self._once(fetch))
            except duckdb.Error as exc:
                bad = catalog.damaged_segment(self.data_dir, str(exc))
                if bad is None or bad in self.skipped:
                    raise
                warnings.warn(
                    f"skipping unreadable segment {bad}: {exc}", catalog.UnreadableSegmentWarning, stacklevel=3
                )
                self.skipped.add(bad)
        raise DataDirError(f"too many unreadable segments in {self.data_dir!r}: {', '.join(sorted(self.skipped))}")

    def _once(self, fetch):
        cur = self.cursor()
        try:
            return fetch(cur)
        finally:
            cur.close()

    def close(self) -> None:
        self.con.close()


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


# --- runs --------------------------------------------------------------------


def list_runs(cat: Catalog) -> pd.DataFrame:
    """Every run, newest first, with its duration so far."""
    return cat.df(
        """
        SELECT run_id, name, status, world_size, n_ranks, started_at, ended_at,
               epoch(coalesce(ended_at::TIMESTAMPTZ, now()) - started_at::TIMESTAMPTZ) AS duration_s,
               source, linked_run_id, config
        FROM runs ORDER BY started_at DESC, run_id""",
        [],
    )


def runs_with(data_dir, table: str) -> set[str]:
    """The runs that have at least one committed segment of ``table`` (a directory listing,
    not a scan: cheap on any data dir)."""
    return {
        layout.run_of(p)
        for p in layout.partitions(Path(data_dir), table)
        if not layout.is_shared(p) and any(p.glob(f"*{layout.SEGMENT_SUFFIX}"))
    }


class UnknownRun(LookupError):
    """No run has that id or name."""


def resolve_run(con, run: str) -> str:
    """The run id of ``run``: a run id, or a run name (the newest run of that name).
    ``con`` is a catalog connection or cursor."""
    rows = con.execute(
        "SELECT run_id FROM runs WHERE run_id = ? OR name = ? ORDER BY (run_id = ?) DESC, started_at DESC",
        [run, run, run],
    ).fetchall()
    if not rows:
        raise UnknownRun(f"no run with id or name {run!r}")
    return rows[0][0]


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


def latest_step(cat: Catalog, run_id: str) -> int | None:
    """The highest step any rank has reported in comm or timers (Parquet min/max stats make it cheap)."""
    value = cat.df(
        """
        SELECT max(step) AS step FROM (
            SELECT max(step) AS step FROM comm WHERE run_id = ?
            UNION ALL SELECT max(step) FROM timers WHERE run_id = ?)""",
        [run_id, run_id],
    ).step.iloc[0]
    return None if pd.isna(value) else int(value)


def ranks(cat: Catalog, run_id: str) -> pd.DataFrame:
    return cat.df(
        """
        SELECT rank, host, pid, status, ended_at, dropped_records
        FROM ranks WHERE run_id = ? ORDER BY rank""",
        [run_id],
    )


# --- the comm rollup -----------------------------------------------------------


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
# retention kept (every Nth step, steps with findings) are only for the drill-down.
COMM_ROLLUP_SQL = f"""
    WITH rolled AS (SELECT coalesce(max(step), -1) AS through FROM comm_steps WHERE run_id = ?),
    fresh AS ({
    rollup_sql(
        "SELECT rank, step, group_name, seq, op, bytes, start_ns, end_ns, algbw_gbs, busbw_gbs "
        "FROM comm WHERE run_id = ? AND step > (SELECT through FROM rolled)"
    )
})
    SELECT {ROLLUP_COLUMNS} FROM comm_steps WHERE run_id = ?
    UNION ALL
    SELECT {ROLLUP_COLUMNS} FROM fresh"""


def comm_rollup(cat: Catalog, run_id: str) -> pa.Table:
    """Per (rank, step, group, op, bytes) sums of a run's comm records (immutable Arrow)."""
    return cat.arrow(COMM_ROLLUP_SQL, [run_id, run_id, run_id])


# The rollup of the steps after a given one: what a live dashboard adds to the rollup it already
# holds (collective instances never span steps, so the steps before it keep their rows).
COMM_ROLLUP_AFTER_SQL = f"""
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


def comm_rollup_after(cat: Catalog, run_id: str, step: int) -> pa.Table:
    """``comm_rollup``'s rows of the steps after ``step`` only (Parquet min/max statistics skip
    the segments of earlier steps): a live run's new steps, without re-reading the old ones."""
    return cat.arrow(COMM_ROLLUP_AFTER_SQL, [run_id, run_id, int(step), run_id, int(step)])


def clock_skew(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank of a run: ``hello_offset_ns`` (the clock offset to rank 0 it measured at start)
    and ``residual_ns`` (what its clock is off beyond that, from when its synchronising collectives
    ended; collector.data.clocks), with the ``instances`` it rests on. For findings.clock."""
    return cat.df(
        f"""
        WITH c AS (SELECT rank, group_name, seq, op, end_ns FROM comm WHERE run_id = ?),
        r AS ({clocks.residuals_sql("c")}),
        h AS (SELECT rank, any_value(clock_offset_ns) AS hello_offset_ns FROM ranks WHERE run_id = ? GROUP BY rank)
        SELECT r.rank, coalesce(h.hello_offset_ns, 0) AS hello_offset_ns, r.residual_ns, r.instances
        FROM r LEFT JOIN h USING (rank) ORDER BY r.rank""",
        [run_id, run_id],
    )


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


def training_filter(dims: dict) -> CommFilter:
    """The traffic of the training steps, from ``comm_dimensions``: every step after the first. The
    first is the warm-up step, and it carries the start-up traffic too (the parameter broadcast, one
    small message per tensor, done once): advice about steady-state messages must not count it."""
    first, last = dims["first_step"], dims["last_step"]
    if first is None or last <= first:
        return CommFilter()
    return CommFilter(steps=(first + 1, last))


def _rollup_query(rollup: pa.Table, flt: CommFilter, select: str) -> pd.DataFrame:
    where, params = flt.where()
    return _on_rollup(rollup, select.format(where=where), params)


def _listed(value) -> list:
    """A DuckDB list aggregate's value as a list. Over no rows it is NULL, which pandas hands back
    as ``pd.NA`` (nullable dtypes) or ``None``: a run with no comm rows yet has no ops, not an error."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return []
    return list(value)


def comm_dimensions(rollup: pa.Table) -> dict:
    """Ops, groups, ranks and step range present in a run's comm records."""
    df = _on_rollup(
        rollup,
        """
        SELECT list(DISTINCT op ORDER BY op) AS ops, list(DISTINCT group_name ORDER BY group_name) AS groups,
               list(DISTINCT rank ORDER BY rank) AS ranks, min(step) AS first_step, max(step) AS last_step
        FROM r""",
        [],
    )
    row = df.iloc[0]
    return {
        "ops": _listed(row.ops),
        "groups": _listed(row.groups),
        "ranks": [int(x) for x in _listed(row.ranks)],
        "first_step": None if pd.isna(row.first_step) else int(row.first_step),
        "last_step": None if pd.isna(row.last_step) else int(row.last_step),
    }


def log_summary(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    """DeepSpeed's comms log_summary table: op x message size. ``transfer_ms`` is the
    latency less the time spent waiting for the last rank to arrive."""
    return _rollup_query(
        rollup,
        flt,
        """
        SELECT op, bytes, sum(n)::BIGINT AS count, sum(dur_ns) / 1e6 AS total_latency_ms,
               sum(dur_ns) / 1e6 / sum(n) AS avg_latency_ms,
               (sum(dur_ns) - sum(wait_sum_ns)) / 1e6 AS transfer_ms,
               sum(algbw_sum) / sum(n) AS algbw_gbs, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY op, bytes ORDER BY op, bytes""",
    )


def bandwidth_by_step(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    return _rollup_query(
        rollup,
        flt,
        """
        SELECT step, op, group_name, sum(algbw_sum) / sum(n) AS algbw_gbs, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY step, op, group_name""",
    )


def bandwidth_by_size(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    return _rollup_query(
        rollup,
        flt,
        """
        SELECT op, bytes, sum(n)::BIGINT AS count, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY op, bytes""",
    )


def comm_by_rank(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    """Per rank and op: communication time, bandwidth and time spent waiting for peers."""
    return _rollup_query(
        rollup,
        flt,
        """
        SELECT rank, op, sum(n)::BIGINT AS count, sum(dur_ns) / 1e6 AS total_latency_ms,
               sum(wait_sum_ns) / 1e6 AS wait_ms, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE {where} GROUP BY ALL ORDER BY rank, op""",
    )


def delay_heatmap(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    """Per rank and step: mean arrival delay and mean wait per collective (ms)."""
    return _rollup_query(
        rollup,
        flt,
        """
        SELECT rank, step, sum(n)::BIGINT AS count, sum(delay_sum_ns) / sum(n) / 1e6 AS arrival_delay_ms,
               sum(wait_sum_ns) / sum(n) / 1e6 AS wait_ms, sum(n_last)::BIGINT AS n_last
        FROM r WHERE {where} GROUP BY ALL ORDER BY rank, step""",
    )


# delay_heatmap's per-collective means, by the rollup sums they divide
_BINNED_VALUES = {"arrival_delay_ms": "delay_sum_ns", "wait_ms": "wait_sum_ns"}


def binned_delay(
    rollup: pa.Table, flt: CommFilter, bins: pd.DataFrame, value: str, max_steps: int = binning.MAX_STEPS
) -> pd.DataFrame:
    """collector.data.binning.bin_grid over delay_heatmap's ``value``, in SQL: per rank bin
    (``bins``: rank, bin, label, as binning.bin_ranks gives them) and step -- the first step of
    a range of steps once there are more than ``max_steps`` -- the bin's max and p95 of its
    ranks' per-collective mean, the rank behind the max (lowest on ties), how many ranks, and
    ``order``: bins worst first (highest max over all steps, then bin). At 1,024 ranks x 500
    steps the (rank, step) grid is half a million rows; only the few thousand cells leave DuckDB."""
    if value not in _BINNED_VALUES:
        raise ValueError(f"value must be one of {sorted(_BINNED_VALUES)}, got {value!r}")
    where, params = flt.where()
    sql = f"""
        WITH g AS (
            SELECT rank, step, sum({_BINNED_VALUES[value]}) / sum(n) / 1e6 AS v
            FROM r WHERE {where} GROUP BY rank, step),
        span AS (
            SELECT min(step) AS first, greatest(1, CAST(ceil((max(step) - min(step) + 1) / ?) AS BIGINT)) AS width
            FROM g),
        b AS (SELECT unnest(?::BIGINT[]) AS rank, unnest(?::BIGINT[]) AS bin, unnest(?::VARCHAR[]) AS label),
        j AS (
            SELECT b.bin, b.label, span.first + (g.step - span.first) // span.width * span.width AS step, g.rank, g.v
            FROM g JOIN b USING (rank), span),
        cells AS (
            SELECT bin, label, step, max(v) AS max, first(rank ORDER BY v DESC, rank) AS worst_rank,
                   count(DISTINCT rank) AS ranks, quantile_cont(v, 0.95) AS p95
            FROM j GROUP BY bin, label, step),
        ordered AS (
            SELECT bin, row_number() OVER (ORDER BY max(max) DESC, bin) - 1 AS "order" FROM cells GROUP BY bin)
        SELECT c.bin, c.label, c.step, c.max, c.worst_rank, c.ranks, c.p95, o."order"
        FROM cells c JOIN ordered o USING (bin) ORDER BY o."order", c.step"""
    return _on_rollup(
        rollup,
        sql,
        [
            *params,
            max_steps,
            bins["rank"].astype("int64").tolist(),
            bins["bin"].astype("int64").tolist(),
            bins["label"].astype(str).tolist(),
        ],
    )


def last_arrivals(rollup: pa.Table, flt: CommFilter) -> pd.DataFrame:
    """Per op and rank: how often the rank arrived last, and by how much (mean, ms).

    ``share`` is over the op's collective instances (each has exactly one last rank)."""
    return _rollup_query(
        rollup,
        flt,
        """
        WITH per AS (
            SELECT op, rank, sum(n_last)::BIGINT AS n_last, sum(last_delay_sum_ns) AS last_delay_ns
            FROM r WHERE {where} GROUP BY op, rank)
        SELECT op, rank, n_last, n_last / sum(n_last) OVER (PARTITION BY op) AS share,
               CASE WHEN n_last > 0 THEN last_delay_ns / n_last / 1e6 END AS mean_lead_ms
        FROM per ORDER BY op, rank""",
    )


def instances_at(cat: Catalog, run_id: str, step: int, rank: int) -> pd.DataFrame:
    """The collective instances behind one heatmap cell (rank, step), with this rank's
    arrival delay and wait and the instance's last rank. Filters on step before grouping
    into instances: all ranks of an instance share its step."""
    return cat.df(
        f"""
        WITH c AS (
            SELECT group_name, seq, op, bytes, rank, start_ns FROM comm WHERE run_id = ? AND step = ?),
        inst AS ({instances_sql("c")})
        SELECT c.group_name, c.seq, c.op, c.bytes, (c.start_ns - i.first_ns) / 1e6 AS arrival_delay_ms,
               (i.last_ns - c.start_ns) / 1e6 AS wait_ms, i.last_rank
        FROM c JOIN inst i ON {join_condition("c", "i")}
        WHERE c.rank = ? ORDER BY c.group_name, c.seq""",
        [run_id, int(step), int(rank)],
    )


# --- per-step tables -----------------------------------------------------------


def step_breakdown(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and timer: mean duration per step (ms) -- a row per rank, not per rank-step."""
    return cat.df(
        """
        WITH per_step AS (SELECT rank, step, name, sum(dur_ns) AS dur_ns FROM timers WHERE run_id = ? GROUP BY ALL)
        SELECT rank, name, avg(dur_ns) / 1e6 AS dur_ms FROM per_step GROUP BY ALL ORDER BY rank, name""",
        [run_id],
    )


def step_wall_ms(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank: total wall time of the timed steps (first timer start to last timer end)."""
    return cat.df(
        """
        WITH per_step AS (
            SELECT rank, step, max(start_ns + dur_ns) - min(start_ns) AS wall_ns
            FROM timers WHERE run_id = ? GROUP BY rank, step)
        SELECT rank, sum(wall_ns) / 1e6 AS wall_ms, count(*) AS steps FROM per_step GROUP BY rank ORDER BY rank""",
        [run_id],
    )


def monitor_series(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every monitor tag per step (mean over ranks), with samples and time for throughput."""
    return cat.df(
        """
        SELECT tag, step, avg(value) AS value, max(samples) AS samples, max(time_ns) AS time_ns
        FROM monitor WHERE run_id = ? GROUP BY tag, step ORDER BY tag, step""",
        [run_id],
    )


def loss_series(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every logged loss per step (tags naming a loss, not the loss scale): the mean of the finite
    values over ranks, and the ranks whose value was NaN or infinite (findings.loss)."""
    return cat.df(
        """
        SELECT tag, step, avg(value) FILTER (WHERE isfinite(value)) AS value,
               list(DISTINCT rank ORDER BY rank) FILTER (WHERE NOT isfinite(value)) AS bad_ranks
        FROM monitor WHERE run_id = ? AND lower(tag) LIKE '%loss%' AND lower(tag) NOT LIKE '%scale%'
        GROUP BY tag, step ORDER BY tag, step""",
        [run_id],
    )


def loss_scale(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Loss scale per step; a step overflowed if any rank said so."""
    return cat.df(
        """
        SELECT step, min(scale) AS scale, bool_or(overflow) AS overflow,
               any_value(bad_params) FILTER (WHERE overflow) AS bad_params
        FROM loss_scale WHERE run_id = ? GROUP BY step ORDER BY step""",
        [run_id],
    )


def flops_profile(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Every rank's module tree from the latest profiled step."""
    return cat.df(
        """
        SELECT rank, step, module, parent, depth, module_type, params, macs, flops, latency_ns, bwd_latency_ns
        FROM flops WHERE run_id = ?
        QUALIFY step = max(step) OVER ()
        ORDER BY rank, depth, module""",
        [run_id],
    )


def memory_lines(cat: Catalog, run_id: str, k: int) -> pd.DataFrame:
    """Per kind, the lines the Memory page draws (kind, step, series, bytes): every rank's while
    there are at most ``k``; beyond that the ``k`` ranks with the highest peak, and the median
    and max over all ranks at each step -- never a line per rank of a thousand."""
    return cat.df(
        """
        WITH m AS (SELECT rank, step, kind, max(bytes) AS bytes FROM memory WHERE run_id = ? GROUP BY ALL),
        n AS (SELECT kind, count(DISTINCT rank) AS ranks FROM m GROUP BY kind),
        top AS (
            SELECT kind, rank FROM (SELECT kind, rank, max(bytes) AS peak FROM m GROUP BY ALL)
            QUALIFY row_number() OVER (PARTITION BY kind ORDER BY peak DESC, rank) <= ?)
        SELECT m.kind, m.step, 'rank ' || m.rank AS series, m.bytes::DOUBLE AS bytes FROM m JOIN top USING (kind, rank)
        UNION ALL
        SELECT kind, step, 'median of ' || ranks || ' ranks', median(bytes)::DOUBLE
        FROM m JOIN n USING (kind) WHERE ranks > ? GROUP BY kind, step, ranks
        UNION ALL
        SELECT kind, step, 'max of ' || ranks || ' ranks', max(bytes)::DOUBLE
        FROM m JOIN n USING (kind) WHERE ranks > ? GROUP BY kind, step, ranks
        ORDER BY kind, series, step""",
        [run_id, int(k), int(k), int(k)],
    )


def moe_load(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Tokens routed to and dropped by each expert per step, summed over ranks."""
    return cat.df(
        """
        SELECT layer, expert, step, sum(tokens) AS tokens, sum(dropped) AS dropped, max(capacity) AS capacity
        FROM moe WHERE run_id = ? GROUP BY ALL ORDER BY layer, expert, step""",
        [run_id],
    )


# --- live metrics (the collector's /metrics endpoint) ------------------------------


def live_runs(cat: Catalog, ended_within_s: float) -> pd.DataFrame:
    """Runs still running, and those that ended less than ``ended_within_s`` seconds ago, newest first."""
    return cat.df(
        """
        SELECT run_id, name, status, world_size, started_at FROM runs
        WHERE status = 'running' OR ended_at::TIMESTAMPTZ >= now() - to_seconds(?::DOUBLE)
        ORDER BY started_at DESC, run_id""",
        [float(ended_within_s)],
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
    return _on_rollup(
        rollup,
        """
        SELECT rank, sum(n_last) / (SELECT sum(n_last) FROM r) AS share FROM r
        GROUP BY rank HAVING (SELECT sum(n_last) FROM r) > 0 ORDER BY rank""",
        [],
    )


def link_transfers(rollup: pa.Table) -> pd.DataFrame:
    """Per (group, step, op, bytes): the median over the group's ranks of their transfer time
    (communication less the wait for the last rank) and of their collective count: what a
    link's speed decides (findings.links)."""
    return _on_rollup(
        rollup,
        """
        SELECT group_name, step, op, bytes, median(transfer_ns) / 1e6 AS transfer_ms, median(n) AS n
        FROM (SELECT group_name, step, op, bytes, rank, sum(n) AS n,
                     sum(dur_ns - coalesce(wait_sum_ns, 0)) AS transfer_ns
              FROM r WHERE group_name IS NOT NULL GROUP BY ALL)
        GROUP BY ALL ORDER BY group_name, step""",
        [],
    )


def busbw_by_step_size(rollup: pa.Table) -> pd.DataFrame:
    """Per (step, op, bytes): mean busbw, for the expected envelope over message sizes."""
    return _on_rollup(
        rollup,
        """
        SELECT step, op, bytes, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE n > 0 AND bytes > 0 GROUP BY ALL ORDER BY op, bytes, step""",
        [],
    )


def group_members(rollup: pa.Table) -> pd.DataFrame:
    """(group_name, rank): the ranks seen in each process group."""
    return _on_rollup(
        rollup,
        "SELECT DISTINCT group_name, rank FROM r WHERE group_name IS NOT NULL ORDER BY group_name, rank",
        [],
    )


# --- SQL console ---------------------------------------------------------------


def console_query(data_dir: str, sql: str, max_rows: int) -> pd.DataFrame:
    """User SQL through the read-only guard; raises catalog.QueryError."""
    return catalog.run_readonly_query(data_dir, sql, max_rows=max_rows).to_pandas()


# --- steps: exposed communication and straggler cost -----------------------------

# A rank's step is the span of its step timers (first start to last end, on the collector's
# clock); only communication inside it counts, so start-up broadcasts and checkpoint traffic
# between steps never read as a straggler. Per rank and step the statement gives:
#   comm_ms       the union of the step's communication intervals (overlapping async
#                 collectives count once, so it never exceeds step_ms);
#   waiting_ms    the union of the parts spent before the instance's last rank arrived;
#   overlapped_ms the part of comm_ms that ran during the rank's compute timers (fwd, bwd_inner);
#   imposed_ms    the wait this rank imposed on the others by arriving last: per instance, the
#                 span from the second-latest arrival to its own (what the step would have saved
#                 had it come with the others), combined over the instances of the step it was
#                 last at as a union (concurrent async collectives hold the others once);
#   late_op       the op where it imposed the longest wait;
#   held_ms       per step (the same on every rank's row), the union of every rank's imposed
#                 waits: step time less held_ms is the "what-if" step without late arrivals.
#   timed         whether the run has step timers; without them (a hook run that sends none) a
#                 step is the span of the rank's communication, enough for the straggler cost
#                 but not for shares of step time.
#
# One pass: the records are read once and grouped into instances once (the second-latest
# arrival comes out of that grouping). Every union is a sweep, not islands: sorted by start,
# an interval adds the part of it past the furthest end of the intervals before it, so one
# sort of a (rank, step) serves all its unions (comm, waiting, compute, comm + compute) as
# running maxima side by side, and the overlap with compute is |comm| + |compute| - |both|.
# It reads two relations: ``c`` (rank, step, group_name, seq, op, start_ns, end_ns) and ``t``
# (rank, step, name, start_ns, end_ns), so the same text runs on the catalog and on Arrow tables.

COMPUTE_TIMERS = ("fwd", "bwd_inner")


_FAR_PAST = "(-9223372036854775807)::BIGINT"


def _union_lengths(
    partition: str, source: str, sets: dict[str, tuple[str | None, str]], carry: tuple[str, ...] = ()
) -> str:
    """Per ``partition`` of ``source``, the union length (ns) of each named set of intervals,
    as columns ``<name>_ns``. A set is (condition on the row ``x`` or None for every row, the
    column that ends its intervals); all start at ``s``. The rows are sorted once by (s, e) into a
    list, which one list_reduce sweeps keeping a running furthest end per set (cheaper here than
    a window: a GROUP BY sorts each small list, not the whole relation). ``carry``: more columns
    of ``source`` to put in the list (ones the conditions read)."""
    fields, start = [], []
    for name, (cond, end) in sets.items():
        reach = f"a.{name}_reach"
        grow, piece = f"greatest({reach}, x.{end})", f"greatest(0, x.{end} - greatest(x.s, {reach}))"
        if cond:
            grow, piece = f"CASE WHEN {cond} THEN {grow} ELSE {reach} END", f"CASE WHEN {cond} THEN {piece} ELSE 0 END"
        fields += [f"'{name}_reach': {grow}", f"'{name}_ns': a.{name}_ns + {piece}"]
        start += [f"'{name}_reach': {_FAR_PAST}", f"'{name}_ns': 0::BIGINT"]
    columns = {"s", "e", *(end for _, end in sets.values()), *carry}
    row = ", ".join(f"'{c}': {c}" for c in sorted(columns))
    return f"""
        SELECT {partition}, unnest(list_reduce(list({{{row}}} ORDER BY s, e),
                                             lambda a, x: {{{", ".join(fields)}}}, {{{", ".join(start)}}}))
        FROM {source} GROUP BY {partition}"""


_INSTANCE_STEP_OP = ("any_value(step) AS step", "any_value(op) AS op")


def _step_analysis_body(timed: bool) -> str:
    """The statement after ``WITH`` (``timed``: whether ``t`` has rows; it decides what a step is)."""
    span_of = "t" if timed else "c"
    compute = ", ".join(f"'{name}'" for name in COMPUTE_TIMERS)
    return f"""
    win AS (SELECT rank, step, min(start_ns) AS w0, max(end_ns) AS w1 FROM {span_of} GROUP BY rank, step),
    cw AS MATERIALIZED (
        SELECT c.rank, c.step, c.group_name, c.seq, c.op, c.start_ns,
               greatest(c.start_ns, w.w0) AS s, least(c.end_ns, w.w1) AS e
        FROM c JOIN win w ON c.rank = w.rank AND c.step = w.step
        WHERE c.end_ns > w.w0 AND c.start_ns < w.w1),
    inst AS MATERIALIZED ({
        instances_sql("cw", runner_up=True, extra=("any_value(step) AS step", "any_value(op) AS op"))
    }),
    iv AS (
        SELECT cw.rank, cw.step, true AS is_comm, cw.s, cw.e,
               least(greatest(coalesce(i.last_ns, cw.s), cw.s), cw.e) AS wait_e
        FROM cw LEFT JOIN inst i ON {join_condition("cw", "i")}
        UNION ALL
        SELECT rank, step, false, start_ns, end_ns, NULL FROM t WHERE name IN ({compute})),
    unions AS ({
        _union_lengths(
            "rank, step",
            "iv",
            {
                "comm": ("x.is_comm", "e"),
                "wait": ("x.is_comm", "wait_e"),
                "compute": ("NOT x.is_comm", "e"),
                "any": (None, "e"),
            },
            carry=("is_comm",),
        )
    }),
    late AS MATERIALIZED (
        SELECT step, last_rank AS rank, op, runner_up_ns AS s, last_ns AS e FROM inst WHERE n_ranks > 1),
    imposed AS ({_union_lengths("rank, step", "late", {"late": (None, "e")})}),
    late_op AS (SELECT rank, step, arg_max(op, e - s) AS op FROM late GROUP BY rank, step),
    held AS ({_union_lengths("step", "late", {"late": (None, "e")})})
    SELECT w.rank, w.step, (w.w1 - w.w0) / 1e6 AS step_ms,
           coalesce(u.comm_ns, 0) / 1e6 AS comm_ms, coalesce(u.wait_ns, 0) / 1e6 AS waiting_ms,
           coalesce(u.comm_ns + u.compute_ns - u.any_ns, 0) / 1e6 AS overlapped_ms,
           coalesce(im.late_ns, 0) / 1e6 AS imposed_ms, lo.op AS late_op, coalesce(h.late_ns, 0) / 1e6 AS held_ms,
           {str(timed).lower()} AS timed
    FROM win w
    LEFT JOIN unions u ON u.rank = w.rank AND u.step = w.step
    LEFT JOIN imposed im ON im.rank = w.rank AND im.step = w.step
    LEFT JOIN late_op lo ON lo.rank = w.rank AND lo.step = w.step
    LEFT JOIN held h ON h.step = w.step
    ORDER BY w.step, w.rank"""


# Timers are on the rank's own clock: moved by its Hello offset and by what clocks.fixes_sql
# found left over (``fix``, over the same steps' comm rows), as the comm rows ``c`` are.
_RUN_TIMERS = """
    offsets AS (SELECT rank, any_value(clock_offset_ns) AS off FROM ranks WHERE run_id = ? GROUP BY rank),
    t AS MATERIALIZED (
        SELECT tm.rank, tm.step, tm.name, tm.start_ns - coalesce(o.off, 0) - coalesce(f.fix_ns, 0) AS start_ns,
               tm.start_ns + tm.dur_ns - coalesce(o.off, 0) - coalesce(f.fix_ns, 0) AS end_ns
        FROM timers tm LEFT JOIN offsets o ON o.rank = tm.rank LEFT JOIN fix f ON f.rank = tm.rank
        WHERE tm.run_id = ? AND tm.step > ? AND tm.step <= ? AND tm.start_ns IS NOT NULL AND tm.dur_ns IS NOT NULL)"""


def step_analysis(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and step of a run: step_ms, comm_ms, waiting_ms, overlapped_ms, imposed_ms, late_op,
    held_ms, timed (see above). The steps the collector already analysed as they settled (the
    ``step_analysis`` table, written by compaction) are read back; only the steps after the last of
    them are computed from the raw records, so the cost follows the unsettled tail, not the run."""
    stored = cat.df(
        f"SELECT {_STEP_ANALYSIS_COLUMNS} FROM step_analysis WHERE run_id = ? ORDER BY step, rank", [run_id]
    )
    if stored.empty:
        return analyse_steps(cat, run_id)
    fresh = analyse_steps(cat, run_id, after=int(stored.step.max()))
    return stored if fresh.empty else pd.concat([stored, fresh], ignore_index=True)


_STEP_ANALYSIS_COLUMNS = ", ".join(f'"{f.name}"' for f in STEP_ANALYSIS_SCHEMA)
_LAST_STEP = 2**62


def analyse_steps(cat: Catalog, run_id: str, after: int = -1, through: int | None = None) -> pd.DataFrame:
    """``step_analysis`` computed from the raw records of the steps in (``after``, ``through``]
    (``through`` None: every later step). Timers are moved onto the collector's clock with the
    rank's measured offset, as the comm records already are; a rank whose clock is still off
    beyond clocks.BOUND_NS (measured over these steps) has both moved by what is left."""
    timed = bool(
        cat.df(
            "SELECT EXISTS (SELECT 1 FROM timers WHERE run_id = ? AND start_ns IS NOT NULL AND dur_ns IS NOT NULL)"
            " AS yes",
            [run_id],
        ).yes.iloc[0]
    )
    # The records are read twice (for the clock check, and for the step spans without timers):
    # read them once into memory.
    steps = [after, _LAST_STEP if through is None else through]
    return cat.df(
        f"""
        WITH raw AS MATERIALIZED (SELECT rank, step, group_name, seq, op, start_ns, end_ns FROM comm
                                  WHERE run_id = ? AND step > ? AND step <= ?),
        fix AS MATERIALIZED ({clocks.fixes_sql("raw")}),
        c AS ({clocks.fixed_sql("raw", "fix")}),
        {_RUN_TIMERS},
        {_step_analysis_body(timed)}""",
        [run_id, *steps, run_id, run_id, *steps],
    )


def step_analysis_of(comm: pa.Table, timers: pa.Table) -> pd.DataFrame:
    """``step_analysis`` over in-memory tables: ``comm`` (rank, step, group_name, seq, op, start_ns,
    end_ns) and ``timers`` (rank, step, name, start_ns, end_ns), already on one clock."""
    with _rollup_lock:
        cur = _rollup_engine.cursor()
    try:
        cur.register("c", comm)
        cur.register("t", timers)
        return cur.execute(f"WITH {_step_analysis_body(timers.num_rows > 0)}").df()
    finally:
        cur.close()


# --- root-cause signals ------------------------------------------------------------


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


def signals_by_step(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Per rank and step, what may explain a late arrival: gc_ms (Python GC pauses), data_ms (the
    wait for the batch, the engine's ``data`` timer), between_steps_ms (a hook run's wait from the
    step before's end to this step's first forward: data loading and host work), runqueue_ms and
    cpu_ms (time the process waited for a CPU and ran on one), cpu_util and steal (host shares),
    tokens (what the rank trained on).
    A signal the run did not record is NULL; runs recorded
    before a signal existed have no table for it, so it is not queried at all."""
    parts = [
        "SELECT rank, step, sum(dur_ns) FILTER (WHERE name = 'data') / 1e6 AS data_ms FROM timers"
        " WHERE run_id = ? GROUP BY rank, step"
    ]
    params: list = [run_id]
    columns = ["t.data_ms"]
    joins = ""
    if _has_segments(cat.data_dir, "gc", run_id):
        joins += " FULL JOIN (SELECT rank, step, sum(dur_ns) / 1e6 AS gc_ms FROM gc WHERE run_id = ?"
        joins += " GROUP BY rank, step) g USING (rank, step)"
        params.append(run_id)
        columns.append("coalesce(g.gc_ms, 0) AS gc_ms")
    else:
        columns.append("NULL::DOUBLE AS gc_ms")
    if _has_segments(cat.data_dir, "between_steps", run_id):
        joins += " FULL JOIN (SELECT rank, step, sum(dur_ns) / 1e6 AS between_steps_ms FROM between_steps"
        joins += " WHERE run_id = ? GROUP BY rank, step) bs USING (rank, step)"
        params.append(run_id)
        columns.append("bs.between_steps_ms")
    else:
        columns.append("NULL::DOUBLE AS between_steps_ms")
    if _has_segments(cat.data_dir, "host", run_id):
        joins += """ FULL JOIN (SELECT rank, step, sum(runqueue_ns) / 1e6 AS runqueue_ms, sum(cpu_ns) / 1e6 AS cpu_ms,
                   avg(cpu_util) AS cpu_util, avg(steal) AS steal FROM host WHERE run_id = ? GROUP BY rank, step) h
                   USING (rank, step)"""
        params.append(run_id)
        columns += ["h.runqueue_ms", "h.cpu_ms", "h.cpu_util", "h.steal"]
    else:
        columns += [f"NULL::DOUBLE AS {c}" for c in ("runqueue_ms", "cpu_ms", "cpu_util", "steal")]
    if _has_segments(cat.data_dir, "batches", run_id):
        joins += """ FULL JOIN (SELECT rank, step, sum(tokens)::DOUBLE AS tokens FROM batches WHERE run_id = ?
                   GROUP BY rank, step) b USING (rank, step)"""
        params.append(run_id)
        columns.append("b.tokens")
    else:
        columns.append("NULL::DOUBLE AS tokens")
    return cat.df(
        f"SELECT rank, step, {', '.join(columns)} FROM ({parts[0]}) t{joins} ORDER BY rank, step",
        params,
    )


# --- liveness: hangs, mismatches, silent ranks (catalog.liveness_views) --------


HANG_COLUMNS = ["group_name", "seq", "op", "step", "waiting_ranks", "missing_ranks", "waiting_s", "hang_after_s"]


def hangs(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Collectives some ranks have waited in for at least hang_after_s, longest wait first."""
    # The view reads every comm record (how far each rank completed); a run no rank ever reported
    # a long enough wait for, the usual case, is answered from the small inflight table alone.
    waited = cat.df(
        """SELECT EXISTS (SELECT 1 FROM inflight WHERE run_id = ? AND coalesce(state, 'waiting') = 'waiting'
                          AND (time_ns - entered_ns) / 1e9 >= hang_after_s) AS yes""",
        [run_id],
    ).yes.iloc[0]
    if not waited:
        return pd.DataFrame(columns=[*HANG_COLUMNS, "missing"])
    return cat.df(
        f"""SELECT {", ".join(HANG_COLUMNS)}, missing
           FROM hangs WHERE run_id = ? ORDER BY waiting_s DESC, group_name, seq""",
        [run_id],
    )


def desyncs(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Collective instances entered with different op/dtype/numel on different ranks (the ``desyncs``
    view's rows). Of the steps compaction analysed, only the instances it could not settle are read
    (the ``unsettled_instances`` table); the raw records after them as they are."""
    through = cat.df("SELECT coalesce(max(step), -1) AS s FROM step_analysis WHERE run_id = ?", [run_id]).s.iloc[0]
    completed = """
        SELECT ?::VARCHAR AS run_id, rank, group_name, seq, op, dtype, numel FROM unsettled_instances WHERE run_id = ?
        UNION ALL
        SELECT run_id, rank, group_name, seq, op, dtype, numel FROM comm
        WHERE run_id = ? AND step > ? AND seq IS NOT NULL AND NOT starts_with(group_name, 'p2p[')"""
    return cat.df(
        f"""SELECT group_name, seq, sides, n_sides FROM ({catalog.desyncs_sql(completed)})
            WHERE run_id = ? ORDER BY group_name, seq""",
        [run_id, run_id, run_id, int(through), run_id],
    )


def rank_liveness(cat: Catalog, run_id: str) -> pd.DataFrame:
    """Each rank's last heartbeat and how it ended (or did not), one row per rank that beat."""
    return cat.df(
        """SELECT rank, step, period_s, last_beat_ns, silent_s, behind_s, ended, gone, gone_ns, unresponsive,
                  run_status
           FROM rank_liveness WHERE run_id = ? ORDER BY rank""",
        [run_id],
    )


def stacks(cat: Catalog, run_id: str, ranks: list[int] | None = None) -> pd.DataFrame:
    """The latest stack capture of each rank (every thread of it), main thread first."""
    return cat.df(
        """WITH latest AS (
               SELECT rank, max(time_ns) AS time_ns FROM stacks WHERE run_id = ? GROUP BY rank)
           SELECT s.rank, s.step, s.reason, s.thread_name, s.is_main, s.innermost, s.stack, s.time_ns
           FROM stacks s JOIN latest l USING (rank, time_ns)
           WHERE s.run_id = ? AND (? IS NULL OR list_contains(?, s.rank))
           ORDER BY s.rank, s.is_main DESC, s.thread_name""",
        [run_id, run_id, ranks, ranks],
    )


WAVEFRONT_MAX_ROWS = 300  # rows of the wavefront chart; larger worlds are binned into rank ranges


def wavefront(cat: Catalog, run_id: str, max_rows: int = WAVEFRONT_MAX_ROWS) -> pd.DataFrame:
    """Per rank range and group: the lowest and highest last seq entered and completed (one rank
    per range when the world fits in ``max_rows`` rows, else ranges of equal width)."""
    return cat.df(
        """WITH w AS (SELECT * FROM wavefront WHERE run_id = ?),
           sized AS (
               SELECT greatest(1, CAST(ceil((SELECT max(rank) + 1 FROM w)
                      / greatest(1, ? // greatest(1, (SELECT count(DISTINCT group_name) FROM w)))) AS BIGINT))
                      AS width)
           SELECT (rank // width) * width AS rank_lo, min(rank) AS first_rank, max(rank) AS last_rank, group_name,
                  min(last_entered_seq) AS min_entered, max(last_entered_seq) AS max_entered,
                  min(last_completed_seq) AS min_completed, max(last_completed_seq) AS max_completed,
                  count(*) AS ranks
           FROM w, sized GROUP BY rank_lo, width, group_name ORDER BY group_name, rank_lo""",
        [run_id, max_rows],
    )
