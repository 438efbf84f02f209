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
~(op types + stages + 4) replays plus one batched replay for every dp_rank (``by_replica``):
1,024 workers x 100 steps (17M ops) ~6 s of CPU (benches/RESULTS-whatif.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.data.whatif.graph import COMM_OPTYPES, P2P, Graph, GraphError, build

WORST_SHARE_PCT = 3  # M_W's workers: the paper's top 3% (at least one)
SAVED_WORKERS = 3  # the worst workers whose own saving (fixing that one alone) is replayed
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


def prepare(ops: pd.DataFrame, *, pp: int | None = None, dp_size: int | None = None, model=None) -> Trace:
    """``ops``: one row per op (rank, dp_rank, stage, step, optype, start, dur; seconds); ``model``:
    the step's graph builder (ref -> Graph; default the 3D-parallel one, graph.build).
    Steps where some replica's ops differ from the reference step's are left out
    (``dropped_steps``); GraphError when no step is complete or the step is not understood.
    Vectorised (integer keys, one sort): a 1,024-worker run of 100 steps is ~17M ops."""
    if ops.empty:
        raise GraphError("no ops to replay")
    n = len(ops)
    optype_code, optypes = pd.factorize(ops.optype, sort=True)
    step_code, steps_all = pd.factorize(ops.step, sort=True)
    dp_code, dp_ranks = pd.factorize(ops.dp_rank, sort=True)
    steps_all, dp_ranks = np.asarray(steps_all), np.asarray(dp_ranks)
    stage = ops.stage.to_numpy(np.int64)
    start = ops.start.to_numpy(np.float64)
    dur = ops.dur.to_numpy(np.float64)
    pp = int(pp or stage.max() + 1)
    n_types, n_dp = len(optypes), len(dp_ranks)
    use_dp = n_dp > 1 or (dp_size or 1) > 1
    # seq: the op's place among its (step, replica, stage, op type) fellows, in start order
    key = ((step_code.astype(np.int64) * n_dp + dp_code) * pp + stage) * n_types + optype_code
    # rows usually come in time order within a group (as stored): one stable sort by key then
    # suffices; otherwise sort by start within the key as well
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    first = np.ones(n, dtype=bool)
    first[1:] = sorted_key[1:] != sorted_key[:-1]
    if (np.diff(start[order])[~first[1:]] < 0).any():
        order = np.lexsort((start, key))
    at = np.arange(n)
    seq = np.empty(n, dtype=np.int64)
    seq[order] = at - np.maximum.accumulate(np.where(first, at, 0))
    # the reference: the first step every replica ran in full (as many ops as the most any ran)
    per_replica = np.bincount(step_code * n_dp + dp_code, minlength=len(steps_all) * n_dp).reshape(-1, n_dp)
    complete = np.flatnonzero((per_replica == per_replica.max()).all(axis=1))
    if len(complete) == 0:
        raise GraphError("no step in which every data-parallel replica recorded all its ops")
    ref_rows = np.flatnonzero((step_code == complete[0]) & (dp_code == 0))
    ref = pd.DataFrame(
        {
            "stage": stage[ref_rows],
            "optype": np.asarray(optypes)[optype_code[ref_rows]],
            "seq": seq[ref_rows],
            "start": start[ref_rows],
            "end": start[ref_rows] + dur[ref_rows],
        }
    )
    graph = model(ref) if model is not None else build(ref, pp=pp, use_dp=use_dp)
    # node of every op through a dense (stage, op type, seq) table; -1: not in the reference step
    code_of = {name: k for k, name in enumerate(optypes)}
    lookup = np.full((pp, n_types, int(seq.max()) + 1), -1, dtype=np.int64)
    gn = graph.nodes
    lookup[gn.stage.to_numpy(), gn.optype.map(code_of).to_numpy(), gn.seq.to_numpy()] = gn.node.to_numpy()
    node = lookup[stage, optype_code, seq]
    good_step = np.zeros(len(steps_all), dtype=bool)
    good_step[complete] = True
    good_step[np.unique(step_code[node < 0])] = False
    kept_steps = np.flatnonzero(good_step)
    if len(kept_steps) == 0:
        raise GraphError("no step has the same ops as the first complete one")
    keep = good_step[step_code]
    new_index = np.cumsum(good_step) - 1  # old step code -> position among the kept steps
    n_nodes = len(gn)
    begin = np.full((n_nodes, len(kept_steps), n_dp), np.nan)
    end = np.full_like(begin, np.nan)
    si, di, ni = new_index[step_code[keep]], dp_code[keep], node[keep]
    begin[ni, si, di] = start[keep]
    end[ni, si, di] = start[keep] + dur[keep]
    cost = end - begin
    for members, synced in zip(graph.groups, graph.synced):
        began = begin[members].max(axis=0)
        if synced:
            began = began.max(axis=1, keepdims=True)
        cost[members] = np.maximum(end[members] - began, 0.0)
    first_of_rank = ~pd.Series(ops["rank"].to_numpy()).duplicated().to_numpy()
    workers = (
        pd.DataFrame(
            {
                "rank": ops["rank"].to_numpy()[first_of_rank],
                "dp_rank": ops.dp_rank.to_numpy()[first_of_rank],
                "stage": stage[first_of_rank],
            }
        )
        .sort_values("rank")
        .reset_index(drop=True)
    )
    steps = steps_all[kept_steps]
    dropped = sorted(int(s) for s in set(steps_all.tolist()) - set(steps.tolist()))
    return Trace(graph, steps, dp_ranks, cost, workers, dropped)


def simulate(trace: Trace, cost: np.ndarray, dp_axis: int = 1) -> np.ndarray:
    """Each step's time when the ops cost ``cost`` (N, S, D), every replica from t=0: (S,).
    ``cost`` may hold several scenarios side by side, e.g. (N, S, B, 2) with the replicas on the
    last axis (``dp_axis`` = 2, its place in cost.shape[1:]): then the times are (S, B)."""
    g = trace.graph
    end = np.empty_like(cost)
    zero = np.zeros(cost.shape[1:])
    deps = g.deps
    synced_of = {members[0]: synced for members, synced in zip(g.groups, g.synced)}

    def ready(node):
        ds = deps[node]
        if not ds:
            return zero
        if len(ds) == 1:
            return end[ds[0]]
        out = np.maximum(end[ds[0]], end[ds[1]])
        for d in ds[2:]:
            np.maximum(out, end[d], out=out)
        return out

    for unit in g.order:
        first = unit[0]
        synced = synced_of.get(first, False)
        if len(unit) == 1 and not synced:
            np.add(ready(first), cost[first], out=end[first])
            continue
        began = ready(first)
        for m in unit[1:]:
            began = np.maximum(began, ready(m))
        if synced:
            began = began.max(axis=dp_axis, keepdims=True)
        for m in unit:
            np.add(began, cost[m], out=end[m])
    return end.max(axis=0).max(axis=dp_axis)


def by_replica(trace: Trace, orig: np.ndarray, ideal_nodes: np.ndarray, chunk: int = 16) -> np.ndarray:
    """(S, D): step times with replica d as run and every other replica ideal, for each d
    (``ideal_nodes``: (N,) or, where a step has its own, (N, S)). The other replicas are alike, so
    each scenario is a two-replica job (d, one ideal replica): all scenarios run side by side in one
    replay per ``chunk`` of replicas, not one replay each."""
    n, s_count, d_count = orig.shape
    if d_count == 1:
        return simulate(trace, orig)[:, None]
    ideal_nodes = np.broadcast_to(ideal_nodes.reshape(n, -1), (n, s_count))
    out = np.empty((s_count, d_count))
    for lo in range(0, d_count, chunk):
        hi = min(d_count, lo + chunk)
        pair = np.empty((n, s_count, hi - lo, 2))
        pair[..., 0] = orig[:, :, lo:hi]
        pair[..., 1] = ideal_nodes[:, :, None]
        out[:, lo:hi] = simulate(trace, pair, dp_axis=2)
    return out


def ideal_cost(trace: Trace) -> np.ndarray:
    """(N,) each node's typical cost: the median of its op type for communication, the mean for compute."""
    optype = trace.graph.nodes.optype.to_numpy()
    out = np.empty(len(optype))
    for name in np.unique(optype):
        at = optype == name
        values = trace.cost[at]
        out[at] = np.nanmedian(values) if name in COMM_OPTYPES else np.nanmean(values)
    return out


def _per_replica(typical: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """A model's typical costs, (N,) (one per node) or (N, S) (one per node and step), as (N, S, D):
    every replica's op at its node's (and step's) typical cost."""
    typical = np.asarray(typical, dtype=np.float64)
    return np.broadcast_to(typical.reshape(typical.shape + (1,) * (3 - typical.ndim)), shape)


def analyze(
    ops: pd.DataFrame, *, pp: int | None = None, dp_size: int | None = None, model=None, typical=ideal_cost
) -> dict:
    """The what-if figures of a run's ops (see the module docstring); JSON-ready. ``model`` and
    ``typical``: the step's graph builder (prepare) and each node's ideal cost (trace -> (N,), or (N, S)
    where each step has its own), for runs modelled otherwise than a 3D-parallel job (collector.data.whatif.dp)."""
    trace = prepare(ops, pp=pp, dp_size=dp_size, model=model)
    g = trace.graph
    orig = trace.cost
    ideal = _per_replica(typical(trace), orig.shape)
    t_run = simulate(trace, orig)
    t_ideal = simulate(trace, ideal)
    base = t_ideal.mean()

    def keep_as_run(mask: np.ndarray):  # mask broadcastable to (N, S, D): those ops as run
        t = simulate(trace, np.where(mask, orig, ideal))
        return t.mean() / base, t / t_ideal

    node_stage = g.nodes.stage.to_numpy()
    # by_optype's keys: a model may name them (a label column), else the op types, p2p sends and
    # receives as one
    labels = g.nodes["label"] if "label" in g.nodes else g.nodes.optype.map(lambda o: _OPTYPE_LABEL.get(o, o))
    labels = labels.to_numpy()
    by: dict[str, dict] = {}
    per: dict[str, dict] = {}
    for name, keys, mask_of in (
        ("by_optype", sorted(set(labels)), lambda k: (labels == k)[:, None, None]),
        ("by_stage", sorted(set(node_stage.tolist())), lambda k: (node_stage == k)[:, None, None]),
    ):
        by[name], per[name] = {}, {}
        for k in keys:
            overall, steps = keep_as_run(mask_of(k))
            by[name][str(k)] = float(overall)
            per[name][str(k)] = steps
    replica_times = by_replica(trace, orig, ideal[:, :, 0])
    by["by_dp_rank"] = {str(d): float(replica_times[:, i].mean() / base) for i, d in enumerate(trace.dp_ranks)}
    per["by_dp_rank"] = {str(d): replica_times[:, i] / t_ideal for i, d in enumerate(trace.dp_ranks)}
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
    ordered = sorted(workers.itertuples(), key=lambda r: (-by_worker[str(r.rank)], r.rank))
    ranked = ordered[:top_n]
    mask_w = np.zeros((len(g.nodes), 1, len(trace.dp_ranks)), dtype=bool)
    for r in ranked:
        mask_w[node_stage == r.stage, 0, int(np.searchsorted(trace.dp_ranks, r.dp_rank))] = True
    last_stage = node_stage.max()
    m_w, m_w_saved = share_removed(mask_w)
    # what fixing each of the worst workers alone saves, per step: the straggler findings' cost
    saved = {}
    for r in ordered[:SAVED_WORKERS]:
        mask = np.zeros((len(g.nodes), 1, len(trace.dp_ranks)), dtype=bool)
        mask[node_stage == r.stage, 0, int(np.searchsorted(trace.dp_ranks, r.dp_rank))] = True
        saved[str(r.rank)] = t_run - simulate(trace, np.where(mask, ideal, orig))
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
        row["saved_s"] = {rank: float(v[i]) for rank, v in saved.items()}
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
        "saved_s": {rank: float(v.mean()) for rank, v in saved.items()},
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
