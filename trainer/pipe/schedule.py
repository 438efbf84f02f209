"""The 1F1B (one forward, one backward) training schedule: what one stage does, in order.

Stage ``s`` of ``p`` runs ``p - s - 1`` warm-up forwards, then alternates one forward and one
backward, then drains the remaining backwards. Activations held per stage are then at most
``p - s`` micro-batches (not all ``m``, as with all-forwards-then-all-backwards), and with equal
stage times the pipeline idles (p - 1) / (m + p - 1) of each step: the bubble.
"""

from __future__ import annotations

FORWARD, BACKWARD = "fwd", "bwd"


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """[(FORWARD | BACKWARD, micro_batch), ...] for ``stage``; every micro-batch once each way."""
    warmup = min(stages - stage - 1, micro_batches)
    steps = [(FORWARD, i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        steps += [(FORWARD, warmup + i), (BACKWARD, i)]
    steps += [(BACKWARD, i) for i in range(micro_batches - warmup, micro_batches)]
    return steps


def ideal_bubble_fraction(stages: int, micro_batches: int) -> float:
    """The share of a step each stage idles under 1F1B with equal stage times."""
    return (stages - 1) / (micro_batches + stages - 1)
