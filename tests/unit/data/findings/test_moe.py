"""Expert imbalance (collector/data/findings/moe.py): a skewed expert that drops tokens is named,
balanced experts are not, and even drops blame the capacity."""

from __future__ import annotations

import pandas as pd

from collector.data.findings import moe


def moe_load(tokens: dict[int, int], dropped: dict[int, int], steps: int = 10) -> pd.DataFrame:
    rows = []
    for step in range(steps):
        for e, n in tokens.items():
            rows.append(
                {"layer": 0, "expert": e, "step": step, "tokens": n, "dropped": dropped.get(e, 0), "capacity": 64}
            )
    return pd.DataFrame(rows)


def test_a_skewed_expert_that_drops_tokens_is_a_warning_naming_it():
    """The sample run's shape: expert 0 gets 55% of the tokens, 9,243 of them dropped."""
    (found,) = moe.expert_imbalance(moe_load({0: 1675, 1: 394, 2: 372, 3: 631}, {0: 924, 1: 9, 2: 14, 3: 27}))
    assert found.severity == "warning" and found.evidence["expert"] == 0
    assert found.text.startswith("MoE layer 0: expert 0 gets 55% of the tokens (4 experts, 25% each if balanced)")
    assert "32% of routed tokens" in found.text


def test_balanced_experts_say_nothing_and_even_drops_blame_capacity():
    assert moe.expert_imbalance(moe_load({0: 260, 1: 250, 2: 240, 3: 250}, {})) == []
    (found,) = moe.expert_imbalance(moe_load({0: 260, 1: 250, 2: 240, 3: 250}, {0: 20, 1: 10, 2: 5, 3: 10}))
    assert found.severity == "warning" and "load even" in found.text and "capacity factor" in found.text
    (note,) = moe.expert_imbalance(moe_load({0: 600, 1: 150, 2: 150, 3: 100}, {}))
    assert note.severity == "info" and "none dropped" in note.text
