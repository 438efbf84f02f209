"""#29 "every chart says what it shows", in a real headless Chromium over (a copy of) the shipped
sample_runs/: axes fit their data (bytes in the unit that fits, loss scale on exact powers of
two), no series drawn twice, every row of a binned heatmap labelled (the worst ones always),
the SQL console lists the catalog's views and reads the picked run, the tables say what they
mean (Liveness' "behind", the Runs page's ticked row), and no request leaves the machine."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest

from collector.data import catalog
from collector.data import queries as q
from collector.testing.dashboard import browser_tab
from tests.integration import _glance
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS, serve_dashboard

SAMPLE_RUNS = Path(__file__).resolve().parents[2] / "sample_runs"
WAIT_MS = 90_000  # generous: the machine is shared

pytestmark = [
    *NEEDS_CHROMIUM,
    pytest.mark.skipif(not (SAMPLE_RUNS / "catalog.duckdb").exists(), reason="sample_runs/ not generated"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(data dir, {name: run_id}) over a copy of the sample runs."""
    data_dir = tmp_path_factory.mktemp("chart-labels") / "sample_runs"
    shutil.copytree(SAMPLE_RUNS, data_dir)
    con = catalog.connect(data_dir)
    try:
        rows = con.execute("SELECT name, run_id FROM runs").fetchall()
    finally:
        con.close()
    return data_dir, dict(rows)


@pytest.fixture(scope="module")
def dashboard(runs):
    yield from serve_dashboard(runs[0])


@pytest.fixture(scope="module")
def browser():
    """(tab, every URL it requested)."""
    requested: list[str] = []
    with browser_tab(height=1400) as page:
        page.on("request", lambda r: requested.append(r.url))
        yield page, requested


@pytest.fixture
def tab(browser):
    return browser[0]


def _settled(tab) -> None:
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=WAIT_MS)
    assert tab.locator("[data-testid='stException']").count() == 0


def open_page(tab, url: str, path: str, run_id: str, wait_for: str = ".js-plotly-plot") -> None:
    tab.goto(f"{url}/{path}?run={run_id}")
    # a dataframe's accessible grid is hidden (the canvas draws it): attached is what it gets to
    tab.locator(wait_for).first.wait_for(timeout=WAIT_MS, state="attached")
    _settled(tab)


_CHARTS_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
    const L = g._fullLayout;
    return {
        title: (L.title.text || '').replace(/<[^>]+>/g, ''),
        y_title: ((L.yaxis && L.yaxis.title.text) || '').replace(/<[^>]+>/g, ''),
        x_title: ((L.xaxis && L.xaxis.title.text) || '').replace(/<[^>]+>/g, ''),
        y_type: L.yaxis && L.yaxis.type,
        y_range: L.yaxis && L.yaxis.range,
        y_ticks: Array.from(g.querySelectorAll('.ytick text')).map(t => t.textContent),
        traces: g._fullData.map(t => ({
            type: t.type, name: t.name || '',
            y: Array.from(t.y || []).map(v => (typeof v === 'number' ? v : String(v))),
            z: t.z ? Array.from(t.z).map(row => Array.from(row)) : null,
            x: Array.from(t.x || []).map(String),
        })),
    };
})
"""


def charts(tab) -> list[dict]:
    return tab.evaluate(_CHARTS_JS)


def table(tab, index: int = 0) -> list[dict]:
    """The index-th st.dataframe's visible rows, read from its accessible grid."""
    return tab.evaluate(
        """i => {
        const t = document.querySelectorAll('[data-testid=stDataFrame] table')[i];
        const head = Array.from(t.querySelectorAll('th')).map(h => h.textContent);
        return Array.from(t.querySelectorAll('tr')).filter(r => r.querySelector('td')).map(r => {
            const cells = Array.from(r.querySelectorAll('td')).map(c => c.textContent);
            return Object.assign({_selected: r.getAttribute('aria-selected')},
                                 Object.fromEntries(head.map((h, j) => [h, cells[j]])));
        });
    }""",
        index,
    )


