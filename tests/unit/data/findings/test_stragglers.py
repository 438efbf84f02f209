"""The straggler rules (collector/data/findings/stragglers.py) on query-shaped frames: who arrives
last and who costs time, worded as a reader needs, and where they must stay silent."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.data.findings import stragglers
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


def test_a_healthy_rank_held_back_on_the_last_steps_is_not_a_straggler():
    """CI beside other jobs: on a 24-step healthy run rank 0 imposed waits on its last 3 steps, long
    enough that its run-long mean reached the floor. Three steps are too few to judge an onset by
    (WINDOW_MIN_STEPS), so the rank is judged over the run, where it was late on 3 of 23 steps."""
    steps = step_rows(4, 24, step_ms=12.0, late_rank=0, late_ms=12.0, late_steps=range(21, 24))
    assert stragglers.costly_ranks(steps, world_size=4) == []
    # the same lateness held since step 12 is judged from its onset, and named
    steps = step_rows(4, 24, step_ms=12.0, late_rank=0, late_ms=12.0, late_from=12)
    (found,) = stragglers.costly_ranks(steps, world_size=4)
    assert found.ranks == (0,) and found.evidence["onset_step"] == 12
