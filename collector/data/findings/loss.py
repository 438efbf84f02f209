"""The loss itself: non-finite values and spikes, in what the script logged (``hook.log``, the
engine's monitor events, the HF / Lightning callbacks).

Input: queries.loss_series (tag, step, value: the mean over ranks of the finite values, bad_ranks:
the ranks whose value was NaN or infinite), for every monitor tag that names a loss (``loss``,
``train_loss``, ``Train/Samples/train_loss``, ``eval_loss``; not ``loss_scale``).

- Non-finite: the first step any rank logged NaN or inf is critical (training is broken from
  there; an fp16 run's own overflow handling skips such steps before they are logged).
- Spike: a step whose loss is at least ``SPIKE_RATIO`` x the median of the ``WINDOW`` steps
  before it and ``SPIKE_MADS`` robust deviations above it (median absolute deviation, scaled to
  sigma): a healthy curve's noise and its early fast fall never are. The biggest is named, the
  rest counted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from collector.data.findings.model import Finding, ranks_label

WINDOW = 10
SPIKE_RATIO = 3.0
SPIKE_MADS = 10.0


def _bad(value) -> list[int]:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return []
    return [int(r) for r in value]


def loss_anomalies(series: pd.DataFrame | None) -> list[Finding]:
    if series is None or series.empty:
        return []
    found = []
    for tag, rows in series.groupby("tag", sort=True):
        rows = rows.sort_values("step")
        bad = rows[rows.bad_ranks.map(lambda v: len(_bad(v)) > 0)]
        if len(bad):
            first = bad.iloc[0]
            ranks = sorted({r for v in bad.bad_ranks for r in _bad(v)})
            found.append(
                Finding(
                    kind="loss_anomaly",
                    severity="critical",
                    ranks=tuple(ranks),
                    steps=(int(first.step), int(bad.step.iloc[-1])),
                    text=f"{tag} is not finite (NaN or inf) from step {int(first.step)} on {ranks_label(ranks)} "
                    f"({len(bad)} of {int((rows.step >= first.step).sum())} steps since)",
                    evidence={"tag": tag, "first_step": int(first.step), "steps": len(bad), "ranks": ranks},
                    page="overview",
                )
            )
        finite = rows.dropna(subset=["value"])
        values, steps = finite.value.to_numpy(dtype=float), finite.step.to_numpy()
        spikes = []
        for i in range(WINDOW, len(values)):
            before = values[i - WINDOW : i]
            median = float(np.median(before))
            sigma = 1.4826 * float(np.median(np.abs(before - median)))
            if median > 0 and values[i] >= SPIKE_RATIO * median and values[i] - median >= SPIKE_MADS * sigma:
                spikes.append((values[i] / median, int(steps[i]), float(values[i]), median))
        if spikes:
            ratio, step, value, median = max(spikes)
            more = f"; {len(spikes) - 1} more spike(s)" if len(spikes) > 1 else ""
            found.append(
                Finding(
                    kind="loss_anomaly",
                    severity="warning",
                    steps=(min(s for _, s, _, _ in spikes), max(s for _, s, _, _ in spikes)),
                    text=f"{tag} spiked to {value:.4g} at step {step}, {ratio:.0f}x the median of the "
                    f"{WINDOW} steps before ({median:.4g}){more}",
                    evidence={"tag": tag, "step": step, "value": value, "median_before": median, "spikes": len(spikes)},
                    page="overview",
                )
            )
    return found
