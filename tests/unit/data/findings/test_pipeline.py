"""Pipeline findings on hand-made stage_bubbles frames: where they must fire, with what numbers,
and where they must stay silent (collector.data.findings.pipeline)."""

from __future__ import annotations

import pandas as pd
import pytest

from collector.data import findings
from collector.data.findings.pipeline import pipelined, stage_imbalance, too_few_micro_batches


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


def _steps(ranks: int, steps: int = 6) -> pd.DataFrame:
    """queries.step_analysis rows: 100 ms steps, 70 ms of them communication, none beside compute."""
    return pd.DataFrame(
        [dict(rank=r, step=s, step_ms=100.0, comm_ms=70.0, waiting_ms=10.0, overlapped_ms=0.0, imposed_ms=0.0,
              late_op=None, held_ms=0.0, timed=True) for s in range(steps) for r in range(ranks)]
    )  # fmt: skip


def _log_summary() -> pd.DataFrame:
    """Small activations sent between stages and small gradient all_reduces."""
    return pd.DataFrame(
        [dict(op=op, bytes=4096, count=40, total_latency_ms=40.0, avg_latency_ms=1.0, transfer_ms=30.0,
              algbw_gbs=0.1, busbw_gbs=0.1) for op in ("isend", "recv", "all_reduce")]
    )  # fmt: skip


def _communication_notes(pipeline: pd.DataFrame | None, log_summary: pd.DataFrame | None = None) -> dict[str, list]:
    log_summary = _log_summary() if log_summary is None else log_summary
    found = findings.summarize(steps=_steps(2), log_summary=log_summary, scales=pd.DataFrame(), world_size=2,
                               source="engine", config="{}", pipeline=pipeline)  # fmt: skip
    return {k: [f for f in found if f.kind == k] for k in ("exposed_communication", "small_messages")}


def test_a_pipelines_point_to_point_traffic_gets_no_communication_note():
    assert pipelined(bubbles([60, 60], m=8)) and not pipelined(bubbles([60], m=8)) and not pipelined(None)
    notes = _communication_notes(bubbles([60, 60], m=8))
    assert notes["exposed_communication"] == []
    (small,) = notes["small_messages"]  # the gradient all_reduces keep their note, the p2p ops are left out
    assert small.evidence["ops"] == ["all_reduce"]
    assert small.evidence["keys"] == ["zero_optimization.reduce_bucket_size"]


@pytest.mark.parametrize("pipeline", ["none", "no rows", "one stage"])
def test_without_a_pipeline_the_communication_notes_are_unchanged(pipeline):
    notes = _communication_notes({"none": None, "no rows": pd.DataFrame(), "one stage": bubbles([60], m=8)}[pipeline])
    (comm,) = notes["exposed_communication"]
    assert comm.evidence["comm"] == pytest.approx(0.7)
    (small,) = notes["small_messages"]
    assert small.evidence["ops"] == ["all_reduce", "isend", "recv"]


def test_pipe_rows_without_point_to_point_traffic_keep_the_communication_note():
    collectives = _log_summary()[lambda d: d.op == "all_reduce"]  # e.g. a fake run's pipe rows beside all_reduces
    (comm,) = _communication_notes(bubbles([60, 60], m=8), collectives)["exposed_communication"]
    assert comm.evidence["comm"] == pytest.approx(0.7)
