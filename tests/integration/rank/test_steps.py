"""Steps and metrics of hook runs: a plain DDP script with gradient accumulation on two gloo ranks,
through the real collector into Parquet, read back with DuckDB; and the step sources' rules
(manual beats the optimizer, micro-batches are not steps, bad calls name what was wrong) in
one process against a live collector."""

from __future__ import annotations

import logging

import pytest
import torch

from collector import hook
from collector.data import catalog
from collector.rank import state, steps
from collector.testing.collectors import live_collector
from tests.integration.rank import _hook_run_workers as script
from tests.integration.rank._rank_util import spawn


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_accum")
    with live_collector(tmp / "data") as (endpoint, _):
        results = spawn(script.ddp_accumulation_worker, script.WORLD, endpoint, tmp)
    run_id = results[0]["run_id"]
    assert all(r["run_id"] == run_id for r in results)
    con = catalog.connect(tmp / "data")
    yield con, run_id
    con.close()


def test_comm_rows_carry_the_optimizer_step(ddp_run):
    """Each optimizer step's ACCUM bucket all_reduces carry that step's number, 1..STEPS, on every rank."""
    con, run_id = ddp_run
    rows = con.execute(
        """SELECT rank, step, count(*) FROM comm
           WHERE run_id = ? AND log_name = 'ddp_bucket_all_reduce' GROUP BY rank, step ORDER BY rank, step""",
        [run_id],
    ).fetchall()
    assert rows == [(r, s, script.ACCUM) for r in range(script.WORLD) for s in range(1, script.STEPS + 1)]
    steps_seen = con.execute("SELECT DISTINCT step FROM comm WHERE run_id = ? ORDER BY step", [run_id]).fetchall()
    assert [s for (s,) in steps_seen] == list(range(1, script.STEPS + 1))  # nothing lands on step 0


def test_logged_metrics_are_in_monitor_at_their_step(ddp_run):
    con, run_id = ddp_run
    rows = con.execute(
        "SELECT rank, step, tag, value FROM monitor WHERE run_id = ? ORDER BY rank, step, tag", [run_id]
    ).fetchall()
    expected = sorted(
        (r, s, tag, value)
        for r in range(script.WORLD)
        for s in range(1, script.STEPS + 1)
        for tag, value in (("grad_norm", 1.0), ("lr", script.lr_at(s)), ("train_loss", script.expected_loss(s, r)))
    )
    assert [row[:3] for row in rows] == [row[:3] for row in expected]
    for got, want in zip(rows, expected, strict=True):
        assert got[3] == pytest.approx(want[3], rel=1e-12)


def test_memory_is_sampled_per_rank_per_step(ddp_run):
    con, run_id = ddp_run
    rows = con.execute(
        "SELECT rank, step, bytes FROM memory WHERE run_id = ? AND kind = 'rss' ORDER BY rank, step", [run_id]
    ).fetchall()
    assert [(r, s) for r, s, _ in rows] == [(r, s) for r in range(script.WORLD) for s in range(1, script.STEPS + 1)]
    assert all(b > 10 * 2**20 for *_, b in rows)  # a Python process with torch loaded: tens of MB at least


# ---------------------------------------------------------------- one process: the sources' rules


@pytest.fixture
def attached(tmp_path, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    # A fresh process's step: attach keeps a step set before it (an engine's global_steps), and an
    # in-process engine test run earlier by the same pytest worker leaves its last one (CI once: 2).
    state.set_step(0)
    with live_collector(tmp_path / "data") as (endpoint, _):
        session = hook.attach(run="rules", endpoint=endpoint)
        try:
            yield session
        finally:
            hook.detach()
    assert state.get_step() == 0  # detach leaves no step behind for the next session


def _adamw_step(optimizer):
    optimizer.step()
    optimizer.zero_grad()


def _model_and_optimizer():
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    return torch.optim.AdamW(model.parameters()), model


def test_optimizer_steps_count_from_one(attached):
    optimizer, _ = _model_and_optimizer()
    assert state.get_step() == 1  # before the first step: step 1
    _adamw_step(optimizer)
    assert (state.get_step(), steps.logged_step(), steps.source()) == (2, 1, steps.Source.OPTIMIZER)
    _adamw_step(optimizer)
    assert (state.get_step(), steps.logged_step()) == (3, 2)


def test_manual_step_wins_over_the_optimizer(attached):
    optimizer, _ = _model_and_optimizer()
    _adamw_step(optimizer)
    hook.step(40)
    _adamw_step(optimizer)  # no longer counted
    assert (state.get_step(), steps.logged_step(), steps.source()) == (40, 40, steps.Source.MANUAL)


def test_an_engines_counter_wins_over_the_optimizer(attached):
    """DeepSpeed skips the inner optimizer's step on an fp16 overflow yet counts the step."""
    optimizer, _ = _model_and_optimizer()
    _adamw_step(optimizer)
    steps.engine_stepped(2)  # step 2 overflowed: no optimizer.step() ran
    assert (state.get_step(), steps.logged_step()) == (3, 2)
    _adamw_step(optimizer)  # the inner optimizer of DeepSpeed's step 3: not counted again
    steps.engine_stepped(3)
    assert (state.get_step(), steps.logged_step(), steps.source()) == (4, 3, steps.Source.ENGINE)


def test_bad_calls_name_what_was_wrong(attached, caplog):
    with pytest.raises(TypeError, match=r"hook.log: metrics must be a mapping"):
        hook.log([("loss", 1.0)])
    with pytest.raises(ValueError, match=r"hook.log: step must be a non-negative int or None, got -1"):
        hook.log({"loss": 1.0}, step=-1)
    with pytest.raises(TypeError, match="metric names must be non-empty strings, got 3"):
        hook.log({3: 1.0})
    with pytest.raises(ValueError, match=r"hook.step: step must be a non-negative int, got '7'"):
        hook.step("7")
    with caplog.at_level(logging.WARNING, logger="rankscope.metrics"):
        hook.log({"note": "text", "loss": torch.tensor(1.5)})  # the loss is still logged
    assert "'note' is str, not a number; not logged" in caplog.text


def test_log_values_reach_the_catalog(tmp_path, monkeypatch):
    """0-dim tensors, ints and NaN are logged; an explicit step is kept; a non-number is skipped."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    # A fresh process's step: attach keeps a step set before it (an engine's global_steps), and an
    # in-process engine test run earlier by the same pytest worker leaves its last one (CI once: 2).
    state.set_step(0)
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        session = hook.attach(run="values", endpoint=endpoint)
        hook.log({"loss": torch.tensor(0.25), "tokens": 128, "grad_norm": float("nan"), "note": "x"})
        hook.log({"val_loss": 0.5}, step=9)
        run_id = session.run_id
        hook.detach()
    con = catalog.connect(data_dir)
    rows = con.execute("SELECT step, tag, value FROM monitor WHERE run_id = ? ORDER BY tag", [run_id]).fetchall()
    con.close()
    assert [(s, t) for s, t, _ in rows] == [(1, "grad_norm"), (1, "loss"), (1, "tokens"), (9, "val_loss")]
    values = [v for *_, v in rows]
    assert values[0] != values[0] and values[1:] == [0.25, 128.0, 0.5]
