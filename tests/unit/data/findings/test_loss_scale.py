"""Loss-scale falls (collector/data/findings/loss_scale.py): counted when they happen, ok without
overflows, absent without fp16."""

from __future__ import annotations

import pandas as pd

from collector.data.findings import loss_scale


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


def test_the_scale_is_said_with_thousands_separators():
    scales = pd.DataFrame(
        {"step": [1, 2], "scale": [262144.0, 131072.0], "overflow": [False, True], "bad_params": [0, 0]}
    )
    (finding,) = loss_scale.loss_scale_falls(scales)
    assert "(now 131,072 at step 2)" in finding.text, finding.text
