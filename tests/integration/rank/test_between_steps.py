"""The wait between steps of a hook run (collector.rank.between_steps), in one process against a
live collector, read back from the catalog: a known sleep between ``optimizer.step()`` and the
next forward is what the rank records for the step it precedes; without one the wait is short;
each gap lies within the test's own clock readings around where it starts and ends (Brackets);
no forward pre-hook is left registered once a step's first forward has run, and none after
detach. The multi-rank DDP run that makes a straggler out of it is
tests/integration/test_hook_causes_e2e.py.

Split by tier: the pure-function tests are in tests/unit/rank/test_between_steps.py."""

from __future__ import annotations

import contextlib
import logging
import time

import pytest
import torch

from collector import hook
from collector.data import catalog
from collector.rank import session, steps
from collector.testing.collectors import live_collector
from tests.unit.rank.test_between_steps import _pre_hooks

SLEEP_S = 0.1
SLEEP_MS = SLEEP_S * 1e3


class Brackets:
    """The test's own clock around where each gap starts (the call that ends a step) and ends (the
    step's first forward). The gap the rank records must lie between the inner span (the ending
    call returned -> the forward was called) and the outer one (the ending call was made -> the
    forward returned), both measured in the same run: a loaded host that deschedules the process
    inside a gap (200 ms seen at load 16 on 2 cores) moves the bounds with it, so no wall-clock
    threshold is involved, and a sleep outside the outer span (inside the step) cannot be in it."""

    def __init__(self) -> None:
        self.ends: dict[int, tuple[float, float]] = {}
        self.forwards: dict[int, tuple[float, float]] = {}

    @contextlib.contextmanager
    def ending(self, step: int):
        began = time.perf_counter()
        yield
        self.ends[step] = (began, time.perf_counter())

    @contextlib.contextmanager
    def forward(self, step: int):
        began = time.perf_counter()
        yield
        self.forwards.setdefault(step, (began, time.perf_counter()))  # the step's first forward

    def check(self, gaps: dict[int, float], after: dict[int, int]) -> None:
        """``after``: each gap's step -> the step whose end starts it."""
        for step, ended in after.items():
            inner = 1e3 * (self.forwards[step][0] - self.ends[ended][1])
            outer = 1e3 * (self.forwards[step][1] - self.ends[ended][0])
            assert inner - 1e-3 <= gaps[step] <= outer + 1e-3, (step, inner, gaps[step], outer)


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


@pytest.mark.timing
def test_a_sleep_before_the_next_forward_is_the_steps_wait(collector):
    model, optimizer = _model()
    hooks_before = _pre_hooks()
    session_ = hook.attach(run="gaps", endpoint=collector.endpoint)
    armed_after_step, hooks_after_forward, clock = [], [], Brackets()
    for step in range(1, 7):
        if step == 4:
            time.sleep(SLEEP_S)  # the "data loader" of step 4
        for _ in range(2):  # two micro-batches: the second forward is inside the step, not a gap
            with clock.forward(step):
                out = model(torch.randn(4, 8))
            out.sum().backward()
            hooks_after_forward.append(_pre_hooks())
        with clock.ending(step):
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
    clock.check(gaps, {s: s - 1 for s in gaps})  # each from the step before's end to its first forward
    assert gaps[4] >= SLEEP_MS, gaps


@pytest.mark.timing
def test_manual_steps_take_the_wait_from_the_optimizer_and_stamp_the_scripts_step(collector):
    """``hook.step(n)`` at the top of the loop, as such scripts do: the gap still starts at
    ``optimizer.step()`` and lands on the step the script set before its forward."""
    model, optimizer = _model()
    session_ = hook.attach(run="gaps-manual", endpoint=collector.endpoint)
    clock = Brackets()
    for step in (10, 20, 30):
        hook.step(step)
        with clock.forward(step):
            out = model(torch.randn(4, 8))
        out.sum().backward()
        with clock.ending(step):
            optimizer.step()
        optimizer.zero_grad()
        time.sleep(SLEEP_S if step == 20 else 0)
    run_id = session_.run_id
    hook.detach()
    gaps = _gaps(collector.data_dir, run_id)
    assert sorted(gaps) == [20, 30]
    clock.check(gaps, {20: 10, 30: 20})
    assert gaps[30] >= SLEEP_MS, gaps


@pytest.mark.timing
def test_an_engines_step_end_starts_the_wait(collector):
    """An engine counter (DeepSpeed, the HF Trainer, Lightning) ends the step: the gap starts there,
    not at the inner optimizer's step before it."""
    model, optimizer = _model()
    session_ = hook.attach(run="gaps-engine", endpoint=collector.endpoint)
    steps.engine_in_use()  # as the integrations say before the first step
    clock = Brackets()
    for step in (1, 2, 3):
        with clock.forward(step):
            out = model(torch.randn(4, 8))
        out.sum().backward()
        optimizer.step()
        time.sleep(SLEEP_S)  # the engine's own work after the optimizer: inside the step
        with clock.ending(step):
            steps.engine_stepped(step)
    run_id = session_.run_id
    hook.detach()
    gaps = _gaps(collector.data_dir, run_id)
    assert sorted(gaps) == [2, 3], gaps
    clock.check(gaps, {2: 1, 3: 2})  # from engine_stepped: the sleep before it is outside the bounds


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
