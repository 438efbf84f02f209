"""The first minute in a real headless Chromium: `rankscope dashboard` on (a copy of) the shipped
sample_runs/, opened as a newcomer opens it, with no run in the URL (the default run, the
newest). Every data page draws a chart with data in it; the toolbar has no "Deploy"; the
Overview's monitor charts say on their x axis what they plot; and a page whose run lacks its
data names the runs that have it, one click away."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.data import catalog
from collector.testing.dashboard import browser_tab, drawn_charts
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS, serve_dashboard

SAMPLE_RUNS = Path(__file__).resolve().parents[2] / "sample_runs"
CHART_PAGES = ["overview", "comms", "stragglers", "liveness", "flops", "memory", "moe"]
WAIT_MS = 90_000  # generous: the machine is shared

pytestmark = [
    *NEEDS_CHROMIUM,
    pytest.mark.skipif(not (SAMPLE_RUNS / "catalog.duckdb").exists(), reason="sample_runs/ not generated"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[str, int]]:
    """The copied sample runs, newest first: {name: (run_id, steps recorded)}."""
    data_dir = tmp_path_factory.mktemp("first-minute") / "sample_runs"
    shutil.copytree(SAMPLE_RUNS, data_dir)
    con = catalog.connect(data_dir)
    try:
        rows = con.execute(
            """SELECT r.name, r.run_id, (SELECT max(step) FROM monitor m WHERE m.run_id = r.run_id)
               FROM runs r ORDER BY r.started_at DESC"""
        ).fetchall()
    finally:
        con.close()
    return data_dir, {name: (run_id, steps) for name, run_id, steps in rows}


@pytest.fixture(scope="module")
def dashboard(runs):
    data_dir, _ = runs
    yield from serve_dashboard(data_dir)


@pytest.fixture(scope="module")
def tab(dashboard):
    with browser_tab() as page:
        yield page


def _settled(tab) -> None:
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    assert tab.locator("[data-testid='stException']").count() == 0


def open_default(tab, url: str, path: str) -> list[dict]:
    tab.goto(f"{url}/{path}")
    tab.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
    _settled(tab)
    return drawn_charts(tab)


def test_the_default_run_is_the_newest(tab, dashboard, runs):
    _, by_name = runs
    newest = next(iter(by_name))
    tab.goto(f"{dashboard}/overview")
    tab.get_by_text(f"{newest} ({by_name[newest][0]}", exact=False).first.wait_for(timeout=WAIT_MS)


@pytest.mark.parametrize("path", CHART_PAGES)
def test_every_page_draws_a_chart_with_data_for_the_default_run(tab, dashboard, path):
    charts = open_default(tab, dashboard, path)
    assert [c for c in charts if not c["blank"]], f"{path}: no chart with data: {charts}"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"sample-runs-{path}.png"), full_page=True)


def test_the_toolbar_has_no_deploy_button(tab, dashboard):
    open_default(tab, dashboard, "overview")
    assert tab.locator("[data-testid='stAppDeployButton']").count() == 0
    toolbar = tab.locator("[data-testid='stToolbar']")
    assert toolbar.count() == 0 or "Deploy" not in toolbar.first.inner_text()
    assert tab.get_by_text("Deploy", exact=True).count() == 0


_AXES_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => ({
    title: (g._fullLayout.title.text || '').replace(/<[^>]+>/g, ''),
    x_title: ((g._fullLayout.xaxis && g._fullLayout.xaxis.title.text) || '').replace(/<[^>]+>/g, ''),
    x_max: Math.max(...g._fullData.flatMap(t => Array.from(t.x || []).map(Number))),
}))
"""


@pytest.mark.parametrize("name", ["moe-skewed-expert", "zero2-slow-rank3"])
def test_the_monitor_charts_label_their_x_axis_with_what_they_plot(tab, dashboard, runs, name):
    """Engine runs carry both the step and DeepSpeed's sample count; the charts plot steps, so
    the axis says "step" and its values stop at the run's last step (the sample count of a
    30-step run of 32-sample batches would reach 960)."""
    _, by_name = runs
    run_id, steps = by_name[name]
    tab.goto(f"{dashboard}/overview?run={run_id}")
    tab.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
    _settled(tab)
    monitor = [c for c in tab.evaluate(_AXES_JS) if c["title"] in ("Loss", "Learning rate")]
    assert len(monitor) == 2, tab.evaluate(_AXES_JS)
    for chart in monitor:
        assert chart["x_title"] == "step", chart
        assert 0 < chart["x_max"] <= steps, (chart, steps)


@pytest.mark.parametrize(
    ("path", "lacking", "having", "shows"),
    [
        ("moe", "zero2-slow-rank3", "moe-skewed-expert", "Expert load"),
        ("liveness", "moe-skewed-expert", "zero2-hang-rank2", "waiting for rank 2"),
        ("overview", "moe-skewed-expert", "zero3-fp16-overflows", "Loss scale"),
    ],
)
def test_a_page_whose_run_lacks_its_data_switches_to_one_that_has_it(
    tab, dashboard, runs, path, lacking, having, shows
):
    _, by_name = runs
    tab.goto(f"{dashboard}/{path}?run={by_name[lacking][0]}")
    button = tab.get_by_role("button", name=f"{having} ({by_name[having][0]}", exact=False)
    button.first.wait_for(timeout=WAIT_MS)
    _settled(tab)
    button.first.click()
    tab.wait_for_function(
        "run => new URLSearchParams(location.search).getAll('run').includes(run)",
        arg=by_name[having][0],
        timeout=WAIT_MS,
    )
    tab.get_by_text(shows, exact=False).first.wait_for(timeout=WAIT_MS)
    _settled(tab)
