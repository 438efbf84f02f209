"""How much of the step communication takes, counted as the time it is in flight.

Per rank and step, ``queries.step_analysis`` gives the union of the step's communication
intervals (async collectives that overlap count once, so no share exceeds 100%), the part of
it spent waiting for the instance's last rank, and the part that ran beside compute. What is
left after waiting is transfer. The finding is a note (``info``), never a warning: time spent
waiting for a late rank is the straggler finding's to blame, and transfer time on its own is
what the interconnect costs. Without step timers there is no step to share, so no note.

Nor on a pipeline run (the bundled engine's: a ``pipe`` table and point-to-point ops): there
most communication is the activations and gradients sent between stages, async isends in flight
beside the next micro-batch's compute (not step time lost) and blocking receives whose waits are
the pipeline's bubbles, which findings.pipeline measures against 1F1B's ideal and blames on a
slow stage or too few micro-batches. And the pipeline engine's step timer spans its optimizer
step only, so a share of "step time" would be a share of that.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, pct
from collector.data.findings.stragglers import training_steps


def exposed_shares(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank: comm, waiting, transfer and exposed (not beside compute) shares of its step
    time, and the share of its communication that overlapped compute."""
    per_rank = steps.groupby("rank")[["step_ms", "comm_ms", "waiting_ms", "overlapped_ms"]].sum()
    per_rank = per_rank[per_rank.step_ms > 0]
    out = pd.DataFrame(index=per_rank.index)
    out["comm"] = per_rank.comm_ms / per_rank.step_ms
    out["waiting"] = per_rank.waiting_ms / per_rank.step_ms
    out["transfer"] = (per_rank.comm_ms - per_rank.waiting_ms) / per_rank.step_ms
    out["exposed"] = (per_rank.comm_ms - per_rank.overlapped_ms) / per_rank.step_ms
    out["overlapped"] = (per_rank.overlapped_ms / per_rank.comm_ms).where(per_rank.comm_ms > 0, 0.0)
    return out.reset_index()


def recent_exposed_share(steps: pd.DataFrame, window: int) -> pd.DataFrame:
    """Per rank (rank, exposed): the exposed share of ``exposed_shares`` over the rank's last
    ``window`` finished steps (its newest step, maybe still running, left out). What the collector's
    Prometheus gauge reports live, with the Overview's definition. Empty without step timers."""
    if steps.empty or not bool(steps.timed.iloc[0]):
        return pd.DataFrame(columns=["rank", "exposed"])
    age = steps.groupby("rank").step.rank(method="first", ascending=False)
    recent = steps[(age >= 2) & (age <= window + 1)]
    return exposed_shares(recent)[["rank", "exposed"]]


def exposed_communication(steps: pd.DataFrame, pipelined: bool = False) -> list[Finding]:
    """From queries.step_analysis (rank, step, step_ms, comm_ms, waiting_ms, overlapped_ms, timed);
    ``pipelined``: the run is a pipeline of two stages or more (no note, see above)."""
    if pipelined:
        return []
    steps = training_steps(steps)
    if steps.empty or not bool(steps.timed.iloc[0]):
        return []
    shares = exposed_shares(steps)
    if shares.empty:
        return []
    mean = shares[["comm", "waiting", "transfer", "exposed", "overlapped"]].mean()
    worst = shares.loc[shares.comm.idxmax()]
    text = (
        f"communication is in flight {pct(mean.comm)} of step time ({pct(mean.waiting)} waiting for late ranks, "
        f"{pct(mean.transfer)} transfer); {pct(mean.overlapped)} of it overlaps compute"
    )
    return [
        Finding(
            kind="exposed_communication",
            severity="info",
            text=text,
            ranks=(int(worst["rank"]),),
            steps=(int(steps.step.min()), int(steps.step.max())),
            evidence={k: float(v) for k, v in mean.items()} | {"max_comm_share": float(worst.comm)},
            page="comms",
        )
    ]
