"""The what-if replay on the bundled pipeline engine's own runs (``pipe`` rows streamed to a real
collector by 2 gloo ranks, tests/integration/_pipe_workers.py): with stage 1 sleeping 30 ms more per
micro-batch forward, ``rankscope whatif`` finds the steps slower than their ideal and puts it on
stage 1 (by_stage), and health's what-if finding names the stage, not a worker; the balanced
pipeline's steps are at their ideal (S < 1.05) and get no what-if finding.

What load changes: the stages' ops are sleeps of a set length, identical in every micro-batch and
step, so any op that ran much longer than its fellows was delayed by the machine (a sleeping rank
woken late on busy cores). Those are real stragglers, and the replay rightly counts them: on a
loaded 2-core machine (two CPU hogs beside the suite) the balanced run's compute ops ran up to 6x
their design, S came out 1.07 and health reported a spread. Whether that happened is read from the
run's own recorded ops (``_machine_share``: the compute time beyond each op group's median); where
an assertion fails and the machine made more than ``MACHINE_SHARE_MAX`` of the compute time, the
test skips naming that share and the load: the claim cannot be checked on that run. Where the
machine was calm, a failure is a failure. No wall-clock limit is asserted."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

from collector.data import findings, queries, whatif
from collector.testing.collectors import live_collector
from tests.integration import _pipe_workers as script
from tests.integration.rank._rank_util import spawn

pytestmark = [pytest.mark.timing, pytest.mark.slow]  # a 2-rank training run of four telemetry sessions

# Calm runs (other work beside the test, load 9 on 2 cores) measured 4-6%; with two CPU hogs added,
# 12-36% (the balanced run at 36%: S 1.07, a whatif_spread finding).
MACHINE_SHARE_MAX = 0.2
COMPUTE = ("forward-compute", "backward-compute")


def _machine_share(cat, run_id: str) -> float:
    """The share of the run's compute time the machine added: each compute op's time beyond the
    median of its (op type, stage) group (all alike by design), over the groups' designed time."""
    ops = queries.whatif_pipe_ops(cat, run_id)
    ops = ops[ops.optype.isin(COMPUTE)]
    median = ops.groupby(["optype", "stage"]).dur.transform("median")
    return float((ops.dur - median).clip(lower=0).sum() / median.sum())


@contextmanager
def _unless_the_machine_delayed(cat, run_id: str):
    """Assertions on ``run_id``'s figures: a failure where the machine made the stragglers is a skip."""
    try:
        yield
    except AssertionError as e:
        share = _machine_share(cat, run_id)
        if share <= MACHINE_SHARE_MAX:
            raise AssertionError(f"{e} (machine-made share of compute time {share:.0%}: a calm run)") from e
        try:
            load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        except OSError:
            load = "load unknown"
        pytest.skip(
            f"the machine delayed this run's sleeping ops by {share:.0%} of their compute time "
            f"(over {MACHINE_SHARE_MAX:.0%}; {load}): stragglers of its own, so the replay's verdict "
            f"cannot be checked; it said: {e}"
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whatif-pipe")
    with live_collector(tmp / "data") as (endpoint, data_dir):
        ranks = spawn(script.pipe_runs_worker, script.WORLD, endpoint, tmp)
    return queries.Catalog(data_dir), ranks[0]


def test_a_slow_stage_is_the_replays_slowdown(runs):
    cat, run_ids = runs
    with _unless_the_machine_delayed(cat, run_ids["slow"]):
        slow = whatif.for_run(cat, run_ids["slow"])
        assert slow["slowdown"] > 1.05, slow["slowdown"]
        assert next(iter(slow["by_stage"])) == "1", slow["by_stage"]
        assert slow["by_stage"]["1"] > slow["by_stage"]["0"]
        (found,) = [f for f in findings.for_run(cat, run_ids["slow"]) if f.kind.startswith("whatif")]
        assert found.kind == "whatif_stage" and "stage 1" in found.text, found


def test_a_balanced_pipeline_has_no_whatif_finding(runs):
    cat, run_ids = runs
    with _unless_the_machine_delayed(cat, run_ids["balanced"]):
        balanced = whatif.for_run(cat, run_ids["balanced"])
        assert balanced["slowdown"] < 1.05, balanced["slowdown"]
        assert not [f for f in findings.for_run(cat, run_ids["balanced"]) if f.kind.startswith("whatif")]


def test_the_machine_share_counts_only_ops_beyond_their_fellows(monkeypatch):
    """The precondition's own measure on a recorded run: 0 for a run whose compute ops all sit at
    their group's median; grows with one op made slower."""
    import pandas as pd

    ops = pd.DataFrame(
        {
            "optype": ["forward-compute"] * 3 + ["backward-compute"] * 3 + ["forward-recv"],
            "stage": [0] * 7,
            "dur": [0.03, 0.03, 0.03, 0.06, 0.06, 0.12, 5.0],
        }
    )
    monkeypatch.setattr(queries, "whatif_pipe_ops", lambda cat, run_id: ops)
    assert _machine_share(None, "x") == pytest.approx(0.06 / 0.27)
    monkeypatch.setattr(queries, "whatif_pipe_ops", lambda cat, run_id: ops.assign(dur=[0.03] * 3 + [0.06] * 3 + [5.0]))
    assert _machine_share(None, "x") == 0.0
