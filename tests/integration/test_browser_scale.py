"""The dashboard at scale in a real headless Chromium: a `rankscope simulate` run of 1,024
ranks (20 steps, so the whole check stays within CI's budget; the 8,192-rank run is
benches/dashboard_scale.py) with rank 517 injected 40 ms late. Every page draws, no chart
is blank, none draws more than MAX_DRAWN rows or legend entries, every page reads at a glance
(tests/integration/_glance.py: no legend over a plot, no raw number in a table or on an axis),
and the straggler is named on Stragglers and Overview."""

from __future__ import annotations

import re

import pytest

from collector.testing.dashboard import DashboardProcess, browser_tab, drawn_charts
from collector.tools import simulate
from tests.integration import _glance
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS

RANKS, STEPS, LATE = 1024, 20, 517
MAX_DRAWN = 300
PAGES = {  # url path -> text on the page once it has rendered
    "overview": f"rank {LATE} costs",
    "comms": "Summary (deepspeed.comm.log_summary)",
    "stragglers": f"rank {LATE} arrives last",
    "memory": "per rank",
    "liveness": "Wavefront",
}

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("scale-data")
    sim = simulate.Simulation(
        ranks=RANKS, steps=STEPS, hosts=64, stragglers=(simulate.Straggler(LATE, 40_000_000),), name="scale"
    )
    simulate.write_data_dir(sim, data_dir)
    dashboard = DashboardProcess(data_dir)
    yield dashboard.url, sim.run_id
    dashboard.stop(timeout=10)


@pytest.fixture(scope="module")
def tab(run):
    with browser_tab() as page:
        yield page


def open_page(tab, run, path: str) -> list[dict]:
    url, run_id = run
    tab.goto(f"{url}/{path}?run={run_id}")
    tab.get_by_text(PAGES[path], exact=False).first.wait_for(timeout=90_000)
    tab.locator(".js-plotly-plot").first.wait_for(timeout=90_000)
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000)
    assert tab.locator("[data-testid='stException']").count() == 0
    return drawn_charts(tab)


@pytest.mark.parametrize("path", list(PAGES))
def test_every_chart_draws_a_readable_number_of_rows(tab, run, path):
    charts = open_page(tab, run, path)
    assert charts, f"{path}: no chart"
    for chart in charts:
        assert not chart["blank"], f"{path}: blank chart {chart['title']!r}"
        assert chart["rows"] <= MAX_DRAWN, f"{path}: {chart['title']!r} draws {chart['rows']} rows"
        assert chart["legend"] <= MAX_DRAWN, f"{path}: {chart['title']!r} has {chart['legend']} legend entries"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"scale-{path}.png"), full_page=True)
    assert not (found := _glance.problems(tab)), "\n".join(found)


def test_stragglers_bins_the_ranks_and_opens_the_straggler_s_host(tab, run):
    charts = open_page(tab, run, "stragglers")
    heatmaps = [c for c in charts if "max per bin" in c["title"]]
    assert heatmaps and all(c["rows"] == 64 for c in heatmaps)  # one row per host
    # the worst bin is open by default: the straggler's host, a row per rank
    opened = [c for c in charts if "arrival delay per rank" in c["title"]]
    assert opened and "node-0032 (ranks 512–527)" in opened[0]["title"] and opened[0]["rows"] == 16
    # late to each step's first collective (the first of its three reduce_scatters): a third of them
    assert tab.get_by_text(re.compile(rf"rank {LATE} arrives last in 3\d% of reduce_scatter")).count() >= 1


def test_clicking_a_bin_s_cell_opens_that_bin(tab, run):
    open_page(tab, run, "stragglers")
    heatmap = tab.locator(".js-plotly-plot").filter(has_text="max per bin").first
    # the bottom row (autorange reversed: the least late bin), a cell mid-run
    ticks = heatmap.locator(".ytick text")
    bottom = max((ticks.nth(i) for i in range(ticks.count())), key=lambda t: t.bounding_box()["y"])
    label = bottom.text_content()
    cells = heatmap.locator(".scatterlayer .point")
    assert cells.count() == 64 * STEPS  # one click marker per cell at this size
    # every cell's box in one round trip (1,280 bounding_box() calls took ~40 s)
    boxes = cells.evaluate_all("els => els.map(e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y}; })")
    row_y = max(b["y"] for b in boxes)
    target = sorted((i for i, b in enumerate(boxes) if abs(b["y"] - row_y) < 1), key=lambda i: boxes[i]["x"])
    cells.nth(target[len(target) // 2]).click(force=True)  # plotly's drag layer takes the click
    tab.get_by_text(f"{label}: arrival delay per rank").first.wait_for(timeout=60_000)
    opened = [c for c in drawn_charts(tab) if "arrival delay per rank" in c["title"]]
    assert opened and label in opened[0]["title"] and "node-0032" not in label