def _shot(tab, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_memory_axes_fit_their_bytes(tab, dashboard, runs):
    """Item 5: params/grads/optimizer (110-441 KB) drew as flat lines at 0 on a -1..1 GiB axis."""
    open_page(tab, dashboard, "memory", runs[1]["zero3-fp16-overflows"])
    drawn = {c["title"].split(" per rank")[0]: c for c in charts(tab)}
    assert {"params", "grads", "optimizer", "rss"} <= set(drawn), list(drawn)
    for kind in ("params", "grads", "optimizer"):
        chart = drawn[kind]
        assert chart["y_title"] == "KiB", chart["y_title"]
        values = [v for t in chart["traces"] for v in t["y"]]
        low, high = chart["y_range"]
        assert low == 0 and max(values) <= high <= 1.5 * max(values), (kind, chart["y_range"], max(values))
        assert min(values) > 0.1 * high, f"{kind}: a line hugs the bottom of its axis"
    assert drawn["rss"]["y_title"] == "MiB"
    _shot(tab, "chart-labels-memory")


def test_overview_draws_each_series_once_on_an_axis_of_its_own_scale(tab, dashboard, runs):
    """Item 6: loss_scale (16.7 M) shared a linear axis with samples/s; samples/s was drawn twice;
    the loss-scale ticks read 16,777,220 and 8,388,610."""
    open_page(tab, dashboard, "overview", runs[1]["zero3-fp16-overflows"])
    tab.locator("text.gtitle", has_text="Samples per second").first.wait_for(timeout=WAIT_MS)
    drawn = charts(tab)
    titles = [c["title"] for c in drawn]
    assert titles.count("Samples per second") == 1
    for tag in ("samples_per_sec", "loss_scale"):  # the dedicated charts draw them, nothing else
        assert not [c for c in drawn if any(tag in t["name"] for t in c["traces"]) or tag in c["title"]], titles
    for chart in drawn:
        if chart["y_type"] != "linear":
            continue
        peaks = [max(abs(v) for v in t["y"]) for t in chart["traces"] if t["y"] and t["type"] == "scatter"]
        if len(peaks) > 1 and min(peaks) > 0:
            assert max(peaks) / min(peaks) < 1e4, f"{chart['title']}: one series flattens another {peaks}"
    (scale,) = [c for c in drawn if c["title"].startswith("Loss scale")]
    assert scale["y_type"] == "log"
    ticks = [t for t in scale["y_ticks"] if t.strip()]
    assert ticks and all(re.fullmatch(r"2\^\d+", t) for t in ticks), ticks
    assert "2^24" in ticks
    _shot(tab, "chart-labels-overview-fp16")


def test_every_binned_heatmap_row_is_labelled_the_worst_row_included(tab, dashboard, runs):
    """Item 7: on simulated-256-ranks plotly labelled every other host row, not node-0014 (rank
    117, the worst), and node-0030's label sat beside the yellow band."""
    open_page(tab, dashboard, "stragglers", runs[1]["simulated-256-ranks"])
    tab.locator("text.gtitle", has_text="max per bin").first.wait_for(timeout=WAIT_MS)
    binned = [c for c in charts(tab) if "max per bin" in c["title"]]
    assert len(binned) == 2
    for chart in binned:
        heat = next(t for t in chart["traces"] if t["type"] == "heatmap")
        rows = heat["y"]
        assert len(rows) > 16
        assert chart["y_ticks"] == rows, (chart["title"], chart["y_ticks"][:5], rows[:5])
        peaks = [max((v for v in row if v is not None), default=float("-inf")) for row in heat["z"]]
        worst = rows[peaks.index(max(peaks))]
        assert worst in chart["y_ticks"]
    arrival = binned[0]
    heat = next(t for t in arrival["traces"] if t["type"] == "heatmap")
    assert heat["y"][0].startswith("node-0014"), heat["y"][:3]  # worst first: the host of rank 117
    _shot(tab, "chart-labels-stragglers-256")


def _pick(tab, label: str, option: str) -> None:
    tab.get_by_label(label).first.click()
    tab.get_by_role("option", name=option).first.click()


def test_sql_console_lists_the_catalogs_views_and_reads_the_picked_run(tab, dashboard, runs):
    """Item 8: the hint listed 11 views; the examples ignored the sidebar's run; the default chart
    was a line over run_id."""
    data_dir, by_name = runs
    run_id = by_name["zero2-slow-rank3"]
    views = sorted(v for v in q.console_query(str(data_dir), "SHOW TABLES", 10_000).iloc[:, 0] if v[0] != "_")
    open_page(tab, dashboard, "sql", run_id, wait_for="textarea")
    hint = tab.get_by_text("Views:", exact=False).first.inner_text()
    listed = re.search(r"Views: (.*?) \(columns", hint).group(1).split(", ")
    assert listed == views and {"hangs", "desyncs", "step_analysis", "wavefront"} <= set(listed)
    assert run_id in tab.locator("textarea").first.input_value()  # the default example reads it
    tab.get_by_role("button", name="Run").click()
    tab.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_MS)
    _settled(tab)
    (chart,) = charts(tab)
    assert chart["x_title"] not in ("run_id", "") and chart["x_title"] == "rank", chart
    assert {t["type"] for t in chart["traces"]} == {"bar"}
    _shot(tab, "chart-labels-sql")
    _pick(tab, "Examples", "Who arrives last")
    tab.wait_for_function(
        "run => document.querySelector('textarea').value.includes(run) && "
        "document.querySelector('textarea').value.includes('stragglers')",
        arg=run_id,
        timeout=WAIT_MS,
    )


