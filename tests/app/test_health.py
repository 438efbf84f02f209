"""The health summary's rules (collector/data/findings) on query-shaped frames, including
the cases where they must stay silent."""

from __future__ import annotations

import pandas as pd

from collector.data import findings as health
from collector.data.findings import loss_scale, messages
from collector.testing.step_frames import step_rows


def summary(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["op", "bytes", "transfer_ms"])


def test_small_messages_are_one_note_naming_only_keys_the_engine_honours():
    rows = summary(
        [
            ("all_reduce", 256 << 10, 62.0),
            ("all_reduce", 50 << 20, 38.0),
            ("all_gather", 64 << 10, 9.0),
            ("all_gather", 32 << 20, 1.0),
        ]
    )
    (bundled,) = messages.small_messages(rows, messages.BUNDLED, stage=2)
    assert bundled.severity == "info"
    assert bundled.text == (
        "65% of all_gather, all_reduce transfer time is in messages < 1 MB (latency-bound): "
        "raise zero_optimization.reduce_bucket_size"
    )
    (deepspeed,) = messages.small_messages(rows, messages.DEEPSPEED, stage=2)
    assert "zero_optimization.allgather_bucket_size and zero_optimization.reduce_bucket_size" in deepspeed.text
    (stage3,) = messages.small_messages(rows, messages.BUNDLED, stage=3)
    assert "stage3_prefetch_bucket_size" in stage3.text and "allgather_bucket_size" not in stage3.text
    (plain,) = messages.small_messages(rows, messages.TORCH)
    assert plain.text.endswith("batch them into fewer, larger messages") and "zero_optimization" not in plain.text


def test_which_engine_produced_a_run():
    assert messages.engine_of("engine", '{"zero_optimization": {"stage": 2}}') == (messages.BUNDLED, 2)
    assert messages.engine_of("hook", '{"train_micro_batch_size_per_gpu": 4}') == (messages.DEEPSPEED, None)
    assert messages.engine_of("hook", None) == (messages.TORCH, None)
    assert messages.engine_of("hook", "not json") == (messages.TORCH, None)


def test_large_messages_are_fine():
    assert messages.small_messages(summary([("all_reduce", 256 << 10, 10.0), ("all_reduce", 50 << 20, 90.0)])) == []


def test_loss_scale_falls_counted():
    scales = pd.DataFrame(
        {"step": range(100), "scale": [2.0**16] * 100, "overflow": [s in (3, 9, 27, 40, 41, 77) for s in range(100)]}
    )
    (finding,) = loss_scale.loss_scale_falls(scales)
    assert finding.severity == "warning"
    assert finding.text.startswith("loss scale fell 6 times in 100 steps")


def test_loss_scale_without_overflow_is_ok_and_absent_without_fp16():
    scales = pd.DataFrame({"step": [0, 1], "scale": [1024.0, 1024.0], "overflow": [False, False]})
    assert loss_scale.loss_scale_falls(scales)[0].severity == "ok"
    assert loss_scale.loss_scale_falls(scales.iloc[0:0]) == []


def test_summary_puts_warnings_first():
    scales = pd.DataFrame({"step": [0], "scale": [1.0], "overflow": [False]})
    steps = step_rows(4, 20, late_rank=3, late_ms=30.0)
    found = health.summarize(steps=steps, log_summary=summary([]), scales=scales, world_size=4)
    assert [f.severity for f in found] == ["warning", "info", "ok"]


def test_durations_read_naturally():
    assert [health.duration(ms) for ms in (41.2, 0.43, 0.002)] == ["41 ms", "0.4 ms", "2 µs"]
