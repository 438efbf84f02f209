"""Straggler cost, onset and exposed communication as pure functions of step-analysis frames:
each fires on its injected story and stays silent on a healthy run, at 4 and at 1,024 ranks.

Split by tier: what needs processes, sockets or seconds is in tests/integration/data/findings/test_cost.py."""

from __future__ import annotations

import numpy as np
import pytest

from collector.data.findings import communication, stragglers
from collector.testing.step_frames import signal_rows, step_rows


def test_a_late_rank_is_named_with_its_cost_per_step_and_the_op():
    (finding,) = stragglers.costly_ranks(step_rows(4, 30, late_rank=3, late_ms=41.0), world_size=4)
    assert finding.kind == "straggler" and finding.severity == "warning" and finding.ranks == (3,)
    assert finding.cost_ms_per_step == pytest.approx(41.0, abs=0.5)
    assert finding.text.startswith("rank 3 costs 41 ms per step (29% of step time) by arriving late at reduce_scatter")
    assert finding.evidence["what_if_step_ms"] == pytest.approx(100.0, abs=1)
    assert "onset_step" not in finding.evidence  # slow from the start: no onset to report


def test_a_healthy_run_has_no_straggler_at_4_and_1024_ranks():
    assert stragglers.costly_ranks(step_rows(4, 50, jitter_ms=0.5), world_size=4) == []
    assert stragglers.costly_ranks(step_rows(1024, 50, jitter_ms=3.0), world_size=1024) == []


def test_a_straggler_among_1024_ranks():
    (finding,) = stragglers.costly_ranks(step_rows(1024, 40, late_rank=777, late_ms=25.0), world_size=1024)
    assert finding.ranks == (777,) and finding.cost_ms_per_step == pytest.approx(25.0, abs=0.5)


def test_warm_up_and_spread_lateness_are_not_stragglers():
    # The first step (warm-up) may be slow anywhere; a rank late only there costs nothing.
    rows = step_rows(4, 20)
    rows.loc[(rows.step == 0) & (rows["rank"] == 2), "imposed_ms"] = 500.0
    assert stragglers.costly_ranks(rows, world_size=4) == []
    # Every rank imposing as much as the others (load imbalance, MoE) names nobody.
    even = step_rows(4, 20)
    even["imposed_ms"] = 10.0
    assert stragglers.costly_ranks(even, world_size=4) == []


def test_onset_is_found_where_the_rank_turned_slow():
    (finding,) = stragglers.costly_ranks(step_rows(4, 80, late_rank=2, late_ms=40.0, late_from=40), world_size=4)
    assert finding.evidence["onset_step"] == 40 and finding.steps == (40, 79)
    assert "slow since step 40 (+40 ms per step from then)" in finding.text
    assert finding.cost_ms_per_step == pytest.approx(40.0, rel=0.05)  # what it costs since, not diluted


@pytest.mark.parametrize("n_ranks", [4, 1024])
def test_a_rank_slow_only_lately_is_judged_on_its_slow_steps(n_ranks):
    # 40 ms on 400 ms steps for the last 50 of 500: 4 ms per step over the whole run, under the
    # 5% bar, but 10% of every step since it turned slow.
    rows = step_rows(n_ranks, 500, step_ms=400.0, late_rank=1, late_ms=40.0, late_from=450, jitter_ms=3.0)
    (finding,) = stragglers.costly_ranks(rows, world_size=n_ranks)
    assert finding.ranks == (1,) and finding.evidence["onset_step"] == 450 and finding.steps == (450, 499)
    assert finding.cost_ms_per_step == pytest.approx(40.0, rel=0.05)
    # Too few slow steps to judge alone (under WINDOW_MIN_STEPS) and diluted over the run: silent.
    brief = step_rows(n_ranks, 500, step_ms=400.0, late_rank=1, late_ms=40.0, late_from=495, jitter_ms=3.0)
    assert stragglers.costly_ranks(brief, world_size=n_ranks) == []
    # Late on 3 of every 5 steps since (a busy host's contention, not a slowdown): silent.
    patchy = rows.copy()
    patchy.loc[(patchy["rank"] == 1) & (patchy.step >= 450) & (patchy.step % 5 < 2), "imposed_ms"] = 0.0
    assert stragglers.costly_ranks(patchy, world_size=n_ranks) == []


def test_a_late_stretch_must_be_beyond_the_runs_own_chance_of_lateness():
    # Beside two busy loops on 2 cores, healthy ranks were late on about a third of their steps,
    # and one was then late on 7 of the last 9: chance on that run, not a slowdown. The same 7 of
    # 9 on a quiet run (ranks late on 1 step in 30), or 40 of 40 on the loaded one, is not.
    stretch = np.array([1, 1, 1, 1, 0, 0, 1, 1, 1], dtype=bool)
    assert not stragglers.late_beyond_chance(stretch, base_rate=0.34, world_size=4)
    assert stragglers.late_beyond_chance(stretch, base_rate=1 / 30, world_size=4)
    assert stragglers.late_beyond_chance(np.ones(40, dtype=bool), base_rate=0.34, world_size=4)
    assert not stragglers.late_beyond_chance(np.array([1, 0] * 10, dtype=bool), base_rate=1 / 30, world_size=4)


