"""What-if replay: each step's dependency graph (collector.data.whatif.graph) evaluated with the
ops' durations as run, with every op at its typical duration (the *ideal*), and with one group of
ops (an op type, a dp_rank, a stage, a set of workers) as run and the rest ideal. Ratios of the
mean step times give the OSDI'25 study's figures:

- ``slowdown`` S = T(as run) / T(ideal), over the run and per step;
- ``by_optype``/``by_dp_rank``/``by_stage`` S_X = T(X as run, the rest ideal) / T(ideal);
- ``by_worker`` S_w = min(S_dp_rank(w), S_stage(w)) (the paper's worker score, one replay per
  dp_rank and per stage instead of one per worker);
- ``m_w``: the share of T(as run) - T(ideal) that goes away when the top 3% of workers by S_w
  run ideal; ``m_s``: the same for the last stage's workers.

"As run" is itself a replay of the recorded durations (host gaps between ops left out), so both
ends of every ratio come from the same model. A collective's *transfer* time is its end minus
the moment its last member was ready (its own wait is the stragglers', not the network's).

Costs: one replay is a pass over the graph's nodes, each a numpy operation over all (step,
dp_rank) pairs at once: O(nodes x steps x dp) with a small constant; the whole analysis is
~(op types + dp + stages + 4) replays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.data.whatif.graph import COMM_OPTYPES, P2P, Graph, GraphError, build

WORST_SHARE_PCT = 3  # M_W's workers: the paper's top 3% (at least one)
_OPTYPE_LABEL = {o: o.split("-")[0] + "-pp-comm" for o in P2P}


@dataclass
class Trace:
    """The ops of complete steps as (node, step, dp) arrays, and the graph they share."""

    graph: Graph
    steps: np.ndarray  # (S,) step numbers
    dp_ranks: np.ndarray  # (D,)
    cost: np.ndarray  # (N, S, D) seconds: duration, or transfer time for communication
    workers: pd.DataFrame  # rank, dp_rank, stage
    dropped_steps: list[int]


def prepare(ops: pd.DataFrame, *, pp: int | None = None, dp_size: int | None = None) -> Trace:
    """``ops``: one row per op (rank, dp_rank, stage, step, optype, start, dur; seconds).
    Steps where some replica's ops differ from the first replica's are left out
    (``dropped_steps``); GraphError when no step is complete or the step is not understood."""
    if ops.empty:
        raise GraphError("no ops to replay")
    ops = ops.sort_values(["step", "dp_rank", "stage", "optype", "start"], kind="stable").reset_index(drop=True)
    ops["seq"] = ops.groupby(["step", "dp_rank", "stage", "optype"], sort=False).cumcount()
    ops["end"] = ops.start + ops.dur
    pp = int(pp or ops.stage.max() + 1)
    dp_ranks = np.sort(ops.dp_rank.unique())
    use_dp = len(dp_ranks) > 1 or (dp_size or 1) > 1
    shape = ops.groupby(["step", "dp_rank"]).size()
    steps_all = np.sort(ops.step.unique())
    ref_step = steps_all[0]
    # the reference: the first step every replica ran in full (as many ops as the most any ran)
    full = shape[shape == shape.max()].reset_index()
    complete = full.groupby("step").dp_rank.nunique()
    complete = complete[complete == len(dp_ranks)].index.to_numpy()
    if len(complete) == 0:
        raise GraphError("no step in which every data-parallel replica recorded all its ops")
    ref_step = complete[0]
    ref = ops[(ops.step == ref_step) & (ops.dp_rank == dp_ranks[0])]
    graph = build(ref[["stage", "optype", "seq", "start", "end"]], pp=pp, use_dp=use_dp)
    node_of = graph.nodes.set_index(["stage", "optype", "seq"]).node
    ops = ops[ops.step.isin(complete)]
    node = node_of.reindex(pd.MultiIndex.from_frame(ops[["stage", "optype", "seq"]])).to_numpy()
    bad_steps = set(ops.step[np.isnan(node)].unique())
    keep = ~ops.step.isin(bad_steps).to_numpy()
    ops, node = ops[keep], node[keep].astype(np.int64)
    steps = np.array(sorted(set(complete) - bad_steps))
    if len(steps) == 0:
        raise GraphError("no step has the same ops as the first complete one")
    dropped = sorted(int(s) for s in set(steps_all) - set(steps))
    n, s_count, d_count = len(graph.nodes), len(steps), len(dp_ranks)
    si = np.searchsorted(steps, ops.step.to_numpy())
    di = np.searchsorted(dp_ranks, ops.dp_rank.to_numpy())
    start = np.full((n, s_count, d_count), np.nan)
    end = np.full((n, s_count, d_count), np.nan)
    start[node, si, di] = ops.start.to_numpy()
    end[node, si, di] = ops.end.to_numpy()
    cost = end - start
    for members, synced in zip(graph.groups, graph.synced):
        began = start[members].max(axis=0)
        if synced:
            began = began.max(axis=1, keepdims=True)
        cost[members] = np.maximum(end[members] - began, 0.0)
    workers = ops[["rank", "dp_rank", "stage"]].drop_duplicates().sort_values("rank").reset_index(drop=True)
    return Trace(graph, steps, dp_ranks, cost, workers, dropped)


def simulate(trace: Trace, cost: np.ndarray) -> np.ndarray:
    """Each step's time (S,) when the ops cost ``cost`` (N, S, D), every replica from t=0."""
    g = trace.graph
    end = np.empty_like(cost)
    zero = np.zeros(cost.shape[1:])
    deps, comm = g.deps, g.is_comm
    synced_of = {}
    for members, synced in zip(g.groups, g.synced):
        synced_of[members[0]] = synced

    def ready(node):
        ds = deps[node]
        if not ds:
            return zero
        if len(ds) == 1:
            return end[ds[0]]
        return end[ds].max(axis=0)

    for unit in g.order:
        first = unit[0]
        if len(unit) == 1 and not (comm[first] and synced_of.get(first)):
            end[first] = ready(first) + cost[first]
            continue
        began = ready(first)
        for m in unit[1:]:
            began = np.maximum(began, ready(m))
        if synced_of.get(first):
            began = began.max(axis=1, keepdims=True)
        for m in unit:
            end[m] = began + cost[m]
    return end.max(axis=(0, 2))


