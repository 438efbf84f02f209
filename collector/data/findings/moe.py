"""MoE expert imbalance: an expert that gets far more than its share of the tokens, and the tokens
dropped over capacity because of it.

Input: queries.moe_load (layer, expert, step, tokens, dropped, capacity), tokens summed over ranks.
Per layer, over the run: each expert's share of the routed tokens, against the fair share 1/E of
E experts, and the dropped tokens as a share of the routed ones. Dropped tokens skip their expert
(their output is the residual only), so dropping is what costs model quality: a layer that drops
at least ``MIN_DROPPED`` of its tokens is a warning, naming its busiest expert when that one gets
``IMBALANCE`` x its fair share or more (the cause), or saying the capacity is short for every
expert when the load is even. An uneven layer that drops nothing is a note (capacity holds it,
today). Balanced layers with no drops say nothing.
"""

from __future__ import annotations

import pandas as pd

from collector.data.findings.model import Finding, pct

MIN_DROPPED = 0.01
IMBALANCE = 1.5


def expert_imbalance(load: pd.DataFrame) -> list[Finding]:
    if load is None or load.empty:
        return []
    found = []
    for layer, rows in load.groupby("layer", sort=True):
        per_expert = rows.groupby("expert")[["tokens", "dropped"]].sum()
        routed, dropped = int(per_expert.tokens.sum()), int(per_expert.dropped.sum())
        experts = len(per_expert)
        if routed <= 0 or experts < 2:
            continue
        busiest = int(per_expert.tokens.idxmax())
        share, fair = float(per_expert.tokens.max() / routed), 1.0 / experts
        dropped_share = dropped / routed
        uneven = share >= IMBALANCE * fair
        evidence = {
            "layer": int(layer),
            "expert": busiest,
            "share": share,
            "fair_share": fair,
            "experts": experts,
            "dropped": dropped,
            "dropped_share": dropped_share,
            "routed": routed,
        }
        steps = (int(rows.step.min()), int(rows.step.max()))
        head = (
            f"MoE layer {layer}: expert {busiest} gets {pct(share)} of the tokens "
            f"({experts} experts, {pct(fair)} each if balanced)"
        )
        if dropped_share >= MIN_DROPPED:
            text = (
                f"{head}; {pct(dropped_share)} of routed tokens ({dropped:,}) were dropped over capacity"
                if uneven
                else f"MoE layer {layer}: {pct(dropped_share)} of routed tokens ({dropped:,}) were dropped over "
                f"capacity with the load even across {experts} experts"
            )
            advice = (
                ": rebalance routing (a larger load-balancing loss coefficient) or raise the capacity factor"
                if uneven
                else ": raise the capacity factor"
            )
            found.append(
                Finding(
                    kind="moe_imbalance",
                    severity="warning",
                    text=text + advice,
                    steps=steps,
                    evidence=evidence,
                    page="moe",
                )
            )
        elif uneven:
            found.append(
                Finding(
                    kind="moe_imbalance",
                    severity="info",
                    text=head + "; none dropped yet",
                    steps=steps,
                    evidence=evidence,
                    page="moe",
                )
            )
    return found
