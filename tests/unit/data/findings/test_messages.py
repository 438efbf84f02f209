"""The small-messages note (collector/data/findings/messages.py): which engine's keys it names, that
large messages are fine, and that the start-up parameter broadcast is no note but one every step is."""

from __future__ import annotations

import pandas as pd

from collector.data import findings as health
from collector.data.findings import messages


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


def _small_broadcasts(data_dir, run, steps) -> None:
    """Per rank, 200 broadcasts of 4 KB (one per parameter tensor) in each of ``steps``."""
    from collector.testing.fake_runs import _stored, _write

    n = 200
    for rank in range(run.world_size):
        for step in steps:
            t0 = run.t0_ns + step * run.step_period_ns + run.step_period_ns // 8
            start = [t0 + i * 2_000_000 for i in range(n)]
            columns = {
                "step": [step] * n,
                "group_name": ["bcast"] * n,
                "group_size": [run.world_size] * n,
                "seq": [step * n + i for i in range(n)],
                "op": ["broadcast"] * n,
                "dtype": ["float32"] * n,
                "numel": [1024] * n,
                "bytes": [4096] * n,
                "start_ns": start,
                "end_ns": [s + 1_000_000 for s in start],
                "algbw_gbs": [0.004] * n,
                "busbw_gbs": [0.004] * n,
            }
            _write(data_dir, "comm", run.run_id, f"bcast-rank{rank}-{step}", _stored("comm", rank, columns))


def test_the_start_up_parameter_broadcast_is_no_small_message_note_but_one_every_step_is(tmp_path):
    from collector.data import queries
    from collector.testing.fake_runs import FakeRun, write_data_dir

    big = (("all_reduce", "world", 50 << 20),)
    once = FakeRun(run_id="once", world_size=4, steps=12, late_rank=None, collectives=big, with_moe=False)
    every = FakeRun(run_id="every", world_size=4, steps=12, late_rank=None, collectives=big, with_moe=False)
    write_data_dir(tmp_path, once, every)
    _small_broadcasts(tmp_path, once, [0])  # at start-up only, in the warm-up step
    _small_broadcasts(tmp_path, every, range(12))
    cat = queries.Catalog(tmp_path)
    try:
        startup = health.for_run(cat, "once")
        steady = health.for_run(cat, "every")
        everything = queries.log_summary(queries.comm_rollup(cat, "once"), queries.CommFilter())
    finally:
        cat.close()
    # the start-up broadcast is in the data (and 100% small), but not in the note's traffic
    assert "broadcast" in set(everything.op)
    assert not [f for f in startup if f.kind == "small_messages"]
    (note,) = [f for f in steady if f.kind == "small_messages"]
    assert note.evidence["ops"] == ["broadcast"] and note.text.startswith("100% of broadcast transfer time")
