"""Pipeline training schedules: what one stage does in a step, in order.

1F1B (one forward, one backward): stage ``s`` of ``p`` runs ``p - s - 1`` warm-up forwards, then
alternates one forward and one backward, then drains the remaining backwards. Activations held per
stage are then at most ``p - s`` micro-batches (not all ``m``, as with all-forwards-then-all-backwards),
and with equal stage times the pipeline idles (p - 1) / (m + p - 1) of each step: the bubble.

Interleaved 1F1B (Megatron's virtual pipeline stages): the layers are cut into ``p * v`` chunks and
stage ``s`` holds chunks s, s + p, s + 2p, ... (its local chunk ``c`` is the model's chunk ``c * p + s``),
so a micro-batch goes round the ranks ``v`` times. Each chunk is 1/v of a stage, the fill and drain
take 1/v as long, and the bubble shrinks to (p - 1) / (v m + p - 1) of a step, at the price of v times
the point-to-point messages. The order is Megatron's ``forward_backward_pipelining_with_interleaving``
(megatron-core): micro-batches go in groups of ``p``, each group through local chunk 0, then 1, ...
(backwards through the last chunk first); ``(p - s - 1) * 2 + (v - 1) * p`` warm-up forwards, then
1F1B over (chunk, micro-batch) pairs, then the remaining backwards. It needs m to be a multiple of p.
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


def interleaved_one_f_one_b(
    stage: int, stages: int, micro_batches: int, virtual_stages: int
) -> list[tuple[str, int, int]]:
    """[(FORWARD | BACKWARD, local chunk, micro_batch), ...] for ``stage``: every (chunk, micro-batch)
    once each way, in Megatron's interleaved order (module docstring)."""
    p, v, m = stages, virtual_stages, micro_batches
    if m % p:
        raise ValueError(f"the interleaved schedule needs micro-batches ({m}) to be a multiple of the stages ({p})")
    total = m * v
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def nth(k: int, kind: str) -> tuple[str, int, int]:
        # Megatron's get_model_chunk_id: the k-th forward (backward) of this stage
        group, pos = divmod(k, p * v)
        chunk = pos // p if kind == FORWARD else v - 1 - pos // p
        return kind, chunk, group * p + pos % p

    steps = [nth(k, FORWARD) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [nth(warmup + k, FORWARD), nth(k, BACKWARD)]
    steps += [nth(k, BACKWARD) for k in range(total - warmup, total)]
    return steps


def stage_schedule(stage: int, stages: int, micro_batches: int, virtual_stages: int = 1) -> list[tuple[str, int, int]]:
    """[(FORWARD | BACKWARD, local chunk, micro_batch), ...]: 1F1B (chunk 0) for one chunk per stage,
    the interleaved schedule for more."""
    if virtual_stages == 1:
        return [(kind, 0, mb) for kind, mb in one_f_one_b(stage, stages, micro_batches)]
    return interleaved_one_f_one_b(stage, stages, micro_batches, virtual_stages)


def ideal_bubble_fraction(stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The share of a step each stage idles with equal stage times: (p - 1) / (v m + p - 1), that is
    the Megatron paper's bubble (p - 1) / (v m) of the ideal compute time, as a share of the step."""
    return (stages - 1) / (virtual_stages * micro_batches + stages - 1)


def simulated_step_time(stages: int, micro_batches: int, virtual_stages: int = 1, fwd: float = 1.0,
                        bwd: float = 2.0) -> float:  # fmt: skip
    """The step time of ``stage_schedule`` on every stage when a whole stage's forward of one
    micro-batch takes ``fwd`` and its backward ``bwd`` (a chunk 1/v of that) and messages are free:
    each stage runs its steps in order, a forward waits for the previous chunk's forward of the same
    micro-batch and a backward for the next chunk's backward (a blocking receive; sends never block,
    as the engine's isends). Raises RuntimeError where the orders deadlock."""
    p, v = stages, virtual_stages
    todo = [stage_schedule(s, p, micro_batches, v) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, model chunk, micro_batch) -> end time
    clock, pos = [0.0] * p, [0] * p
    while any(pos[s] < len(todo[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(todo[s]):
                kind, chunk, mb = todo[s][pos[s]]
                g = chunk * p + s  # the model's chunk
                if kind == FORWARD:
                    needs = (FORWARD, g - 1, mb) if g > 0 else None
                else:  # the model's last chunk starts from its own loss
                    needs = (BACKWARD, g + 1, mb) if g < p * v - 1 else (FORWARD, g, mb)
                if needs is not None and needs not in done:
                    break
                ready = done[needs] if needs is not None else 0.0
                clock[s] = max(clock[s], ready) + (fwd if kind == FORWARD else bwd) / v
                done[(kind, g, mb)] = clock[s]
                pos[s] += 1
                moved = True
        if not moved:
            waiting = [todo[s][pos[s]] for s in range(p) if pos[s] < len(todo[s])]
            raise RuntimeError(f"deadlock: the stages wait at {waiting}")
    return max(clock)
