"""Which host's link, when the groups that slowed cannot say: how the telemetry itself arrived.

With two hosts every cross-host group spans both, so the groups' transfer times fit either host's
link equally (links.py's covers tie). Training traffic between two hosts crosses both links;
what crosses only one is each host's traffic to a third place -- its ranks' telemetry to the
collector. A rank's telemetry leaves through its host's interface, so where that interface is the
slow link the telemetry waits in its queue, behind the training traffic, for as long as the queue
happens to hold at that moment.

What is measured: a rank's client flushes its records every ``flush_interval_s`` (0.2 s), all its
envelopes at once, so at the collector (collector.data.deliveries: each envelope's receive time)
a rank's flushes arrive evenly spaced; a queue that fills and drains in front of them spaces them
unevenly. Per rank, flushes are the envelopes that arrived within FLUSH_GAP_MS of the one before;
a flush's *jitter* is how far its spacing from the one before lies from the rank's usual spacing
(its median: a queue moves flushes both ways around the client's period, and a link slow from the
first step leaves no healthy stretch to take it from). A host whose jitter during the slowdown stands out of every
other candidate's -- a one-sided Mann-Whitney test of the jitters during it (normal approximation)
at MIN_Z, medians at least MIN_EXTRA_MS apart, at least MIN_FLUSHES flushes each during it -- is
named; two links slow at once are two hosts that stand out together (each of them out of every
other candidate); otherwise the finding keeps its "or" and says what the spacing showed.

Why spacing, not delivery lag (receive time less the envelope's latest record time, the first
idea): measured on the namespace hosts (2 hosts x 2 ranks, tbf 50 Mbit/s on one host's link for
20 steps, 3 runs), the throttled host's median lag rose 50-70 ms but the other's rose 15-50 ms too:
the lag holds the client's wait for its flush, which grows on every host when steps slow (records
are sparser), and the test separated the hosts at z 1.4-5.0 only. The spacing rests on the
sender's own timer and on no record time: median jitter 8-9 ms on the throttled host against
0.7-0.8 ms on the other, z 4.9-5.2, and under 1 ms on both in an unthrottled run.

Where it means nothing: a cluster whose training traffic runs on a fabric the telemetry does not
use (InfiniBand beside a management Ethernet) shows no jitter on either host, so the "or" stays;
it names a host only where the slow interface carries the telemetry too. A host whose CPU is
contended can delay its client's flushes as well, but then its groups inside the host slow too,
and links.py names no link at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.data.deliveries import FLUSH_GAP_NS
from collector.data.findings.probes import during as probes_during

FLUSH_GAP_MS = FLUSH_GAP_NS / 1e6  # the collector keeps one delivery per flush (collector.data.deliveries)
MIN_FLUSHES = 10
MIN_Z = 3.0
MIN_EXTRA_MS = 3.0
WARMUP_STEPS = 5  # the first steps' flushes carry the connection's start
SHOWN = 3  # hosts whose jitter the sentence names
MAX_HOSTS = 4  # at most this many links slow at once are named (more: a cause on the hosts, not links)


@dataclass(frozen=True)
class Side:
    hosts: tuple[str, ...]  # the hosts whose link it is (several: slow at once), or (): not decisive
    jitter_ms: dict[str, float]  # per candidate, its flushes' median jitter during the slowdown
    z: float | None  # the weakest test of a named host against the others (or top against runner-up)
    sentence: str  # what the spacing showed, for the finding's text
    probe: str | None = None  # the link probe that named the hosts (its request id), where it did


def flush_jitter(deliveries: pd.DataFrame, host_of: dict[int, str], spans: list[tuple[int, int]]) -> pd.DataFrame:
    """``deliveries``: queries.delivery_lags (rank, step, received_ns). Per rank and flush (the
    envelopes that arrived within FLUSH_GAP_MS of the one before) after the first: host, step (its
    latest), during (inside one of ``spans``, steps [onset, stop) each), jitter_ms (its spacing from the flush before,
    less the rank's median spacing)."""
    cols = ["host", "rank", "step", "during", "jitter_ms"]
    d = deliveries.dropna(subset=["step", "received_ns"]).sort_values(["rank", "received_ns"])
    if d.empty:
        return pd.DataFrame(columns=cols)
    rank = d["rank"].to_numpy()
    received = d.received_ns.to_numpy(dtype=np.int64)
    new_flush = np.ones(len(d), dtype=bool)
    new_flush[1:] = (rank[1:] != rank[:-1]) | (np.diff(received) > FLUSH_GAP_MS * 1e6)
    f = (
        d.assign(flush=np.cumsum(new_flush))
        .groupby("flush")
        .agg(rank=("rank", "first"), step=("step", "max"), at=("received_ns", "min"))
    )
    f["gap_ms"] = f.groupby("rank").at.diff() / 1e6
    f = f.dropna(subset=["gap_ms"])
    f = f[f.step >= d.step.min() + WARMUP_STEPS]
    f["during"] = False
    for onset, stop in spans:
        f["during"] |= (f.step >= onset) & (f.step < stop)
    usual = f.groupby("rank").gap_ms.median()
    f["jitter_ms"] = (f.gap_ms - f["rank"].map(usual)).abs()
    f["host"] = f["rank"].map(lambda r: host_of.get(int(r)))
    return f.dropna(subset=["host", "jitter_ms"])[cols].reset_index(drop=True)


def which_side_or_probe(
    deliveries: pd.DataFrame | None,
    probes: pd.DataFrame | None,
    host_of: dict[int, str],
    candidates: list[str],
    spans: list[tuple[int, int]],
) -> Side:
    """``which_side``; where the telemetry does not decide, a link probe made while it lasted
    (``rankscope probe``: collector.data.findings.probes) that names hosts among ``candidates``."""
    side = which_side(deliveries, host_of, candidates, spans)
    if side.hosts:
        return side
    probed = probes_during(probes, candidates, spans)
    if probed is None:
        return side
    request_id, verdict = probed
    said = f"{side.sentence}; a link probe while it lasted ({request_id}): {verdict.sentence}"
    return Side(verdict.hosts, side.jitter_ms, side.z, said, probe=request_id)


def mann_whitney_z(x: np.ndarray, y: np.ndarray) -> float:
    """How far ``x`` tends to lie above ``y``: the Mann-Whitney U statistic's z (normal
    approximation, ties ranked by their mean)."""
    n1, n2 = len(x), len(y)
    ranks = pd.Series(np.concatenate([x, y])).rank().to_numpy()
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    return float((u - n1 * n2 / 2) / np.sqrt(n1 * n2 * (n1 + n2 + 1) / 12))


def which_side(
    deliveries: pd.DataFrame | None, host_of: dict[int, str], candidates: list[str], spans: list[tuple[int, int]]
) -> Side:
    """Of ``candidates`` (hosts each of whose link alone explains the slowdown of the steps in
    ``spans``, [onset, stop) each: one, or every episode of a link that flaps), those whose
    telemetry arrived unevenly while the others' did not: the fewest top hosts (by median jitter,
    at most half the candidates) each of which stands out of every other candidate (MIN_Z,
    MIN_EXTRA_MS). Two links slow at once are then two hosts; none: not decisive."""
    if deliveries is None or deliveries.empty:
        return Side((), {}, None, "no telemetry arrival times to tell them apart")
    flushes = flush_jitter(deliveries, host_of, spans)
    inside = {}
    for host in candidates:
        mine = flushes[flushes.host == host]
        if (n := int(mine.during.sum())) < MIN_FLUSHES:
            return Side((), {}, None, f"too few telemetry flushes of {host} to tell ({n} while it lasted)")
        inside[host] = mine[mine.during].jitter_ms.to_numpy()
    jitter = {h: float(np.median(x)) for h, x in inside.items()}
    order = sorted(candidates, key=lambda h: -jitter[h])
    said = ", ".join(f"{h} {jitter[h]:.1f} ms" for h in order[:SHOWN])
    if len(order) > SHOWN:  # at 128 hosts, the rest as one figure
        rest = len(order) - SHOWN
        said += f", {rest} other host{'s' if rest > 1 else ''} <= {jitter[order[SHOWN]]:.1f} ms"
    z_top = None
    for k in range(1, 1 + max(1, min(MAX_HOSTS, len(order) // 2))):
        top, rest = order[:k], order[k:]
        # the weakest named host against the strongest other is the margin; z against every other
        if jitter[top[-1]] - jitter[rest[0]] < MIN_EXTRA_MS:
            continue
        z = min(mann_whitney_z(inside[t], inside[r]) for t in top for r in rest)
        z_top = z if z_top is None else z_top
        if z >= MIN_Z:
            named = sorted(top)
            whose = f"{named[0]}'s telemetry" if k == 1 else f"the telemetry of {', '.join(named[:-1])} and {named[-1]}"
            said = f"{whose} arrived unevenly while it lasted (jitter {said}; z {z:.1f})"
            return Side(tuple(top), jitter, z, said)
    z = z_top if z_top is not None else mann_whitney_z(inside[order[0]], inside[order[1]])
    return Side((), jitter, z, f"the telemetry's arrival does not tell them apart (jitter {said}; z {z:.1f})")
