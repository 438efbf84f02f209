"""The live dashboard beside a training run: its CPU per refresh and its freshness, against a
baseline commit's dashboard in the same run.

    python -m benches.live_refresh [--baseline 23a6b92] [--seconds 30] [--pages overview,stragglers]

One collector (this tree) on a free port with a fresh data dir and spool dir; a 4-rank run of the
example GPT (the training `rankscope demo` runs, without its staged fault) trains into it on the
same cores for the whole benchmark. Then, per page, a fresh dashboard of each code version (the
baseline exported with `git archive`, and this tree; the order alternates page by page, ABBA,
since the run grows meanwhile) opens the run in headless Chromium, and over ``--seconds`` after its
first chart is drawn:

- CPU per refresh: the dashboard process's user+sys CPU divided by the refresh periods (1 s,
  both versions) in the window; Chromium's likewise (every Chromium process of this benchmark);
- freshness: for each step, the time from the collector acknowledging it (an ack means the segment
  holding it is committed, so: the first committed segment of the page's table whose max step
  reaches it, seen by polling the run's partition every 20 ms) to the page's chart first drawing
  it (the chart's largest x, polled in the page every 50 ms); p50, p95 and max over the steps
  acked in the window;
- redraw gap: the longest time between two successive changes of that chart in the window.

Writes (replaces) its section of benches/RESULTS-live.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq

from benches._common import baseline_tree, code_version, cpu_seconds
from benches._sections import replace_section
from collector.data import layout
from collector.testing.dashboard import launch_chromium
from collector.testing.ports import answers_ok
from collector.tools.launch import CollectorProcess, free_port, torchrun_command

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASELINE = "23a6b92"  # the last commit before per-chart fragments: one fragment per page, redrawn whole
RUN_NAME, WORLD = "bench-live", 4
REFRESH_S = 1.0  # both versions' refresh period
# page -> (the table its chart reads, text in the chart's title)
PAGES = {
    "overview": ("monitor", "Loss"),
    "stragglers": ("comm", "Arrival delay"),
    "comms": ("comm", "Bandwidth per step"),
}

_RECORDER_JS = """
title => {
    window.__draws = [];
    let last = null;
    setInterval(() => {
        let best = null;
        for (const g of document.querySelectorAll('.js-plotly-plot')) {
            const t = (g.layout && g.layout.title && g.layout.title.text) || '';
            if (!t.includes(title)) continue;
            for (const trace of (g._fullData || [])) {
                for (const x of Array.from(trace.x || [])) {
                    const v = Number(x);
                    if (Number.isFinite(v) && (best === null || v > best)) best = v;
                }
            }
        }
        if (best !== null && best !== last) { last = best; window.__draws.push([Date.now() / 1000, best]); }
    }, 50);
}
"""


class AckWatcher:
    """The first moment a committed segment of ``table`` holding each step appeared."""

    def __init__(self, data_dir: Path, table: str, run_id: str) -> None:
        self.part = layout.partition_dir(data_dir, table, run_id)
        self.seen: set[str] = set()
        self.acked: dict[int, float] = {}
        self.top = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            now = time.time()
            try:
                names = [n for n in os.listdir(self.part) if n.endswith(layout.SEGMENT_SUFFIX) and n[0] != "."]
            except FileNotFoundError:
                continue
            for name in names:
                if name in self.seen:
                    continue
                self.seen.add(name)
                try:
                    steps = pq.read_table(self.part / name, columns=["step"])["step"].to_numpy()
                except (OSError, ValueError):
                    continue  # deleted by compaction meanwhile
                if len(steps) and int(steps.max()) > self.top:
                    for s in range(self.top + 1, int(steps.max()) + 1):
                        self.acked[s] = now
                    self.top = int(steps.max())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def start_dashboard(tree: Path, data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "app", "--data-dir", str(data_dir), "--port", str(port), "--host", "127.0.0.1"]
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while not answers_ok(f"{url}/_stcore/health"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard of {tree} did not start")
        time.sleep(0.3)
    return proc, url


def chromium_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name().lower():
                t = child.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(tree: Path, data_dir: Path, run_id: str, page: str, seconds: float, playwright) -> dict:
    table, title = PAGES[page]
    proc, url = start_dashboard(tree, data_dir)
    browser = launch_chromium(playwright)
    try:
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        t0 = time.perf_counter()
        tab.goto(f"{url}/{page}?run={run_id}")
        tab.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
        first_chart_s = time.perf_counter() - t0
        tab.evaluate(_RECORDER_JS, title)
        time.sleep(3)  # the page's remaining charts and first refreshes
        acks = AckWatcher(data_dir, table, run_id)
        time.sleep(1)  # segments already there when the watcher started are not acks in the window
        start, cpu0, chrome0, load0 = time.time(), cpu_seconds(proc.pid), chromium_cpu(), os.getloadavg()[0]
        time.sleep(seconds)
        end, cpu1, chrome1 = time.time(), cpu_seconds(proc.pid), chromium_cpu()
        time.sleep(5)  # steps acked near the end get their chance to be drawn
        acks.stop()
        draws = tab.evaluate("window.__draws")
    finally:
        browser.close()
        proc.terminate()
        proc.wait(30)
    fresh = []
    for step, acked in acks.acked.items():
        if not start + 1 <= acked <= end:
            continue
        drawn = next((t for t, top in draws if top >= step and t >= acked - 0.05), None)
        if drawn is not None:
            fresh.append(drawn - acked)
    in_window = [t for t, _ in draws if start <= t <= end]
    gaps = np.diff([start, *in_window, end])
    periods = (end - start) / REFRESH_S
    return {
        "first_chart_s": first_chart_s,
        "cpu_ms": 1e3 * (cpu1 - cpu0) / periods,
        "chrome_ms": 1e3 * (chrome1 - chrome0) / periods,
        "steps": len(fresh),
        "acked": sum(1 for a in acks.acked.values() if start + 1 <= a <= end),
        "p50": float(np.percentile(fresh, 50)) if fresh else float("nan"),
        "p95": float(np.percentile(fresh, 95)) if fresh else float("nan"),
        "max": max(fresh) if fresh else float("nan"),
        "draws": len(in_window),
        "gap": float(gaps.max()),
        "load": (load0, os.getloadavg()[0]),
        "run_step": acks.top,
    }


def run_id_of(data_dir: Path, timeout_s: float = 300) -> str:
    from collector.data import catalog

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            con = catalog.connect(data_dir)
            try:
                row = con.execute("SELECT run_id FROM runs WHERE name = ?", [RUN_NAME]).fetchone()
            finally:
                con.close()
            if row:
                return row[0]
        except Exception:  # the catalog before the first segment
            pass
        time.sleep(1)
    raise TimeoutError("the training run never showed up in the catalog")


NOTES = """
### Reading these numbers

