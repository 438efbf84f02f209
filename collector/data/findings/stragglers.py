"""Stragglers by what they cost: the "what-if" estimate of the step time had a rank not been late.

Arriving last is not a problem by itself: at every collective some rank is last, usually by
microseconds, and start-up broadcasts wait for the slowest process to launch. What matters
is the wait a late rank imposes on the others. ``queries.step_analysis`` gives it per rank
and step (``imposed_ms``: the span from the second-latest arrival to this rank's, combined
over the step's instances); a rank is a straggler when that wait is a real part of the step
and falls on it far more than on the others. Its cost per step is the mean imposed wait,
bounded by the step time, and it is what the job would save per step without it.

The first step is left out: it is warm-up (lazy initialisation, first allocations) on every
rank. The *onset* is where a rank's imposed wait steps up for good: the split of its series
into a low "before" and a high "after" with the least squared error.

Who *arrives last* is a separate, descriptive statistic (the Stragglers page's sentences,
``late_ranks``): with n ranks each instance has one last rank, about 1/n of the time each on
a healthy run, and at 1,024 ranks some rank is last three or four times by pure chance. So a
rank is named there only when its count is both well above its share (FAIR_SHARE_FACTOR) and
beyond chance: the Chernoff bound on the binomial tail P(X >= k), X ~ Bin(instances, 1/n),
times n for looking at every rank, is below CHANCE. The sentence names the few ranks that
matter, the worst first ("ranks 17, 290 and 511 arrive last in 60% of all_reduces"), and
counts the rest.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from collector.data.findings import causes
from collector.data.findings.model import Finding, duration, pct

# A straggler's cost must be at least this share of the step and this many ms per step ...
MIN_COST_SHARE = 0.05
MIN_COST_MS = 1.0
# ... and it must carry this many times its fair share (1/n) of all the imposed waiting,
# capped so a two-rank run can still name one.
FAIR_SHARE_FACTOR = 2.0
MAX_CONCENTRATION = 0.75
MIN_STEPS = 4
# An onset: at least this many steps on each side, and "before" at most this fraction of "after".
ONSET_MIN_SEGMENT = 3
ONSET_BEFORE_RATIO = 0.25
# A rank is judged on its steps since an onset only when there are this many of them and it was
# late on this share of them: a host's CPU contention makes a healthy rank late for a stretch now
# and then (CI: 9 of 17 steps), an injected or real slowdown nearly always (measured: 88% of 40).
# The share must also be beyond chance given how often ranks are late on this run anyway (the
# other ranks' median late share over the run): on a loaded host a healthy rank is late on a third of
# its steps, and then 7 of the last 9 happens (measured beside two busy loops on 2 cores); the
# binomial tail of that count (Chernoff), times the ranks looked at, must be under CHANCE.
WINDOW_MIN_STEPS = 8
# A burst that ended (transient) or every k-th step (intermittent): late on this share of the
# burst's span / of those steps, a burst at least this long and this many steps before the end.
BURST_DENSITY = 0.75
BURST_MIN_STEPS = 3
# A transient burst is at least this long: a loaded host holds a healthy rank back for a few
# steps in a row now and then (seen: 5 steps of +61 ms at load 10), which no step-independent
# chance model forbids; a throttled or contended rank that matters stays slow for longer.
TRANSIENT_MIN_STEPS = 8
MIN_BASE_RATE = 0.05  # the chance model's floor for how often a healthy rank is slow
GROUP_MAX_SHARE = 0.25  # ranks late together: at most this share of the world
WINDOW_LATE_SHARE = 0.75
# Arrival statistics (late_ranks): enough instances to judge, how unlikely by chance, ranks named.
MIN_INSTANCES = 10
CHANCE = 1e-3  # how unlikely, over all ranks, a healthy run's worst count must be to name it
NAMED = 3  # ranks named in a sentence; more are counted


def training_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """``step_analysis`` rows without the warm-up step."""
    if steps.empty:
        return steps
    return steps[steps.step > steps.step.min()]


def step_costs(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step: the step time (median over ranks), the time ranks were held by late arrivals
    (bounded by it), and the what-if step time without them. For the chart over steps."""
    per_step = steps.groupby("step").agg(step_ms=("step_ms", "median"), held_ms=("held_ms", "max"))
    per_step["held_ms"] = np.minimum(per_step.held_ms, per_step.step_ms)
    per_step["what_if_ms"] = per_step.step_ms - per_step.held_ms
    return per_step.reset_index()


