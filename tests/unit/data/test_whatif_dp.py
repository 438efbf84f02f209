"""The what-if replay of data-parallel-only runs (collector.data.whatif.dp): hand-made collectives
whose answer is worked out by hand, and the straggler finding's cost taken from the replay."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.data.findings import stragglers
from collector.data.findings.whatif import describe, savings
from collector.data.whatif import NoSteps, analyze_dp

MS = 1_000_000


def dp_run(
    ranks=4, steps=12, compute_ms=40.0, slow=None, extra_ms=0.0, noise_ms=0.0, eval_step=None, seed=0, slow_from=1
):
    """comm rows of a DDP-like loop: per step a synchronous loss all_reduce, then ``compute_ms`` of
    forward/backward (a number, or a function of (rank, step)), then an asynchronous bucket all_reduce
    (2 ms transfer) the rank waits for at the step's end. Rank ``slow`` computes ``extra_ms`` more every
    step from ``slow_from`` on; ``eval_step`` has one all_reduce more (an eval pass)."""
    rng = np.random.default_rng(seed)
    compute = compute_ms if callable(compute_ms) else (lambda rank, step: compute_ms)
    rows, t = [], 0.0
    for step in range(1, steps + 1):
        loss_arrive = {r: t + rng.uniform(0, noise_ms) for r in range(ranks)}
        loss_end = max(loss_arrive.values()) + 0.5
        late = {r: extra_ms if r == slow and step >= slow_from else 0.0 for r in range(ranks)}
        arrive = {r: loss_end + compute(r, step) + late[r] + rng.uniform(0, noise_ms) for r in range(ranks)}
        bucket_end = max(arrive.values()) + 2.0
        for r in range(ranks):
            rows.append((r, step, "all_reduce", "all_reduce", False, loss_arrive[r], loss_end))
            rows.append((r, step, "all_reduce", "ddp_bucket_all_reduce", True, arrive[r], bucket_end))
            if step == eval_step:
                rows.append((r, step, "all_reduce", "eval_all_reduce", False, bucket_end + 1, bucket_end + 2))
        t = bucket_end + (3.0 if step == eval_step else 1.0)
    df = pd.DataFrame(rows, columns=["rank", "step", "op", "log_name", "async_op", "start_ns", "end_ns"])
    df[["start_ns", "end_ns"]] = (df[["start_ns", "end_ns"]] * MS).astype("int64")
    return df


def test_one_slow_rank_is_named_alone_with_its_delay_as_the_saving():
    result = analyze_dp(dp_run(slow=2, extra_ms=50.0))
    # a step: 1 ms between steps + 0.5 ms loss all_reduce + 40 (90 on rank 2) ms compute + 2 ms bucket
    assert result["step_time_s"] == pytest.approx(0.0935, abs=1e-6)
    assert result["ideal_step_time_s"] == pytest.approx(0.0435, abs=1e-6)
    assert next(iter(result["by_worker"])) == "2" and result["m_w_workers"] == [2]
    assert result["saved_s"]["2"] == pytest.approx(0.050, abs=1e-6)
    assert result["m_w"] == pytest.approx(1.0)
    assert result["workers"]["2"] == {"dp_rank": 2, "stage": 0}
    assert result["steps"] == 11  # the first step is warm-up
    found = describe(result)
    assert found.kind == "whatif_worker" and found.ranks == (2,) and found.severity == "info"


def test_two_ranks_one_slow_the_other_is_the_typical_one():
    result = analyze_dp(dp_run(ranks=2, slow=1, extra_ms=30.0))
    assert result["saved_s"]["1"] == pytest.approx(0.030, abs=1e-6)  # not half of it (a mean over both)
    assert result["saved_s"]["0"] == pytest.approx(0.0, abs=1e-6)


def test_a_rank_slow_for_the_last_quarter_saves_its_delay_on_those_steps():
    # as `rankscope simulate` records a late onset: the step period has room for the straggler from
    # the start, so every rank computes 80 ms before the onset and 40 ms after it (the slack gone),
    # rank 1 40 ms more from step 31. A typical compute taken over the whole run (70 ms) would leave
    # fixing rank 1 saving 10 ms a step there; the step's typical worker computes 40
    result = analyze_dp(
        dp_run(steps=40, compute_ms=lambda r, s: 80.0 if s < 31 else 40.0, slow=1, extra_ms=40.0, slow_from=31)
    )
    saved = savings(result)
    assert saved.loc[31:, 1].to_numpy() == pytest.approx(40.0, abs=1e-3)
    assert saved.loc[:30, 1].to_numpy() == pytest.approx(0.0, abs=1e-3)


def test_a_peers_slow_warm_up_does_not_hide_a_straggler():
    # two ranks, rank 0 40 ms late every step; rank 1's first steps take 200 ms (a loaded host's
    # warm-up). Where rank 1 was the slow one, fixing rank 0 saves nothing; after, 40 ms a step
    # (with rank 1's mean as the typical compute, 69 ms, it saved 11)
    result = analyze_dp(
        dp_run(ranks=2, steps=30, compute_ms=lambda r, s: 200.0 if r == 1 and s <= 5 else 40.0, slow=0, extra_ms=40.0)
    )
    saved = savings(result)
    assert saved.loc[6:, 0].to_numpy() == pytest.approx(40.0, abs=1e-3)
    assert saved.loc[:5, 0].to_numpy() == pytest.approx(0.0, abs=1e-3)


def test_a_healthy_run_with_noise_is_near_no_slowdown():
    result = analyze_dp(dp_run(noise_ms=2.0))
    assert 1.0 <= result["slowdown"] < 1.05
    assert describe(result) is None


def test_a_step_with_other_collectives_is_left_out():
    result = analyze_dp(dp_run(eval_step=6))
    assert result["steps"] == 10 and "6" not in result["per_step"]


def test_no_usual_step_is_no_steps():
    with pytest.raises(NoSteps):
        analyze_dp(dp_run(steps=1))


def test_the_straggler_cost_is_the_replays_saving():
    result = analyze_dp(dp_run(slow=1, extra_ms=50.0, steps=20))
    saved = savings(result)
    # arrival lateness saying 70 ms a step (a rank that also waits downstream, say): the replay's 50 wins
    steps = pd.DataFrame(
        [(r, s, 100.0, 70.0 if r == 1 else 0.0, "all_reduce", 70.0) for s in range(1, 21) for r in range(4)],
        columns=["rank", "step", "step_ms", "imposed_ms", "late_op", "held_ms"],
    )
    (found,) = stragglers.costly_ranks(steps, world_size=4, saved=saved)
    assert found.ranks == (1,)
    assert found.cost_ms_per_step == pytest.approx(50.0, abs=1e-3)
    assert found.evidence["replay_ms_per_step"] == pytest.approx(50.0, abs=1e-3)
    assert found.evidence["lateness_ms_per_step"] == pytest.approx(70.0)
    assert found.evidence["cost_model"] == "what-if replay"
    assert found.text.startswith("rank 1 costs 50 ms per step")
    (alone,) = stragglers.costly_ranks(steps, world_size=4)  # no replay: arrival lateness's
    assert alone.cost_ms_per_step == pytest.approx(70.0) and alone.evidence["cost_model"] == "arrival lateness"
    assert alone.evidence["replay_ms_per_step"] is None


def zero_run(ranks=4, steps=10, slow=None, extra_ms=0.0):
    """comm rows of a ZeRO-like step as `rankscope simulate` records it: 10 ms of compute, then two
    asynchronous reduce-scatters, the second issued 5 ms after every rank met at the first (so a late
    rank's lead shifts everyone's second issue), then a blocking norm all_reduce once both ended."""
    rows, t = [], 0.0
    for step in range(1, steps + 1):
        arrive = {r: t + 10.0 + (extra_ms if r == slow else 0.0) for r in range(ranks)}
        met = max(arrive.values())
        rs0_end = met + 3.0
        rs1_at = met + 5.0
        rs1_end = max(rs1_at, rs0_end) + 3.0
        norm_at = rs1_end + 1.0
        for r in range(ranks):
            rows.append((r, step, "reduce_scatter", "rs", True, arrive[r], rs0_end))
            rows.append((r, step, "reduce_scatter", "rs", True, rs1_at, rs1_end))
            rows.append((r, step, "all_reduce", "norm", False, norm_at, norm_at + 0.5))
        t = norm_at + 0.5
    df = pd.DataFrame(rows, columns=["rank", "step", "op", "log_name", "async_op", "start_ns", "end_ns"])
    df[["start_ns", "end_ns"]] = (df[["start_ns", "end_ns"]] * MS).astype("int64")
    return df


def test_after_an_asynchronous_collective_a_rank_is_free_once_every_rank_met():
    # read from its own issue, a healthy rank's second issue (shifted by the late rank's lead) would
    # look like 45 ms of its own compute, and fixing the late rank would save nothing
    result = analyze_dp(zero_run(slow=1, extra_ms=40.0))
    assert next(iter(result["by_worker"])) == "1"
    assert result["saved_s"]["1"] == pytest.approx(0.040, abs=1e-6)
    assert result["ideal_step_time_s"] == pytest.approx(0.0195, abs=1e-6)  # 10 + 5 + 3 + 1 + 0.5 ms
    assert set(result["by_optype"]) == {"compute", "rs", "norm"}  # a meeting is told as its collective
    assert analyze_dp(zero_run())["slowdown"] == pytest.approx(1.0)