def test_onset_of_a_pure_series():
    assert stragglers.onset([0.1] * 10 + [30.0] * 10)[0] == 10
    assert stragglers.onset([30.0] * 20) is None
    assert stragglers.onset([1.0, 2.0]) is None


def test_step_costs_give_the_what_if_step_time():
    per_step = stragglers.step_costs(stragglers.training_steps(step_rows(4, 10, late_rank=1, late_ms=20.0)))
    assert (per_step.step_ms - per_step.what_if_ms).to_numpy() == pytest.approx(per_step.held_ms.to_numpy())
    assert per_step.what_if_ms.to_numpy() == pytest.approx(100.0, abs=0.5)


def test_exposed_communication_is_a_note_and_never_over_100_percent():
    (finding,) = communication.exposed_communication(step_rows(4, 20, late_rank=3, late_ms=30.0))
    assert finding.severity == "info" and finding.kind == "exposed_communication"
    assert 0 < finding.evidence["comm"] <= 1 and finding.evidence["waiting"] <= finding.evidence["comm"]
    assert finding.text.startswith("communication is in flight")
    untimed = step_rows(4, 20).assign(timed=False)
    assert communication.exposed_communication(untimed) == []


@pytest.mark.parametrize(
    ("column", "cause", "words"),
    [
        ("gc_ms", "gc", "GC pauses"),
        ("data_ms", "data", "waits for the next batch (data loading)"),
        ("between_steps_ms", "data", "waits between steps (data loading and host work)"),
        ("runqueue_ms", "host_cpu", "host CPU"),
    ],
)
def test_the_signal_that_explains_a_straggler_is_named(column, cause, words):
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    signals = signal_rows(4, 30, rank=3, column=column, ms=36.0)
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=signals)
    assert finding.evidence["cause"] == cause and words in finding.text
    assert finding.evidence["coincidence"] == pytest.approx(1.0)
    assert finding.evidence["signal_median_ms"] == pytest.approx(36.25, abs=0.5)


def test_no_cause_when_no_signal_stands_out_or_none_was_recorded():
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    (quiet,) = stragglers.costly_ranks(steps, world_size=4, signals=signal_rows(4, 30))
    assert "cause" not in quiet.evidence and ":" not in quiet.text
    # A signal every rank has as much of explains nothing about one of them.
    everyone = signal_rows(4, 30)
    everyone["gc_ms"] += 36.0
    (shared,) = stragglers.costly_ranks(steps, world_size=4, signals=everyone)
    assert "cause" not in shared.evidence
    unrecorded = signal_rows(4, 30, rank=3, ms=36.0).assign(gc_ms=None, runqueue_ms=None)
    (unknown,) = stragglers.costly_ranks(steps, world_size=4, signals=unrecorded)
    assert "cause" not in unknown.evidence


@pytest.mark.parametrize(("late_ms", "named"), [(12.0, False), (38.0, True)])
def test_on_an_oversubscribed_host_only_lateness_beyond_everyones_cpu_wait_names_a_rank(late_ms, named):
    # every rank waits ~20 ms a step for a CPU: a rank late by less than that on its late steps is
    # the scheduler's luck (seen on CI: 4 ms late, 13.5 ms waits); one late by more is still named
    steps = step_rows(4, 30, late_rank=3, late_ms=late_ms)
    busy_host = signal_rows(4, 30).assign(runqueue_ms=lambda f: f.runqueue_ms + 20.0)
    found = stragglers.costly_ranks(steps, world_size=4, signals=busy_host)
    assert [f.ranks for f in found] == ([(3,)] if named else []), [f.text for f in found]
    # the same lateness on a host with CPUs to spare is named either way
    (quiet,) = stragglers.costly_ranks(steps, world_size=4, signals=signal_rows(4, 30))
    assert quiet.ranks == (3,)


def test_a_hook_runs_wait_between_steps_is_data_loading_and_host_work():
    """A hook run records no loader timer (data_ms NULL), only the wait between steps: the sentence
    says what that wait holds; a wait the other ranks have as much of explains nothing."""
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    hook_run = signal_rows(4, 30, rank=3, column="between_steps_ms", ms=36.0).assign(data_ms=None)
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=hook_run)
    assert finding.evidence["cause"] == "data" and "waits between steps (data loading and host work)" in finding.text
    assert "waits for the next batch" not in finding.text
    shared = signal_rows(4, 30).assign(data_ms=None)
    shared["between_steps_ms"] += 36.0
    (quiet,) = stragglers.costly_ranks(steps, world_size=4, signals=shared)
    assert "cause" not in quiet.evidence


