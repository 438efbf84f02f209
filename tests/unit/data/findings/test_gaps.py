"""collector.data.findings.gaps: a stretch the collector heard nothing, after which what was made
meanwhile arrives late (a partition, a collector down), named once for the ranks it cut off; a rank
that stopped making records, a slow trickle and normal flushes are not gaps."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.gaps import GAP_S, network_gaps

S = 1_000_000_000
FLUSH = 0.2
OFFSET = 37 * S  # rank 0's time line against the collector's clock: cancels


def flushes(rank: int, t0: float, t1: float, *, lag: float = 0.05, step_s: float = 0.05, offset: int = OFFSET):
    """A rank's deliveries every FLUSH s from t0 to t1 (collector's seconds), each made ``lag`` s before."""
    rows, t = [], t0
    while t < t1:
        made = t - lag
        step = int(made / step_s)
        rows.append({"rank": rank, "step": step, "made_ns": int(made * S) - offset, "received_ns": int(t * S)})
        t += FLUSH
    return rows


def partitioned(rank: int, cut: float, heal: float, end: float) -> list[dict]:
    """Flushes until ``cut``; nothing until ``heal``; then the held-back records in one burst (made
    from ``cut`` on), then live flushes again."""
    held = {"rank": rank, "step": int(cut / 0.05), "made_ns": int(cut * S) - OFFSET, "received_ns": int(heal * S)}
    return [*flushes(rank, 0, cut), held, *flushes(rank, heal + FLUSH, end)]


def test_a_partition_of_two_ranks_is_one_gap_with_its_steps_and_length():
    frame = pd.DataFrame(partitioned(0, 20, 620, 640) + partitioned(1, 20.1, 620.3, 640))
    [gap] = network_gaps(frame)
    assert gap.kind == "network_gap" and gap.severity == "info"
    assert gap.ranks == (0, 1)
    assert 599 <= gap.evidence["seconds"] <= 601
    first, last = gap.steps
    assert 390 <= first <= 400 and 12_400 <= last <= 12_410  # heard last near 20 s, live again near 620 s
    assert gap.text.startswith("the collector heard nothing from ranks 0-1 between steps")
    assert "(10.0 min)" in gap.text and "dropped" not in gap.text


def test_dropped_records_make_it_a_warning_that_counts_them():
    frame = pd.DataFrame(partitioned(0, 20, 80, 90))
    ranks = pd.DataFrame({"rank": [0, 1], "dropped_records": [1234, 0]})
    [gap] = network_gaps(frame, ranks)
    assert gap.severity == "warning" and gap.evidence["dropped_records"] == 1234
    assert "counted 1234 records dropped" in gap.text


def test_separate_gaps_are_separate_findings_and_a_rank_not_cut_off_is_not_named():
    frame = pd.DataFrame(partitioned(0, 20, 50, 200) + flushes(1, 0, 200) + partitioned(2, 100, 130, 200))
    gaps = network_gaps(frame)
    assert [g.ranks for g in gaps] == [(0,), (2,)]


def test_a_rank_that_stopped_is_no_gap_though_what_it_held_arrives_late():
    # a frozen process (SIGSTOP, swap): nothing received for 60 s; what it held when it froze
    # arrives late when it resumes, but its steps did not move meanwhile
    held = {"rank": 0, "step": 399, "made_ns": int(20 * S) - OFFSET, "received_ns": int(80 * S)}
    resumed = [r | {"step": 400 + (r["step"] - 1600)} for r in flushes(0, 80.2, 100)]  # steps go on from 400
    frame = pd.DataFrame([*flushes(0, 0, 20), held, *resumed])
    assert network_gaps(frame) == []
    fresh = pd.DataFrame([*flushes(0, 0, 20), *flushes(0, 80, 100)])  # or nothing held at all
    assert network_gaps(fresh) == []


def test_a_partition_whose_oldest_records_were_dropped_is_still_a_gap():
    # the spool kept only the last 80 s: the first delivery after the heal was made 80 s before it
    held = {"rank": 0, "step": int(540 / 0.05), "made_ns": int(540 * S) - OFFSET, "received_ns": int(620 * S)}
    frame = pd.DataFrame([*flushes(0, 0, 20), held, *flushes(0, 620.2, 640)])
    ranks = pd.DataFrame({"rank": [0], "dropped_records": [99]})
    [gap] = network_gaps(frame, ranks)
    assert gap.ranks == (0,) and 599 <= gap.evidence["seconds"] <= 601 and gap.severity == "warning"


def test_pauses_shorter_than_the_threshold_and_steady_flushes_are_silent():
    short = GAP_S * 0.8
    frame = pd.DataFrame(partitioned(0, 20, 20 + short, 60) + flushes(1, 0, 60, lag=3.0))
    assert network_gaps(frame) == []
    assert network_gaps(pd.DataFrame()) == [] and network_gaps(None) == []
