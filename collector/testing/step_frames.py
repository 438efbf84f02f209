"""``queries.step_analysis``-shaped frames with a known story, for testing the findings that
read them (stragglers, their onset, exposed communication) as the pure functions they are."""

from __future__ import annotations

import numpy as np
import pandas as pd


def step_rows(
    n_ranks: int,
    n_steps: int,
    *,
    step_ms: float = 100.0,
    late_rank: int | None = None,
    late_ms: float = 0.0,
    late_from: int = 0,
    late_steps=None,
    late_op: str = "reduce_scatter_tensor",
    jitter_ms: float = 0.3,
    comm_ms: float = 40.0,
    seed: int = 0,
) -> pd.DataFrame:
    """Every rank's steps take ``step_ms`` (+ the late rank's lateness, which every rank waits
    out); each step some rank imposes up to ``jitter_ms`` at random, and ``late_rank`` imposes
    ``late_ms`` on the steps from ``late_from`` on (or on ``late_steps``, when given)."""
    rng = np.random.default_rng(seed)
    rank = np.tile(np.arange(n_ranks), n_steps)
    step = np.repeat(np.arange(n_steps), n_ranks)
    on = np.isin(step, list(late_steps)) if late_steps is not None else step >= late_from
    late = np.where(on, late_ms, 0.0) if late_rank is not None else np.zeros(len(step))
    jitter_rank = np.repeat(rng.integers(0, n_ranks, n_steps), n_ranks)
    imposed = np.where(rank == jitter_rank, rng.uniform(0, jitter_ms, len(rank)), 0.0)
    imposed = np.where(rank == late_rank, imposed + late, imposed)
    held = pd.Series(imposed).groupby(step).transform("sum").to_numpy()
    waiting = np.where(rank == late_rank, 0.0, late)
    return pd.DataFrame(
        {
            "rank": rank,
            "step": step,
            "step_ms": step_ms + late,
            "comm_ms": comm_ms + waiting,
            "waiting_ms": waiting,
            "overlapped_ms": comm_ms / 2,
            "imposed_ms": imposed,
            "late_op": np.where(imposed > 0, late_op, None),
            "held_ms": held,
            "timed": True,
        }
    )


TOKENS_PER_STEP = 4096


def signal_rows(
    n_ranks: int, n_steps: int, *, rank: int | None = None, column: str = "gc_ms", ms: float = 0.0, seed: int = 1
) -> pd.DataFrame:
    """``queries.signals_by_step``-shaped: every signal small and noisy on every rank (tokens about
    TOKENS_PER_STEP on each), and ``column`` at ``ms`` (+ noise) more on ``rank``."""
    rng = np.random.default_rng(seed)
    ranks = np.tile(np.arange(n_ranks), n_steps)
    steps = np.repeat(np.arange(n_steps), n_ranks)
    out = {"rank": ranks, "step": steps}
    for name in ("gc_ms", "data_ms", "runqueue_ms"):
        out[name] = rng.uniform(0, 0.5, len(ranks))
    out["cpu_ms"] = rng.uniform(50, 55, len(ranks))
    out["cpu_util"] = np.full(len(ranks), 0.5)
    out["steal"] = np.zeros(len(ranks))
    out["tokens"] = np.round(rng.uniform(0.95, 1.05, len(ranks)) * TOKENS_PER_STEP)
    out["between_steps_ms"] = rng.uniform(0, 0.5, len(ranks))  # drawn last: the others keep their values
    frame = pd.DataFrame(out)
    if rank is not None:
        frame.loc[frame["rank"] == rank, column] += ms
    return frame
