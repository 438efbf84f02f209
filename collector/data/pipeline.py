"""Pipeline-parallel bubbles from the ``pipe`` table (collector.rank.pipe_timeline).

A pipeline's step is the span from its first forward to its last backward over all its stages
(one data-parallel replica: the ranks sharing a ``data_rank``); a stage is busy during its own
forward and backward passes and idle otherwise: waiting for an activation or a gradient, or done
before the others. Bubble = span - busy, per stage and step. 1F1B with equal stages idles
(p - 1) / (m + p - 1) of the span (``ideal_fraction``; interleaved 1F1B with v virtual stages:
(p - 1) / (v m + p - 1)); slower stages and overheads add to it.
Only steps every stage of the pipeline reported count. The stages' times share rank 0's clock
(collector.rank.clock), so their spans line up.
"""

from __future__ import annotations

import pandas as pd

# Per (step, data_rank, stage) bubbles over ``rows`` (a query giving pipe rows with rank).
BUBBLES_SQL = """
        WITH p AS ({rows}),
        span AS (SELECT step, data_rank, min(start_ns) AS t0, max(end_ns) AS t1, count(DISTINCT stage) AS seen
                 FROM p WHERE kind IN ('fwd', 'bwd') GROUP BY step, data_rank),
        st AS (SELECT step, data_rank, stage, min(rank) AS rank, max(stages) AS stages,
                      max(micro_batches) AS micro_batches, coalesce(max(virtual_stages), 1) AS virtual_stages,
                      max(layers) AS layers,
                      coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'fwd'), 0) / 1e6 AS fwd_ms,
                      coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'bwd'), 0) / 1e6 AS bwd_ms,
                      coalesce(sum(end_ns - start_ns) FILTER (WHERE kind IN ('recv_act', 'recv_grad')), 0) / 1e6
                          AS recv_ms
               FROM p GROUP BY step, data_rank, stage)
        SELECT st.step, st.data_rank, st.stage, st.rank, st.stages, st.micro_batches, st.virtual_stages, st.layers,
               (t1 - t0) / 1e6 AS span_ms, fwd_ms, bwd_ms, fwd_ms + bwd_ms AS busy_ms,
               (t1 - t0) / 1e6 - fwd_ms - bwd_ms AS bubble_ms,
               ((t1 - t0) / 1e6 - fwd_ms - bwd_ms) / nullif((t1 - t0) / 1e6, 0) AS bubble_fraction,
               (st.stages - 1) / (st.micro_batches * st.virtual_stages + st.stages - 1) AS ideal_fraction, recv_ms
        FROM st JOIN span USING (step, data_rank)
        WHERE span.seen = st.stages
        ORDER BY st.step, st.data_rank, st.stage"""


def ideal_fraction(stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """BUBBLES_SQL's ``ideal_fraction`` for given counts: what the schedule idles with equal stages."""
    return (stages - 1) / (micro_batches * virtual_stages + stages - 1)


def stage_bubbles(cat, run_id: str) -> pd.DataFrame:
    """Per (step, data_rank, stage): rank, stages, micro_batches, layers, span_ms, fwd_ms, bwd_ms,
    busy_ms, bubble_ms, bubble_fraction, ideal_fraction, recv_ms (waiting on neighbours). Empty for
    a run without pipeline parallelism."""
    if not cat.has_rows("pipe", run_id):
        return pd.DataFrame()
    return cat.df(BUBBLES_SQL.format(rows="SELECT * FROM pipe WHERE run_id = ?"), [run_id])


def timeline(cat, run_id: str, step: int, data_rank: int = 0) -> pd.DataFrame:
    """One step of one pipeline: stage, rank, kind, micro_batch, start_ms, end_ms (from the step's
    first event), for the dashboard's stages x time chart."""
    if not cat.has_rows("pipe", run_id):
        return pd.DataFrame()
    return cat.df(
        """
        WITH p AS (SELECT * FROM pipe WHERE run_id = ? AND step = ? AND data_rank = ?)
        SELECT stage, rank, kind, micro_batch,
               (start_ns - (SELECT min(start_ns) FROM p)) / 1e6 AS start_ms,
               (end_ns - (SELECT min(start_ns) FROM p)) / 1e6 AS end_ms
        FROM p ORDER BY stage, start_ns""",
        [run_id, int(step), int(data_rank)],
    )


def bubbles_of(rows: pd.DataFrame) -> pd.DataFrame:
    """``stage_bubbles`` over in-memory ``pipe`` rows (with a ``rank`` column), e.g. a benchmark's."""
    import duckdb

    with duckdb.connect() as con:
        con.register("rows_in", rows)
        return con.execute(BUBBLES_SQL.format(rows="SELECT * FROM rows_in")).df()
