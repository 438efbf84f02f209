"""A rank whose clock is off rank 0's by more than its Hello's offset says (an estimate skipped
or wrong): the offset left over is measured from when synchronising collectives end (every rank
leaves one together), the rank's times are corrected by it before anyone is judged late, and a
``clock`` finding says so. Both ways: small, real offsets get no finding and no correction."""

from __future__ import annotations

import pytest

from collector.data import findings, queries
from collector.data.findings import clock
from collector.testing.fake_runs import FakeRun, write_data_dir

HOURS_3 = 3 * 3600 * 10**9


def _open(tmp_path, *runs):
    write_data_dir(tmp_path, *runs)
    return queries.Catalog(tmp_path)


def _found(cat, run_id):
    return findings.for_run(cat, run_id)


def test_a_rank_3_h_ahead_is_flagged_and_never_judged_10800_s_late(tmp_path):
    run = FakeRun(run_id="skew", steps=30, late_rank=None, with_moe=False, skewed_clocks=((1, HOURS_3),))
    cat = _open(tmp_path, run)
    try:
        found = _found(cat, "skew")
        steps = queries.step_analysis(cat, "skew")
        skew = queries.clock_skew(cat, "skew")
    finally:
        cat.close()
    (flag,) = [f for f in found if f.kind == "clock"]
    assert flag.severity == "warning" and flag.ranks == (1,)
    assert flag.evidence["offsets_s"]["1"] == pytest.approx(10_800, abs=0.01)
    assert "rank 1's clock is 3.0 h ahead of rank 0's" in flag.text and "corrected" in flag.text
    assert not [f for f in found if f.kind == "straggler"]  # nobody is late in this run
    assert steps.imposed_ms.max() < 5 and steps.waiting_ms.max() < 50
    assert skew.set_index("rank").loc[1].residual_ns == pytest.approx(HOURS_3, abs=1e7)
    assert (skew.set_index("rank").drop(index=1).residual_ns.abs() < 1e7).all()


def test_a_skewed_straggler_is_still_found_with_its_real_lateness(tmp_path):
    # Correcting (not leaving the rank out) keeps it judged: rank 3 is 40 ms late at every
    # all_reduce *and* its clock is 3 h behind; it is named for what the same run costs with a
    # right clock, never for 3 h.
    story = {"steps": 30, "late_rank": 3, "with_moe": False}
    cat = _open(
        tmp_path, FakeRun(run_id="both", skewed_clocks=((3, -HOURS_3),), **story), FakeRun(run_id="plain", **story)
    )
    try:
        found, found_plain = _found(cat, "both"), _found(cat, "plain")
    finally:
        cat.close()
    (flag,) = [f for f in found if f.kind == "clock"]
    assert flag.ranks == (3,) and "3.0 h behind rank 0's" in flag.text
    (late,) = [f for f in found if f.kind == "straggler"]
    (truth,) = [f for f in found_plain if f.kind == "straggler"]
    assert late.ranks == (3,) and late.cost_ms_per_step == pytest.approx(truth.cost_ms_per_step, abs=0.1)
    assert late.text == truth.text


def test_a_healthy_run_with_small_real_offsets_gets_no_clock_finding(tmp_path):
    # 0.2 ms and -0.1 ms left over after the Hello's offset (what a barrier estimate leaves across
    # hosts): nothing is corrected and nothing is said; the real straggler is still the only one.
    run = FakeRun(run_id="ok", steps=30, late_rank=3, with_moe=False, skewed_clocks=((1, 200_000), (2, -100_000)))
    plain = FakeRun(run_id="plain", steps=30, late_rank=None, with_moe=False)
    cat = _open(tmp_path, run, plain)
    try:
        found, found_plain = _found(cat, "ok"), _found(cat, "plain")
    finally:
        cat.close()
    assert not [f for f in found + found_plain if f.kind == "clock"]
    (late,) = [f for f in found if f.kind == "straggler"]
    assert late.ranks == (3,)


def test_rankscope_health_is_not_healthy_with_a_rank_3_h_off(tmp_path, capsys):
    import argparse

    from collector.tools import health

    write_data_dir(
        tmp_path, FakeRun(run_id="skew", steps=20, late_rank=None, with_moe=False, skewed_clocks=((1, HOURS_3),))
    )
    code = health.main(argparse.Namespace(data_dir=str(tmp_path), run="skew", json=False, all=False))
    out = capsys.readouterr().out
    assert code == 1 and "healthy" not in out
    assert "rank 1's clock is 3.0 h ahead of rank 0's" in out


def test_the_rule_on_hand_made_frames():
    import pandas as pd

    frame = pd.DataFrame(
        {
            "rank": [0, 1, 2, 3],
            "hello_offset_ns": [0, 0, 5_000_000, 0],
            "residual_ns": [0, 2_000, -7_200 * 10**9, 1_500_000_000],
            "instances": [100, 100, 100, 100],
        }
    )
    (flag,) = clock.implausible_clocks(frame)
    assert flag.ranks == (2,) and "2.0 h behind rank 0's" in flag.text
    assert flag.evidence["offsets_s"] == {"2": pytest.approx(-7_199.995)}
    assert clock.implausible_clocks(frame.iloc[:2]) == [] and clock.implausible_clocks(pd.DataFrame()) == []


def test_the_sql_views_judge_arrivals_on_corrected_clocks_per_run(tmp_path):
    # Two runs in one catalog: the views' correction is per run (rank 1 of "skew" only).
    skewed = FakeRun(run_id="skew", steps=10, late_rank=None, with_moe=False, skewed_clocks=((1, HOURS_3),))
    late = FakeRun(run_id="late", steps=10, late_rank=3, with_moe=False)
    cat = _open(tmp_path, skewed, late)
    try:
        fixes = cat.df("SELECT run_id, rank, fix_ns FROM comm_clock_fixes", [])
        worst = cat.df("SELECT run_id, max(max_delay_ns) / 1e9 AS s FROM stragglers GROUP BY run_id", [])
        delay = cat.df("SELECT run_id, max(arrival_delay_ns) / 1e9 AS s FROM comm_instances GROUP BY run_id", [])
        rolled = queries.last_arrivals(queries.comm_rollup(cat, "skew"), queries.CommFilter())
    finally:
        cat.close()
    assert fixes.to_dict("records") == [{"run_id": "skew", "rank": 1, "fix_ns": pytest.approx(HOURS_3, abs=1e7)}]
    worst, delay = worst.set_index("run_id").s, delay.set_index("run_id").s
    assert worst["skew"] < 0.01 and delay["skew"] < 0.01  # jitter, not 10,800 s
    assert worst["late"] == pytest.approx(0.04, abs=0.001) and delay["late"] == pytest.approx(0.04, abs=0.001)
    assert rolled.mean_lead_ms.max() < 1