- On a 2-core machine shared with other jobs at nice 19 the dashboard gets what CPU is left: a
  version that needs more than it gets refreshes less often, so its CPU per refresh period is
  capped by its share and says little; CPU per redraw (work per update delivered) and freshness
  are what to compare. Rows of one page ran back to back, the run growing meanwhile.
- Baseline: one fragment per page, re-rendered whole every second: the runs table read, every
  query of the page run again, the Overview's findings worked out again, every chart rebuilt
  with plotly express and the whole comm rollup of the run rebuilt, whenever a segment landed
  (about every second while it trains). This tree: charts rebuilt only when their tables moved,
  from graph objects; the rollup grown by its new steps; findings in words at most every 5 s;
  the banner every 2 s; the run's status read when its data moved.
"""


HEADER = (
    "| page | code | dashboard CPU per refresh (ms) | dashboard CPU per redraw (ms) | Chromium CPU per refresh (ms) "
    "| freshness p50 (s) | p95 (s) | max (s) | steps drawn/acked | redraws | longest gap (s) | first chart (s) "
    "| load | run's step |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", default=BASELINE, help=f"the commit to compare with (default {BASELINE})")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds per page and version")
    p.add_argument("--pages", default=",".join(PAGES), help=f"pages to measure (default: {','.join(PAGES)})")
    p.add_argument("--out", default=str(HERE / "RESULTS-live.md"))
    args = p.parse_args()
    pages = args.pages.split(",")
    unknown = sorted(set(pages) - set(PAGES))
    if unknown:
        raise SystemExit(f"unknown page(s) {', '.join(unknown)}; known: {', '.join(PAGES)}")

    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="rankscope-bench-live-"))
    old = baseline_tree(REPO, args.baseline, work / "baseline")
    trees = {f"baseline {args.baseline}": old, f"this tree ({code_version(REPO)})": REPO}
    data_dir = work / "data"
    results, started = [], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with CollectorProcess(data_dir) as collector:
        env = dict(
            os.environ,
            RANKSCOPE_ENDPOINT=collector.address,
            RANKSCOPE_RUN=RUN_NAME,
            RANKSCOPE_SPOOL_DIR=str(work / "spool"),
            OMP_NUM_THREADS="1",
        )
        train = subprocess.Popen(
            torchrun_command(WORLD, "-m", "trainer.examples.gpt", "--config", "zero2.json", "--steps", "1000000"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            run_id = run_id_of(data_dir)
            time.sleep(10)  # past the start-up (compile, first profiled step)
            with sync_playwright() as playwright:
                for i, page in enumerate(pages):
                    order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
                    for label, tree in order:
                        r = measure(tree, data_dir, run_id, page, args.seconds, playwright)
                        results.append((page, label, r))
                        print(
                            f"{page:11s} {label:40s} cpu/refresh {r['cpu_ms']:6.0f} ms"
                            f"  chromium {r['chrome_ms']:5.0f} ms"
                            f"  freshness p50 {r['p50']:.2f} s p95 {r['p95']:.2f} s max {r['max']:.2f} s"
                            f"  ({r['steps']}/{r['acked']} steps)  {r['draws']} redraws, longest gap {r['gap']:.2f} s"
                            f"  load {r['load'][0]:.1f}->{r['load'][1]:.1f}  step {r['run_step']}",
                            flush=True,
                        )
        finally:
            os.killpg(train.pid, signal.SIGINT)
            try:
                train.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(train.pid, signal.SIGKILL)
                train.wait()

    shutil.rmtree(work, ignore_errors=True)  # the baseline tree, the run's data and spool
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    rows = "\n".join(
        f"| {page} | {label} | {r['cpu_ms']:.0f} | {r['cpu_ms'] * args.seconds / REFRESH_S / max(r['draws'], 1):.0f} "
        f"| {r['chrome_ms']:.0f} | {r['p50']:.2f} | {r['p95']:.2f} | "
        f"{r['max']:.2f} | {r['steps']}/{r['acked']} | {r['draws']} | {r['gap']:.2f} | {r['first_chart_s']:.1f} | "
        f"{r['load'][0]:.1f} → {r['load'][1]:.1f} | {r['run_step']} |"
        for page, label, r in results
    )
    text = f"""# Live refresh: the dashboard's CPU and freshness while a run trains beside it

Measured {started} on a {os.cpu_count()}-core VM ({cpu}),
{platform.python_implementation()} {platform.python_version()}, with a 4-rank CPU run of the example GPT
(ZeRO-2) training on the same cores throughout, and other jobs on the machine (1-minute load averages per row).
Command: `python -m benches.live_refresh --baseline {args.baseline} --seconds {args.seconds:g} --pages {args.pages}`

Per page, a fresh dashboard of each version opened in headless Chromium (order alternating page by page, as the
run grows). CPU per refresh: the dashboard process's CPU (user+sys) over the {args.seconds:g} s window divided by
its 1-s refresh periods; Chromium's likewise. Freshness: per step acked in the window, from the collector's ack
(the committed segment holding it appearing in the data dir) to the page's chart first drawing it. Longest gap:
between two successive redraws of that chart with new data. CPU per redraw: the dashboard's CPU in the window
divided by the chart's redraws in it.

{HEADER}
{rows}
"""
    replace_section(Path(args.out), text + NOTES)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
