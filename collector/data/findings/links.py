"""Slow links: a communicator's *transfer* time stepping up against what the run itself taught
us to expect, localised to the smallest set of hosts whose links explain it.

Transfer, not waiting: the comm rollup splits each collective into the wait for its last rank
(a late rank's doing, the straggler finding's) and what is left, ``dur - wait``, the data moving.
A compute straggler moves the wait and leaves transfer alone; a slow link moves transfer.

Expected transfer, learned from the run: collectives are put in classes (op, message size to a
factor of 4, group span -- inside one host or across hosts -- and group size); a class's expected
time per collective is the median over its groups of the step, medianed over its first
BASELINE_STEPS steps after warm-up, then over its last HISTORY_STEPS steps that were not slow
(so it follows slow drifts, never a fault). Where the data dir holds a calibration of the run's
exact host set (``rankscope calibrate``, collector.data.calibration), a collective the sweep
covers (its op family, span and group size, its size inside the sizes swept) is expected to take
the calibrated time instead: a link slow from the first step, which the run cannot learn as slow,
then shows (and for a slowdown that began inside the first BASELINE_STEPS, only such groups can
show that they kept their speed). Messages under MIN_BYTES are latency, not bandwidth, and left out.

Change points, per communicator (group): its step's transfer over the expected, r = log(ratio),
runs a one-sided CUSUM, S = max(0, S + r - k); S >= ALARM is a slowdown whose onset is the step
after S was last 0. The reference k is log SLOW_RATIO, or NOISE_K robust standard deviations of
the group's own first log ratios where it is noisier (on a quiet cluster a 4x slowdown alarms in
2 steps, 2x in 6; on a loaded 2-core host only what stands out of its noise counts). Once alarmed,
a second CUSUM on k - r finds where it recovered: the end is the step after that one was last 0.

Localisation: slowdowns of several groups that overlap in time are one episode. A link on host h
slows exactly the groups that span hosts and include h; groups inside a host never touch a link.
So an episode is a slow link only when every slowed group spans hosts and the groups inside hosts
kept their speed (else the cause is on the hosts, e.g. CPU contention, and no link is named);
the suspects are the slowed groups' hosts that no unchanged cross-host group includes, and the
finding names the fewest suspects that touch every slowed group (greedy cover). Where several
covers are as small (2 hosts: every cross-host group spans both), how the hosts' telemetry arrived
breaks the tie where it is decisive (collector.data.findings.link_side: the slow link's host's
envelopes queue behind its training traffic and arrive unevenly); else it names them all, "or",
and says what the telemetry showed.

The world group only (plain DDP or FSDP over every rank, one or many ranks a host: most jobs):
there is no group inside a host to compare with, and every collective spans every host, so every
host is a suspect. What shows the hosts kept their speed is then their busy time per step (step
less communication, from step analysis): unchanged on every host (risen by less than MAX_BUSY_RISE
of the link's cost) while the transfer jumped is the network; risen with it, the hosts slowed
themselves (a loaded CPU slows a transfer too) and no link is named. Which host: the telemetry
tie-break above (a third place only one link carries), else the honest "or" of every host. A slow
link is never a straggler: a rank that leaves a collective last (ring order; a slow link stretches
it) and so arrives last at the next has its wait taken out of what it imposes (queries.step_analysis).

Cost per step: for each rank, the extra transfer of the cross-host groups it is in that pass
through the named links (slowed enough to prove it or not; of a point-to-point pair, its
receiver's: the sender does not wait for the bytes to land); the job waits
for the rank that lost most (a synchronous step ends with its last rank), so the step's cost is
the largest, averaged over the episode's steps. Over the world group only, at most what the ranks'
transfer per step grew as a union (async collectives in flight together, DDP's buckets, FSDP's
prefetches, each count the link's time for all of them).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from collector.data import calibration as calibrated
from collector.data.bandwidth import bus_factor
from collector.data.findings.link_side import Side, which_side_or_probe
from collector.data.findings.model import Finding, duration, pct

MIN_BYTES = 64 * 1024
RECEIVES = ("recv", "irecv")
WARMUP_STEPS = 2
BASELINE_STEPS = 10
HISTORY_STEPS = 50
SLOW_RATIO = 1.5
NOISE_K = 2.0
ALARM = 1.5
# the CUSUM's reference never above log of this: a collective this much slower for good is out of any noise
MAX_REFERENCE = 4.0
# a slowdown must last this many steps (a scheduler stall of a step or two on a busy host is not a link)
MIN_EPISODE_STEPS = 3
# a link's cost must be at least this much per step, and this share of the step, to be named
MIN_COST_MS = 1.0
MIN_COST_SHARE = 0.05
# Without groups inside hosts (the world group only): a host whose busy time per step (step less
# communication) rose by more than this share of the link's cost per step slowed itself (CPU
# contention slows transfers and compute alike), so no link is named.
MAX_BUSY_RISE = 0.25
# more single-host alternatives than this are said as a count, not one name each
MAX_NAMED_COVERS = 4


@dataclass
class Episode:
    group: str
    onset: int  # first slow step
    alarm: int  # the step the CUSUM crossed ALARM
    end: int | None  # first step at speed again (None: still slow)


def expected_transfer(t: pd.DataFrame) -> pd.Series:
    """Per row of ``t`` (step, per_coll_ms, cls: a class's number, of op, size to a factor of 4
    (log2(bytes) // 2), span and group size): the class's expected
    time per collective at that step, learned from the steps before it that were not slow."""
    med = t.groupby(["cls", "step"]).per_coll_ms.median()
    out = []
    for cls, series in med.groupby(level="cls"):
        series = series.droplevel("cls").sort_index()
        history = deque(series.iloc[:BASELINE_STEPS].tolist(), maxlen=HISTORY_STEPS)
        base = float(np.median(history))
        for i, (step, value) in enumerate(series.items()):
            out.append((cls, step, base))
            if i >= BASELINE_STEPS and value < SLOW_RATIO * base:
                history.append(float(value))
                base = float(np.median(history))
    expected = pd.DataFrame(out, columns=["cls", "step", "expected"])
    return t[["cls", "step"]].merge(expected, on=["cls", "step"], how="left").expected.set_axis(t.index)


def references(first: dict[str, np.ndarray], kind_of: dict[str, tuple]) -> dict[str, float]:
    """The CUSUM's reference k per group: log SLOW_RATIO, or NOISE_K robust standard deviations
    of the first BASELINE_STEPS log ratios of the groups of its kind (span, size), pooled, where
    their healthy transfers are noisier (a loaded host's): a slowdown must stand out of the noise.
    For groups across hosts at most log MAX_REFERENCE: first steps that jittered 3x (start-up on a
    loaded host) must not hide a link 10x slower for good (whether the hosts kept their speed is the
    controls' to say); groups inside hosts keep theirs (a noisy one "slowed" would clear every link)."""
    pooled: dict[tuple, list] = {}
    for g, x in first.items():
        pooled.setdefault(kind_of[g], []).extend(x.tolist())
    sigma = {}
    for kind, xs in pooled.items():
        x = np.asarray(xs)
        sigma[kind] = 1.4826 * float(np.median(np.abs(x - np.median(x)))) if len(x) else 0.0
    k = {g: max(math.log(SLOW_RATIO), NOISE_K * sigma[kind_of[g]]) for g in first}
    return {g: min(x, math.log(MAX_REFERENCE)) if kind_of[g][0] else x for g, x in k.items()}


def change_points(steps: np.ndarray, log_ratio: np.ndarray, k: float) -> list[tuple[int, int, int | None]]:
    """CUSUM over one group's per-step log ratios with reference ``k``: (onset, alarm, end or
    None) per slowdown."""
    found, s, zero, i, n = [], 0.0, 0, 0, len(steps)
    while i < n:
        s = max(0.0, s + log_ratio[i] - k)
        if s == 0.0:
            zero = i + 1
        if s >= ALARM:
            onset, alarm = _step_up(log_ratio, min(zero, i), i), i
            d, back, end = 0.0, i + 1, None
            j = i + 1
            while j < n:
                d = max(0.0, d + k - log_ratio[j])
                if d == 0.0:
                    back = j + 1
                if d >= ALARM:
                    end = back
                    break
                j += 1
            found.append((int(steps[onset]), int(steps[alarm]), int(steps[end]) if end is not None else None))
            if end is None:
                break
            s, zero, i = 0.0, end, end
            continue
        i += 1
    return found


def _step_up(x: np.ndarray, first: int, alarm: int) -> int:
    """Where in [first, alarm] the series steps up: the split with the least squared error between
    the BASELINE_STEPS before it and the steps after it (up to BASELINE_STEPS past the alarm). The
    CUSUM's own onset, the step after it was last 0, drifts early where noise above the reference
    piled up before the slowdown began (seen 5 steps early on a loaded host)."""
    lo, hi = max(0, first - BASELINE_STEPS), min(len(x), alarm + BASELINE_STEPS + 1)

    def sse(a: np.ndarray) -> float:
        return float(((a - a.mean()) ** 2).sum()) if len(a) else 0.0

    return min(range(first, alarm + 1), key=lambda j: (sse(x[lo:j]) + sse(x[j:hi]), j))


@dataclass
class Ratios:
    """A run's transfer against the expected, per group and step, and who is where."""

    per_group: pd.DataFrame  # group_name, step, transfer_ms, expected_ms, ratio
    rows: pd.DataFrame  # the collectives behind it (group_name, step, op, bytes, n, per_coll_ms, cls, expected_ms)
    host_of: dict[int, str]
    ranks_of: dict[str, list[int]]
    hosts_of: dict[str, frozenset]


def transfer_ratios(
    transfers: pd.DataFrame, members: pd.DataFrame, hosts: pd.DataFrame, calibration: pd.DataFrame | None = None
) -> Ratios | None:
    """``transfers``: queries.link_transfers; ``members``: queries.group_members; ``hosts``:
    queries.ranks; ``calibration``: collector.data.calibration.load's, of the run's hosts (optional).
    None where there is nothing to judge (no hosts, one host, no big messages)."""
    if transfers.empty or members.empty or hosts.empty:
        return None
    host_of = dict(zip(hosts["rank"].astype(int), hosts["host"].astype(str), strict=True))
    ranks_of = members.groupby("group_name")["rank"].apply(lambda r: sorted({int(x) for x in r})).to_dict()
    hosts_of = {g: frozenset(host_of.get(r, f"rank-{r}") for r in rs) for g, rs in ranks_of.items()}
    if len(set(host_of.values())) < 2:
        return None
    t = transfers[(transfers.bytes >= MIN_BYTES) & transfers.group_name.isin(list(hosts_of))]
    t = t[(t.step >= t.step.min() + WARMUP_STEPS) & (t.n > 0)] if not t.empty else t
    if t.empty:
        return None
    # per group once, then joined on (a map over 100,000s of Arrow strings costs seconds)
    groups = pd.DataFrame(
        {
            "group_name": list(ranks_of),
            "span": ["inter" if len(hosts_of[g]) > 1 else "intra" for g in ranks_of],
            "size": [len(rs) for rs in ranks_of.values()],
        }
    )
    t = t.assign(group_name=t.group_name.astype(str)).merge(groups.astype({"group_name": str}), on="group_name")
    # a point-to-point pair (pseudo-group p2p[src->dst]) moves at its receiver's pace: a recv's
    # transfer is its time once the sender had posted (the rollup takes that wait out); a sender's
    # isend ends when it is waited on (after the rest of its schedule), not when its bytes land
    t = t[~t.group_name.str.startswith("p2p[") | t.op.isin(RECEIVES)]
    if t.empty:
        return None
    t["per_coll_ms"] = t.transfer_ms / t.n
    t["bucket"] = (np.log2(t.bytes.clip(lower=1).to_numpy(dtype=float)) // 2).astype(int)
    t["cls"] = t.groupby(["op", "bucket", "span", "size"]).ngroup()
    t["expected_ms"] = expected_transfer(t) * t.n
    t["calibrated"] = False
    if calibration is not None:
        sweep = calibrated.expected_ms(calibration, t.op.to_numpy(), t.bytes.to_numpy(), t.span.to_numpy(), t["size"])
        t["calibrated"] = ~np.isnan(sweep)
        t["expected_ms"] = np.where(t.calibrated, sweep * t.n, t.expected_ms)
    per_group = t.groupby(["group_name", "step"])[["transfer_ms", "expected_ms"]].sum().reset_index()
    per_group["ratio"] = per_group.transfer_ms / per_group.expected_ms.clip(lower=1e-9)
    return Ratios(per_group, t, host_of, ranks_of, hosts_of)


def host_link_ratios(ratios: Ratios | None) -> pd.DataFrame:
    """(host, step, ratio): per host and step, the median transfer ratio of the cross-host groups
    through its link, those not over every host (they slow alike for everyone); the per-host view
    of link health. Empty without cross-host groups."""
    if ratios is None:
        return pd.DataFrame(columns=["host", "step", "ratio"])
    everywhere = set(ratios.host_of.values())
    through = {g: sorted(h) for g, h in ratios.hosts_of.items() if 1 < len(h) and h != everywhere}
    pg = ratios.per_group[ratios.per_group.group_name.isin(through)]
    if pg.empty:
        return pd.DataFrame(columns=["host", "step", "ratio"])
    per_host = pg.assign(host=pg.group_name.map(through)).explode("host")
    return per_host.groupby(["host", "step"]).ratio.median().reset_index()


def slow_links(
    transfers: pd.DataFrame,
    members: pd.DataFrame,
    hosts: pd.DataFrame,
    steps: pd.DataFrame | None = None,
    deliveries: pd.DataFrame | None = None,
    calibration: pd.DataFrame | None = None,
    signals: pd.DataFrame | None = None,
    probes: pd.DataFrame | None = None,
) -> list[Finding]:
    """``transfers``: queries.link_transfers (group_name, step, op, bytes, transfer_ms, n);
    ``members``: queries.group_members (group_name, rank); ``hosts``: queries.ranks (rank, host);
    ``steps``: queries.step_analysis (for the step time a cost is a share of, and where no group
    lies inside a host for the hosts' busy time that shows they kept their speed; optional: without
    it such runs are judged on their transfer alone);
    ``deliveries``: queries.deliveries (to break a tie between hosts; optional); ``calibration``:
    collector.data.calibration.load's, of the run's hosts (what transfers should cost; optional);
    ``signals``: queries.signals_by_step (its runqueue_ms: where the ranks' wait for a CPU rose with
    the transfer, the hosts slowed themselves; optional); ``probes``: queries.probes (link probes
    made while it lasted: which host, where the telemetry cannot say; optional)."""
    ratios = transfer_ratios(transfers, members, hosts, calibration)
    if ratios is None:
        return []
    per_group, t = ratios.per_group, ratios.rows
    host_of, ranks_of, hosts_of = ratios.host_of, ratios.ranks_of, ratios.hosts_of

    ordered = per_group.sort_values(["group_name", "step"])
    log_ratio = np.log(np.clip(ordered.ratio.to_numpy(dtype=float), 1e-3, 1e3))
    names = ordered.group_name.to_numpy()
    cuts = np.flatnonzero(names[1:] != names[:-1]) + 1
    series = {
        str(chunk[0]): (at, x)
        for chunk, at, x in zip(
            np.split(names, cuts), np.split(ordered.step.to_numpy(), cuts), np.split(log_ratio, cuts), strict=True
        )
    }
    kind_of = {g: (len(hosts_of[g]) > 1, len(ranks_of[g])) for g in series}
    refs = references({g: x[:BASELINE_STEPS] for g, (_, x) in series.items()}, kind_of)
    episodes = []
    for group, (at, log_ratio) in series.items():
        for onset, alarm, end in change_points(at, log_ratio, refs[group]):
            episodes.append(Episode(group, onset, alarm, end))
    last_step = int(per_group.step.max())

    def tell(candidates: list[str], spans: list[tuple[int, int]]) -> Side:
        return which_side_or_probe(deliveries, probes, host_of, candidates, spans)

    found = []
    for episode in _overlapping(episodes, last_step):
        finding = _judge(episode, per_group, t, hosts_of, ranks_of, host_of, steps, last_step, refs, tell, signals)
        if finding is not None:
            found.append(finding)
    return _flaps(found, tell, host_of)


def _flaps(found: list[Finding], tell, host_of: dict[int, str]) -> list[Finding]:
    """One finding per link: slowdowns at different times that share a localisation (a link that
    flaps: slow some steps of every N) are told once, with every episode's steps. Each episode may
    have placed it differently (one named the host alone, another an "or" that holds it): the
    merged finding keeps the hosts every episode allows, and the words of the episode that said
    most; its cost is per slow step, over all of them. Where every episode left an "or" of single
    hosts (each too short for its telemetry to tell), their telemetry is judged over all the
    episodes together."""
    clusters: list[list[Finding]] = []
    for f in sorted(found, key=lambda f: f.steps[0]):
        mine = {tuple(c) for c in f.evidence["hosts"]}
        for cluster in clusters:
            if mine & {tuple(c) for g in cluster for c in g.evidence["hosts"]}:
                cluster.append(f)
                break
        else:
            clusters.append([f])
    out = []
    for same in clusters:
        if len(same) == 1:
            out.append(same[0])
            continue
        allowed = set.intersection(*({tuple(c) for c in f.evidence["hosts"]} for f in same))
        told = min(same, key=lambda f: (len(f.evidence["hosts"]), f.steps[0]))  # the most specific
        side = None
        if len(allowed) > 1 and all(len(c) == 1 for c in allowed):
            episodes = [(f.steps[0], f.steps[1] + 1) for f in same]
            side = tell(sorted(h for (h,) in allowed), episodes)
            allowed = {tuple(side.hosts)} if side.hosts else allowed
        first, last = same[0], same[-1]
        lengths = [f.steps[1] - f.steps[0] + 1 for f in same]
        cost = sum(f.cost_ms_per_step * n for f, n in zip(same, lengths, strict=True)) / sum(lengths)
        spans = ", ".join(f"{f.steps[0]}-{f.steps[1]}" for f in same)
        text = (
            f"{told.text}; the link flaps: slow {len(same)} times (steps {spans}), {sum(lengths)} steps in all, "
            f"{duration(cost)} per slow step"
        )
        if side is not None and side.hosts:
            text += f"; over all of them {side.sentence}: {_host_list(side.hosts)}"
            text += "'s link" if len(side.hosts) == 1 else "'s links"
        evidence = {
            **told.evidence,
            "hosts": [list(c) for c in sorted(allowed)],
            "onset_step": first.evidence["onset_step"],
            "detected_step": first.evidence["detected_step"],
            "end_step": last.evidence["end_step"],
            "cost_ms_per_step": cost,
            "episodes": [[f.evidence["onset_step"], f.evidence["end_step"]] for f in same],
        }
        named = {h for c in allowed for h in c}
        ranks = tuple(sorted(r for r, h in host_of.items() if h in named))  # the hosts kept, not told's
        out.append(
            dataclasses.replace(
                told,
                text=text,
                ranks=ranks,
                steps=(first.steps[0], last.steps[1]),
                cost_ms_per_step=cost,
                evidence=evidence,
            )
        )
    return out


def _overlapping(episodes: list[Episode], last_step: int) -> list[list[Episode]]:
    """Slowdowns of different groups whose steps overlap, each list one episode."""
    out: list[list[Episode]] = []
    for e in sorted(episodes, key=lambda e: e.onset):
        stop = e.end if e.end is not None else last_step + 1
        if out and e.onset < max(x.end if x.end is not None else last_step + 1 for x in out[-1]):
            out[-1].append(e)
        elif stop > e.onset:
            out.append([e])
    return out


def _judge(episode, per_group, t, hosts_of, ranks_of, host_of, steps, last_step, refs, tell, signals) -> Finding | None:
    onset = int(np.median([e.onset for e in episode]))
    ends = [e.end for e in episode]
    end = None if any(x is None for x in ends) else int(np.median(ends))
    stop = end if end is not None else last_step + 1
    if stop - onset < MIN_EPISODE_STEPS:
        return None
    during = per_group[(per_group.step >= onset) & (per_group.step < stop)]
    # Over the episode's steps, a group is slowed when its typical step is out of its noise (a
    # one-step spike that alarmed is not; a noisy group's steady slowdown that did not alarm is),
    # unchanged when it stays within half that; in between it proves nothing either way.
    ratio = np.log(during.groupby("group_name").ratio.median())
    slowed = {g for g, r in ratio.items() if r >= refs[g]}
    unchanged = {g for g, r in ratio.items() if r < refs[g] / 2}
    if onset < int(t.step.min()) + BASELINE_STEPS:
        # slow from before the run learned what a transfer costs: a group expected from the run
        # itself learned the slow speed as its own, so only calibrated groups can show they kept it
        swept = t.groupby("group_name").calibrated.all()
        unchanged = {g for g in unchanged if swept.get(g, False)}
    if not slowed:
        return None
    if any(len(hosts_of[g]) < 2 for g in slowed):
        return None  # groups inside a host slowed too: not a link
    if any(len(hosts_of[g]) < 2 for g in ratio.index) and not any(len(hosts_of[g]) < 2 for g in unchanged):
        return None  # groups inside hosts exist and none shows the hosts themselves kept their speed
    cleared = set().union(*(hosts_of[g] for g in unchanged if len(hosts_of[g]) > 1)) if unchanged else set()
    covers = _smallest_covers([hosts_of[g] - cleared for g in slowed])
    if not covers:
        return None
    side = None
    if len(covers) > 1:  # as small covers, each one host: whose telemetry queued?
        side = tell(sorted(h for c in covers for h in c), [(onset, stop)])
        covers = [frozenset(side.hosts)] if side.hosts else covers

    suspects = sorted(set().union(*covers))
    # cost: per step, the rank that lost most to the cross-host groups through the suspects' links
    # (all of them: one slowed less than the rest, say across every host, still costs its part)
    through = {g for g in ratio.index if len(hosts_of[g]) > 1 and hosts_of[g] & set(suspects)}
    slow_rows = during[during.group_name.isin(through)]
    extra = (slow_rows.transfer_ms - slow_rows.expected_ms).clip(lower=0)
    per_rank_step: dict[tuple[int, int], float] = {}
    for g, step, x in zip(slow_rows.group_name, slow_rows.step, extra, strict=True):
        for r in _paid_by(g, ranks_of[g]):
            per_rank_step[(r, int(step))] = per_rank_step.get((r, int(step)), 0.0) + float(x)
    by_step = pd.Series(per_rank_step, dtype=float)
    if by_step.empty:
        return None
    cost = float(by_step.groupby(level=1).max().mean())
    inside = any(len(hosts_of[g]) < 2 for g in ratio.index)
    if not inside:
        # the world group only: DDP's buckets and FSDP's prefetches are async collectives in flight
        # together, each counting the time the link took for all of them; the step lost at most
        # what its ranks' transfer, as a union of their communication less their waiting, grew
        # (slow from the start, with nothing before to grow from: at most that transfer itself)
        grew = transfer_growth(steps, onset, stop)
        cost = min(cost, grew) if grew is not None else cost
    step_ms = None
    if steps is not None and not steps.empty and "step_ms" in steps:
        before = steps[(steps.step < onset) & (steps.step > steps.step.min())]
        step_ms = float(before.groupby("step").step_ms.median().median()) if not before.empty else None
    if cost < MIN_COST_MS or (step_ms and cost < MIN_COST_SHARE * step_ms):
        return None
    busy, by_calibration = None, False
    if not inside and steps is not None:
        # no group inside a host to show the hosts kept their speed (the world group only, as plain
        # DDP/FSDP run): their compute must have, on every host, while the transfer grew. (Without
        # step analysis, as delivery retention asks, the transfer alone decides: a superset.)
        busy = busy_before_after(steps, host_of, onset, stop)
        # a loaded CPU slows a CPU-driven transfer (gloo; NCCL's proxy threads) while the step's busy
        # part hides under it (DDP overlaps compute and buckets): the ranks' wait for a CPU tells
        cpu_wait = cpu_wait_before_after(signals, host_of, onset, stop)
        if cpu_wait and any(after - before > MAX_BUSY_RISE * cost for before, after in cpu_wait.values()):
            return None
        if busy is None and _calibrated_from_the_start(t, slowed, ratio, onset, stop):
            by_calibration = True  # no healthy stretch to compare compute with: the sweep is the yardstick
        elif busy is None or any(after - before > MAX_BUSY_RISE * cost for before, after in busy.values()):
            return None

    # the sentence's numbers: the busiest slowed class, its busbw before and during
    rows = t[t.group_name.isin(slowed) & (t.step >= onset) & (t.step < stop)]
    top = rows.assign(extra=rows.transfer_ms - rows.expected_ms).groupby("cls").extra.sum().idxmax()
    cls_rows = rows[rows.cls == top]
    op, size = str(cls_rows.op.iloc[0]), int(cls_rows["size"].iloc[0])
    nbytes = float(cls_rows.bytes.median())
    factor = bus_factor(op, int(size)) or 1.0
    before_gbs = nbytes * factor / (float(cls_rows.expected_ms.div(cls_rows.n).median()) * 1e6)
    after_gbs = nbytes * factor / (float(cls_rows.per_coll_ms.median()) * 1e6)
    fell = before_gbs / after_gbs if after_gbs > 0 else float("inf")
    swept = bool(cls_rows.calibrated.all())  # expected from rankscope calibrate's sweep, not the run
    where = " or ".join(f"{_host_list(c)}'s link" if len(c) == 1 else f"the links of {_host_list(c)}" for c in covers)
    if len(covers) > MAX_NAMED_COVERS and all(len(c) == 1 for c in covers):  # 128 hosts: not 128 names
        names = sorted(h for c in covers for h in c)
        where = f"the link of one of {len(names)} hosts ({names[0]} ... {names[-1]}: evidence.hosts lists them)"
    spanning = " or ".join(_host_list(c) for c in covers)
    n_hosts = len(set(host_of.values()))
    if all(hosts_of[g] == set(host_of.values()) for g in slowed):  # the world group: every host, whichever
        spanning = "both hosts" if n_hosts == 2 else f"all {n_hosts} hosts"
    first_alarm = min(e.alarm for e in episode)
    text = (
        f"{op} busbw on groups spanning {spanning} fell {fell:.1f}x at step {onset} "
        f"({before_gbs:.2g} -> {after_gbs:.2g} GB/s{' calibrated before' if swept else ''}); "
        f"{_control_words(inside, busy, by_calibration)}: {where}; "
        f"costs {duration(cost)} per step"
    )
    if by_calibration and steps is not None and "step_ms" in steps:  # no step before it: a share of its own
        now = steps[(steps.step >= onset) & (steps.step < stop)].groupby("step").step_ms.median().median()
        text += f" ({pct(cost / now)} of the {duration(now)} step)" if pd.notna(now) and now else ""
    elif step_ms:
        text += f" (+{pct(cost / step_ms)} on the {duration(step_ms)} step before)"
    text += f", ended at step {end}" if end is not None else ", still slow"
    if side is not None:
        text += f"; {side.sentence}"
    ranks = tuple(sorted(r for r, h in host_of.items() if h in suspects))
    # ranks the link can make late to others: those of the slowed groups that do not span every
    # host (a group over all of them slows everyone alike)
    everywhere = set(host_of.values())
    partial = [g for g in slowed if hosts_of[g] != everywhere] or list(slowed)
    affected = sorted({r for g in partial for r in ranks_of[g]})
    return Finding(
        kind="slow_link",
        severity="warning",
        text=text,
        ranks=ranks,
        steps=(onset, (end - 1) if end is not None else last_step),
        cost_ms_per_step=cost,
        evidence={
            "hosts": [sorted(c) for c in covers],
            "onset_step": onset,
            "detected_step": first_alarm,
            "end_step": end,
            "op": op,
            "bytes": nbytes,
            "factor": fell,
            "before_gbs": before_gbs,
            "after_gbs": after_gbs,
            "cost_ms_per_step": cost,
            "median_step_ms": step_ms,
            "slowed_groups": sorted(slowed),
            "unchanged_groups": len(unchanged),
            "affected_ranks": affected,
            "expected_from": "calibration" if swept else "run",
            "control": "host groups" if inside else "compute" if busy else "calibration" if by_calibration else "none",
            "busy_ms": {h: [round(b, 2), round(a, 2)] for h, (b, a) in busy.items()} if busy else None,
            "telemetry_jitter_ms": side.jitter_ms if side is not None else None,
            "telemetry_jitter_z": side.z if side is not None else None,
            "probe": side.probe if side is not None else None,
        },
        page="comms",
    )


def hosts_in_doubt(finding: Finding) -> list[str]:
    """Every host a slow-link finding's alternatives name (evidence.hosts: one list per "or"); a
    finding that named its host alone has one."""
    return sorted({h for cover in finding.evidence.get("hosts", []) for h in cover})


def _paid_by(group: str, ranks: list[int]) -> list[int]:
    """The ranks a group's extra transfer holds up: all of a collective's; a point-to-point pair's
    receiver (p2p[src->dst]: the sender's isend does not wait for the bytes to land)."""
    if group.startswith("p2p[") and "->" in group:
        dst = group.rsplit("->", 1)[1].rstrip("]")
        if dst.isdigit():
            return [int(dst)]
    return ranks


def transfer_growth(steps: pd.DataFrame | None, onset: int, stop: int) -> float | None:
    """How much the ranks' transfer per step (their communication less waiting, each a union over
    the step's collectives) grew over [onset, stop) from the HISTORY_STEPS steps before: the per
    step maximum over ranks, mean during less median before. With too few steps before or during
    (slow from the start: nothing to grow from), the transfer during it itself. None without step
    analysis or steps during it."""
    if steps is None or steps.empty or not {"comm_ms", "waiting_ms"} <= set(steps.columns):
        return None
    s = steps[steps.step >= steps.step.min() + WARMUP_STEPS]
    per_step = (s.comm_ms - s.waiting_ms.fillna(0.0)).groupby(s.step).max()
    before = per_step[(per_step.index < onset) & (per_step.index >= onset - HISTORY_STEPS)]
    during = per_step[(per_step.index >= onset) & (per_step.index < stop)]
    if len(before) < MIN_EPISODE_STEPS or len(during) < MIN_EPISODE_STEPS:
        return float(during.mean()) if len(during) else None
    return max(0.0, float(during.mean() - before.median()))


def cpu_wait_before_after(
    signals: pd.DataFrame | None, host_of: dict[int, str], onset: int, stop: int
) -> dict[str, tuple[float, float]] | None:
    """Per host, its ranks' typical wait for a CPU per step (runqueue_ms) before ``onset`` and
    during [onset, stop) (_per_host_before_after). None where the run recorded none."""
    if signals is None or signals.empty or "runqueue_ms" not in signals or signals.runqueue_ms.isna().all():
        return None
    return _per_host_before_after(signals.dropna(subset=["runqueue_ms"]), "runqueue_ms", host_of, onset, stop)


def busy_before_after(
    steps: pd.DataFrame | None, host_of: dict[int, str], onset: int, stop: int
) -> dict[str, tuple[float, float]] | None:
    """Per host, its ranks' typical busy time per step (step less communication: compute and
    whatever else is not a collective) before ``onset`` and during [onset, stop)
    (_per_host_before_after). None without step analysis."""
    if steps is None or steps.empty or not {"step_ms", "comm_ms"} <= set(steps.columns):
        return None
    return _per_host_before_after(steps.assign(busy=steps.step_ms - steps.comm_ms), "busy", host_of, onset, stop)


def _per_host_before_after(
    frame: pd.DataFrame, column: str, host_of: dict[int, str], onset: int, stop: int
) -> dict[str, tuple[float, float]] | None:
    """Per host, ``column`` (per rank and step) typical over the HISTORY_STEPS steps before
    ``onset`` (warm-up left out) and over [onset, stop): the median over steps of the median over
    its ranks. None without MIN_EPISODE_STEPS steps on both sides."""
    s = frame[frame.step >= frame.step.min() + WARMUP_STEPS].assign(host=lambda x: x["rank"].map(host_of))
    before = s[(s.step < onset) & (s.step >= onset - HISTORY_STEPS)]
    during = s[(s.step >= onset) & (s.step < stop)]
    if before.step.nunique() < MIN_EPISODE_STEPS or during.step.nunique() < MIN_EPISODE_STEPS:
        return None
    b = before.groupby(["host", "step"])[column].median().groupby(level="host").median()
    a = during.groupby(["host", "step"])[column].median().groupby(level="host").median()
    return {str(h): (float(b[h]), float(a[h])) for h in b.index.intersection(a.index)} or None


def _calibrated_from_the_start(t: pd.DataFrame, slowed: set, ratio: pd.Series, onset: int, stop: int) -> bool:
    """A world-group-only slowdown from before the run learned anything (no step before it to show
    the hosts' compute kept its speed) is still the network where every slowed collective was
    expected from ``rankscope calibrate``'s sweep of these hosts and runs at least MAX_REFERENCE
    times that: more than a busy CPU makes of a transfer (a milder one stays unsaid)."""
    if onset >= int(t.step.min()) + BASELINE_STEPS:
        return False
    rows = t[t.group_name.isin(slowed) & (t.step >= onset) & (t.step < stop)]
    return bool(len(rows)) and bool(rows.calibrated.all()) and all(ratio[g] >= math.log(MAX_REFERENCE) for g in slowed)


def _control_words(inside: bool, busy: dict[str, tuple[float, float]] | None, by_calibration: bool = False) -> str:
    """What shows the hosts themselves kept their speed."""
    if inside:
        return "groups inside hosts unchanged"
    if by_calibration:
        return f"from the first steps, at least {MAX_REFERENCE:g}x what rankscope calibrate measured on these hosts"
    if busy is None:
        return "no group inside a host or step time to compare with"
    before = np.median([b for b, _ in busy.values()])
    after = np.median([a for _, a in busy.values()])
    return f"compute on every host unchanged ({duration(before)} -> {duration(after)} a step)"


def _smallest_covers(sets: list[frozenset]) -> list[frozenset]:
    """The fewest hosts touching every set: all such single hosts if one is enough, else the
    greedy cover. Empty when some set has no suspect left (nothing explains it)."""
    if not sets or any(not s for s in sets):
        return []
    common = frozenset.intersection(*sets)
    if common:
        return [frozenset([h]) for h in sorted(common)]
    left, cover = list(sets), set()
    while left:
        counts: dict[str, int] = {}
        for s in left:
            for h in s:
                counts[h] = counts.get(h, 0) + 1
        best = min(counts, key=lambda h: (-counts[h], h))
        cover.add(best)
        left = [s for s in left if best not in s]
    return [frozenset(cover)]


def _host_list(hosts) -> str:
    hosts = sorted(hosts)
    return hosts[0] if len(hosts) == 1 else ", ".join(hosts[:-1]) + " and " + hosts[-1]


def busbw_envelope(by_step: pd.DataFrame, found: list[Finding]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """For the Comms page's busbw-vs-size chart. ``by_step``: queries.busbw_by_step_size (step, op,
    bytes, busbw_gbs); ``found``: slow_link findings. Returns (band, marks): per (op, bytes) the
    expected envelope -- the 10th, 50th and 90th percentile of its per-step busbw over the steps no
    slow link covers (warm-up left out) -- and per (finding, op, bytes) the median busbw over the
    finding's steps where it fell under the band's bottom, with the finding's words."""
    band_cols = ["op", "bytes", "low", "mid", "high"]
    mark_cols = ["op", "bytes", "busbw_gbs", "steps", "text"]
    if by_step.empty:
        return pd.DataFrame(columns=band_cols), pd.DataFrame(columns=mark_cols)
    df = by_step[by_step.step >= by_step.step.min() + WARMUP_STEPS]
    windows = [f.steps for f in found if f.kind == "slow_link" and f.steps is not None]
    slow = np.zeros(len(df), dtype=bool)
    for first, last in windows:
        slow |= df.step.between(first, last).to_numpy()
    q = df[~slow].groupby(["op", "bytes"]).busbw_gbs
    band = pd.concat([q.quantile(0.1), q.median(), q.quantile(0.9)], axis=1, keys=["low", "mid", "high"]).reset_index()
    marks = []
    for f in found:
        if f.kind != "slow_link" or f.steps is None:
            continue
        during = df[df.step.between(*f.steps)].groupby(["op", "bytes"]).busbw_gbs.median().rename("busbw_gbs")
        fell = band.merge(during.reset_index(), on=["op", "bytes"])
        fell = fell[fell.busbw_gbs < fell.low]
        for row in fell.itertuples():
            marks.append((row.op, row.bytes, row.busbw_gbs, f"{f.steps[0]}-{f.steps[1]}", f.text))
    return band[band_cols], pd.DataFrame(marks, columns=mark_cols)


def link_health_grid(per_host: pd.DataFrame, max_rows: int = 32, max_steps: int = 200) -> pd.DataFrame:
    """host_link_ratios cut to a chart readable at 1,024 hosts: hosts x steps of the transfer ratio,
    the ``max_rows - 1`` worst hosts (by their 90th-percentile step) first, the rest as one row of
    their median ("others: N hosts"); steps binned to at most ``max_steps`` columns (a bin's max)."""
    if per_host.empty:
        return pd.DataFrame()
    width = max(1, -(-int(per_host.step.nunique()) // max_steps))
    binned = per_host.assign(step=per_host.step // width * width)
    grid = binned.pivot_table(index="host", columns="step", values="ratio", aggfunc="max")
    worst = grid.quantile(0.9, axis=1).sort_values(ascending=False, kind="stable")
    if len(grid) <= max_rows:
        return grid.loc[worst.index]
    keep = worst.index[: max_rows - 1]
    rest = grid.drop(index=keep)
    others = rest.median(axis=0).to_frame(f"others: {len(rest)} hosts (median)").T
    return pd.concat([grid.loc[keep], others])