def test_a_rank_that_computes_more_waits_more_for_a_cpu_without_a_neighbour_to_blame():
    # On a busy host every rank waits ~0.5 ms of run queue per CPU ms; the straggler ran 40 ms
    # more and waited in proportion: its own work, not contention aimed at it.
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    signals = signal_rows(4, 30)
    signals["runqueue_ms"] = signals.cpu_ms * 0.5
    signals.loc[signals["rank"] == 3, "cpu_ms"] += 40.0
    signals.loc[signals["rank"] == 3, "runqueue_ms"] = signals.cpu_ms * 0.5
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=signals)
    assert "cause" not in finding.evidence


def cpu_waits_sampled_every_other_step():
    """Rank 3's CPU waits (36 ms a step) as a 0.1 s sampler sees them on short steps: every other
    step has no sample and the next one carries both steps' waits."""
    signals = signal_rows(4, 30, rank=3, column="runqueue_ms", ms=36.0)
    unsampled = signals.step % 2 == 0
    for column in ("runqueue_ms", "cpu_ms"):
        signals[column] = signals[column].where(unsampled, None) * 2
    return signals


def test_cpu_waits_sampled_on_a_clock_are_spread_over_the_steps_they_cover():
    # The sampler reads /proc every 0.1 s: with shorter steps, some steps get no sample and the
    # next one covers them. Half the steps sampled, each sample covering two steps' worth.
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=cpu_waits_sampled_every_other_step())
    assert finding.evidence["cause"] == "host_cpu" and finding.evidence["coincidence"] >= 0.9


def test_bursty_lateness_is_judged_per_sample_of_a_clock_sampled_signal():
    # CPU contention makes a rank late in bursts (here 74 ms, then 6 ms, alternating: 40 ms a step)
    # while the sampler, reading every 0.1 s, sees two steps' waits as one sample (72 ms, spread
    # 36 a step): per sample it covers the 40 ms mean lateness; against the 74 ms steps alone it
    # would miss the 50% on half the late steps and the cause would go unnamed.
    steps = step_rows(4, 30, step_ms=60.0, late_rank=3, late_ms=40.0)
    burst = np.where(steps.step % 2 == 0, 34.0, -34.0)
    steps["imposed_ms"] = np.where(steps["rank"] == 3, steps.imposed_ms + burst, steps.imposed_ms)
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=cpu_waits_sampled_every_other_step())
    assert finding.evidence["cause"] == "host_cpu" and finding.evidence["coincidence"] >= 0.9


def test_a_rank_given_more_tokens_is_named_for_input_imbalance_and_a_balanced_one_is_not():
    steps = step_rows(4, 30, late_rank=3, late_ms=38.0)
    heavy = signal_rows(4, 30)
    heavy.loc[heavy["rank"] == 3, "tokens"] *= 1.8
    (finding,) = stragglers.costly_ranks(steps, world_size=4, signals=heavy)
    assert finding.evidence["cause"] == "input_imbalance"
    assert finding.evidence["tokens_ratio"] == pytest.approx(1.8, abs=0.1)
    assert "it processed 1.8x the median tokens per step on its late steps" in finding.text
    # balanced inputs explain nothing; a measured wait, where one explains it, is the cause named
    (balanced,) = stragglers.costly_ranks(steps, world_size=4, signals=signal_rows(4, 30))
    assert "cause" not in balanced.evidence and "tokens" not in balanced.text
    both = heavy.copy()
    both.loc[both["rank"] == 3, "gc_ms"] += 36.0
    (gc_first,) = stragglers.costly_ranks(steps, world_size=4, signals=both)
    assert gc_first.evidence["cause"] == "gc"
    # a rank with more tokens that is not late is no straggler at all
    assert stragglers.costly_ranks(step_rows(4, 30), world_size=4, signals=heavy) == []
    # runs that record no tokens (float inputs, hook runs) leave the cause open
    (unrecorded,) = stragglers.costly_ranks(steps, world_size=4, signals=heavy.assign(tokens=None))
    assert "cause" not in unrecorded.evidence


def test_rankscope_health_names_input_imbalance_from_the_batches_table(tmp_path):
    # The fake run's rank 3 is late to every all_reduce; in "heavy" it also trained on 1.8x the tokens.
    from collector.data import findings, queries
    from collector.testing.fake_runs import FakeRun, write_data_dir

    heavy = FakeRun(run_id="heavy", world_size=4, steps=30, late_rank=3, with_moe=False, late_rank_tokens=1.8)
    even = FakeRun(run_id="even", world_size=4, steps=30, late_rank=3, with_moe=False)
    write_data_dir(tmp_path, heavy, even)
    cat = queries.Catalog(tmp_path)
    try:
        signals = queries.signals_by_step(cat, "heavy")
        heavy_found = [f for f in findings.for_run(cat, "heavy") if f.kind == "straggler" and 3 in f.ranks]
        even_found = [f for f in findings.for_run(cat, "even") if f.kind == "straggler" and 3 in f.ranks]
    finally:
        cat.close()
    assert signals.tokens.notna().all() and signals.groupby("rank").tokens.median()[3] > 7000
    assert heavy_found and heavy_found[0].evidence.get("cause") == "input_imbalance"
    assert "1.8x the median tokens per step" in heavy_found[0].text
    assert even_found and even_found[0].evidence.get("cause") != "input_imbalance"
