"""Which process group each collective of a gloo torch.profiler trace ran on, when its rank was in
several. The trace does not say: a ``c10d::`` op and its ``gloo:`` worker event carry shapes and
types, no group. But gloo runs a process group's collectives on that group's own worker threads
(two per group, created with it), so each worker thread id of a rank belongs to exactly one of its
groups, and thread ids grow in creation order, as the rank's groups in ``distributedInfo.pg_config``
are listed. Which thread is which group's is decided across ranks: a rank's threads map onto its
groups in creation order, and every member of a group must have issued the same collectives on it
(op and size, in order). Where exactly one assignment fits every rank, the rows take their group
(named as the hook names it), its size, and a seq counted per group from the trace's start;
otherwise those collectives are left out and the import says why."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations_with_replacement

from collector.tools.importers import base
from collector.tools.importers.base import Parsed

HINT = "torch_profiler.groups"  # Parsed.hints key: a trace's Pending
MAX_WAYS = 20_000  # assignments of one rank's threads tried; beyond, the import says so
# ProcessGroupGloo's worker threads per group (its Options' default). Without this bound a group
# doing the same as its peers everywhere could be read as one bigger group: every TP pair's
# collectives, in step on every pair, read as the world's.
GLOO_THREADS = 2


@dataclass(frozen=True)
class Group:
    key: str  # pg_name: the same group's name on every rank
    size: int | None
    ranks: tuple[int, ...]
    world: bool
    desc: str = ""  # pg_desc: the description it was made with (its role, where a script gave one)


def stated(info: dict) -> list[Group]:
    """The rank's process groups as its trace lists them (``pg_config``), in creation order."""
    listed = info.get("pg_config") if isinstance(info.get("pg_config"), list) else []
    groups = []
    for g in listed:
        if not isinstance(g, dict):
            continue
        ranks = g.get("ranks")
        ranks = tuple(ranks) if isinstance(ranks, list) and all(type(r) is int for r in ranks) else ()
        size = g.get("pg_size")
        size = size if type(size) is int and size >= 1 else None
        desc = g.get("pg_desc") if isinstance(g.get("pg_desc"), str) else ""
        groups.append(Group(str(g.get("pg_name", len(groups))), size, ranks, desc == base.WORLD_DESC, desc))
    return groups


@dataclass
class Pending:
    """One trace's collectives whose group is not decided yet: (row, its worker thread, whether
    its element count is per member and multiplies by the group's size)."""

    rank: int
    groups: list[Group]
    rows: list[tuple[dict, object, bool]] = field(default_factory=list)

    def add(self, row: dict, thread, times_group: bool) -> None:
        self.rows.append((row, thread, times_group))


def settle(parsed: list[Parsed]) -> list[str]:
    """Decide the group of every pending collective across the import's traces; returns notes."""
    traces = {p.hints[HINT].rank: p for p in parsed if HINT in p.hints}
    if not traces:
        return []
    pending = {rank: p.hints[HINT] for rank, p in traces.items()}
    count = sum(len(pd.rows) for pd in pending.values())
    found = _assign(pending)
    if isinstance(found, str):
        for rank, p in traces.items():
            dropped = {id(row) for row, _, _ in pending[rank].rows}
            p.rows[("comm", rank)] = [r for r in p.rows[("comm", rank)] if id(r) not in dropped]
        return [
            f"{count:,} collectives not imported: their ranks are in several process groups, and the traces do "
            f"not tell which one each ran on ({found})"
        ]
    every = {g.key: g for pd in pending.values() for g in pd.groups}
    world = next((key for key, g in every.items() if g.world), None)
    roles = {key: g.desc for key, g in every.items()}
    names = base.group_names({key: list(g.ranks) for key, g in every.items()}, world, roles)
    used = set()
    for rank, pd in pending.items():
        seqs: dict[str, int] = defaultdict(int)
        for row, thread, times_group in pd.rows:
            g = found[rank][thread]
            size = g.size or len(g.ranks)
            seqs[g.key] += 1
            used.add(names[g.key])
            row.update(group_name=names[g.key], group_size=size, seq=seqs[g.key])
            if times_group:
                row["numel"] *= size
                row["bytes"] = row["bytes"] and row["bytes"] * size
            base.set_bandwidth(row)
    return [
        f"process groups inferred: {count:,} collectives on {len(used)} groups ({', '.join(sorted(used))}); "
        "a gloo trace names no group per collective, so each took the group whose worker threads ran it, "
        "matched across ranks"
    ]


def _assign(pending: dict[int, Pending]) -> dict[int, dict[object, Group]] | str:
    """rank -> {worker thread: group}, the one assignment that fits every rank; or why none does."""
    options: dict[int, list[tuple[tuple, dict[str, int]]]] = {}
    threads_of: dict[int, list] = {}
    for rank, pd in pending.items():
        threads = {t for _, t, _ in pd.rows}
        if any(type(t) is not int for t in threads):
            return f"rank {rank}'s gloo worker events carry no numeric thread id"
        threads = sorted(threads)
        if not pd.groups or math.comb(len(threads) + len(pd.groups) - 1, len(threads)) > MAX_WAYS:
            return f"rank {rank}: {len(threads)} worker threads over {len(pd.groups)} groups, too many ways to match"
        at = {t: i for i, t in enumerate(threads)}
        calls = [((row["op"], row["numel"]), at[t]) for row, t, _ in pd.rows]
        most = GLOO_THREADS if len(threads) <= GLOO_THREADS * len(pd.groups) else len(threads)
        ways = []
        for way in combinations_with_replacement(range(len(pd.groups)), len(threads)):  # creation order kept
            if max(Counter(way).values()) > most:
                continue
            seqs: list[list] = [[] for _ in pd.groups]
            for call, t in calls:
                seqs[way[t]].append(call)
            ways.append((way, {g.key: hash(tuple(s)) for g, s in zip(pd.groups, seqs, strict=True)}))
        options[rank], threads_of[rank] = ways, threads
    members: dict[str, list[int]] = defaultdict(list)
    for rank, pd in pending.items():
        for g in pd.groups:
            members[g.key].append(rank)
    while True:  # keep only the ways whose every group's collectives some way of each member shares
        allowed = {
            key: set.intersection(*({sig[key] for _, sig in options[r]} for r in ranks))
            for key, ranks in members.items()
        }
        changed = False
        for rank, ways in options.items():
            kept = [(way, sig) for way, sig in ways if all(sig[key] in allowed[key] for key in sig)]
            if not kept:
                return f"rank {rank}'s collectives match no member's of the same groups"
            changed |= len(kept) < len(ways)
            options[rank] = kept
        if not changed:
            break
    unsure = sorted(rank for rank, ways in options.items() if len(ways) > 1)
    if unsure:
        return f"the worker threads of {len(unsure)} of {len(options)} ranks fit their groups more than one way"
    return {
        rank: {t: pending[rank].groups[g] for t, g in zip(threads_of[rank], options[rank][0][0], strict=True)}
        for rank in pending
    }
