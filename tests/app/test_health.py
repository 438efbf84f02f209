"""The health summary's rules (collector/data/findings) on query-shaped frames, including
the cases where they must stay silent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.data import findings as health
from collector.data.findings import loss, loss_scale, memory, messages, moe, stragglers
from collector.testing.step_frames import step_rows


def last_arrivals(counts: dict[int, int], lead_ms: float = 41.0, op: str = "all_reduce") -> pd.DataFrame:
    total = sum(counts.values())
    return pd.DataFrame(
        [{"op": op, "rank": r, "n_last": n, "share": n / total, "mean_lead_ms": lead_ms} for r, n in counts.items()]
    )


def test_arrival_sentence_names_the_late_rank_with_share_and_lead():
    found = stragglers.late_ranks(last_arrivals({0: 5, 1: 5, 2: 6, 3: 84}), world_size=4)
    assert [f.text for f in found] == [
        "rank 3 arrives last in 84% of all_reduces (+41 ms on average after the first rank)"
    ]
    assert stragglers.late_ranks(last_arrivals({0: 24, 1: 26, 2: 25, 3: 25}), world_size=4) == []


def test_at_two_ranks_the_rank_last_in_59_of_60_is_named():
    """Twice the fair share is 100% at 2 ranks: the bar is capped (MAX_CONCENTRATION) so a rank last
    in 59 of 60 all_reduces is named, and a coin-flip 33 of 60 is not."""
    (found,) = stragglers.late_ranks(last_arrivals({0: 1, 1: 59}), world_size=2)
    assert found.ranks == (1,) and found.text.startswith("rank 1 arrives last in 98% of all_reduces")
    assert stragglers.late_ranks(last_arrivals({0: 27, 1: 33}), world_size=2) == []


def test_chance_alone_names_nobody_at_1024_ranks():
    # 300 instances over 1,024 ranks: some rank is last 3 or 4 times, 10x its fair share, by chance.
    rng = np.random.default_rng(0)
    last = rng.integers(0, 1024, 300)
    counts = {int(r): int((last == r).sum()) for r in np.unique(last)}
    assert max(counts.values()) * 1024 / 300 >= stragglers.FAIR_SHARE_FACTOR
    assert stragglers.late_ranks(last_arrivals(counts), world_size=1024) == []


def test_a_few_late_ranks_at_1024_ranks_are_named_worst_first():
    rng = np.random.default_rng(1)
    last = np.concatenate([rng.integers(0, 1024, 200), [290] * 250, [17] * 200, [511] * 150])
    counts = {int(r): int((last == r).sum()) for r in np.unique(last)}
    (found,) = stragglers.late_ranks(last_arrivals(counts), world_size=1024)
    share = (counts[290] + counts[17] + counts[511]) / len(last)
    assert found.ranks == (290, 17, 511)
    assert found.text.startswith(f"ranks 290, 17 and 511 arrive last in {100 * share:.0f}% of all_reduces")


def test_more_late_ranks_than_named_are_counted():
    counts = {r: 60 for r in (5, 9, 13, 21, 40)} | {r: 1 for r in range(100, 200)}
    (found,) = stragglers.late_ranks(last_arrivals(counts), world_size=256)
    assert found.text.startswith("ranks 5, 9, 13 and 2 more arrive last in")
    assert found.evidence["late_ranks"] == [5, 9, 13, 21, 40]


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


def moe_load(tokens: dict[int, int], dropped: dict[int, int], steps: int = 10) -> pd.DataFrame:
    rows = []
    for step in range(steps):
        for e, n in tokens.items():
            rows.append(
                {"layer": 0, "expert": e, "step": step, "tokens": n, "dropped": dropped.get(e, 0), "capacity": 64}
            )
    return pd.DataFrame(rows)


def test_a_skewed_expert_that_drops_tokens_is_a_warning_naming_it():
    """The sample run's shape: expert 0 gets 55% of the tokens, 9,243 of them dropped."""
    (found,) = moe.expert_imbalance(moe_load({0: 1675, 1: 394, 2: 372, 3: 631}, {0: 924, 1: 9, 2: 14, 3: 27}))
    assert found.severity == "warning" and found.evidence["expert"] == 0
    assert found.text.startswith("MoE layer 0: expert 0 gets 55% of the tokens (4 experts, 25% each if balanced)")
    assert "32% of routed tokens" in found.text


def test_balanced_experts_say_nothing_and_even_drops_blame_capacity():
    assert moe.expert_imbalance(moe_load({0: 260, 1: 250, 2: 240, 3: 250}, {})) == []
    (found,) = moe.expert_imbalance(moe_load({0: 260, 1: 250, 2: 240, 3: 250}, {0: 20, 1: 10, 2: 5, 3: 10}))
    assert found.severity == "warning" and "load even" in found.text and "capacity factor" in found.text
    (note,) = moe.expert_imbalance(moe_load({0: 600, 1: 150, 2: 150, 3: 100}, {}))
    assert note.severity == "info" and "none dropped" in note.text


def loss_frame(values: list[float], bad: dict[int, list[int]] | None = None, tag: str = "loss") -> pd.DataFrame:
    bad = bad or {}
    return pd.DataFrame(
        [
            {"tag": tag, "step": s, "value": (None if s in bad else v), "bad_ranks": bad.get(s)}
            for s, v in enumerate(values)
        ]
    )


def test_a_nan_loss_is_critical_from_its_first_step_and_names_the_rank():
    rng = np.random.default_rng(0)
    values = list(2.3 + 0.05 * rng.standard_normal(30))
    (found,) = loss.loss_anomalies(loss_frame(values, {s: [1] for s in range(15, 30)}))
    assert found.severity == "critical" and found.ranks == (1,) and found.evidence["first_step"] == 15
    assert "from step 15 on rank 1" in found.text


