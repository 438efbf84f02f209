"""The dashboard in a real headless Chromium: `rankscope dashboard` on a free port over
the fake runs of collector.testing.fake_runs; every page loads and draws its charts.
Screenshots go to test-artifacts/screenshots/<page>.png (the README's tour uses them)."""

from __future__ import annotations

import pytest

from collector.testing.dashboard import browser_tab
from collector.testing.fake_runs import COLLECTIVES, FINISHED, LIVE, write_data_dir
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS, serve_dashboard

DELAYED_RANK = FINISHED.late_rank
# url path -> what must be on the page once it has rendered
PAGES = {
    "": "train_batch_size",  # the selected run's config, drawn after the runs table
    "overview": f"rank {DELAYED_RANK} costs",
    "comms": "Summary (deepspeed.comm.log_summary)",
    "stragglers": f"rank {DELAYED_RANK} arrives last",
    "flops": "Detailed profile",
    "memory": "params per rank",
    "moe": "Expert load",
    "sql": "SQL console",
}
CHART_PAGES = {"overview", "comms", "stragglers", "flops", "memory", "moe"}

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    data_dir = write_data_dir(tmp_path_factory.mktemp("browser-data"), FINISHED, LIVE)
    yield from serve_dashboard(data_dir)


@pytest.fixture(scope="module")
def page(dashboard):
    with browser_tab() as tab:
        yield tab


def open_page(tab, base: str, path: str) -> None:
    tab.goto(f"{base}/{path}?run={FINISHED.run_id}")
    tab.get_by_text(PAGES[path], exact=False).first.wait_for(timeout=45_000)
    if path in CHART_PAGES:
        tab.locator(".js-plotly-plot").first.wait_for(timeout=45_000)
    if path == "":
        tab.locator("[data-testid='stDataFrame'] canvas").first.wait_for(timeout=45_000)
    # Streamlit shows a running indicator until the script run finishes.
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=45_000)


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders(page, dashboard, path):
    open_page(page, dashboard, path)
    assert page.locator("[data-testid='stException']").count() == 0
    if path in CHART_PAGES:
        assert page.locator(".js-plotly-plot").count() >= 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{path or 'runs'}.png"), full_page=True)


def test_straggler_page_names_the_delayed_rank(page, dashboard):
    open_page(page, dashboard, "stragglers")
    assert page.get_by_text(f"rank {DELAYED_RANK} arrives last in 100%").count() >= 1


def test_comms_table_lists_each_op(page, dashboard):
    open_page(page, dashboard, "comms")
    summary = page.locator("[data-testid='stTable']").first
    summary.wait_for()
    text = summary.inner_text()
    for op in {op for op, _, _ in COLLECTIVES}:
        assert op in text


def test_clicking_a_heatmap_cell_drills_down_to_it(page, dashboard):
    open_page(page, dashboard, "stragglers")
    heatmap = page.locator(".js-plotly-plot").nth(1)  # arrival delay; [0] is the last-rank bars
    heatmap.scroll_into_view_if_needed()
    cells = heatmap.locator(".nsewdrag").first.bounding_box()
    # Rows are ranks 0..3 (grouped by host, in rank order here). The drill-down starts at the
    # last rank and step 0; click rank 1's row mid-run and both follow the clicked cell.
    clicked_rank = 1
    page.mouse.click(cells["x"] + cells["width"] / 2, cells["y"] + cells["height"] * (clicked_rank + 0.5) / 4)
    page.wait_for_function(
        "rank => [...document.querySelectorAll(\"[data-testid='stSelectbox'] input\")]"
        ".some(el => el.value.endsWith(rank))",
        arg=f"rank {clicked_rank}",
        timeout=30_000,
    )
    step = int(page.locator("[data-testid='stNumberInput'] input").first.input_value())
    assert 0 < step < FINISHED.steps - 1
