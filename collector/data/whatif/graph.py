"""The dependency graph of one training step of a 3D-parallel job (DP x PP x TP), as the
OSDI'25 straggler study models it (Lin et al., "Understanding Stragglers in Large Model
Training Using What-if Analysis"), written for rankscope.

One model-parallel group (one data-parallel replica: every pipeline stage of it) is modelled;
every other replica and every step runs the same graph, so the replay evaluates each node for
all (step, dp_rank) pairs at once (collector.data.whatif.replay).

Nodes are the ops of one step of one replica, named (stage, optype, seq): seq is the op's place
among the ops of that type on that stage in start order. Edges, per stage:

- compute stream: forward and backward compute in the order they ran;
- four p2p streams (forward/backward send/recv), each in its own order;
- a receive feeds the compute it precedes and waits for the compute before it; a send waits for
  the compute whose output it carries. A p2p op with no partner (before the first or after the
  last compute, or on the first/last stage) is a no-op: it only keeps its stream's order;
- 1F1B's warm-up: the first backward send/recv waits for the second-last forward before the
  first backward (Megatron sends the last warm-up activation and receives the first gradient
  in one call);
- the DP stream (params all-gather, grads reduce-scatter) in its order; the first forward
  waits for the last all-gather;
- after the last compute: gc -> layernorm all-reduce -> embedding all-reduce (first and last
  stage) -> grads reduce-scatter -> clip (a global norm) -> optimizer. With overlapped DP (the trace
  has ``separate-grads-all-reduce``) the reduce-scatters start at the last backward instead, and the
  separate all-reduce takes their place in that chain, after the last of them and gc.

Collectives and p2p pairs are *groups*: every member starts when the last one is ready, and
ends its own transfer time later. DP collectives and the clip's norm also wait across all
data-parallel replicas (``synced``). Everything else costs its own duration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

FORWARD, BACKWARD = "forward-compute", "backward-compute"
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
PARAMS_AG, GRADS_RS = "params-all-gather", "grads-reduce-scatter"
LAYERNORM, EMBEDDING, CLIP = "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "optimizer-clip-main-grad"
SEPARATE_AR = "separate-grads-all-reduce"  # overlapped DP: the grads left after the overlapped reduce-scatters
GC, OPTIMIZER = "gc", "optimizer"
# The ideal duration of a communication op is its median, of a compute op its mean (the paper's choice:
# a collective's tail is noise, a compute op's mean is what an even load would cost).
COMM_OPTYPES = frozenset((*P2P, PARAMS_AG, GRADS_RS, SEPARATE_AR, LAYERNORM, EMBEDDING, CLIP))
KNOWN_OPTYPES = frozenset((FORWARD, BACKWARD, GC, OPTIMIZER, *COMM_OPTYPES))
_PEER = {"forward-send": "forward-recv", "forward-recv": "forward-send"}
_PEER |= {"backward-send": "backward-recv", "backward-recv": "backward-send"}
# timestamps of the two ends of a step may disagree by a clock's error
_EPS = 5e-5


class GraphError(ValueError):
    """The ops do not form a step this model knows; the message says which op or stage."""


@dataclass
class Graph:
    """Nodes (stage, optype, seq) in ``nodes``; ``deps[i]``: the nodes node i waits for;
    ``groups``: lists of nodes that run as one communication; ``synced[g]``: group g also waits
    across data-parallel replicas. ``order``: the units (a group, or one lone node) in an order
    where every unit comes after all it depends on."""

    nodes: pd.DataFrame  # stage, optype, seq, node
    deps: list[list[int]]
    groups: list[list[int]] = field(default_factory=list)
    synced: list[bool] = field(default_factory=list)
    order: list[tuple[int, ...]] = field(default_factory=list)  # lone node: (node,), group: members


def build(ref: pd.DataFrame, *, pp: int, use_dp: bool) -> Graph:
    """The graph of one step from ``ref``: the ops of one replica in one step (columns stage,
    optype, seq, start, end). Raises GraphError on a step the model cannot explain."""
    unknown = sorted(set(ref.optype) - KNOWN_OPTYPES)
    if unknown:
        raise GraphError(f"op types the model does not know: {', '.join(unknown)}")
    nodes = ref[["stage", "optype", "seq"]].reset_index(drop=True).copy()
    nodes["node"] = np.arange(len(nodes))
    key = {(s, o, q): n for s, o, q, n in nodes[["stage", "optype", "seq", "node"]].itertuples(index=False)}
    deps: list[list[int]] = [[] for _ in range(len(nodes))]
    g = Graph(nodes=nodes, deps=deps)
    ops = ref.assign(node=nodes.node.to_numpy())
    p2p_index: dict[tuple[int, str, int], int] = {}  # (stage, optype, j-th real p2p op) -> node
    for stage in sorted(ops.stage.unique()):
        on = ops[ops.stage == stage].sort_values(["start", "seq", "optype"])
        _stage_edges(g, on, int(stage), pp, use_dp, key, p2p_index)
    _groups(g, ops, pp, use_dp, key, p2p_index)
    g.order = _topological(g)
    return g


def _chain(deps: list[list[int]], chain: list[int], after: list[int] | None = None) -> None:
    last = list(after or [])
    for node in chain:
        deps[node].extend(last)
        last = [node]


def _stage_edges(g, on: pd.DataFrame, stage: int, pp: int, use_dp: bool, key, p2p_index) -> None:
    deps = g.deps
    comp = on[on.optype.isin((FORWARD, BACKWARD))]
    _chain(deps, comp.node.tolist())
    for optype in P2P:
        _chain(deps, on[on.optype == optype].node.tolist())
    for kind, compute in (("forward", FORWARD), ("backward", BACKWARD)):
        runs = comp[comp.optype == compute]
        if runs.empty:
            continue
        nodes = runs.node.tolist()
        for side in ("recv", "send"):
            optype = f"{kind}-{side}"
            p2p = on[on.optype == optype]
            # a receive after the last compute started, or a send that ended before the first
            # compute ended, carries nothing of this step: no partner, no compute edge
            real = (
                p2p.start <= runs.start.max() + _EPS if side == "recv" else p2p.end >= runs.end.min() - _EPS
            ).to_numpy()
            count = int(real.sum())
            first = 0
            if count != len(nodes):
                if stage not in (0, pp - 1) or count not in (0, len(nodes) - 1):
                    raise GraphError(
                        f"stage {stage}: {count} {optype} ops for {len(nodes)} {compute} ops; "
                        "a middle stage sends and receives once per micro-batch"
                    )
                if side == "recv" and count == len(nodes) - 1:
                    first = 1  # the first stage's first receive was not recorded
            # the first stage receives no activation and sends no gradient; the last, the reverse
            no_peer = stage == (0 if optype in ("forward-recv", "backward-send") else pp - 1)
            j = 0
            for at, node in enumerate(p2p.node.tolist()):
                if not real[at]:
                    continue
                cid = first + j
                if side == "recv":
                    deps[nodes[cid]].append(node)
                    if cid >= 1:
                        deps[node].append(nodes[cid - 1])
                else:
                    deps[node].append(nodes[cid])
                if not no_peer:
                    p2p_index[(stage, optype, j)] = node
                j += 1
    # 1F1B warm-up: the first backward send/recv goes with the second-last warm-up forward
    kinds = comp.optype.tolist()
    if BACKWARD in kinds:
        first_bwd = kinds.index(BACKWARD)
        if first_bwd >= 2 and kinds[first_bwd - 1] == FORWARD and kinds[first_bwd - 2] == FORWARD:
            for optype in ("backward-recv", "backward-send"):
                node = key.get((stage, optype, 0))
                if node is not None:
                    deps[node].append(int(comp.node.iloc[first_bwd - 2]))
    if use_dp:
        dp_stream = on[on.optype.isin((PARAMS_AG, GRADS_RS))]
        _chain(deps, dp_stream.node.tolist())
        gathers = on[on.optype == PARAMS_AG].sort_values("seq")
        forwards = comp[comp.optype == FORWARD]
        if not gathers.empty and not forwards.empty:
            deps[int(forwards.node.iloc[0])].append(int(gathers.node.iloc[-1]))
    # after the last compute
    tail = []
    if not comp.empty:
        last_compute = int(comp.node.iloc[int(np.argmax(comp.end.to_numpy()))])
    else:
        last_compute = None
    gc = on[on.optype == GC].sort_values("seq").node.tolist()
    after = gc[:1] if gc else ([last_compute] if last_compute is not None else [])
    if gc and last_compute is not None:
        deps[gc[0]].append(last_compute)
    scatters = on[on.optype == GRADS_RS].sort_values("seq").node.tolist()
    overlapped = use_dp and (on.optype == SEPARATE_AR).any()
    if overlapped and scatters:
        # overlapped DP: the reduce-scatters run beside the backward passes, from the last backward
        # on; what they leave is reduced by the separate all-reduce after the last compute
        backward = comp[comp.optype == BACKWARD]
        if not backward.empty:
            deps[scatters[0]].append(int(backward.node.iloc[int(np.argmax(backward.end.to_numpy()))]))
        after = after + scatters[-1:]
    for optype in (LAYERNORM, EMBEDDING, SEPARATE_AR if overlapped else GRADS_RS, CLIP, OPTIMIZER):
        if optype == EMBEDDING and stage not in (0, pp - 1):
            continue
        tail += on[on.optype == optype].sort_values("seq").node.tolist()
    _chain(deps, tail, after)


def _groups(g: Graph, ops: pd.DataFrame, pp: int, use_dp: bool, key, p2p_index) -> None:
    paired = set()
    for (stage, optype, j), node in sorted(p2p_index.items()):
        if node in paired:
            continue
        peer_stage = stage + (1 if optype in ("forward-send", "backward-recv") else -1)
        peer = p2p_index.get((peer_stage, _PEER[optype], j))
        if peer is None:
            raise GraphError(
                f"stage {stage}'s {optype} #{j} has no {_PEER[optype]} #{j} on stage {peer_stage}: "
                "the trace lost one side of a pipeline transfer"
            )
        g.groups.append([node, peer])
        g.synced.append(False)
        paired |= {node, peer}
    for node in ops[ops.optype.isin(P2P)].node:
        if node not in paired:  # a no-op transfer: waits only for itself
            g.groups.append([int(node)])
            g.synced.append(False)
    if use_dp:
        for node in ops[ops.optype.isin((PARAMS_AG, GRADS_RS, SEPARATE_AR))].node:
            g.groups.append([int(node)])
            g.synced.append(True)
    emb = ops[ops.optype == EMBEDDING]
    for seq in sorted(emb.seq.unique()):
        members = [key[(s, EMBEDDING, seq)] for s in sorted({0, pp - 1}) if (s, EMBEDDING, seq) in key]
        g.groups.append(members)
        g.synced.append(False)
    clip = ops[ops.optype == CLIP]
    for seq in sorted(clip.seq.unique()):
        g.groups.append(clip[clip.seq == seq].node.astype(int).tolist())
        g.synced.append(True)


def _topological(g: Graph) -> list[tuple[int, ...]]:
    """Units (a group or a lone node) in dependency order; GraphError names a cycle's nodes."""
    n = len(g.nodes)
    unit_of = np.arange(n)
    units: list[tuple[int, ...]] = []
    for members in g.groups:
        for m in members:
            unit_of[m] = n + len(units)
        units.append(tuple(members))
    lone = [i for i in range(n) if unit_of[i] == i]
    index = {i: k for k, i in enumerate(lone)}
    all_units = [(i,) for i in lone] + units
    uid = np.array([index[i] if unit_of[i] == i else len(lone) + unit_of[i] - n for i in range(n)])
    need = [set() for _ in all_units]
    for node, ds in enumerate(g.deps):
        for d in ds:
            if uid[d] != uid[node]:
                need[uid[node]].add(int(uid[d]))
    waiting = [len(s) for s in need]
    feeds: list[list[int]] = [[] for _ in all_units]
    for u, s in enumerate(need):
        for d in s:
            feeds[d].append(u)
    ready = [u for u, w in enumerate(waiting) if w == 0]
    order = []
    while ready:
        u = ready.pop()
        order.append(all_units[u])
        for v in feeds[u]:
            waiting[v] -= 1
            if waiting[v] == 0:
                ready.append(v)
    if len(order) != len(all_units):
        stuck = [all_units[u][0] for u, w in enumerate(waiting) if w > 0][:5]
        names = ", ".join(f"{r.optype}#{r.seq}@stage{r.stage}" for r in g.nodes.iloc[stuck].itertuples())
        raise GraphError(f"the ops wait on each other in a cycle (first: {names}); the trace's order is not a step")
    return order
