"""trainer.pipe.schedule: 1F1B and Megatron's interleaved 1F1B as pure step lists, their bubbles at equal
stage times (simulated with the engine's blocking receives and non-blocking sends), and the ideal formulas."""

from __future__ import annotations

import itertools

import pytest

from trainer.pipe.schedule import (
    BACKWARD,
    FORWARD,
    ideal_bubble_fraction,
    interleaved_one_f_one_b,
    one_f_one_b,
    simulated_step_time,
    stage_schedule,
)

LAYOUTS = [(p, v, m) for p in (2, 3, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)]


@pytest.mark.parametrize(("p", "v", "m"), LAYOUTS)
def test_every_chunk_and_micro_batch_goes_forward_once_then_backward_once(p, v, m):
    for s in range(p):
        steps = interleaved_one_f_one_b(s, p, m, v)
        pairs = {(c, mb) for c in range(v) for mb in range(m)}
        forwards = [(c, mb) for kind, c, mb in steps if kind == FORWARD]
        backwards = [(c, mb) for kind, c, mb in steps if kind == BACKWARD]
        assert sorted(forwards) == sorted(backwards) == sorted(pairs) and len(steps) == 2 * m * v
        for pair in pairs:
            assert steps.index((FORWARD, *pair)) < steps.index((BACKWARD, *pair)), (s, pair)


@pytest.mark.parametrize(("p", "v", "m"), LAYOUTS)
def test_chunks_follow_each_other_and_take_micro_batches_in_order(p, v, m):
    for s in range(p):
        steps = interleaved_one_f_one_b(s, p, m, v)
        at = {step: i for i, step in enumerate(steps)}
        for c, mb in itertools.product(range(1, v), range(m)):
            # this stage's chunk c takes its input from (the model's chunks after) its chunk c - 1
            assert at[(FORWARD, c - 1, mb)] < at[(FORWARD, c, mb)]
            assert at[(BACKWARD, c, mb)] < at[(BACKWARD, c - 1, mb)]
        for kind, c in itertools.product((FORWARD, BACKWARD), range(v)):
            # each stream between two chunks is received in the order it is sent (and the data read in order)
            assert [mb for k, cc, mb in steps if (k, cc) == (kind, c)] == list(range(m))


def test_the_order_is_megatrons():
    """p 2, v 2, m 4: stage 0 warms up with (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards, micro-batches in
    groups of p through chunk 0 then 1; backwards start with the last chunk (get_model_chunk_id)."""
    f, b = FORWARD, BACKWARD
    assert interleaved_one_f_one_b(0, 2, 4, 2) == [
        (f, 0, 0), (f, 0, 1), (f, 1, 0), (f, 1, 1),
        (f, 0, 2), (b, 1, 0), (f, 0, 3), (b, 1, 1), (f, 1, 2), (b, 0, 0), (f, 1, 3), (b, 0, 1),
        (b, 1, 2), (b, 1, 3), (b, 0, 2), (b, 0, 3),
    ]  # fmt: skip
    last = interleaved_one_f_one_b(1, 2, 4, 2)
    assert [kind for kind, _, _ in last[:3]] == [f, f, f] and last[3] == (b, 1, 0)  # warm-up (2 - 1) * 2 = 2
    for p, v, m in LAYOUTS:
        for s in range(p):
            warmup = min((p - s - 1) * 2 + (v - 1) * p, m * v)
            kinds = [kind for kind, _, _ in interleaved_one_f_one_b(s, p, m, v)]
            forwards_first = min(warmup + 1, m * v)  # then the steady state's first backward (or the drain)
            assert kinds[: forwards_first + 1] == [f] * forwards_first + [b], (p, v, m, s)


def test_one_chunk_per_stage_is_plain_1f1b():
    for p, m in itertools.product((1, 2, 4), (1, 3, 8)):
        for s in range(p):
            assert stage_schedule(s, p, m) == [(kind, 0, mb) for kind, mb in one_f_one_b(s, p, m)]
        assert ideal_bubble_fraction(p, m) == ideal_bubble_fraction(p, m, 1) == (p - 1) / (m + p - 1)


def test_micro_batches_must_be_a_multiple_of_the_stages():
    with pytest.raises(ValueError, match=r"micro-batches \(6\) to be a multiple of the stages \(4\)"):
        interleaved_one_f_one_b(0, 4, 6, 2)


@pytest.mark.parametrize(("p", "m"), list(itertools.product((2, 4), (4, 8, 16))))
def test_at_equal_stage_times_the_bubble_is_the_ideal_one_and_interleaving_shrinks_it(p, m):
    """Stages run in their order with blocking receives (no deadlock), a backward twice a forward: the idle
    share of the step is (p - 1) / (v m + p - 1) exactly, the Megatron paper's (p - 1) / (v m) of the compute."""
    bubbles = []
    for v in (1, 2, 4):
        step = simulated_step_time(p, m, v, fwd=1.0, bwd=2.0)
        bubble = 1 - m * 3.0 / step
        assert bubble == pytest.approx(ideal_bubble_fraction(p, m, v), abs=1e-12), (p, m, v)
        assert (step - m * 3.0) / (m * 3.0) == pytest.approx((p - 1) / (v * m), abs=1e-12)
        bubbles.append(bubble)
    assert bubbles[0] > bubbles[1] > bubbles[2]


def test_the_simulation_finds_a_deadlocking_order(monkeypatch):
    import trainer.pipe.schedule as schedule

    def backward_first(stage, stages, m, v=1):  # the last stage waits for a gradient nobody sends yet
        steps = schedule.one_f_one_b(stage, stages, m)
        return [(k, 0, mb) for k, mb in (steps[::-1] if stage == 0 else steps)]

    monkeypatch.setattr(schedule, "stage_schedule", backward_first)
    with pytest.raises(RuntimeError, match="deadlock"):
        simulated_step_time(2, 4)
