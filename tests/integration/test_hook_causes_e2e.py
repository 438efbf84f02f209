"""From symptom to cause in a hook run: a plain DDP script (no engine, collector.hook attached) on
4 real gloo ranks streaming into a real collector; then ``rankscope health --json`` on each run.

- data: rank 3's data loader sleeps 40 ms before each batch -> the top finding is a straggler
  naming rank 3, its cause data loading, worded as the wait between steps it measures;
- compute: rank 3 busy 40 ms inside its forward pass -> a straggler too, but its cause is not
  data loading (the wait between steps ends where the forward begins);
- healthy: nobody slowed -> no straggler and no data-loading cause;
- the Overview, in headless Chromium, says the same sentence for the data run.
"""

from __future__ import annotations

import json

import pytest

from collector.testing.collectors import live_collector
from collector.testing.dashboard import DashboardProcess, browser_tab
from tests.integration import _hook_causes_workers as script
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS
from tests.integration._health import health
from tests.integration.rank._rank_util import spawn

pytestmark = pytest.mark.timing  # CPU sharing between ranks or wall-clock gaps: `make test-stress`


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hook-causes")
    with live_collector(tmp / "data") as (endpoint, data_dir):
        ranks = spawn(script.hook_runs_worker, script.WORLD, endpoint, tmp)
    assert all(r == ranks[0] for r in ranks), ranks  # every rank in the same runs
    return data_dir, ranks[0]


def test_a_slow_data_loader_is_named_as_the_cause(runs):
    data_dir, run_ids = runs
    (top, *_) = health(data_dir, run_ids["data"])
    assert top["kind"] == "straggler" and top["ranks"] == [script.SLOW_RANK], top
    assert top["evidence"].get("cause") == "data", top["text"]
    assert "waits between steps (data loading and host work)" in top["text"], top["text"]
    # what it measured: the sleep, on the slow rank, against a few ms on the others
    assert top["evidence"]["signal_median_ms"] >= script.DELAY_S * 1e3, top["evidence"]
    assert top["evidence"]["others_median_ms"] < script.DELAY_S * 1e3 / 2, top["evidence"]


def test_a_slow_forward_is_a_straggler_but_not_for_its_data(runs):
    data_dir, run_ids = runs
    (top, *_) = health(data_dir, run_ids["compute"])
    assert top["kind"] == "straggler" and top["ranks"] == [script.SLOW_RANK], top
    assert top["evidence"].get("cause") != "data" and "data loading" not in top["text"], top["text"]


def test_a_healthy_hook_run_has_no_straggler_and_no_data_cause(runs):
    data_dir, run_ids = runs
    found = health(data_dir, run_ids["healthy"])
    # the whole findings, evidence and all, if it fails (pytest's repr cuts the dicts short)
    assert not [f for f in found if f["kind"] == "straggler"], json.dumps(found, indent=1)[:4000]
    assert not [f for f in found if f["evidence"].get("cause") == "data" or "data loading" in f["text"]], found


@NEEDS_CHROMIUM[0]
@NEEDS_CHROMIUM[1]
def test_the_overview_names_the_wait_between_steps(runs):
    data_dir, run_ids = runs
    with DashboardProcess(data_dir) as dashboard, browser_tab() as page:
        page.goto(f"{dashboard.url}/overview?run={run_ids['data']}")
        try:
            page.get_by_text(f"rank {script.SLOW_RANK} costs", exact=False).first.wait_for(timeout=90_000)
            assert page.get_by_text("waits between steps (data loading and host work)", exact=False).count() >= 1
        finally:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "causes-hook-data.png"), full_page=True)
