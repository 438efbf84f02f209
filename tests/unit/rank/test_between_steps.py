"""The wait between steps of a hook run (collector.rank.between_steps), in one process against a
live collector, read back from the catalog: a known sleep between ``optimizer.step()`` and the
next forward is what the rank records for the step it precedes; without one the wait is short;
each gap lies within the test's own clock readings around where it starts and ends (Brackets);
no forward pre-hook is left registered once a step's first forward has run, and none after
detach. The multi-rank DDP run that makes a straggler out of it is
tests/integration/test_hook_causes_e2e.py.

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
