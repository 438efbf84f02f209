"""The step of a data-parallel-only run (plain DDP/FSDP under the hook, the engine without a
pipeline), for the what-if replay: what these runs record is each rank's collectives (its arrival,
``start_ns``, and its end) per step, so a step is modelled from them.

Each rank is a worker (dp_rank = rank, stage 0). Per rank and step, in the order it issued them:

    compute #0 -> collective #0 -> compute #1 -> collective #1 -> ... -> collective #n-1

- compute #k is the rank's own time before it issued collective #k: from the moment it was free
  (the end of the collective before, or its issue where that one was asynchronous and left the
  rank free; before a blocking collective, the end of the asynchronous ones still in flight, which
  the rank waited for) to its arrival; compute #0 starts where the rank had finished the step
  before (all its collectives ended), so what runs between steps (the optimizer, data loading) is in it;
- a collective waits for every rank (the world's and a data-parallel group's collectives alike:
  the replay's synced groups) and for the collective before it (one communication stream), and
  costs its transfer time: its end less the last member's arrival;
- the step ends when the rank's last collective ends.

The typical duration (the "no stragglers" job) is, per node, for a collective the longest of
its workers' median transfer times (the step waits for its last worker's) and, for compute, the
lower median over workers of each worker's mean: with two
workers, one slowed, the other one's time; with more, the middle worker's, so a minority of slow
workers does not move it (the OSDI'25 study's mean over all workers would put half of a slowed
rank's delay into the ideal of a 2-rank job).

Steps whose ranks did not issue the run's usual collectives (an eval pass, a checkpoint's
barrier) and the first step (warm-up) are left out.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from collector.data.whatif import replay
from collector.data.whatif.graph import Graph, _topological

COMPUTE = "compute"


def ops(comm: pd.DataFrame) -> pd.DataFrame:
    """``comm``: rank, step, op, log_name, async_op, start_ns, end_ns (one row per collective a rank
    took part in, on one clock). Returns the replay's ops (rank, dp_rank, stage, step, optype, start,
    dur; seconds), empty when no step has the same collectives on every rank, and the op types that
    were issued asynchronously in ``attrs["async"]``."""
    columns = ["rank", "dp_rank", "stage", "step", "optype", "start", "dur"]
    if comm.empty:
        return pd.DataFrame(columns=columns)
    c = comm.assign(optype=comm.log_name.fillna(comm.op).astype(str)).sort_values(["rank", "step", "start_ns"])
    c = c.reset_index(drop=True)
    rank, step = c["rank"].to_numpy(np.int64), c.step.to_numpy(np.int64)
    is_async = c.async_op.fillna(False).astype(bool).to_numpy()
    start, end = c.start_ns.to_numpy(np.int64), c.end_ns.to_numpy(np.int64)
    # (rank, step) groups of consecutive rows, in integer arrays (a 1,024-rank run has 100k of them)
    first = np.r_[True, (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])]
    heads = np.flatnonzero(first)
    gid = np.cumsum(first) - 1
    pos = np.arange(len(c)) - heads[gid]
    g_rank, g_step = rank[heads], step[heads]
    # the steps every rank ran with the run's usual collectives (the most common sequence of op types)
    codes = pd.factorize(c.optype)[0]
    seqs = np.full((len(heads), int(pos.max()) + 1), -1)
    seqs[gid, pos] = codes
    _, which, counts = np.unique(seqs, axis=0, return_inverse=True, return_counts=True)
    usual = which.ravel() == np.argmax(counts)
    # each rank's step before must be there (its end starts compute #0), and the first step is warm-up
    g_end = np.maximum.reduceat(end, heads)
    follows = np.r_[False, (g_rank[1:] == g_rank[:-1]) & (g_step[1:] == g_step[:-1] + 1)]
    prev_end = np.r_[0, g_end[:-1]]
    by_step = pd.DataFrame({"step": g_step, "ok": usual & follows}).groupby("step").ok.agg(["all", "size"])
    good = by_step.index[by_step["all"] & (by_step["size"] == len(np.unique(g_rank)))]
    # where the rank was free before each collective: after the one before (its end, or its issue
    # when asynchronous); at a step's first, after everything of its step before ended
    freed = np.where(is_async, start, end)
    ready = np.where(first, prev_end[gid], np.r_[0, freed[:-1]])
    # before a blocking collective the rank waited for its asynchronous ones still in flight (a
    # ZeRO step's reduce-scatters before the gradient norm): not its compute
    in_flight = pd.Series(np.where(is_async, end, 0)).groupby(gid).cummax().to_numpy()
    in_flight = np.where(first, 0, np.r_[0, in_flight[:-1]])
    ready = np.where(is_async, ready, np.maximum(ready, in_flight))
    keep = c.step.isin(good).to_numpy()
    c, ready, start, end, is_async = c[keep], ready[keep], start[keep], end[keep], is_async[keep]
    if c.empty:
        return pd.DataFrame(columns=columns)
    t0 = pd.Series(np.minimum(ready, start)).groupby(c.step.to_numpy()).transform("min").to_numpy()
    base = dict(rank=c["rank"].to_numpy(), dp_rank=c["rank"].to_numpy(), stage=0, step=c.step.to_numpy())
    compute = pd.DataFrame(
        {**base, "optype": COMPUTE, "start": (ready - t0) / 1e9, "dur": np.maximum(start - ready, 0) / 1e9}
    )
    coll = pd.DataFrame(
        {**base, "optype": c.optype.to_numpy(), "start": (start - t0) / 1e9, "dur": (end - start) / 1e9}
    )
    out = pd.concat([compute, coll], ignore_index=True)[columns]
    out.attrs["async"] = sorted(set(c.optype[is_async]) - set(c.optype[~is_async]))
    return out


def build(ref: pd.DataFrame, asynchronous=()) -> Graph:
    """The graph of one rank's step from ``ref`` (its ops: stage, optype, seq, start, end), the
    chain above; ``asynchronous``: the collective op types that leave the rank free."""
    ref = ref.reset_index(drop=True)
    # the chain in time order: a compute ends at the arrival of the collective it leads to, and
    # comes before it on a tie
    is_compute = ref.optype.to_numpy() == COMPUTE
    chain = np.lexsort((~is_compute, np.where(is_compute, ref.end.to_numpy(), ref.start.to_numpy())))
    nodes = ref.loc[chain, ["stage", "optype", "seq"]].reset_index(drop=True)
    nodes["node"] = np.arange(len(nodes))
    deps: list[list[int]] = [[] for _ in range(len(nodes))]
    g = Graph(nodes=nodes, deps=deps)
    kinds = nodes.optype.tolist()
    last_compute = last_coll = None
    for i, kind in enumerate(kinds):
        if kind == COMPUTE:
            if last_compute is not None:
                deps[i].append(last_compute)
            # after a blocking collective, or before one (waiting for the asynchronous ones; the
            # stream's order makes the last of them the one to wait for)
            leads_to = kinds[i + 1] if i + 1 < len(kinds) else None
            if last_coll is not None and (kinds[last_coll] not in asynchronous or leads_to not in asynchronous):
                deps[i].append(last_coll)
            last_compute = i
        else:
            deps[i].extend(n for n in (last_compute, last_coll) if n is not None)
            g.groups.append([i])
            g.synced.append(True)
            last_coll = i
    g.order = _topological(g)
    return g


def typical(trace) -> np.ndarray:
    """(N,) each node's typical cost: compute's lower median over workers of the worker's mean; a
    collective's, the longest of its workers' median transfers (it ends for the step when its last
    worker's transfer does: a worker that typically leaves it last is how it runs, not a straggler)."""
    optype = trace.graph.nodes.optype.to_numpy()
    out = np.empty(len(optype))
    for i, name in enumerate(optype):
        values = trace.cost[i]  # (S, D)
        if name == COMPUTE:
            means = np.sort(np.nanmean(values, axis=0))
            out[i] = means[(len(means) - 1) // 2]
        else:
            out[i] = np.nanmax(np.nanmedian(values, axis=0))
    return out


def analyze(ops_: pd.DataFrame) -> dict:
    """replay.analyze with this module's step model and typical durations (``ops_``: ``ops``' frame)."""
    model = functools.partial(build, asynchronous=ops_.attrs.get("async", ()))
    return replay.analyze(ops_, model=model, typical=typical)
