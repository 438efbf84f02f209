"""The Comms and Stragglers pages' queries: most read the comm rollup (collector.data.queries.rollup)
through a ``CommFilter``; a few read one step's or one run's raw comm records."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from collector.data import binning, clocks
from collector.data.instances import instances_sql, join_condition
from collector.data.queries.connection import Catalog, on_rollup


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
    return on_rollup(rollup, select.format(where=where), params)


def _listed(value) -> list:
    """A DuckDB list aggregate's value as a list. Over no rows it is NULL, which pandas hands back
    as ``pd.NA`` (nullable dtypes) or ``None``: a run with no comm rows yet has no ops, not an error."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return []
    return list(value)


def comm_dimensions(rollup: pa.Table) -> dict:
    """Ops, groups, ranks and step range present in a run's comm records."""
    df = on_rollup(
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
    return on_rollup(
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


# --- links: what findings.links reads off the rollup ---------------------------------


def link_transfers(rollup: pa.Table, min_bytes: int = 0) -> pd.DataFrame:
    """Per (group, step, op, bytes), messages of ``min_bytes`` or more: the median over the group's
    ranks of their transfer time (communication less the wait for the last rank) and of their
    collective count: what a link's speed decides (findings.links, which reads messages of its
    MIN_BYTES or more only: asked for those alone, this costs ~40% less at 1,024 ranks)."""
    return on_rollup(
        rollup,
        """
        SELECT group_name, step, op, bytes, median(transfer_ns) / 1e6 AS transfer_ms, median(n) AS n
        FROM (SELECT group_name, step, op, bytes, rank, sum(n) AS n,
                     sum(dur_ns - coalesce(wait_sum_ns, 0)) AS transfer_ns
              FROM r WHERE group_name IS NOT NULL AND bytes >= ? GROUP BY ALL)
        GROUP BY ALL ORDER BY group_name, step""",
        [int(min_bytes)],
    )


def busbw_by_step_size(rollup: pa.Table) -> pd.DataFrame:
    """Per (step, op, bytes): mean busbw, for the expected envelope over message sizes."""
    return on_rollup(
        rollup,
        """
        SELECT step, op, bytes, sum(busbw_sum) / sum(n) AS busbw_gbs
        FROM r WHERE n > 0 AND bytes > 0 GROUP BY ALL ORDER BY op, bytes, step""",
        [],
    )


def group_members(rollup: pa.Table) -> pd.DataFrame:
    """(group_name, rank): the ranks seen in each process group."""
    return on_rollup(
        rollup,
        "SELECT DISTINCT group_name, rank FROM r WHERE group_name IS NOT NULL ORDER BY group_name, rank",
        [],
    )
