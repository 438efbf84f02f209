"""What-if analysis of a run's steps: how much faster would each step be without its stragglers,
and whose ops (which op type, dp_rank, stage, worker) the slowdown belongs to.

    from collector.data import queries, whatif
    result = whatif.for_run(queries.Catalog(data_dir), run_id)   # JSON-ready dict

``graph`` is the step's dependency model (``dp`` that of a data-parallel-only run), ``replay`` the
simulator and the figures (the OSDI'25 study's S, S_optype, S_dp_rank, S_stage, S_worker, M_W, M_S).
``NoSteps`` / ``GraphError`` say why a run cannot be replayed.
"""

from __future__ import annotations

import collections
import threading

import pandas as pd

from collector.data.whatif import dp
from collector.data.whatif.graph import GraphError
from collector.data.whatif.replay import analyze

__all__ = ["GraphError", "NoSteps", "analyze", "analyze_dp", "for_run", "replay_or_none", "worker_steps"]


class NoSteps(LookupError):
    """The run has no ops the replay models (yet)."""


_CACHE: collections.OrderedDict = collections.OrderedDict()  # (data dir, run, data version) -> result or NoSteps
_CACHE_RUNS = 8
_CACHE_LOCK = threading.Lock()


def for_run(cat, run_id: str) -> dict:
    """The what-if figures of ``run_id`` (collector.data.whatif.replay.analyze), computed once per data
    version of the run (the collector's findings refresh and its /metrics figures both ask; treat the
    result as read-only)."""
    from collector.data import queries

    key = (str(cat.data_dir), run_id, queries.data_version(cat.data_dir, run_id))
    with _CACHE_LOCK:
        known = _CACHE.get(key)
    if known is None:
        try:
            known = _replay(cat, run_id)
        except (NoSteps, GraphError) as exc:
            known = exc
        with _CACHE_LOCK:
            _CACHE[key] = known
            while len(_CACHE) > _CACHE_RUNS:
                _CACHE.popitem(last=False)
    if isinstance(known, Exception):
        raise type(known)(*known.args)
    return known


def replay_or_none(cat, run_id: str) -> dict | None:
    """``for_run``'s figures, or None where the run has nothing the replay models (the findings, the
    collector's gauges and the dashboard read it so)."""
    try:
        return for_run(cat, run_id)
    except (NoSteps, GraphError):
        return None


def _replay(cat, run_id: str) -> dict:
    from collector.data import queries

    ops = queries.whatif_ops(cat, run_id)
    if ops.empty:  # not an imported trace: a pipeline engine run?
        ops = queries.whatif_pipe_ops(cat, run_id)
    if ops.empty:  # data parallelism alone: its collectives
        return analyze_dp(queries.whatif_collectives(cat, run_id))
    return analyze(ops)


def analyze_dp(comm: pd.DataFrame) -> dict:
    """The what-if figures of a data-parallel-only run from its collectives (collector.data.whatif.dp)."""
    try:
        ops = dp.ops(comm)
    except (KeyError, IndexError, ValueError) as exc:  # records no step model reads: say so, never a traceback
        raise GraphError(f"the data-parallel step model cannot read this run's collectives: {exc}") from exc
    if ops.empty:
        raise NoSteps(
            "no ops the what-if replay models: no step in which every rank issued the run's usual collectives "
            "(it reads imported OSDI'25 traces, the pipeline engine's pipe rows and a data-parallel run's collectives)"
        )
    try:
        return dp.analyze(ops)
    except (KeyError, IndexError) as exc:
        raise GraphError(f"the data-parallel step model cannot order this run's collectives: {exc}") from exc


def worker_steps(result: dict) -> pd.DataFrame:
    """rank, step, slowdown (the worker's per-step score, min of its dp_rank's and stage's) and
    label: the paper's Fig. 14 heatmap, one row per (worker, step)."""
    rows = [
        (int(rank), int(step), value)
        for step, row in result["per_step"].items()
        for rank, value in row["by_worker"].items()
    ]
    out = pd.DataFrame(rows, columns=["rank", "step", "slowdown"])
    where = result["workers"]
    out["label"] = [f"rank {r} (dp {where[str(r)]['dp_rank']}, stage {where[str(r)]['stage']})" for r in out["rank"]]
    return out
