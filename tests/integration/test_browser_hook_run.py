"""A plain DDP script with the hook attached (2 gloo ranks, gradient accumulation 4) streams
through the real collector; the Overview in Chromium plots what it passed to ``hook.log``:
its loss on the loss chart, its learning rate on the learning-rate chart, and its other
metric under "Other metrics", each over the script's optimizer steps."""

from __future__ import annotations

from collector.testing.collectors import live_collector
from collector.testing.dashboard import DashboardProcess, browser_tab
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS
from tests.integration.rank import _hook_run_workers as script
from tests.integration.rank._rank_util import spawn

pytestmark = NEEDS_CHROMIUM


def test_overview_plots_what_the_script_logged(tmp_path):
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        results = spawn(script.ddp_accumulation_worker, script.WORLD, endpoint, tmp_path)
    run_id = results[0]["run_id"]

    dashboard = DashboardProcess(data_dir)
    try:
        with browser_tab(height=1400) as tab:
            tab.goto(f"{dashboard.url}/overview?run={run_id}")
            for title in ("Loss", "Learning rate", "Other metrics"):
                tab.locator("text.gtitle", has_text=title).first.wait_for(timeout=60_000)
            for tag in ("train_loss", "lr", "grad_norm"):
                assert tab.locator("text.legendtext", has_text=tag).count() >= 1, f"{tag} is not on the Overview"
            assert tab.get_by_text("No loss in the monitor events yet.").count() == 0
            # #29: the finished run logged no samples/s and no sample counts: it will never have a
            # throughput, so the Overview says it has none (it said "No throughput yet")
            tab.get_by_text("No throughput: this run has no samples/s", exact=False).first.wait_for(timeout=60_000)
            assert tab.get_by_text("No throughput yet", exact=False).count() == 0
            # the x axis is the optimizer step: STEPS points, ticks within 1..STEPS
            ticks = [t.strip() for t in tab.locator(".xtick text").all_text_contents() if t.strip()]
            assert ticks and all(1 <= float(t) <= script.STEPS for t in ticks), ticks
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(SCREENSHOTS / "hook-run-overview.png"), full_page=True)
    finally:
        dashboard.stop(timeout=10)
