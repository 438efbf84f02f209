"""Why a straggler is late: its lateness set against the root-cause signals every rank records.

For each signal (Python GC pauses; the wait for the next batch, as the engine's loader times it or,
in a hook run, the wait from a step's end to the next forward; the time the process waited for
a CPU), take the straggler's value on each of its late steps less what the other ranks had on
the same step (their median): the *excess*, what this rank went through that the others did
not. CPU waits are judged against the rank's own CPU use: a rank that simply computes more on
a busy host also waits more in the run queue, in proportion; only the wait beyond the others'
wait-per-CPU-ms is contention aimed at it (a noisy neighbour on its core). A signal
explains the lateness when its median excess is a real part of the median lateness
(``MIN_EXPLAINED``) and it coincides with most late steps (excess at least ``MIN_EXPLAINED`` of
that step's lateness in ``MIN_COINCIDENCE`` of them; for a signal sampled on a clock, of the mean
lateness over the steps its sample covers); of those, the one explaining the most wins.
Signals a run did not record (NULL columns) are not considered, so an unexplained straggler
stays unexplained rather than blamed on the wrong thing.

When no measured wait explains it, the work itself may: *input imbalance*, a rank given more
tokens than the others (variable-length sequences). Tokens are not time, so they are judged by
ratio: the rank's tokens on a late step over the other ranks' median on that step, at least
``MIN_TOKEN_RATIO`` in the median and on ``MIN_COINCIDENCE`` of its late steps ("it processed
1.8x the median tokens per step on its late steps").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.data.findings.model import duration, pct

MIN_EXPLAINED = 0.5
MIN_COINCIDENCE = 0.6
MIN_TOKEN_RATIO = 1.2

# (cause, signals_by_step column, how the sentence names it). Data loading is measured two ways:
# the engine times its loader; a hook run has only the gap between a step's end and the next
# forward, which holds the script's other host work too, and the sentence says so.
SIGNALS = (
    ("gc", "gc_ms", "GC pauses"),
    ("data", "data_ms", "waits for the next batch (data loading)"),
    ("data", "between_steps_ms", "waits between steps (data loading and host work)"),
    ("host_cpu", "runqueue_ms", "waits for a CPU (host CPU contention)"),
)


class Grids:
    """A run's signals as step x rank grids (``_grid``), each built once and shared by every rank
    explained from them: at 1,024 ranks one takes ~1 s."""

    def __init__(self, signals: pd.DataFrame) -> None:
        self.signals = signals
        self._built: dict[str, pd.DataFrame] = {}

    def __call__(self, column: str) -> pd.DataFrame:
        if column not in self._built:
            self._built[column] = _grid(self.signals, column)
        return self._built[column]


def explain(
    rank: int, lateness: pd.Series, signals: pd.DataFrame, imposed: pd.Series | None = None, grids: Grids | None = None
) -> dict | None:
    """``lateness``: the rank's imposed wait (ms) on its late steps, indexed by step; ``imposed``:
    its imposed wait on every step (late or not; without it, 0 off the late steps);
    ``signals``: queries.signals_by_step (``grids``: its grids, when the caller shares them). Returns
    the cause, a clause for the sentence and the evidence, or None if no recorded signal explains it.

    A signal sampled on a clock (SAMPLED) is known per sample, not per step, so its coincidence
    is judged at that resolution: each late step's excess (the sample's, spread evenly) against
    the rank's mean lateness over the steps the same sample covers. Against the step's own
    lateness, a rank whose lateness comes in bursts (15 ms on one step, 3 on the next, as CPU
    contention makes it) would miss the 50% on the bursty steps though the waits cover it."""
    if lateness.empty or signals.empty:
        return None
    grids = grids if grids is not None else Grids(signals)
    late_steps = lateness.index
    best = None
    for cause, column, label in SIGNALS:
        if column not in signals or signals[column].isna().all():
            continue
        grid = grids(column)
        if rank not in grid.columns or grid.shape[1] < 2:
            continue
        judged = lateness
        if column in SAMPLED:
            judged = _per_sample(rank, lateness, imposed, signals, column, grid.index)
        own = grid[rank].reindex(late_steps).fillna(0.0)
        if cause == "host_cpu" and "cpu_ms" in signals and not signals.cpu_ms.isna().all():
            cpu = grids("cpu_ms")
            per_cpu_ms = (grid / cpu.where(cpu > 0)).drop(columns=rank).median(axis=1)
            others = (cpu[rank] * per_cpu_ms).reindex(late_steps).fillna(0.0)
        else:
            others = grid.drop(columns=rank).median(axis=1).reindex(late_steps).fillna(0.0)
        excess = (own - others).clip(lower=0.0)
        explained = float(excess.median() / lateness.median()) if lateness.median() > 0 else 0.0
        coincidence = float((excess >= MIN_EXPLAINED * judged).mean())
        if explained >= MIN_EXPLAINED and coincidence >= MIN_COINCIDENCE and (best is None or explained > best[0]):
            best = (explained, cause, label, float(np.median(own)), float(others.median()), coincidence)
    if best is None:
        return _input_imbalance(rank, late_steps, signals, grids)
    explained, cause, label, own_median, others_median, coincidence = best
    return {
        "cause": cause,
        "clause": f"its {label}, {duration(own_median)} median per late step (others: {duration(others_median)}), "
        f"coincide with {pct(coincidence)} of its late steps",
        "evidence": {
            "cause": cause,
            "signal_median_ms": own_median,
            "others_median_ms": others_median,
            "coincidence": coincidence,
            "explained": explained,
        },
    }


def shared_cpu_wait(
    rank: int, late_steps: pd.Index, signals: pd.DataFrame | None, grids: Grids | None = None
) -> float | None:
    """The other ranks' median wait for a CPU (ms) on ``rank``'s late steps, or None where the run
    did not record it. On an oversubscribed host every rank waits in the run queue at random; a rank
    late by less than that on its late steps is not told apart from the others' luck by its lateness."""
    if signals is None or signals.empty or "runqueue_ms" not in signals or signals.runqueue_ms.isna().all():
        return None
    grid = (grids if grids is not None else Grids(signals))("runqueue_ms")
    if rank not in grid.columns or grid.shape[1] < 2:
        return None
    others = grid.drop(columns=rank).reindex(late_steps).median(axis=1).dropna()
    return float(others.median()) if len(others) else None


