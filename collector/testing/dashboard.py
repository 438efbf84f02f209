"""The dashboard as users run it (``rankscope dashboard``: Streamlit in a child process)
and the headless Chromium that browser tests and the dashboard benchmark drive it with.

    with DashboardProcess(data_dir) as dashboard:     # returns once /_stcore/health answers
        with sync_playwright() as p:
            tab = launch_chromium(p).new_page()
            tab.goto(f"{dashboard.url}/stragglers?run={run_id}")

Streamlit's output goes to a temporary file rather than a pipe nobody reads (a full
pipe would stall the dashboard mid-test); when it exits before answering, the error
carries the end of that output. Playwright is the caller's import: ``launch_chromium``
needs only the object ``sync_playwright()`` yields.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time

from collector.testing.ports import ChildServer, answers_ok
from collector.tools.launch import dashboard_command, free_port

CHROMIUM = "/usr/bin/chromium"  # Debian's build; Playwright's bundled browsers are not installed


def chromium_installed() -> bool:
    return os.path.exists(CHROMIUM)


class DashboardProcess(ChildServer):
    """`rankscope dashboard --data-dir D --port P` in a session of its own, started and waited for.

    ``port`` None picks a free one. Raises RuntimeError (with Streamlit's output) if the
    dashboard exits before answering, TimeoutError if it never answers."""

    def __init__(self, data_dir, port: int | None = None, timeout_s: float = 60.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile(mode="w+b")
        self.proc = subprocess.Popen(
            dashboard_command(str(data_dir), port=self.port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None:
                output = self.output()
                self._log.close()
                raise RuntimeError(
                    f"the dashboard exited with {self.proc.returncode} before answering on port {self.port}: {output}"
                )
            if time.monotonic() > deadline:
                self.stop(timeout=5)
                raise TimeoutError(f"the dashboard did not answer {self.url}/_stcore/health within {timeout_s:.0f} s")
            time.sleep(0.3)

    def _answers(self) -> bool:
        return answers_ok(f"{self.url}/_stcore/health")

    def output(self, chars: int = 2000) -> str:
        """The end of what Streamlit printed so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]


def launch_chromium(playwright):
    """Headless Chromium from a ``sync_playwright()`` context."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
    )


@contextlib.contextmanager
def browser_tab(width: int = 1400, height: int = 1000):
    """One page of a headless Chromium, closed on exit: what a browser test drives."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


# What each drawn Plotly chart on a page shows: its title, the rows it draws (heatmap rows, bar
# categories, or lines), its legend entries, and whether it drew any data at all.
_DRAWN_CHARTS_JS = """
() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(g => {
    const data = g._fullData || g.data || [];
    const rows = data.map(t => {
        if (t.type === 'heatmap') return (t.y || []).length;
        if (t.type === 'bar') return new Set(Array.from(t.x || [])).size;
        return 0;
    });
    const lines = data.filter(t => t.type === 'scatter' && (t.mode || '').includes('lines')).length;
    const points = data.reduce((n, t) => n + (t.z || t.y || t.x || t.values || []).length, 0);
    return {
        title: (g.layout && g.layout.title && g.layout.title.text) || '',
        rows: Math.max(lines, ...rows, 0),
        legend: g.querySelectorAll('.legend .traces').length,
        blank: points === 0,
    };
})
"""


def drawn_charts(tab) -> list[dict]:
    """Every Plotly chart drawn on a Playwright page: {title, rows, legend, blank}."""
    return tab.evaluate(_DRAWN_CHARTS_JS)


# Records, in the page, each chart's redraws: every 50 ms a signature of what each drawn chart shows
# (points, largest x, sum of y), and the time whenever it changed. A chart is keyed by its title.
_REDRAW_RECORDER_JS = """
() => {
    window.__redraws = {};
    const last = {};
    const sig = g => {
        let points = 0, maxX = -Infinity, sumY = 0;
        for (const t of (g._fullData || [])) {
            for (const x of Array.from(t.x || [])) {
                const v = Number(x); if (Number.isFinite(v) && v > maxX) maxX = v;
            }
            for (const y of Array.from(t.y || [])) { const v = Number(y); if (Number.isFinite(v)) sumY += v; }
            for (const row of Array.from(t.z || [])) for (const z of Array.from(row || [])) {
                const v = Number(z); if (Number.isFinite(v)) sumY += v;
            }
            points += (t.z || t.y || t.x || t.values || []).length;
        }
        return `${points}|${maxX}|${sumY.toPrecision(12)}`;
    };
    setInterval(() => {
        const now = Date.now() / 1000;
        for (const g of document.querySelectorAll('.js-plotly-plot')) {
            const title = (g.layout && g.layout.title && g.layout.title.text) || '';
            const s = sig(g);
            if (last[title] !== s) {
                last[title] = s;
                (window.__redraws[title] = window.__redraws[title] || []).push(now);
            }
        }
    }, 50);
}
"""


def record_redraws(tab) -> None:
    """Start recording when each chart on the page changes (``redraws`` reads them)."""
    tab.evaluate(_REDRAW_RECORDER_JS)


def redraws(tab) -> dict[str, list[float]]:
    """Chart title -> the wall-clock times (s) its content changed since ``record_redraws``."""
    return tab.evaluate("window.__redraws || {}")
