"""The wait between steps of a hook run (collector.rank.between_steps) with no session: nothing is armed.

Split by tier: what needs processes, sockets or seconds is in tests/integration/rank/test_between_steps.py."""

from __future__ import annotations

from torch.nn.modules import module as torch_module

from collector.rank import between_steps


def _pre_hooks() -> int:
    return len(torch_module._global_forward_pre_hooks)


def test_without_a_session_nothing_is_armed():
    gaps = between_steps.BetweenSteps()
    before = _pre_hooks()
    gaps.step_ended()
    assert _pre_hooks() == before and not gaps.armed()
