"""End to end, as `make demo` runs it: a real collector process, the dashboard, and a
real 4-rank gloo training run of the bundled engine (rank 3 made slow) streaming into
them; then every page in headless Chromium. The straggler page must name rank 3 and
the comms summary must list every op the run issued. Screenshots go to
test-artifacts/screenshots/e2e-<page>.png."""

from __future__ import annotations

import os
import subprocess

import pytest

from collector.data.catalog import connect
from collector.testing.dashboard import DashboardProcess, browser_tab
from collector.tools.launch import CollectorProcess, torchrun_command
from tests.integration._browser import NEEDS_CHROMIUM, SCREENSHOTS

RUN_NAME, SLOW_RANK, WORLD, STEPS = "e2e-slow-rank", 3, 4, 8
PAGES = {  # url path -> text that is there once the page has rendered
    "": "train_micro_batch_size_per_gpu",  # the selected run's config, drawn after the runs table
    "overview": "Health",
    "comms": "Summary (deepspeed.comm.log_summary)",
    "stragglers": f"rank {SLOW_RANK} arrives last",
    "flops": "Detailed profile",
    "memory": "params per rank",
    "moe": "No MoE records in this run",
    "sql": "SQL console",
}
CHART_PAGES = {"overview", "comms", "stragglers", "flops", "memory"}

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory):
    """Collector + dashboard up first, then the training run streams into them."""
    data_dir = tmp_path_factory.mktemp("e2e-data")
    with CollectorProcess(data_dir) as collector, DashboardProcess(data_dir) as dashboard:
        env = dict(os.environ, RANKSCOPE_ENDPOINT=collector.address, RANKSCOPE_RUN=RUN_NAME, OMP_NUM_THREADS="1")
        train = subprocess.run(
            torchrun_command(
                WORLD,
                "-m",
                "trainer.examples.scenarios",
                "--scenario",
                "zero2-slow-rank3",
                "--steps",
                str(STEPS),
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=420,
        )
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        con = connect(data_dir)
        run_id, status = con.execute("SELECT run_id, status FROM runs WHERE name = ?", [RUN_NAME]).fetchone()
        ops = {op for (op,) in con.execute("SELECT DISTINCT op FROM comm WHERE run_id = ?", [run_id]).fetchall()}
        con.close()
        assert status == "finished" and ops
        yield dashboard.url, run_id, ops


@pytest.fixture(scope="module")
def tab(live_stack):
    with browser_tab() as page:
        yield page


def open_page(tab, base: str, run_id: str, path: str) -> None:
    tab.goto(f"{base}/{path}?run={run_id}")
    try:
        tab.get_by_text(PAGES[path], exact=False).first.wait_for(timeout=60_000)
    except Exception:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(SCREENSHOTS / f"e2e-FAILED-{path or 'runs'}.png"), full_page=True)
        raise
    if path in CHART_PAGES:
        tab.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
    tab.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=60_000)


@pytest.mark.parametrize("path", list(PAGES))
def test_every_page_renders_the_live_run(tab, live_stack, path):
    base, run_id, _ = live_stack
    open_page(tab, base, run_id, path)
    assert tab.locator("[data-testid='stException']").count() == 0
    if path in CHART_PAGES:
        assert tab.locator(".js-plotly-plot").count() >= 1
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"e2e-{path or 'runs'}.png"), full_page=True)


def test_straggler_page_names_the_slow_rank(tab, live_stack):
    base, run_id, _ = live_stack
    open_page(tab, base, run_id, "stragglers")
    assert tab.get_by_text(f"rank {SLOW_RANK} arrives last").count() >= 1
    assert tab.locator(".js-plotly-plot").count() >= 2  # last-rank bars and the delay heatmap


def test_comms_summary_lists_every_op_the_run_issued(tab, live_stack):
    base, run_id, ops = live_stack
    open_page(tab, base, run_id, "comms")
    summary = tab.locator("[data-testid='stTable']").first
    summary.wait_for()
    text = summary.inner_text()
    for op in ops:
        assert op in text, f"{op} missing from the comms summary"
