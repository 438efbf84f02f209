"""What the what-if replay (collector.data.whatif) reads of a run: one row per op, with the
worker's dp_rank and stage.

Imported OSDI'25 traces (collector/tools/importers/osdi_trace.py) keep the paper's op types:
compute as ``timers`` named by op type, communication as ``comm`` rows whose ``log_name`` is the
op type, each worker's stage and data-parallel rank in its ``pipe`` rows.

The bundled pipeline engine's runs (trainer/pipe) say the same in their ``pipe`` rows
(``whatif_pipe_ops``): fwd / bwd are the compute, recv_act / recv_grad the receives, reduce the
data-parallel gradient reduction (named grads-reduce-scatter: it is the step's DP collective); the
engine's sends are asynchronous and not timed, so each is a send of no duration when its compute ends.

Data-parallel-only runs (hook runs of DDP/FSDP scripts, the engine without a pipeline) have only
their collectives: ``whatif_collectives`` reads them (collector.data.whatif.dp models the step).
"""

from __future__ import annotations

import pandas as pd

from collector.data import clocks
from collector.data.queries.connection import Catalog
from collector.data.whatif.graph import COMM_OPTYPES, KNOWN_OPTYPES

_COMPUTE = sorted(KNOWN_OPTYPES - COMM_OPTYPES)
_COMM = sorted(COMM_OPTYPES)


def whatif_ops(cat: Catalog, run_id: str) -> pd.DataFrame:
    """rank, dp_rank, stage, step, optype, start, dur (seconds) of the run's ops the replay models;
    ranks with no ``pipe`` rows are their own replica on stage 0 (data parallelism alone)."""
    marks = ", ".join("?" for _ in _COMPUTE)
    comm_marks = ", ".join("?" for _ in _COMM)
    return cat.df(
        f"""
        WITH workers AS (
            SELECT rank, min(data_rank) AS dp_rank, min(stage) AS stage
            FROM pipe WHERE run_id = ? GROUP BY rank),
        ops AS (
            SELECT rank, step, name AS optype, start_ns, dur_ns
            FROM timers WHERE run_id = ? AND name IN ({marks})
            UNION ALL
            SELECT rank, step, log_name, start_ns, end_ns - start_ns
            FROM comm WHERE run_id = ? AND log_name IN ({comm_marks}))
        SELECT o.rank, coalesce(w.dp_rank, o.rank) AS dp_rank, coalesce(w.stage, 0) AS stage, o.step,
               o.optype, (o.start_ns - min(o.start_ns) OVER (PARTITION BY o.step)) / 1e9 AS start,
               o.dur_ns / 1e9 AS dur
        FROM ops o LEFT JOIN workers w USING (rank)
        WHERE o.start_ns IS NOT NULL AND o.dur_ns IS NOT NULL""",
        [run_id, run_id, *_COMPUTE, run_id, *_COMM],
    )


def whatif_pipe_ops(cat: Catalog, run_id: str) -> pd.DataFrame:
    """``whatif_ops``'s columns from a pipeline engine run's ``pipe`` rows (empty without them)."""
    return cat.df(
        """
        WITH p AS (SELECT * FROM pipe WHERE run_id = ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL),
        ops AS (
            SELECT rank, data_rank, stage, step,
                   CASE kind WHEN 'fwd' THEN 'forward-compute' WHEN 'bwd' THEN 'backward-compute'
                             WHEN 'recv_act' THEN 'forward-recv' WHEN 'recv_grad' THEN 'backward-recv'
                             ELSE 'grads-reduce-scatter' END AS optype,
                   start_ns, end_ns - start_ns AS dur_ns
            FROM p WHERE kind IN ('fwd', 'bwd', 'recv_act', 'recv_grad', 'reduce')
            UNION ALL
            SELECT rank, data_rank, stage, step,
                   CASE kind WHEN 'fwd' THEN 'forward-send' ELSE 'backward-send' END, end_ns, 0
            FROM p WHERE (kind = 'fwd' AND stage < stages - 1) OR (kind = 'bwd' AND stage > 0))
        SELECT rank, data_rank AS dp_rank, stage, step, optype,
               (start_ns - min(start_ns) OVER (PARTITION BY step)) / 1e9 AS start, dur_ns / 1e9 AS dur
        FROM ops""",
        [run_id],
    )


def whatif_collectives(cat: Catalog, run_id: str, after: int = -1) -> pd.DataFrame:
    """rank, step, op, log_name, async_op, start_ns (arrival), end_ns of the run's collectives after
    step ``after`` (point-to-point left out), on rank 0's clock (clocks.fixes_sql: a rank whose clock
    is off beyond the bound is moved by what is left)."""
    return cat.df(
        f"""
        WITH raw AS MATERIALIZED (
            SELECT rank, step, group_name, seq, op, log_name, async_op, start_ns, end_ns FROM comm
            WHERE run_id = ? AND step > ? AND start_ns IS NOT NULL AND end_ns IS NOT NULL
              AND NOT starts_with(group_name, 'p2p[')),
        fix AS MATERIALIZED ({clocks.fixes_sql("raw")})
        SELECT rank, step, op, log_name, async_op, start_ns, end_ns FROM ({clocks.fixed_sql("raw", "fix")})
        ORDER BY rank, step, start_ns""",
        [run_id, after],
    )
