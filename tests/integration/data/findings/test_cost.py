"""Straggler cost, onset and exposed communication as pure functions of step-analysis frames:
each fires on its injected story and stays silent on a healthy run, at 4 and at 1,024 ranks.

Split by tier: the pure-function tests are in tests/unit/data/findings/test_cost.py."""

from __future__ import annotations

import pytest

from collector.data.findings import stragglers
from collector.testing.step_frames import signal_rows, step_rows


@pytest.mark.parametrize("column", ["data_ms", "between_steps_ms"])
def test_a_cause_among_1024_ranks(column):
    steps = step_rows(1024, 20, late_rank=5, late_ms=30.0)
    signals = signal_rows(1024, 20, rank=5, column=column, ms=29.0)
    (finding,) = stragglers.costly_ranks(steps, world_size=1024, signals=signals)
    assert finding.ranks == (5,) and finding.evidence["cause"] == "data"


def test_input_imbalance_among_1024_ranks():
    steps = step_rows(1024, 20, late_rank=5, late_ms=30.0)
    signals = signal_rows(1024, 20)
    signals.loc[signals["rank"] == 5, "tokens"] *= 2.0
    (finding,) = stragglers.costly_ranks(steps, world_size=1024, signals=signals)
    assert finding.ranks == (5,) and finding.evidence["cause"] == "input_imbalance"