def test_a_loss_spike_is_named_and_a_healthy_falling_curve_is_not():
    rng = np.random.default_rng(1)
    falling = list(np.exp(-np.arange(60) / 10) * 8 + 2 + 0.05 * rng.standard_normal(60))
    assert loss.loss_anomalies(loss_frame(falling)) == []
    noisy = list(2.3 + 0.3 * rng.standard_normal(60))
    assert loss.loss_anomalies(loss_frame(noisy)) == []
    spiked = list(noisy)
    spiked[40] = 46.0
    (found,) = loss.loss_anomalies(loss_frame(spiked))
    assert found.severity == "warning" and found.evidence["step"] == 40 and "spiked to 46 at step 40" in found.text


def memory_rows(rank: int, per_step: float, steps: int = 100, start: float = 800e6) -> dict:
    return {
        "rank": rank,
        "bytes_per_s": per_step * 50,
        "r2": 0.99 if per_step else 0.1,
        "first_rss": start,
        "last_rss": start + per_step * steps / 2,
        "available": 20 * 2**30,
        "first_step": steps // 2,
        "last_step": steps,
        "steps_per_s": 50.0,
        "samples": 20,
    }


def test_a_leaking_rank_is_named_with_its_growth_and_the_step_it_runs_out():
    trend = pd.DataFrame([memory_rows(0, 0.0), memory_rows(1, 3 * 2**20)])
    (found,) = memory.memory_growth(trend)
    assert found.kind == "memory_growth" and found.ranks == (1,)
    assert "grows 3.0 MiB per step" in found.text and "runs out in ~6,827 steps" in found.text
    assert found.evidence["oom_step"] == 100 + 6826


def test_flat_or_small_or_stepwise_memory_is_not_growth():
    assert memory.memory_growth(pd.DataFrame([memory_rows(0, 0.0), memory_rows(1, 0.0)])) == []
    small = memory_rows(1, 0.5 * 2**20)  # 25 MiB over the window: under MIN_GROWTH_BYTES
    assert memory.memory_growth(pd.DataFrame([small])) == []
    jump = dict(memory_rows(1, 3 * 2**20), r2=0.4)  # one step up, not a line
    assert memory.memory_growth(pd.DataFrame([jump])) == []


def test_a_hung_rank_is_told_once_by_the_hang_not_again_as_a_straggler():
    from collector.data.findings import Finding, _one_story

    hang = Finding(kind="hang", severity="critical", ranks=(1,), text="hang", evidence={"missing_ranks": [1]})
    late = Finding(kind="straggler", severity="warning", ranks=(1,), text="rank 1 costs", cost_ms_per_step=3.0)
    other = Finding(kind="straggler", severity="warning", ranks=(2,), text="rank 2 costs", cost_ms_per_step=3.0)
    assert _one_story([late, hang, other]) == [hang, other]
    assert _one_story([late, other]) == [late, other]


def test_a_burst_that_ended_is_told_as_was_slow_not_is_slow():
    steps = step_rows(4, 60, late_rank=2, late_ms=60.0, late_steps=range(20, 32))
    (found,) = stragglers.costly_ranks(steps, world_size=4)
    assert found.ranks == (2,) and found.evidence["pattern"] == "transient"
    assert "was slow in steps 20-31" in found.text and "slow since" not in found.text


def test_every_kth_step_is_told_as_intermittent():
    steps = step_rows(4, 60, late_rank=1, late_ms=80.0, late_steps=range(3, 60, 4))
    (found,) = stragglers.costly_ranks(steps, world_size=4)
    assert found.ranks == (1,) and "slow every 4 steps" in found.text
    assert found.cost_ms_per_step == pytest.approx(80.0 / 4, rel=0.15)


def test_a_short_burst_on_a_healthy_rank_is_not_a_straggler():
    """A loaded host holds a healthy rank back for a few steps in a row now and then."""
    steps = step_rows(4, 60, late_rank=2, late_ms=60.0, late_steps=range(20, 25))
    assert stragglers.costly_ranks(steps, world_size=4) == []


def _late_together(n_ranks: int, late: set[int], n_steps: int = 30, late_ms: float = 40.0) -> pd.DataFrame:
    """Ranks in ``late`` arrive ``late_ms`` late together: every other rank waits that long, they
    wait ~0, and each imposes only the jitter between them (the second-latest is one of them)."""
    rng = np.random.default_rng(3)
    rows = []
    for step in range(n_steps):
        last = sorted(late)[step % len(late)] if late else None
        for r in range(n_ranks):
            waiting = 0.2 if r in late else late_ms
            imposed = rng.uniform(0, 0.4) if r == last else 0.0
            rows.append(
                dict(
                    rank=r,
                    step=step,
                    step_ms=100.0 + late_ms,
                    comm_ms=waiting + 10,
                    waiting_ms=waiting,
                    overlapped_ms=5.0,
                    imposed_ms=imposed,
                    late_op="all_reduce" if imposed else None,
                    held_ms=imposed,
                    timed=True,
                )
            )
    return pd.DataFrame(rows)


def test_ranks_late_together_are_named_together_with_what_the_others_wait():
    (found,) = stragglers.costly_ranks(_late_together(16, {3, 9}), world_size=16)
    assert found.ranks == (3, 9) and found.evidence["late_together"] == [3, 9]
    assert found.cost_ms_per_step == pytest.approx(40.0, rel=0.05)
    assert found.text.startswith("ranks 3 and 9 cost 40 ms per step")


def test_nobody_late_together_in_a_healthy_frame():
    healthy = _late_together(16, set(), late_ms=0.3)
    assert stragglers.costly_ranks(healthy, world_size=16) == []
