"""The liveness banner in a real headless Chromium: over a run that is stuck now (one rank
never entered the next all_reduce), every page shows the red banner naming the hang, its link
leads to the Liveness page with the wavefront; a healthy run shows no banner."""

from __future__ import annotations

import pytest

from collector.testing.dashboard import DashboardProcess, launch_chromium
from collector.testing.fake_runs import FINISHED, FakeRun
from collector.testing.liveness import write_hang
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS

STUCK = FakeRun(run_id="stuck-now", status="running", steps=5, with_moe=False)
STUCK_RANK = 2
BANNER = "This run needs attention now"

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    from collector.testing.fake_runs import write_run

    data_dir = tmp_path_factory.mktemp("liveness-data")
    write_run(data_dir, FINISHED)
    write_hang(data_dir, STUCK, STUCK_RANK, waited_s=3600)  # waits an hour: still stuck while the test runs
    dashboard = DashboardProcess(data_dir)
    yield dashboard.url
    dashboard.stop(timeout=10)


@pytest.fixture(scope="module")
def tab(dashboard):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


@pytest.mark.parametrize("path", ["overview", "comms", "flops"])
def test_a_stuck_run_shows_the_banner_on_every_page(tab, dashboard, path):
    tab.goto(f"{dashboard}/{path}?run={STUCK.run_id}")
    banner = tab.get_by_text(BANNER, exact=False).first
    banner.wait_for(timeout=60_000)
    text = tab.locator("[data-testid='stAlertContentError']").first.inner_text()
    assert "hang:" in text and f"waiting for rank {STUCK_RANK}" in text and "all_reduce" in text
    if path == "overview":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / "liveness-banner.png"))


def test_the_banner_links_to_the_wavefront(tab, dashboard):
    tab.goto(f"{dashboard}/overview?run={STUCK.run_id}")
    tab.get_by_text("Wavefront and stacks").first.wait_for(timeout=60_000)
    tab.get_by_text("Wavefront and stacks").first.click()
    tab.get_by_role("heading", name="Wavefront").first.wait_for(timeout=60_000)
    assert "/liveness" in tab.url
    tab.get_by_text("Stuck collectives").first.wait_for(timeout=60_000)


def test_a_healthy_run_shows_no_banner(tab, dashboard):
    tab.goto(f"{dashboard}/overview?run={FINISHED.run_id}")
    tab.get_by_text("Health").first.wait_for(timeout=60_000)
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)
    assert tab.get_by_text(BANNER, exact=False).count() == 0
