"""How often the fp16 loss scale fell (each fall is a skipped step)."""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding


def loss_scale_falls(scales: pd.DataFrame) -> list[Finding]:
    """From queries.loss_scale (step, scale, overflow, bad_params)."""
    if scales.empty:
        return []
    falls = int(scales.overflow.sum())
    n_steps = scales.step.nunique()
    last = scales.iloc[-1]
    scale = float(last.scale)
    shown = f"{scale:,.0f}" if scale >= 1 and scale.is_integer() else f"{scale:g}"  # 131,072, not 131072 or 1.3e+05
    text = f"loss scale fell {falls} times in {n_steps} steps (now {shown} at step {int(last.step)})"
    return [
        Finding(
            kind="loss_scale",
            severity="warning" if falls else "ok",
            text=text,
            steps=(int(scales.step.min()), int(scales.step.max())),
            evidence={"overflows": falls, "steps": int(n_steps), "scale": float(last.scale)},
            page="overview",
        )
    ]