def _input_imbalance(rank: int, late_steps: pd.Index, signals: pd.DataFrame, grids: Grids) -> dict | None:
    """The input-imbalance explanation of a rank's late steps, from the ``tokens`` column, or None."""
    if "tokens" not in signals or signals.tokens.isna().all():
        return None
    grid = grids("tokens")
    if rank not in grid.columns or grid.shape[1] < 2:
        return None
    own = grid[rank].reindex(late_steps)
    others = grid.drop(columns=rank).median(axis=1).reindex(late_steps)
    ratio = (own / others.where(others > 0)).dropna()
    if ratio.empty:
        return None
    median_ratio, coincidence = float(ratio.median()), float((ratio >= MIN_TOKEN_RATIO).mean())
    if median_ratio < MIN_TOKEN_RATIO or coincidence < MIN_COINCIDENCE:
        return None
    return {
        "cause": "input_imbalance",
        "clause": f"it processed {median_ratio:.1f}x the median tokens per step on its late steps "
        f"({own.median():,.0f} vs {others.median():,.0f}), on {pct(coincidence)} of them: input imbalance "
        "(longer sequences)",
        "evidence": {
            "cause": "input_imbalance",
            "tokens_median": float(own.median()),
            "others_tokens_median": float(others.median()),
            "tokens_ratio": median_ratio,
            "coincidence": coincidence,
        },
    }


# Sampled on a clock (every 0.1 s), not per step: a sample covers every step since the one before.
SAMPLED = {"runqueue_ms", "cpu_ms"}


def _grid(signals: pd.DataFrame, column: str) -> pd.DataFrame:
    """step x rank of one signal; a sampled one is spread evenly over the steps each sample covers."""
    grid = signals.groupby(["step", "rank"])[column].sum(min_count=1).unstack("rank")
    if column not in SAMPLED or grid.empty:
        return grid
    grid = grid.reindex(range(int(grid.index.min()), int(grid.index.max()) + 1))
    return grid.apply(_spread)


def _owners(col: pd.Series) -> pd.Series:
    """Per step, which sample covers it: the first at or after it (steps after the last: none, 0)."""
    return col.notna()[::-1].cumsum()[::-1]


def _spread(col: pd.Series) -> pd.Series:
    owner = _owners(col)
    return col.fillna(0.0).groupby(owner).transform("sum") / col.groupby(owner).transform("size")


def _per_sample(
    rank: int, lateness: pd.Series, imposed: pd.Series | None, signals: pd.DataFrame, column: str, steps: pd.Index
) -> pd.Series:
    """The rank's lateness on each late step, as the mean over the steps the same sample of
    ``column`` covers (the resolution the signal has)."""
    raw = signals[signals["rank"] == rank].groupby("step")[column].sum(min_count=1).reindex(steps)
    every = (imposed if imposed is not None else lateness).reindex(steps).fillna(0.0)
    return every.groupby(_owners(raw)).transform("mean").reindex(lateness.index).fillna(lateness)
