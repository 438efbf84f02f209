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
ARRIVAL = " arrival"  # a collective's op type + this: the ranks meeting at it (costs nothing; starts it)


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
    # a collective starts when its last rank arrives (every rank runs the same sequence in the steps kept)
    last = pd.Series(start).groupby([step, pos]).transform("max").to_numpy()
    # where the rank was free before each collective: after the one before (its end; where that one
    # was asynchronous, once every rank had arrived at it); at a step's first, after everything of its
    # step before ended
    freed = np.where(is_async, np.maximum(start, np.minimum(last, end)), end)
    ready = np.where(first, prev_end[gid], np.r_[0, freed[:-1]])
    # before a blocking collective the rank waited for its asynchronous ones still in flight (a
    # ZeRO step's reduce-scatters before the gradient norm): not its compute
    in_flight = pd.Series(np.where(is_async, end, 0)).groupby(gid).cummax().to_numpy()
    in_flight = np.where(first, 0, np.r_[0, in_flight[:-1]])
    ready = np.where(is_async, ready, np.maximum(ready, in_flight))
    # the transfer begins when every rank arrived and the rank's collective before ended (one stream)
    began = np.maximum(last, np.where(first, 0, np.r_[0, end[:-1]]))
    keep = c.step.isin(good).to_numpy()
    c, ready, start, end, is_async, began = (x[keep] for x in (c, ready, start, end, is_async, began))
    if c.empty:
        return pd.DataFrame(columns=columns)
    t0 = pd.Series(np.minimum(ready, start)).groupby(c.step.to_numpy()).transform("min").to_numpy()
    base = dict(rank=c["rank"].to_numpy(), dp_rank=c["rank"].to_numpy(), stage=0, step=c.step.to_numpy())
    names = c.optype.to_numpy()
    own = np.maximum(start - ready, 0)  # a compute ends at the arrival it leads to (its start: in arrival order)
    compute = pd.DataFrame({**base, "optype": COMPUTE, "start": (start - own - t0) / 1e9, "dur": own / 1e9})
    arrive = pd.DataFrame({**base, "optype": names + ARRIVAL, "start": (start - t0) / 1e9, "dur": 0.0})
    transfer = pd.DataFrame(
        {**base, "optype": names, "start": (began - t0) / 1e9, "dur": np.maximum(end - began, 0) / 1e9}
    )
    out = pd.concat([compute, arrive, transfer], ignore_index=True)[columns]
    out.attrs["async"] = sorted(set(c.optype[is_async]) - set(c.optype[~is_async]))
    return out


def build(ref: pd.DataFrame, asynchronous=()) -> Graph:
    """The graph of one rank's step from ``ref`` (its ops: stage, optype, seq, start, end), the
    chain above; ``asynchronous``: the collective op types that leave the rank free once every rank
    has arrived. A collective is two nodes: the ranks' meeting (synced: it waits for every rank;
    costs nothing) and the rank's transfer after it (and after its transfer before: one stream)."""
    ref = ref.reset_index(drop=True)
    optype = ref.optype.to_numpy().astype(str)
    is_compute, is_arrival = optype == COMPUTE, np.char.endswith(optype, ARRIVAL)
    # compute k and meeting k alternate in arrival order (a compute ends at its arrival; first on a tie)
    paced = np.flatnonzero(is_compute | is_arrival)
    at = np.where(is_compute, ref.end.to_numpy(), ref.start.to_numpy())[paced]
    chain = paced[np.lexsort((is_arrival[paced], at))]
    transfers = np.flatnonzero(~is_compute & ~is_arrival)
    order = np.r_[chain, transfers]
    nodes = ref.loc[order, ["stage", "optype", "seq"]].reset_index(drop=True)
    nodes["node"] = np.arange(len(nodes))
    nodes["label"] = nodes.optype.str.removesuffix(ARRIVAL)  # by_optype: a meeting is its collective's
    index = {(o, q): n for o, q, n in nodes[["optype", "seq", "node"]].itertuples(index=False)}
    deps: list[list[int]] = [[] for _ in range(len(nodes))]
    g = Graph(nodes=nodes, deps=deps)
    kinds = nodes.optype.tolist()
    last_compute = last_meeting = last_transfer = None
    for i in range(len(chain)):
        kind = kinds[i]
        if kind == COMPUTE:
            if last_compute is not None:
                deps[i].append(last_compute)
            if last_meeting is not None:
                before = kinds[last_meeting].removesuffix(ARRIVAL)
                leads_to = kinds[i + 1].removesuffix(ARRIVAL) if i + 1 < len(chain) else None
                # free once the ranks met at an asynchronous collective; after a blocking one, or before
                # one (waiting for the asynchronous ones in flight), once its transfer ended (the
                # stream's order makes the last transfer the one to wait for)
                free_early = before in asynchronous and leads_to in asynchronous
                deps[i].append(last_meeting if free_early else last_transfer)
            last_compute = i
        else:
            transfer = index[(kind.removesuffix(ARRIVAL), nodes.seq[i])]
            if last_compute is not None:
                deps[i].append(last_compute)
            g.groups.append([i])
            g.synced.append(True)
            deps[transfer].extend(n for n in (i, last_transfer) if n is not None)
            last_meeting, last_transfer = i, transfer
    g.order = _topological(g)
    return g


WINDOW_STEPS = 5  # a compute's typical at a step: its workers' medians over the steps this near (11 in all)


def typical(trace) -> np.ndarray:
    """(N, S) each node's typical cost at each step: a compute's, the lower median over workers of
    each worker's median over the steps around it (WINDOW_STEPS either side, the window kept whole at
    the run's ends): what the typical worker took then. So a worker slow for part of the run is
    replayed against its peers of that part (not against another phase's durations, nor a peer's slow
    warm-up), and one step's noise is not the typical (a lower median over 2 workers at each step
    alone would be the faster one's, and would read a slow worker's every noisy op as its delay). A
    collective's, the longest of its workers' median transfers over the run (it ends for the step
    when its last worker's transfer does: a worker that typically leaves it last is how it runs, not
    a straggler)."""
    optype = trace.graph.nodes.optype.to_numpy()
    cost = trace.cost  # (N, S, D)
    n_steps = cost.shape[1]
    out = np.empty(cost.shape[:2])
    compute = optype == COMPUTE
    if compute.any():
        values = cost[compute]  # (K, S, D)
        width = min(n_steps, 2 * WINDOW_STEPS + 1)
        first = np.clip(np.arange(n_steps) - WINDOW_STEPS, 0, n_steps - width)  # each step's window
        windows = np.lib.stride_tricks.sliding_window_view(values, width, axis=1)[:, first]  # (K, S, D, W)
        median = np.nanmedian if np.isnan(values).any() else np.median  # (the NaN-aware one is slower)
        near = np.sort(median(windows, axis=3), axis=2)  # NaN (a worker without the op) last
        counts = np.maximum((~np.isnan(near)).sum(axis=2), 1)
        out[compute] = np.take_along_axis(near, ((counts - 1) // 2)[..., None], axis=2)[..., 0]
    for i in np.flatnonzero(~compute):  # a transfer (a meeting costs nothing)
        out[i] = np.nanmax(np.nanmedian(cost[i], axis=0))
    return out


def analyze(ops_: pd.DataFrame) -> dict:
    """replay.analyze with this module's step model and typical durations (``ops_``: ``ops``' frame)."""
    model = functools.partial(build, asynchronous=ops_.attrs.get("async", ()))
    return replay.analyze(ops_, model=model, typical=typical)
