"""The liveness banner in a real headless Chromium: over a run that is stuck now (one rank
never entered the next all_reduce), every page shows the red banner naming the hang, its link
leads to the Liveness page with the wavefront; a healthy run shows no banner. A 1,024-rank
`rankscope simulate --hang` run: the Liveness page names the stuck rank, the op and the step,
and shows two stacks (the stuck rank's, and the 1,023 identical ones of the ranks waiting)."""

from __future__ import annotations

import pytest

from collector.testing.dashboard import browser_tab
from collector.testing.fake_runs import FINISHED, FakeRun
from collector.testing.liveness import write_hang
from collector.tools import simulate
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS, serve_dashboard

STUCK = FakeRun(run_id="stuck-now", status="running", steps=5, with_moe=False)
STUCK_RANK = 2
SIMULATED = simulate.Simulation(ranks=1024, steps=3, hang=simulate.Hang(700, 2), run_id="simulated-hang")
BANNER = "This run needs attention now"

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    from collector.testing.fake_runs import write_run

    data_dir = tmp_path_factory.mktemp("liveness-data")
    write_run(data_dir, FINISHED)
    write_hang(data_dir, STUCK, STUCK_RANK, waited_s=3600)  # waits an hour: still stuck while the test runs
    simulate.write_data_dir(SIMULATED.anchored_now(), data_dir)
    yield from serve_dashboard(data_dir)


@pytest.fixture(scope="module")
def tab(dashboard):
    with browser_tab() as page:
        yield page


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


def test_a_simulated_hang_at_1024_ranks_on_the_liveness_page(tab, dashboard):
    tab.goto(f"{dashboard}/liveness?run={SIMULATED.run_id}")
    tab.get_by_text("Stuck collectives").first.wait_for(timeout=120_000)
    banner = tab.locator("[data-testid='stAlertContentError']").first.inner_text()
    assert "waiting for rank 700" in banner and "reduce_scatter_tensor" in banner and "at step 2" in banner
    tab.get_by_text("rank 700 · step 2 · missing from").first.wait_for(timeout=120_000)
    tab.get_by_text("ranks 0-699,701-1023 · step 2 · hang:").first.wait_for(timeout=120_000)
    expanders = tab.locator("[data-testid='stExpander']")
    assert expanders.count() == 2  # one per distinct stack, not one per rank
    stuck, waiting = expanders.nth(0).inner_text(), expanders.nth(1).inner_text()
    assert "missing from reduce_scatter_tensor #14 of world" in stuck and "simulated_stall" in stuck
    assert "hang: reduce_scatter_tensor world #14 in flight > 60 s" in waiting
