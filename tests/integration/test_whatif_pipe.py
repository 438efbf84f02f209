"""The what-if replay on the bundled pipeline engine's own runs (``pipe`` rows streamed to a real
collector by 2 gloo ranks, tests/integration/_pipe_workers.py): with stage 1 sleeping 30 ms more per
micro-batch forward, ``rankscope whatif`` finds the steps slower than their ideal and puts it on
stage 1 (by_stage), and health's what-if finding names the stage, not a worker; the balanced
pipeline's steps are at their ideal (S < 1.05) and get no what-if finding."""

from __future__ import annotations

import pytest

from collector.data import findings, queries, whatif
from collector.testing.collectors import live_collector
from tests.integration import _pipe_workers as script
from tests.integration.rank._rank_util import spawn

pytestmark = [pytest.mark.timing, pytest.mark.slow]  # a 2-rank training run of four telemetry sessions


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whatif-pipe")
    with live_collector(tmp / "data") as (endpoint, data_dir):
        ranks = spawn(script.pipe_runs_worker, script.WORLD, endpoint, tmp)
    return queries.Catalog(data_dir), ranks[0]


def test_a_slow_stage_is_the_replays_slowdown(runs):
    cat, run_ids = runs
    slow = whatif.for_run(cat, run_ids["slow"])
    assert slow["slowdown"] > 1.05, slow["slowdown"]
    assert next(iter(slow["by_stage"])) == "1", slow["by_stage"]
    assert slow["by_stage"]["1"] > slow["by_stage"]["0"]
    (found,) = [f for f in findings.for_run(cat, run_ids["slow"]) if f.kind.startswith("whatif")]
    assert found.kind == "whatif_stage" and "stage 1" in found.text, found


def test_a_balanced_pipeline_has_no_whatif_finding(runs):
    cat, run_ids = runs
    balanced = whatif.for_run(cat, run_ids["balanced"])
    assert balanced["slowdown"] < 1.05, balanced["slowdown"]
    assert not [f for f in findings.for_run(cat, run_ids["balanced"]) if f.kind.startswith("whatif")]