def ideal_cost(trace: Trace) -> np.ndarray:
    """(N,) each node's typical cost: the median of its op type for communication, the mean for compute."""
    optype = trace.graph.nodes.optype.to_numpy()
    out = np.empty(len(optype))
    for name in np.unique(optype):
        at = optype == name
        values = trace.cost[at]
        out[at] = np.nanmedian(values) if name in COMM_OPTYPES else np.nanmean(values)
    return out


def analyze(ops: pd.DataFrame, *, pp: int | None = None, dp_size: int | None = None) -> dict:
    """The what-if figures of a run's ops (see the module docstring); JSON-ready."""
    trace = prepare(ops, pp=pp, dp_size=dp_size)
    g = trace.graph
    orig = trace.cost
    ideal = np.broadcast_to(ideal_cost(trace)[:, None, None], orig.shape)
    t_run = simulate(trace, orig)
    t_ideal = simulate(trace, ideal)
    base = t_ideal.mean()

    def keep_as_run(mask: np.ndarray):  # mask broadcastable to (N, S, D): those ops as run
        t = simulate(trace, np.where(mask, orig, ideal))
        return t.mean() / base, t / t_ideal

    node_stage = g.nodes.stage.to_numpy()
    labels = g.nodes.optype.map(lambda o: _OPTYPE_LABEL.get(o, o)).to_numpy()
    by: dict[str, dict] = {}
    per: dict[str, dict] = {}
    for name, keys, mask_of in (
        ("by_optype", sorted(set(labels)), lambda k: (labels == k)[:, None, None]),
        ("by_dp_rank", trace.dp_ranks.tolist(), lambda k: (trace.dp_ranks == k)[None, None, :]),
        ("by_stage", sorted(set(node_stage.tolist())), lambda k: (node_stage == k)[:, None, None]),
    ):
        by[name], per[name] = {}, {}
        for k in keys:
            overall, steps = keep_as_run(mask_of(k))
            by[name][str(k)] = float(overall)
            per[name][str(k)] = steps
    workers = trace.workers
    by_worker = {
        str(r.rank): min(by["by_dp_rank"][str(r.dp_rank)], by["by_stage"][str(r.stage)]) for r in workers.itertuples()
    }
    t_run_mean = float(t_run.mean())

    def share_removed(mask: np.ndarray) -> tuple[float | None, float]:
        """M: the share of the slowdown gone when the masked ops run ideal; and the seconds a
        step that saves."""
        t = simulate(trace, np.where(mask, ideal, orig)).mean()
        if t_run_mean - base <= 1e-12:
            return None, 0.0
        return float((t_run_mean - t) / (t_run_mean - base)), float(t_run_mean - t)

    top_n = max(1, math.ceil(len(workers) * WORST_SHARE_PCT / 100))
    ranked = sorted(workers.itertuples(), key=lambda r: (-by_worker[str(r.rank)], r.rank))[:top_n]
    mask_w = np.zeros((len(g.nodes), 1, len(trace.dp_ranks)), dtype=bool)
    for r in ranked:
        mask_w[node_stage == r.stage, 0, int(np.searchsorted(trace.dp_ranks, r.dp_rank))] = True
    last_stage = node_stage.max()
    m_w, m_w_saved = share_removed(mask_w)
    m_s, m_s_saved = share_removed((node_stage == last_stage)[:, None, None])

    per_step = {}
    for i, step in enumerate(trace.steps.tolist()):
        row = {
            "slowdown": float(t_run[i] / t_ideal[i]),
            "step_time_s": float(t_run[i]),
            "ideal_s": float(t_ideal[i]),
        }
        for name in ("by_optype", "by_dp_rank", "by_stage"):
            row[name] = {k: float(v[i]) for k, v in per[name].items()}
        row["by_worker"] = {
            str(r.rank): min(row["by_dp_rank"][str(r.dp_rank)], row["by_stage"][str(r.stage)])
            for r in workers.itertuples()
        }
        per_step[str(step)] = row
    return {
        "slowdown": float(t_run_mean / base),
        "step_time_s": t_run_mean,
        "ideal_step_time_s": float(base),
        "by_optype": _sorted(by["by_optype"]),
        "by_worker": _sorted(by_worker),
        "by_dp_rank": _sorted(by["by_dp_rank"]),
        "by_stage": _sorted(by["by_stage"]),
        "m_w": m_w,
        "m_w_workers": [int(r.rank) for r in ranked],
        "m_w_saved_s": m_w_saved,
        "m_s": m_s,
        "m_s_saved_s": m_s_saved,
        "last_stage": int(last_stage),
        "workers": {str(r.rank): {"dp_rank": int(r.dp_rank), "stage": int(r.stage)} for r in workers.itertuples()},
        "steps": len(trace.steps),
        "dropped_steps": trace.dropped_steps,
        "per_step": per_step,
    }


def _sorted(d: dict) -> dict:
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))
