"""Which host's link a link probe names: the rates ``rankscope probe`` measured between hosts.

A probe (collector.server.probe) times bytes both ways between one rank of each probed host and
every other, and between each host and the collector. The paths fall into slow and fast at their
widest gap in rate, when that gap is at least SLOW_RATIO (smaller gaps are a probe's own noise:
measured between healthy namespace hosts beside a training job, 4 MiB paths read 4-17 Gbit/s, the
widest gap 2.1x; behind a 120 Mbit/s link, 90-100 Mbit/s against 4+ Gbit/s). A host whose link is
slow is an end every one of whose paths is slow, while a path without it is fast: asked both ways
first, then its sending side alone and its receiving side alone (a link slowed in one direction).
The collector is an end like the hosts, so two hosts with the collector on a third machine still
tell which side is slow; with nothing but the pair itself timed there is no path without either
end to compare, and the verdict keeps both ("the link between host-0 and host-1").

More than half of the ends slow at once is no link (the hosts' CPUs, the network's core), and the
verdict names none. A slowdown that moves every path alike is not seen by comparison at all.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pandas as pd

COLLECTOR = "the collector"
SLOW_RATIO = 3.0
WAYS = (("both ways", "either"), ("sending", "src"), ("receiving", "dst"))
MEASURED = ["host", "peer_host", "peer_rank", "direction", "mbit_s"]  # what rates() reads of a probes row


@dataclass(frozen=True)
class Verdict:
    hosts: tuple[str, ...]  # the hosts whose link is slow (one: named alone); () none or not decisive
    ways: dict[str, str]  # per named host: "both ways" | "sending" | "receiving"
    rates: dict[tuple[str, str], float]  # (from, to) -> Mbit/s, the median of its measurements
    sentence: str


def rates(measured: pd.DataFrame | list[dict] | None) -> dict[tuple[str, str], float]:
    """``measured``: probes rows of status measured (a frame, or the dicts a probe's report holds)
    with MEASURED's columns -> (from, to) -> median Mbit/s; the collector's end is COLLECTOR."""
    if measured is None or len(measured) == 0:
        return {}
    m = pd.DataFrame(measured, columns=MEASURED).dropna(subset=["host", "peer_host", "mbit_s"])
    peer = m.peer_host.where(m.peer_rank >= 0, COLLECTOR)
    sending = m.direction == "send"
    src = m.host.where(sending, peer)
    dst = peer.where(sending, m.host)
    return {(s, d): float(v) for (s, d), v in m.mbit_s.groupby([src, dst]).median().items()}


def judge(paths: dict[tuple[str, str], float]) -> Verdict:
    """Which ends' links ``paths`` ((from, to) -> Mbit/s) show slow."""
    if not paths:
        return Verdict((), {}, {}, "nothing was measured")
    ends = sorted({e for p in paths for e in p})
    cut = _slow_below(sorted(paths.values()))
    slow: dict[str, str] = {}
    compared = False
    for end in ends:
        outside = [v for (s, d), v in paths.items() if end not in (s, d)]
        if not outside:
            continue
        compared = True
        if cut is None or max(outside) < cut:
            continue
        for way, side in WAYS:
            through = [v for (s, d), v in paths.items() if _touches(end, side, s, d)]
            if through and max(through) < cut:
                slow[end] = way
                break
    slowest, fastest = min(paths.values()), max(paths.values())
    spread = f"paths {_rate(slowest)} to {_rate(fastest)}"
    if not compared:
        a, b = ends[0], ends[-1]
        said = f"only {a} and {b} were timed, with no third end to compare: the link between them moved {spread}"
    elif len(slow) > max(1, len(ends) // 2):
        said = f"most paths are slow ({spread}): not one link (the hosts themselves, or the network's core)"
    elif not slow:
        said = f"no link stands out ({spread})"
    elif COLLECTOR in slow:
        said = f"{COLLECTOR}'s own link is slow ({spread}): the probe cannot tell the hosts' links apart through it"
    else:
        said = ""
    if said:
        return Verdict((), {}, paths, said)
    named = tuple(sorted(slow))
    parts = []
    for end in named:
        through = [v for (s, d), v in paths.items() if end in (s, d)]
        outside = max(v for (s, d), v in paths.items() if end not in (s, d))
        parts.append(
            f"{end}'s link is slow {slow[end]} (its paths {_rate(min(through))}-{_rate(max(through))} "
            f"against up to {_rate(outside)} without it)"
        )
    return Verdict(named, {e: slow[e] for e in named}, paths, "; ".join(parts))


def during(
    probes: pd.DataFrame | None, candidates: list[str], spans: list[tuple[int, int]]
) -> tuple[str, Verdict] | None:
    """The latest probe (request id, its verdict) measured inside ``spans`` (steps [onset, stop)
    each) that names hosts, all of them among ``candidates``; None without one."""
    if probes is None or probes.empty:
        return None
    m = probes[probes.status == "measured"]
    inside = pd.Series(False, index=m.index)
    for onset, stop in spans:
        inside |= (m.step >= onset) & (m.step < stop)
    m = m[inside]
    for request_id in m.sort_values("time_ns").request_id.unique()[::-1]:
        verdict = judge(rates(m[m.request_id == request_id]))
        if verdict.hosts and set(verdict.hosts) <= set(candidates):
            return str(request_id), verdict
    return None


def _slow_below(ordered: list[float]) -> float | None:
    """The rate under which a path is slow: the top of the widest gap between sorted rates, where it
    is at least SLOW_RATIO; None: no gap that wide (all paths alike, within the probe's noise)."""
    if len(ordered) < 2 or ordered[0] <= 0:
        return None
    gaps = [(b / a, b) for a, b in itertools.pairwise(ordered) if a > 0]
    ratio, top = max(gaps)
    return top if ratio >= SLOW_RATIO else None


def _touches(end: str, side: str, src: str, dst: str) -> bool:
    return src == end if side == "src" else dst == end if side == "dst" else end in (src, dst)


def _rate(mbit_s: float) -> str:
    return f"{mbit_s / 1000:.2g} Gbit/s" if mbit_s >= 1000 else f"{mbit_s:.3g} Mbit/s"
