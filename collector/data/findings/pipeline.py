"""Pipeline parallelism: a stage slower than the others, and too few micro-batches for the stages.

Input: collector.data.pipeline.stage_bubbles (per step, pipeline and stage: busy and bubble time),
the run's first step left out (warm-up) when it has more. Per stage, its forward + backward time
per micro-batch t_s (median over steps of its fastest data-parallel replica: a replica slower than
its peers is a straggler, which the straggler findings name). Under 1F1B a step takes about
sum(t_s) + (m - 1) * max(t_s): after the fill, the pipeline moves at its slowest stage's pace.

- Stage imbalance: the slowest stage takes ``IMBALANCE`` or more longer than the others' mean and
  that costs ``MIN_COST_SHARE`` of the step or more. Cost (ms/step): (m - 1) * (max t - mean t),
  what an even split of the same work would save. Advice: the number k of layers to move to the
  faster neighbour stage that brings the slowest stage down most, assuming the slow stage's time
  is spread evenly over its layers, and what that would save, (m - 1) * (max t - new max t).
- Too few micro-batches: with p stages and m micro-batches each stage idles at least
  (p - 1) / (m + p - 1) of the step. When that ideal is above ``MAX_IDEAL`` and the measured
  bubble is ``MIN_BUBBLE`` or more, say so, with the idle time per step and the m that brings
  the ideal to about 11% (8 micro-batches per stage boundary).
Balanced pipelines with enough micro-batches say nothing.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, duration, pct
from collector.data.pipeline import ideal_fraction

IMBALANCE = 0.2
MIN_COST_SHARE = 0.05
MAX_IDEAL = 0.2
MIN_BUBBLE = 0.2


def _settled(bubbles: pd.DataFrame) -> pd.DataFrame:
    first = bubbles.step.min()
    later = bubbles[bubbles.step > first]
    return later if later.step.nunique() >= 2 else bubbles


def _pipeline(bubbles: pd.DataFrame | None) -> tuple[pd.DataFrame, int, int] | None:
    """The settled rows, stage count and micro-batches per step of a run with a pipeline of
    two stages or more; None otherwise (no finding to make)."""
    if bubbles is None or bubbles.empty:
        return None
    rows = _settled(bubbles)
    stages, m = int(rows.stages.max()), int(rows.micro_batches.median())
    return (rows, stages, m) if stages >= 2 else None


def pipelined(bubbles: pd.DataFrame | None) -> bool:
    """Whether the run is a pipeline of two stages or more (its point-to-point traffic is then the
    stages' activations and gradients, which these findings speak for)."""
    return _pipeline(bubbles) is not None


def stage_imbalance(bubbles: pd.DataFrame | None) -> list[Finding]:
    if (pipeline := _pipeline(bubbles)) is None:
        return []
    rows, stages, m = pipeline
    # a stage's time is its fastest replica's in each step: one slow replica is a straggler (the stage's
    # data-parallel all_reduce waits for it), not a slow stage
    fastest = rows.groupby(["step", "stage"], as_index=False).agg(busy_ms=("busy_ms", "min"), layers=("layers", "max"))
    per_stage = fastest.groupby("stage").agg(busy=("busy_ms", "median"), layers=("layers", "max"))
    t = per_stage.busy / m
    slow = int(t.idxmax())
    t_max, t_others = float(t[slow]), float(t.drop(slow).mean())
    excess = t_max / t_others - 1 if t_others > 0 else float("inf")
    cost = (m - 1) * (t_max - float(t.mean()))
    span = float(rows.groupby("step").span_ms.max().median())
    if excess < IMBALANCE or cost < MIN_COST_SHARE * span:
        return []
    # an imported trace may not say how many layers a stage holds: then no move is suggested
    layers = int(per_stage.layers[slow]) if pd.notna(per_stage.layers[slow]) else None
    neighbour = min((s for s in (slow - 1, slow + 1) if s in t.index), key=lambda s: t[s])
    moved, new_max = _best_move(t, slow, neighbour, layers) if layers else (0, t_max)
    saving = (m - 1) * (t_max - new_max)
    text = (
        f"stage {slow} takes {pct(excess)} longer per micro-batch than the other stages "
        f"({duration(t_max)} vs {duration(t_others)}, forward + backward); the pipeline moves at its pace, "
        f"~{duration(cost)}/step over an even split"
    )
    if moved:
        text += (
            f"; moving about {moved} layer{'s' if moved > 1 else ''} to stage {neighbour} "
            f"would save ~{duration(saving)}/step (PipelineModule partition_method, or the layers' order)"
        )
    elif layers is None:
        text += "; the run does not say how many layers each stage holds: repartition so the stages take alike"
    else:
        text += (
            f"; no move of whole layers evens it out (~{duration(t_max / max(layers, 1))} per layer on "
            f"stage {slow}): look at its costliest layer"
        )
    ranks = tuple(sorted(int(r) for r in rows[rows.stage == slow]["rank"].unique()))
    return [
        Finding(
            kind="stage_imbalance",
            severity="warning",
            text=text,
            ranks=ranks,
            steps=(int(bubbles.step.min()), int(bubbles.step.max())),
            cost_ms_per_step=cost,
            evidence={
                "stage": slow,
                "stages": stages,
                "micro_batches": m,
                "stage_ms_per_micro_batch": {int(s): float(v) for s, v in t.items()},
                "excess": excess,
                "move_layers": moved,
                "move_to_stage": int(neighbour),
                "saving_ms_per_step": saving,
            },
            page="pipeline",
        )
    ]


def _best_move(t: pd.Series, slow: int, neighbour: int, layers: int) -> tuple[int, float]:
    """(layers to move from ``slow`` to ``neighbour``, the slowest stage's time after), best first."""
    per_layer = float(t[slow]) / max(layers, 1)
    best_k, best_max = 0, float(t.max())
    for k in range(1, layers):
        moved = t.copy()
        moved[slow] -= k * per_layer
        moved[neighbour] += k * per_layer
        if float(moved.max()) < best_max - 1e-9:
            best_k, best_max = k, float(moved.max())
    return best_k, best_max


def too_few_micro_batches(bubbles: pd.DataFrame | None) -> list[Finding]:
    if (pipeline := _pipeline(bubbles)) is None:
        return []
    rows, stages, m = pipeline
    v = int(rows.virtual_stages.max()) if "virtual_stages" in rows else 1  # interleaved 1F1B's chunks a stage
    ideal = ideal_fraction(stages, m, v)
    measured = float(rows.bubble_fraction.mean())
    if ideal <= MAX_IDEAL or measured < MIN_BUBBLE:
        return []
    idle_ms = float(rows.bubble_ms.mean())
    better = 8 * (stages - 1)
    schedule = "1F1B" if v == 1 else f"interleaved 1F1B with {v} virtual stages"
    return [
        Finding(
            kind="pipeline_bubble",
            severity="warning",
            text=(
                f"pipeline stages idle {pct(measured)} of each step (~{duration(idle_ms)}/step) with {stages} stages "
                f"and {m} micro-batches: {schedule} idles at least {pct(ideal)} at that ratio; with {better} "
                f"micro-batches (gradient_accumulation_steps, smaller train_micro_batch_size_per_gpu for the same "
                f"batch) it would be {pct(ideal_fraction(stages, better, v))}"
            ),
            steps=(int(bubbles.step.min()), int(bubbles.step.max())),
            cost_ms_per_step=idle_ms,
            evidence={
                "stages": stages,
                "micro_batches": m,
                "virtual_stages": v,
                "bubble_fraction": measured,
                "ideal_fraction": ideal,
                "suggested_micro_batches": better,
            },
            page="pipeline",
        )
    ]
