"""Pipeline findings on hand-made stage_bubbles frames: where they must fire, with what numbers,
and where they must stay silent (collector.data.findings.pipeline)."""

from __future__ import annotations

import pandas as pd
import pytest

from collector.data.findings.pipeline import stage_imbalance, too_few_micro_batches


def bubbles(stage_ms: list[float], m: int, layers: list[int] | None = None, steps: int = 6) -> pd.DataFrame:
    """A 1F1B pipeline whose stage s takes stage_ms[s] per micro-batch, every step alike."""
    p = len(stage_ms)
    span = sum(stage_ms) + (m - 1) * max(stage_ms)
    rows = []
    for step in range(steps):
        for s, t in enumerate(stage_ms):
            busy = m * t
            rows.append(
                dict(step=step, data_rank=0, stage=s, rank=s, stages=p, micro_batches=m,
                     layers=(layers or [4] * p)[s], span_ms=span, busy_ms=busy, bubble_ms=span - busy,
                     bubble_fraction=(span - busy) / span, ideal_fraction=(p - 1) / (m + p - 1))
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_a_slow_stage_is_named_with_its_cost_and_the_layers_to_move():
    (f,) = stage_imbalance(bubbles([60, 90], m=4))
    assert f.kind == "stage_imbalance" and f.ranks == (1,) and f.evidence["stage"] == 1
    assert f.cost_ms_per_step == pytest.approx(3 * (90 - 75))  # (m - 1) * (max - mean)
    # 22.5 ms per layer on stage 1: one layer to stage 0 gives 82.5 / 67.5, saving 3 * 7.5 ms
    assert f.evidence["move_layers"] == 1 and f.evidence["saving_ms_per_step"] == pytest.approx(22.5)
    assert f.text.startswith("stage 1 takes 50% longer per micro-batch than the other stages (90 ms vs 60 ms")
    assert "moving about 1 layer to stage 0 would save ~22 ms/step" in f.text


def test_the_slow_stage_moves_layers_to_its_faster_neighbour():
    (f,) = stage_imbalance(bubbles([50, 50, 100, 80], m=8, layers=[4, 4, 8, 4]))
    assert f.evidence["stage"] == 2 and f.evidence["move_to_stage"] == 1
    assert f.evidence["move_layers"] == 2  # 12.5 ms a layer: 75 / 75 on stages 2 and 1, 80 the new max
    assert f.evidence["saving_ms_per_step"] == pytest.approx(7 * 20)


def test_a_one_layer_stage_gets_no_move_advice():
    (f,) = stage_imbalance(bubbles([60, 90], m=4, layers=[1, 1]))
    assert f.evidence["move_layers"] == 0 and "no move of whole layers evens it out" in f.text


@pytest.mark.parametrize(
    "stage_ms, m",
    [([60, 66], 4), ([60, 60, 60, 60], 8), ([60], 4)],
    ids=["within-20%", "balanced", "one-stage"],
)
def test_balanced_pipelines_have_no_imbalance_finding(stage_ms, m):
    assert stage_imbalance(bubbles(stage_ms, m)) == []


def test_the_first_step_is_left_out():
    frame = bubbles([60, 60], m=4)
    frame.loc[(frame.step == 0) & (frame.stage == 1), "busy_ms"] = 4 * 200  # warm-up
    assert stage_imbalance(frame) == []


def test_too_few_micro_batches_names_the_ideal_and_a_better_count():
    (f,) = too_few_micro_batches(bubbles([60, 60], m=2))
    assert f.kind == "pipeline_bubble" and f.evidence["ideal_fraction"] == pytest.approx(1 / 3)
    assert f.evidence["bubble_fraction"] == pytest.approx(1 / 3) and f.evidence["suggested_micro_batches"] == 8
    assert f.cost_ms_per_step == pytest.approx(60)  # idle per stage and step: span 120 + 60, busy 2 x 60
    assert "idle 33% of each step" in f.text and "with 8 micro-batches" in f.text and "11%" in f.text


@pytest.mark.parametrize("stages, m", [(2, 4), (4, 16), (1, 1)], ids=["2x4", "4x16", "one-stage"])
def test_enough_micro_batches_say_nothing(stages, m):
    assert too_few_micro_batches(bubbles([60] * stages, m)) == []


def test_no_pipeline_rows_no_findings():
    assert stage_imbalance(pd.DataFrame()) == [] and too_few_micro_batches(None) == []
