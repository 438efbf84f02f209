"""`rankscope demo` as a person opens it: time to each page's first chart while its 4-rank run
trains on the same cores, in headless Chromium, with and without a CPU hog beside it.

    python -m benches.demo_first_chart [--rounds 1] [--hog 2] [--no-quiet]

The demo (collector, training until stopped with its staged straggler, dashboard) starts on free
ports, and beside its dashboard the same app as it was served before issue 48's early Plotly import
(``streamlit run app/main.py``: the page shell without preload.PlotlyEarly). 25 s after the
demo's dashboard answers, every chart page is opened, on each dashboard in turn, per round:

- cold: a new browser per page (nothing cached: Streamlit's bundle and its 4.7 MB Plotly chunk
  fetched and compiled again), as the first page a person opens;
- switch: one browser opens the Overview, then goes from page to page by the sidebar's links, as a
  person moves through the dashboard (the page's scripts stay loaded; a page's first chart is
  its first chart whose title the page before did not show).

Per page: the sidebar's appearance (Streamlit's frontend up and its session connected), the
arrival of the server's first chart element (its websocket frame: the server's part), the first
drawn Plotly chart (the rest is the browser's), all from navigation, and the charts still blank (no point drawn)
SETTLE_S after it. Then, with the live Overview open for CPU_WINDOW_S, the dashboard server's CPU
per script run, for the demo's dashboard and for the same app under Streamlit's defaults beside
it. With ``--hog N`` the same pass runs again beside N processes spinning a core each
(``python -c "while True: pass"``), so the report has both side by side. Target (issues 29,
48): first chart within 5 s and no blank chart, hog or not. Writes (replaces) benches/RESULTS-demo-first-chart.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from app.state import REFRESH_S
from benches._common import code_version, publish
from collector.testing.cpu_hog import cpu_hog
from collector.testing.dashboard import drawn_charts, launch_chromium
from collector.testing.ports import answers_ok
from collector.tools.launch import free_port
from tests.integration._demo import start_demo

HERE = Path(__file__).resolve().parent
PAGES = ["overview", "comms", "stragglers", "liveness", "memory", "flops"]
SHIPPED, BEFORE = "as shipped", "before early Plotly"
VISIBLE_CHART = ".js-plotly-plot >> visible=true"
TARGET_S = 5.0
SETTLE_S = 3.0  # after the first chart, how long the page gets before its charts are checked for blanks
CPU_WINDOW_S = 20.0


def _first_chart_message(payload, got: dict) -> None:
    """Note when the server's first Plotly chart element reaches the browser (a websocket frame)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    if "chart" in got or not isinstance(payload, bytes):
        return
    msg = ForwardMsg.FromString(payload)
    if msg.WhichOneof("type") == "delta" and msg.delta.WhichOneof("type") == "new_element":
        if msg.delta.new_element.WhichOneof("type") == "plotly_chart":
            got["chart"] = time.monotonic()


def _open(tab, url: str, page: str) -> dict:
    got: dict = {}
    tab.on("websocket", lambda ws: ws.on("framereceived", lambda payload: _first_chart_message(payload, got)))
    t0 = time.monotonic()
    tab.goto(f"{url}/{page}")
    tab.locator("[data-testid=stSidebar]").first.wait_for(timeout=120_000)
    sidebar = time.monotonic() - t0
    tab.locator(VISIBLE_CHART).first.wait_for(timeout=180_000)
    first = time.monotonic() - t0
    sent = got.get("chart", float("nan")) - t0
    tab.wait_for_timeout(SETTLE_S * 1000)
    blank = [re.sub("<[^>]+>", "", c["title"]) or "(untitled)" for c in drawn_charts(tab) if c["blank"]]
    return {"sidebar": sidebar, "sent": sent, "first": first, "blank": blank}


