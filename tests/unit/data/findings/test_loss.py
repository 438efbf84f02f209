"""Loss anomalies (collector/data/findings/loss.py): a NaN loss and a spike are named, a healthy
falling or noisy curve is not."""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.data.findings import loss


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