def own_lateness(steps: pd.DataFrame) -> pd.DataFrame:
    """``steps`` with each rank's imposed wait less its own wait in the step: a rank that reached
    a collective late because it was waiting for another rank in an earlier one (ranks of a host
    group that wait for their slow member, then arrive late at the cross-host group; a pipeline's
    first stage, whose receive waits end its step last, at the loss broadcast) passes the lateness
    on, it does not cause it. A rank late by itself waits little, so keeps its cost."""
    if "waiting_ms" not in steps:
        return steps
    return steps.assign(imposed_ms=(steps.imposed_ms - steps.waiting_ms.fillna(0.0)).clip(lower=0.0))


def rank_costs(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: cost_ms_per_step (its mean imposed wait, each step's bounded by the step
    time), share_of_run (its total over the run's step time), share_of_waiting (its part of
    all ranks' imposed waiting), late_op (where it imposed the most)."""
    step_ms = steps.groupby("step").step_ms.median()
    bounded = steps.assign(cost=np.minimum(steps.imposed_ms, steps.step.map(step_ms)))
    per_rank = bounded.groupby("rank").agg(total=("cost", "sum"), steps=("step", "nunique"))
    per_rank["cost_ms_per_step"] = per_rank.total / per_rank.steps
    per_rank["share_of_run"] = per_rank.total / step_ms.sum()
    all_waiting = per_rank.total.sum()
    per_rank["share_of_waiting"] = per_rank.total / all_waiting if all_waiting > 0 else 0.0
    by_op = bounded.dropna(subset=["late_op"]).groupby(["rank", "late_op"]).cost.sum()
    per_rank["late_op"] = by_op.groupby(level="rank").idxmax().map(lambda key: key[1]) if len(by_op) else None
    return per_rank.reset_index()


def onsets(series: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each column of a (steps x ranks) matrix of per-step costs steps up for good, all
    columns and all splits at once from cumulative sums: (index of the first slow step, or -1
    where a column does not step up; mean before; mean after)."""
    x = np.asarray(series, dtype=float)
    n = x.shape[0]
    none = np.full(x.shape[1], -1), np.zeros(x.shape[1]), np.zeros(x.shape[1])
    if n < 2 * ONSET_MIN_SEGMENT:
        return none
    csum, csq = np.cumsum(x, axis=0), np.cumsum(x * x, axis=0)
    k = np.arange(ONSET_MIN_SEGMENT, n - ONSET_MIN_SEGMENT + 1)  # first index of "after"
    before_sum, after_sum = csum[k - 1], csum[-1] - csum[k - 1]
    before_sq, after_sq = csq[k - 1], csq[-1] - csq[k - 1]
    kk = k[:, None]
    sse = (before_sq - before_sum**2 / kk) + (after_sq - after_sum**2 / (n - kk))
    best = np.argmin(sse, axis=0)
    cols = np.arange(x.shape[1])
    split = k[best]
    before, after = before_sum[best, cols] / split, after_sum[best, cols] / (n - split)
    stepped = (after > 0) & (before <= ONSET_BEFORE_RATIO * after)
    return np.where(stepped, split, -1), before, after


def onset(series) -> tuple[int, float, float] | None:
    """Where one series of per-step costs steps up for good: (index of the first slow step,
    mean before, mean after), or None if it does not."""
    split, before, after = onsets(np.asarray(series, dtype=float)[:, None])
    return None if split[0] < 0 else (int(split[0]), float(before[0]), float(after[0]))


def late_floor(median_step_ms: float) -> float:
    """The wait a rank must impose on a step to count as late on it."""
    return max(MIN_COST_MS, MIN_COST_SHARE * median_step_ms)


def costly_ranks(
    steps: pd.DataFrame, world_size: int, signals: pd.DataFrame | None = None, saved: pd.DataFrame | None = None
) -> list[Finding]:
    """From queries.step_analysis (rank, step, step_ms, imposed_ms, late_op, held_ms) and, to say
    why, queries.signals_by_step (see findings.causes). ``saved`` (findings.whatif.savings: ms a
    step that fixing the rank alone saves, steps x ranks, from the what-if replay): where it has the
    rank, the finding's cost is the replay's over the same steps (one cost model); arrival lateness
    still decides who is named, and stays in the evidence (``lateness_ms_per_step``).

    A rank that turned slow is judged on the steps since its onset, not diluted by the healthy
    steps before it: a rank slow for the last 500 of 10,000 steps costs what it costs now."""
    # Lateness passed on is not counted: queries.step_analysis leaves out of a rank's imposed wait
    # the part its own previous collective of the group still held it (a transfer a slow link
    # stretched), and own_lateness the rank's waiting in the step (for a slow member of a host group,
    # for a pipeline peer), so what is left is the rank's own doing.
    steps = own_lateness(training_steps(steps))
    if world_size < 2 or steps.empty or steps.step.nunique() < MIN_STEPS:
        return []
    step_ms = steps.groupby("step").step_ms.median()
    bounded = steps.assign(cost=np.minimum(steps.imposed_ms, steps.step.map(step_ms)))
    cost = bounded.pivot_table(index="step", columns="rank", values="cost", aggfunc="sum", fill_value=0.0)
    step_ms = step_ms.reindex(cost.index)
    matrix = cost.to_numpy()
    split, before, after = onsets(matrix)
    median_since = {s: float(step_ms.iloc[s:].median()) for s in {0, *map(int, split[split > 0])}}
    # Judge each rank over the whole run and, if it turned slow long enough ago and has been
    # late on nearly every step since (not the chance "onsets" of healthy jitter), since then.
    late_shares = np.mean(matrix >= late_floor(median_since[0]), axis=0)

    def base_rate(col: int) -> float:  # how often the other ranks were late over the run
        return max(float(np.median(np.delete(late_shares, col))), 1 / len(cost))

    windows = {0} | {
        int(s)
        for col, s in enumerate(split)
        if 0 < s <= len(cost) - WINDOW_MIN_STEPS
        and late_beyond_chance(matrix[s:, col] >= late_floor(median_since[s]), base_rate(col), world_size)
    }
    judged = {
        start: (median_since[start], rank_costs(steps[steps.step >= cost.index[start]]).set_index("rank"))
        for start in windows
    }
    concentration = min(MAX_CONCENTRATION, FAIR_SHARE_FACTOR / world_size)
    # Only ranks costly enough in some window can be named: test the rest in one vectorised pass
    # (a .loc per rank and window was ~1.3 s of `rankscope health` at 8,192 ranks).
    candidates = set()
    for _, per_rank in judged.values():
        ok = (per_rank.cost_ms_per_step >= MIN_COST_MS) & (per_rank.share_of_waiting >= concentration)
        candidates.update(per_rank.index[ok.to_numpy()])
    found = []
    grids = causes.Grids(signals) if signals is not None else None  # built on the first rank explained
    for col, rank in enumerate(cost.columns):
        if rank not in candidates:
            continue
        turned = int(split[col])
        series = cost.iloc[:, col]
        for start in [turned, 0] if turned in judged else [0]:
            median_step, per_rank = judged[start]
            row = per_rank.loc[rank]
            floor = late_floor(median_step)
            # Late on most of its (slow) steps, not a few de-scheduled ones: a rank every rank
            # waits for now and then on a busy host is noise, not a straggler. Its slow steps are
            # those since its onset only when the onset's window was judged (long enough, beyond
            # chance): a healthy rank held back on the last 3 of 24 steps (CI beside other jobs)
            # has an "onset" there, and the median of those 3 steps said nothing about it.
            slow = series.iloc[max(start, turned) if turned in judged else start :]
            if row.cost_ms_per_step >= floor and row.share_of_waiting >= concentration and slow.median() >= floor:
                pattern = late_pattern(series.to_numpy(), _others(matrix, col), floor, world_size)
                found.append(
                    straggler(
                        int(rank),
                        row,
                        start,
                        median_step,
                        series,
                        (turned, before[col], after[col]),
                        signals,
                        pattern,
                        saved,
                        grids,
                    )
                )
                break
        else:
            # Not late on most steps: late in one burst that ended, or on every k-th step?
            median_step, per_rank = judged[0]
            row, floor = per_rank.loc[rank], late_floor(median_step)
            if row.share_of_waiting < concentration or row.cost_ms_per_step < MIN_COST_MS:
                continue
            pattern = late_pattern(series.to_numpy(), _others(matrix, col), floor, world_size)
            if pattern:
                found.append(
                    straggler(int(rank), row, 0, median_step, series, (-1, 0.0, 0.0), signals, pattern, saved, grids)
                )
    found = [f for f in found if f is not None]  # within the host's CPU noise: see straggler()
    if not found:
        group = late_together(steps, world_size, step_ms)
        if group is not None:
            found.append(group)
    return found


def late_together(steps: pd.DataFrame, world_size: int, step_ms: pd.Series) -> Finding | None:
    """Several ranks late together mask each other: at each collective the wait a rank imposes is
    the span from the second-latest arrival to its own, so two ranks 40 ms late impose ~0 each
    while everyone else waits 40 ms (no single what-if helps; removing both would). Seen from the
    waiting side instead: on most steps where a typical rank waits (its median ``waiting_ms`` at
    least the late floor), the same few ranks barely wait (at most a quarter of that). Those ranks,
    at least 2 and at most GROUP_MAX_SHARE of the world (beyond it the "late" ones are simply most
    ranks), cost what the typical rank waits, bounded by the step."""
    if "waiting_ms" not in steps or world_size < 3:
        return None
    wait = steps.pivot_table(index="step", columns="rank", values="waiting_ms", aggfunc="sum", fill_value=0.0)
    typical = wait.median(axis=1)
    floor = late_floor(float(step_ms.median()))
    busy = typical >= floor
    if busy.sum() < MIN_STEPS or busy.mean() < WINDOW_LATE_SHARE:
        return None
    barely = wait[busy].le(0.25 * typical[busy], axis=0).mean()
    group = sorted(int(r) for r in barely[barely >= WINDOW_LATE_SHARE].index)
    if not 2 <= len(group) <= max(2, GROUP_MAX_SHARE * world_size):
        return None
    cost = float(np.minimum(typical, step_ms.reindex(typical.index)).mean())
    median_step = float(step_ms.median())
    late_op = steps[steps["rank"].isin(group)].late_op.dropna()
    op = late_op.mode().iloc[0] if len(late_op) else None
    at = f" at {op}" if isinstance(op, str) else ""
    return Finding(
        kind="straggler",
        severity="warning",
        ranks=tuple(group),
        steps=(int(wait.index[0]), int(wait.index[-1])),
        text=f"{rank_list(group, 0)} cost {duration(cost)} per step ({pct(cost / median_step)} of step time) by "
        f"arriving late together{at}: the other ranks wait for them on {pct(float(busy.mean()))} of steps; "
        "each alone imposes little, as the rest of them arrive as late (removing one would not help, all would)",
        cost_ms_per_step=cost,
        evidence={
            "cost_ms_per_step": cost,
            "median_step_ms": median_step,
            "what_if_step_ms": median_step - cost,
            "late_together": group,
            "op": op,
        },
        page="stragglers",
    )


def _others(matrix: np.ndarray, col: int) -> np.ndarray:
    """The other ranks' columns, for their typical share of slow steps: at 2 ranks the other one;
    beyond, all of them (one column moves a median over 3 or more little, and copying the matrix
    without it for each of 8,192 ranks cost seconds)."""
    return np.delete(matrix, col, axis=1) if matrix.shape[1] <= 2 else matrix


def late_pattern(values: np.ndarray, others: np.ndarray, floor: float, world_size: int) -> dict | None:
    """How a rank's slow steps fall, when it is not slow on most of them. ``values``: its imposed
    wait per step; ``others``: the other ranks' (steps x ranks). A step is slow when its wait is at
    least half the rank's 90th percentile (and the floor): the fault's steps, not the noise around
    them. Judged beyond what chance gives a rank slow at the others' typical share of such steps
    (``p``), times ``world_size`` for looking at every rank, under CHANCE:

    - ``transient``: one burst of at least TRANSIENT_MIN_STEPS (slow on BURST_DENSITY of its span)
      that ended at least BURST_MIN_STEPS before the last step; chance: such a run anywhere,
      n * p^length;
    - ``intermittent``: every k-th step (k >= 2 the common gap), late on BURST_DENSITY of those
      steps; chance: the binomial tail of that count at ``base_rate``.
    Returns the pattern (indexes into the series) or None."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n < 2 * BURST_MIN_STEPS:
        return None
    threshold = max(floor, 0.5 * float(np.quantile(values, 0.9)))
    late = values >= threshold
    base = float(np.median(np.mean(others >= threshold, axis=0))) if others.size else 0.0
    p = min(max(base, MIN_BASE_RATE), 1 - 1e-9)
    idx = np.flatnonzero(late)
    if len(idx) < BURST_MIN_STEPS:
        return None
    span = int(idx[-1] - idx[0] + 1)
    if len(idx) >= BURST_DENSITY * span and idx[-1] <= n - 1 - BURST_MIN_STEPS and idx[0] > 0:
        if len(idx) < TRANSIENT_MIN_STEPS:
            return None
        if n * world_size * p ** len(idx) < CHANCE:
            return {"pattern": "transient", "first": int(idx[0]), "last": int(idx[-1]), "late": len(idx)}
        return None
    gaps = np.diff(idx)
    k = int(np.median(gaps))
    if k < 2:
        return None
    positions = np.arange(idx[0], n, k)
    hits = int(late[positions].sum())
    m = len(positions)
    if m < 4 or hits < BURST_DENSITY * m or hits / m <= p:
        return None
    if world_size * math.exp(-m * _kl(hits / m, p)) >= CHANCE:
        return None
    return {"pattern": "intermittent", "every": k, "late": hits, "of": m}


def late_beyond_chance(late: np.ndarray, base_rate: float, world_size: int) -> bool:
    """Whether a rank late on these steps (booleans) since its onset was late on most of them
    (WINDOW_LATE_SHARE) and more often than chance allows when ranks are late at ``base_rate``:
    P(X >= k), X ~ Bin(steps, base_rate), bounded by exp(-steps * KL(k/steps || base_rate)) and
    times ``world_size`` for looking at every rank, under CHANCE."""
    n, k = len(late), int(np.sum(late))
    if n == 0 or k < WINDOW_LATE_SHARE * n:
        return False
    p, q = min(base_rate, 1 - 1e-9), k / n
    if q <= p:
        return False
    return world_size * math.exp(-n * _kl(q, p)) < CHANCE


def _kl(q: float, p: float) -> float:
    """KL(q || p) of two Bernoulli shares, q > p: the exponent of the binomial tail's Chernoff bound."""
    return q * math.log(q / p) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else 0.0)


def straggler(
    rank, row, start, median_step, imposed: pd.Series, onset_at, signals, pattern=None, saved=None, grids=None
) -> Finding | None:
    """The finding for a rank judged costly over the steps from index ``start`` of ``imposed``
    (its bounded imposed wait per step); ``onset_at`` is (onset index or -1, mean before, after);
    ``pattern`` is late_pattern's, when its late steps were a burst that ended or every k-th step;
    ``saved``: costly_ranks'; ``grids``: the signals' causes.Grids, shared by the run's ranks. None
    when nothing of its own explains it and the other ranks waited as long for a CPU on its late
    steps as it was late (causes.shared_cpu_wait): on an oversubscribed host some rank is late at
    random by about the run queue's wait, and which one says nothing (a healthy 4-rank run beside
    other jobs: rank 2 late 4 ms a step on half its steps, every rank waiting 13.5 ms a step for a CPU)."""
    turned, before, after = onset_at
    if pattern is not None:
        turned = -1  # the pattern says when, not an onset
    cost = lateness = float(row.cost_ms_per_step)
    share = float(row.share_of_run)
    # One cost model: where the what-if replay has the rank, its saving over the same steps is the
    # cost (docs/whatif.md: closer to the measured rise on the fault suite's data-parallel cases);
    # arrival lateness names the rank, and stays in the evidence.
    replayed = replay_cost(saved, rank, int(imposed.index[start]))
    if replayed is not None:
        share = share * replayed / lateness if lateness > 0 else share
        cost = replayed
    text = f"rank {rank} costs {duration(cost)} per step ({pct(share)} of step time)"
    text += f" by arriving late at {row.late_op}" if isinstance(row.late_op, str) else " by arriving late"
    floor = late_floor(median_step)
    evidence = {
        "cost_ms_per_step": cost,
        "cost_model": "arrival lateness" if replayed is None else "what-if replay",
        "lateness_ms_per_step": lateness,
        "replay_ms_per_step": replayed,
        "share_of_run": share,
        "share_of_waiting": float(row.share_of_waiting),
        "median_step_ms": median_step,
        "what_if_step_ms": median_step - cost,
        "op": row.late_op if isinstance(row.late_op, str) else None,
        "steps": int(row.steps),
        "late_steps": int((imposed.iloc[start:] >= floor).sum()),
    }
    first = int(imposed.index[start])
    if turned >= 0:
        first = int(imposed.index[turned])
        text += f"; slow since step {first} (+{duration(after - before)} per step from then)"
        evidence |= {"onset_step": first, "before_ms": float(before), "after_ms": float(after)}
    if pattern is not None and pattern["pattern"] == "transient":
        a, b = int(imposed.index[pattern["first"]]), int(imposed.index[pattern["last"]])
        burst = float(imposed.iloc[pattern["first"] : pattern["last"] + 1].mean())
        text += f"; was slow in steps {a}-{b} (+{duration(burst)} per step then), not since"
        evidence |= {"pattern": "transient", "first_step": a, "last_step": b, "burst_ms": burst}
        first = a
    elif pattern is not None:
        text += f"; slow every {pattern['every']} steps ({pattern['late']} of {pattern['of']} such steps)"
        # the median step is one of its normal steps: without it, every step would be that
        evidence |= {"pattern": "intermittent", "every": pattern["every"], "what_if_step_ms": median_step}
    late = imposed[imposed >= floor]
    why = causes.explain(rank, late, signals, imposed, grids) if signals is not None else None
    if why is None and not late.empty:
        noise = causes.shared_cpu_wait(rank, late.index, signals, grids)
        if noise is not None and float(late.median()) <= noise:
            return None
    if why is not None:
        text += f": {why['clause']}"
        evidence |= why["evidence"]
    return Finding(
        kind="straggler",
        severity="warning",
        ranks=(rank,),
        steps=(first, int(imposed.index[-1])),
        text=text,
        cost_ms_per_step=cost,
        evidence=evidence,
        page="stragglers",
        filters={"rank": rank},
    )


def replay_cost(saved: pd.DataFrame | None, rank: int, first_step: int) -> float | None:
    """The mean of what the what-if replay says fixing ``rank`` alone saves a step (ms), over its
    replayed steps from ``first_step`` on; None where it has no such figure."""
    if saved is None or rank not in saved.columns:
        return None
    values = saved.loc[saved.index >= first_step, rank].dropna()
    return float(max(values.mean(), 0.0)) if len(values) else None


def chance_bound(k: int, instances: int, world_size: int) -> float:
    """Upper bound on the probability that any of ``world_size`` equally likely ranks is
    last in ``k`` or more of ``instances`` (Chernoff: exp(-N * KL(k/N || 1/n)), times n)."""
    p, q = 1 / world_size, k / instances
    if q <= p:
        return 1.0
    kl = q * math.log(q / p) + ((1 - q) * math.log((1 - q) / (1 - p)) if q < 1 else math.log(1 / (1 - p)))
    return min(1.0, world_size * math.exp(-instances * kl))


def rank_list(ranks: list[int], more: int = 0) -> str:
    """'rank 3', 'ranks 3 and 7', 'ranks 17, 290 and 511', 'ranks 17, 290, 511 and 4 more'."""
    words = [str(r) for r in ranks]
    if more:
        return f"ranks {', '.join(words)} and {more} more"
    if len(words) == 1:
        return f"rank {words[0]}"
    return f"ranks {', '.join(words[:-1])} and {words[-1]}"


def late_ranks(last_arrivals: pd.DataFrame, world_size: int) -> list[Finding]:
    """From queries.last_arrivals (op, rank, n_last, share, mean_lead_ms)."""
    found = []
    if world_size < 2:
        return found
    for op, rows in last_arrivals.groupby("op", sort=True):
        total = int(rows.n_last.sum())
        if total < MIN_INSTANCES:
            continue
        # FAIR_SHARE_FACTOR x the fair share, capped: at 2 ranks twice the fair share is every instance
        late = rows[
            (rows.share >= min(MAX_CONCENTRATION, FAIR_SHARE_FACTOR / world_size))
            & rows.n_last.map(lambda k, n=total: chance_bound(int(k), n, world_size) < CHANCE)
        ].sort_values(["n_last", "rank"], ascending=[False, True])
        if late.empty:
            continue
        named = late.head(NAMED)
        ranks = [int(r) for r in named["rank"]]
        share = float(named.n_last.sum() / total)
        lead = float((named.mean_lead_ms * named.n_last).sum() / named.n_last.sum())
        verb = "arrives" if len(late) == 1 else "arrive"
        found.append(
            Finding(
                kind="straggler",
                severity="warning",
                ranks=tuple(ranks),
                text=f"{rank_list(ranks, len(late) - len(named))} {verb} last in {pct(share)} of {op}s "
                f"(+{duration(lead)} on average after the first rank)",
                evidence={
                    "op": op,
                    "share": share,
                    "instances": total,
                    "mean_lead_ms": lead,
                    "late_ranks": [int(r) for r in late["rank"]],
                },
                page="stragglers",
                filters={"op": op},
            )
        )
    return found