_TITLES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(
    g => (g.layout && g.layout.title && g.layout.title.text) || '')"""
_NEW_CHART_JS = """(before) => Array.from(document.querySelectorAll('.js-plotly-plot')).some(g =>
    g.offsetParent !== null && !before.includes((g.layout && g.layout.title && g.layout.title.text) || ''))"""


def _switch(tab, page: str) -> dict:
    """Go to ``page`` by the sidebar's link: seconds to its first chart the page before did not show."""
    before = tab.evaluate(_TITLES_JS)
    t0 = time.monotonic()
    tab.locator(f'[data-testid=stSidebarNav] a[href$="/{page}"]').first.click()
    tab.wait_for_function(_NEW_CHART_JS, arg=before, timeout=180_000, polling=50)
    first = time.monotonic() - t0
    tab.wait_for_timeout(SETTLE_S * 1000)
    blank = [re.sub("<[^>]+>", "", c["title"]) or "(untitled)" for c in drawn_charts(tab) if c["blank"]]
    return {"sidebar": float("nan"), "sent": float("nan"), "first": first, "blank": blank}


def _pages(p, urls: dict[str, str], rounds: int, phase: str) -> list[dict]:
    """Cold opens and a switch pass over the pages on each dashboard, the dashboards taking turns
    (which goes first alternates) so that load swings reach both."""
    rows = []
    order = itertools.cycle([list(urls), list(urls)[::-1]])
    for _ in range(rounds):
        for page in PAGES:  # cold: a browser of its own per page
            for server in next(order):
                browser = launch_chromium(p)
                try:
                    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                    rows.append({"phase": phase, "server": server, "mode": "cold", "page": page})
                    rows[-1]["load"] = os.getloadavg()[0]
                    rows[-1].update(_open(tab, urls[server], page))
                finally:
                    browser.close()
        for server in next(order):  # switch: one tab, the Overview opened, then the sidebar's links
            browser = launch_chromium(p)
            try:
                tab = browser.new_page(viewport={"width": 1400, "height": 1000})
                _open(tab, urls[server], PAGES[0])
                for page in [*PAGES[1:], PAGES[0]]:
                    rows.append({"phase": phase, "server": server, "mode": "switch", "page": page})
                    rows[-1]["load"] = os.getloadavg()[0]
                    rows[-1].update(_switch(tab, page))
            finally:
                browser.close()
    return rows


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu_per_run(p, url: str, server_pid: int, page: str = "overview") -> dict:
    """The dashboard server's CPU per script run while one browser holds the live Overview: its
    1 s refresh and the attention banner's 2 s re-check, each a run, counted as the browser gets
    each run's script_finished message (a loaded server runs fewer than the timers ask for)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    finished = []

    def count(payload) -> None:
        if isinstance(payload, bytes) and ForwardMsg.FromString(payload).WhichOneof("type") == "script_finished":
            finished.append(time.monotonic())

    browser = launch_chromium(p)
    try:
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        tab.on("websocket", lambda ws: ws.on("framereceived", count))
        tab.goto(f"{url}/{page}")
        tab.locator(".js-plotly-plot").first.wait_for(timeout=120_000)
        tab.wait_for_timeout(3000)  # past the first full run of the page
        cpu0, t0, runs0 = _cpu(server_pid), time.monotonic(), len(finished)
        tab.wait_for_timeout(CPU_WINDOW_S * 1000)
        cpu, wall, runs = _cpu(server_pid) - cpu0, time.monotonic() - t0, len(finished) - runs0
    finally:
        browser.close()
    return {"cpu_s": cpu, "wall_s": wall, "runs": runs, "per_run": cpu / max(runs, 1), "load": os.getloadavg()[0]}


@contextlib.contextmanager
def side_dashboard(data_dir: str, *flags: str):
    """The app's main.py served by ``streamlit run`` beside the demo's dashboard, over its data dir,
    with ``flags`` (none: Streamlit's defaults)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(HERE.parent / "app" / "main.py"),
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        *flags,
        "--",
        "--data-dir",
        data_dir,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while not answers_ok(f"{url}/_stcore/health"):
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def streamlit_defaults(data_dir: str):
    """The same app as Streamlit runs it by default: a full gc.collect(2) after every script run,
    and a watcher on its source files (what app/__main__.py turns off)."""
    return side_dashboard(data_dir)


def before_early_plotly(data_dir: str):
    """The app as ``python -m app`` served it before issue 48's early Plotly import: main.py itself
    (not serve.py's st.App with preload.PlotlyEarly), with the flags app/__main__.py passes."""
    flags = ["--client.toolbarMode", "viewer", "--runner.postScriptGC", "false", "--server.fileWatcherType", "none"]
    return side_dashboard(data_dir, *flags)


def cpu_both(p, url: str, dashboard_pid: int, data_dir: str) -> dict[str, dict]:
    with streamlit_defaults(data_dir) as (default_url, default_pid):
        return {
            "as shipped": cpu_per_run(p, url, dashboard_pid),
            "Streamlit defaults": cpu_per_run(p, default_url, default_pid),
        }


def _dashboard_pid(demo_pid: int) -> int:
    for child in psutil.Process(demo_pid).children(recursive=True):
        if "streamlit" in " ".join(child.cmdline()):
            return child.pid
    raise RuntimeError("the demo's dashboard process was not found")


def _cell(x: float) -> str:
    return "–" if x != x else f"{x:.2f}"  # NaN: not measured in that mode


def report(rows: list[dict], cpu: dict[str, dict], command: str) -> str:
    loads = [r["load"] for r in rows]
    sides = list(dict.fromkeys((r["phase"], r["server"]) for r in rows))
    lines = [
        "# The demo's first charts while it trains (issues 29, 48)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on a {os.cpu_count()}-core "
        f"{platform.machine()} host, CPython {platform.python_version()}, {code_version(HERE.parent)}; "
        f"the demo's 4 ranks training on the same cores, 1-minute load {min(loads):.1f}-{max(loads):.1f}.",
        f"Command: `{command}`",
        "",
        f"Seconds. {SHIPPED}: the demo's dashboard (`python -m app`: the page shell imports Plotly's chunk as it "
        f"loads, app/preload.py); {BEFORE}: the same app beside it on the same data dir as it was served before "
        "(`streamlit run app/main.py`, the chunk fetched when the first chart arrives); the two take turns page by "
        "page. Cold: a new browser per page, from navigation (sidebar: Streamlit's frontend up and its session "
        "connected; chart sent: the server's first chart element reached the browser, its websocket frame; first "
        "chart: drawn). Switch: one browser, the Overview opened, then each page by the sidebar's link, from the "
        "click to the first chart the page before did not show. Blank: charts with no point drawn "
        f"{SETTLE_S:g} s after the first. Target: first chart within {TARGET_S:g} s, no blank chart.",
        "",
    ]
    by_key = {(r["phase"], r["server"], r["mode"], r["page"]): r for r in rows}  # the last round's, when several
    for phase in dict.fromkeys(ph for ph, _ in sides):
        servers = [sv for ph, sv in sides if ph == phase]
        lines += [
            f"**{phase}**",
            "",
            "| page | mode | "
            + " | ".join(
                f"{sv}: sidebar s | {sv}: chart sent s | {sv}: first chart s | {sv}: load | {sv}: blank"
                for sv in servers
            )
            + " |",
            "|---|---|" + "---:|---:|---:|---:|---|" * len(servers),
        ]
        for mode in ("cold", "switch"):
            for page in PAGES:
                cells = []
                for sv in servers:
                    r = by_key.get((phase, sv, mode, page))
                    if r is None:
                        cells += ["–"] * 5
                        continue
                    first = _cell(r["first"]) if r["first"] <= TARGET_S else f"**{r['first']:.2f}**"
                    cells += [_cell(r["sidebar"]), _cell(r["sent"]), first, f"{r['load']:.1f}"]
                    cells.append(", ".join(r["blank"]) or "none")
                lines.append(f"| {page} | {mode} | " + " | ".join(cells) + " |")
        lines.append("")
    for phase, server in sides:
        for mode in ("cold", "switch"):
            picked = [r for r in rows if (r["phase"], r["server"], r["mode"]) == (phase, server, mode)]
            if not picked:
                continue
            firsts = [r["first"] for r in picked]
            blanks = sum(bool(r["blank"]) for r in picked)
            lines.append(
                f"- {phase}, {server}, {mode}: first chart median {statistics.median(firsts):.2f} s, max "
                f"{max(firsts):.2f} s ({sum(f <= TARGET_S for f in firsts)} of {len(firsts)} within {TARGET_S:g} s; "
                f"{blanks} page(s) with a blank chart; load {min(r['load'] for r in picked):.1f}-"
                f"{max(r['load'] for r in picked):.1f})."
            )
    if cpu:
        lines += [
            "",
            f"Dashboard server CPU while one browser holds the live Overview for {CPU_WINDOW_S:g} s (its refresh "
            f"every {REFRESH_S:g} s and the banner's every 2 s, each a script run, counted from the runs' "
            "script_finished messages): the demo's dashboard as shipped, and the same app beside it under "
            "Streamlit's defaults (a full `gc.collect(2)` after every run, a source-file watcher).",
            "",
            "| phase | server | CPU s | wall s | script runs | CPU ms per run | load |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
    for ph, servers in cpu.items():
        for server, c in servers.items():
            lines.append(
                f"| {ph} | {server} | {c['cpu_s']:.2f} | {c['wall_s']:.1f} | {c['runs']} | "
                f"{1000 * c['per_run']:.0f} | {c['load']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1, help="cold and switch passes over the pages (default 1)")
    p.add_argument("--hog", type=int, default=0, help="then again beside N processes spinning a core each")
    p.add_argument("--no-quiet", action="store_true", help="with --hog: only the pass beside the hog")
    p.add_argument("--no-cpu", action="store_true", help="skip the server CPU per script run")
    p.add_argument("--out", default=str(HERE / "RESULTS-demo-first-chart.md"))
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    data_dir = tempfile.mkdtemp(prefix="rankscope-demo-first-chart-")
    proc = start_demo(data_dir, "--dashboard-port", str(free_port()), "--straggler", "1:40@60")
    rows, cpu = [], {}
    try:
        console = []
        for line in proc.stdout:
            console.append(line)
            if line.startswith("[demo] staged fault"):
                break
        url = re.search(r"\[demo\] dashboard: (\S+)", "".join(console)).group(1)
        while not answers_ok(f"{url}/_stcore/health"):
            time.sleep(1)
        dashboard = _dashboard_pid(proc.pid)
        with before_early_plotly(data_dir) as (before_url, _), sync_playwright() as pw:
            time.sleep(25)  # past the start-up: the run has steps, findings and a FLOPS profile
            urls = {SHIPPED: url, BEFORE: before_url}
            phases = [] if args.hog and args.no_quiet else [("no hog", 0)]
            phases += [(f"hog {args.hog}", args.hog)] if args.hog else []
            for phase, hog in phases:
                with cpu_hog(hog):
                    rows += _pages(pw, urls, args.rounds, phase)
                    if not args.no_cpu:
                        cpu[phase] = cpu_both(pw, url, dashboard, data_dir)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    command = f"python -m benches.demo_first_chart --rounds {args.rounds}" + (f" --hog {args.hog}" if args.hog else "")
    command += (" --no-quiet" if args.no_quiet else "") + (" --no-cpu" if args.no_cpu else "")
    publish(args.out, report(rows, cpu, command))


if __name__ == "__main__":
    main()