def test_liveness_behind_is_zero_for_the_waiting_ranks_and_one_for_the_missing_rank(tab, dashboard, runs):
    """Item 9: "behind" read 1 for every rank of zero2-hang-rank2, the missing rank 2 included."""
    open_page(tab, dashboard, "liveness", runs[1]["zero2-hang-rank2"])
    tab.locator("[data-testid=stDataFrame] table").nth(1).wait_for(timeout=WAIT_MS, state="attached")
    wave = table(tab, 1)
    assert {r["first_rank"]: r["behind"] for r in wave} == {"0": "0", "1": "0", "2": "1", "3": "0"}


def test_flops_per_rank_chart_leaves_out_containers_with_no_time_of_their_own(tab, dashboard, runs):
    """Item 9: `blocks` (a ModuleList, never called itself) had an empty bar."""
    open_page(tab, dashboard, "flops", runs[1]["zero2-slow-rank3"])
    tab.locator("text.gtitle", has_text="fwd latency per rank").first.wait_for(timeout=WAIT_MS)
    (chart,) = [c for c in charts(tab) if "fwd latency per rank" in c["title"]]
    modules = {x for t in chart["traces"] for x in t["x"]}
    assert "blocks" not in modules and {"lm_head", "ln_f", "wte", "wpe"} <= modules
    assert all(v > 0 for t in chart["traces"] for v in t["y"])


def test_runs_page_ticks_the_picked_run_and_collapses_its_config(tab, dashboard, runs):
    """Item 9: the picked run's row was not ticked; its config JSON was fully expanded."""
    run_id = runs[1]["zero2-slow-rank3"]
    open_page(tab, dashboard, "", run_id, wait_for="[data-testid=stDataFrame] table")
    tab.locator("[data-testid=stJson]").first.wait_for(timeout=WAIT_MS)
    ticked = [r["run_id"] for r in table(tab, 0) if r["_selected"] == "true"]
    assert ticked == [run_id]
    assert tab.get_by_text(re.compile(r"started 2026-11-24 03:53:53")).count() >= 1  # names alike tell apart
    config = tab.locator("[data-testid=stJson]").first.inner_text()
    assert "zero_optimization" in config and '"stage"' not in config and "stage" not in config, config[:400]
    _shot(tab, "chart-labels-runs")


def test_no_request_leaves_the_machine(browser, dashboard, runs):
    """Item 10: the favicon came from fonts.gstatic.com, which fails offline. Runs after the other
    tests of this module, so every page they opened counts."""
    tab, requested = browser
    open_page(tab, dashboard, "overview", runs[1]["zero2-slow-rank3"])
    icon = tab.evaluate("() => (document.querySelector(\"link[rel='shortcut icon']\") || {}).href || ''")
    assert icon.startswith("data:") or urlparse(icon).hostname in ("127.0.0.1", "localhost"), icon
    outside = {u for u in requested if urlparse(u).scheme in ("http", "https", "ws", "wss")}
    outside = {u for u in outside if urlparse(u).hostname not in ("127.0.0.1", "localhost")}
    assert not outside, sorted(outside)[:10]


# Issue 48 item 6: each page over the sample run that has its data, in this module's one browser.
GLANCE = {
    "": "zero2-slow-rank3",  # the Runs page: a table, no chart
    "overview": "zero3-fp16-overflows",
    "comms": "zero2-slow-rank3",
    "stragglers": "zero2-slow-rank3",
    "liveness": "zero2-hang-rank2",
    "memory": "zero3-fp16-overflows",
    "flops": "zero2-slow-rank3",
    "moe": "moe-skewed-expert",
}


def test_every_page_reads_at_a_glance(tab, dashboard, runs):
    """No blank chart, no legend over a plot, no raw number (7978.5628) in a table or on an axis."""
    found = []
    for page, name in GLANCE.items():
        first = ".js-plotly-plot" if page else "[data-testid=stDataFrame]"
        open_page(tab, dashboard, page, runs[1][name], wait_for=first)
        found += _glance.problems(tab, f"{page or 'runs'} ({name}): ")  # waits for the tables too
        _shot(tab, f"glance-{page or 'runs'}")
    assert not found, "\n".join(found)


def test_who_arrives_last_leaves_out_the_start_up_broadcasts(tab, dashboard, runs):
    """Issue 48: Stragglers said 'rank 3 arrives last in 71% of broadcasts', all of them the
    parameter broadcasts of the warm-up step; it counts the training steps now."""
    open_page(tab, dashboard, "stragglers", runs[1]["zero2-slow-rank3"])
    sentences = tab.locator("[data-testid=stMarkdownContainer] strong").all_inner_texts()
    assert "reduce_scatter_tensor" in sentences and "broadcast" not in sentences, sentences
    bars = [c for c in charts(tab) if c["title"].startswith("Ranks arriving last")]
    assert bars and "broadcast" not in {t["name"] for t in bars[0]["traces"]}
