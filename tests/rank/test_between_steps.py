"""The wait between steps of a hook run (collector.rank.between_steps), in one process against a
live collector, read back from the catalog: a known sleep between ``optimizer.step()`` and the
next forward is what the rank records for the step it precedes; without one the wait is short (a
few ms typically; see EMPTY_GAP_MS); no forward pre-hook is left registered once a step's first
forward has run, and none after detach. The multi-rank DDP run that makes a straggler out of it
is tests/integration/test_hook_causes_e2e.py."""

from __future__ import annotations

import logging
import statistics
import time

import pytest
import torch
from torch.nn.modules import module as torch_module

from collector import hook
from collector.data import catalog
from collector.rank import between_steps, session, steps
from collector.testing.collectors import live_collector

SLEEP_S = 0.1
SLEEP_MS = SLEEP_S * 1e3
# A gap with nothing in it (zero_grad and a loop iteration on a tiny model) takes well under a
# ms, but a loaded host may deschedule the process inside any gap (28 ms seen beside two busy
# loops on 2 cores). So the bounds are set by the sleep, not by the host's speed: a gap that held
# the sleep is at least SLEEP_MS and under two of it (one sleep, not two); one that held none is
# under half of it (told apart from one that did); and the empty gaps' median (the typical gap,
# which one descheduling does not move) is at most EMPTY_GAP_MS.
EMPTY_GAP_MS = 20.0


@pytest.fixture
def collector(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with live_collector(tmp_path / "data") as live:
        yield live


def _gaps(data_dir, run_id) -> dict[int, float]:
    con = catalog.connect(data_dir)
    try:
        rows = con.execute(
            "SELECT step, dur_ns / 1e6, start_ns FROM between_steps WHERE run_id = ? ORDER BY step", [run_id]
        ).fetchall()
    finally:
        con.close()
    assert all(start > 0 for *_, start in rows)
    steps_seen = [s for s, *_ in rows]
    assert len(steps_seen) == len(set(steps_seen)), rows  # one row per step
    return {s: ms for s, ms, _ in rows}


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    return model, torch.optim.AdamW(model.parameters())


def _pre_hooks() -> int:
    return len(torch_module._global_forward_pre_hooks)


@pytest.mark.timing
def test_a_sleep_before_the_next_forward_is_the_steps_wait(collector):
    model, optimizer = _model()
    hooks_before = _pre_hooks()
    session_ = hook.attach(run="gaps", endpoint=collector.endpoint)
    armed_after_step, hooks_after_forward = [], []
    for step in range(1, 7):
        if step == 4:
            time.sleep(SLEEP_S)  # the "data loader" of step 4
        for _ in range(2):  # two micro-batches: the second forward is inside the step, not a gap
            model(torch.randn(4, 8)).sum().backward()
            hooks_after_forward.append(_pre_hooks())
        optimizer.step()
        armed_after_step.append(_pre_hooks())
        optimizer.zero_grad()
    run_id = session_.run_id
    hook.detach()
    assert _pre_hooks() == hooks_before  # detach removed the one armed after the last step
    assert armed_after_step == [hooks_before + 1] * 6  # one pre-hook a step, armed at its end
    assert hooks_after_forward == [hooks_before] * 12  # and gone once the next forward began

    gaps = _gaps(collector.data_dir, run_id)
    assert sorted(gaps) == [2, 3, 4, 5, 6]  # nothing ends before step 1: no wait precedes it
    assert SLEEP_MS <= gaps[4] < 2 * SLEEP_MS, gaps
    empty = [ms for s, ms in gaps.items() if s != 4]
    assert all(0 <= ms < SLEEP_MS / 2 for ms in empty) and statistics.median(empty) < EMPTY_GAP_MS, gaps


@pytest.mark.timing
def test_manual_steps_take_the_wait_from_the_optimizer_and_stamp_the_scripts_step(collector):
    """``hook.step(n)`` at the top of the loop, as such scripts do: the gap still starts at
    ``optimizer.step()`` and lands on the step the script set before its forward."""
    model, optimizer = _model()
    session_ = hook.attach(run="gaps-manual", endpoint=collector.endpoint)
    for step in (10, 20, 30):
        hook.step(step)
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(SLEEP_S if step == 20 else 0)
    run_id = session_.run_id
    hook.detach()
    gaps = _gaps(collector.data_dir, run_id)
    assert sorted(gaps) == [20, 30]
    assert SLEEP_MS <= gaps[30] < 2 * SLEEP_MS and gaps[20] < SLEEP_MS / 2, gaps


@pytest.mark.timing
def test_an_engines_step_end_starts_the_wait(collector):
    """An engine counter (DeepSpeed, the HF Trainer, Lightning) ends the step: the gap starts there,
    not at the inner optimizer's step before it."""
    model, optimizer = _model()
    session_ = hook.attach(run="gaps-engine", endpoint=collector.endpoint)
    steps.engine_in_use()  # as the integrations say before the first step
    for step in (1, 2, 3):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        time.sleep(SLEEP_S)  # the engine's own work after the optimizer: inside the step
        steps.engine_stepped(step)
    run_id = session_.run_id
    hook.detach()
    gaps = _gaps(collector.data_dir, run_id)
    assert sorted(gaps) == [2, 3] and all(ms < SLEEP_MS / 2 for ms in gaps.values()), gaps  # the sleep is not in it


def test_a_failure_to_record_never_reaches_the_forward(collector, monkeypatch, caplog):
    model, optimizer = _model()
    hook.attach(run="gaps-failing", endpoint=collector.endpoint)
    try:
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()

        def broken(table, rows):
            raise RuntimeError("buffer gone")

        monkeypatch.setattr(session, "emit_rows", broken)
        with caplog.at_level(logging.ERROR, logger="rankscope.steps"):
            out = model(torch.randn(4, 8))  # the forward runs, and the pre-hook is gone all the same
        assert out.shape == (4, 1) and not steps._counter.between.armed()
        assert "recording the wait between steps failed" in caplog.text
    finally:
        monkeypatch.undo()
        hook.detach()


def test_without_a_session_nothing_is_armed():
    gaps = between_steps.BetweenSteps()
    before = _pre_hooks()
    gaps.step_ended()
    assert _pre_hooks() == before and not gaps.armed()
