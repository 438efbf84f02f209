"""Dashboard query latency on a synthetic 10M-comm-record run.

    python -m benches.dashboard_queries [--records 10000000] [--reps 20] [--browser]
                                        [--out benches/RESULTS-dashboard.md]

Generates the run once into a temp dir (collector.testing.fake_runs: 8 ranks, rank 3
late to every all_reduce), then times every page query of collector/data/queries/
uncached (the per-run rollup is built once, as the dashboard caches it
in the app), next to the same aggregations over the raw Parquet views (the
baseline: what the pages would cost without rollups). With --browser it also
times first chart in Chromium per page, cold (rollup not built yet) and warm.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from collector import catalog
from collector.data import queries as q
from collector.testing.dashboard import DashboardProcess, launch_chromium
from collector.testing.fake_runs import FakeRun, write_data_dir

REPO = Path(__file__).resolve().parents[1]

WORLD = 8
PER_STEP = 1000


def _timed(fn, reps: int) -> tuple[float, float]:
    """(p50, p95) in ms over ``reps`` calls."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]


def raw(data_dir: str, sql: str, params: list):
    """Baseline: the same aggregation straight over the catalog's Parquet views."""
    con = catalog.connect(data_dir)
    try:
        return con.execute(sql, params).df()
    finally:
        con.close()


RAW_BASELINES = {
    "log_summary": """
        SELECT op, bytes, count(*), sum(end_ns - start_ns) / 1e6, avg(algbw_gbs), avg(busbw_gbs)
        FROM comm WHERE run_id = ? GROUP BY op, bytes""",
    "bandwidth_by_step": """
        SELECT step, op, group_name, avg(algbw_gbs), avg(busbw_gbs) FROM comm WHERE run_id = ? GROUP BY ALL""",
    "comm_by_rank": """
        SELECT rank, op, count(*), sum(end_ns - start_ns) / 1e6 FROM comm WHERE run_id = ? GROUP BY ALL""",
    "delay_heatmap": """
        SELECT rank, step, avg(arrival_delay_ns) / 1e6, avg(wait_ns) / 1e6
        FROM comm_instances WHERE run_id = ? GROUP BY ALL""",
    "last_arrivals": """
        SELECT op, last_rank, count(*), avg(max_delay_ns) FROM stragglers WHERE run_id = ? GROUP BY ALL""",
}


def bench_queries(data_dir: str, run_id: str, reps: int) -> tuple[list[tuple], dict]:
    cat = q.Catalog(data_dir)
    t0 = time.perf_counter()
    rollup = q.comm_rollup(cat, run_id)
    build_ms = (time.perf_counter() - t0) * 1e3
    everything = q.CommFilter()
    narrowed = q.CommFilter(ops=["all_reduce"], ranks=[0, 3], steps=(100, 600))
    # The query layer itself, uncached: the dashboard's cache only adds hits on top.
    page_queries = [
        ("all", "list_runs", lambda: q.list_runs(cat)),
        ("all", "data_version", lambda: q.data_version(data_dir, run_id)),
        ("comms", "comm_dimensions", lambda: q.comm_dimensions(rollup)),
        ("comms", "log_summary", lambda: q.log_summary(rollup, everything)),
        ("comms", "log_summary (op+rank+step filter)", lambda: q.log_summary(rollup, narrowed)),
        ("comms", "bandwidth_by_step", lambda: q.bandwidth_by_step(rollup, everything)),
        ("comms", "bandwidth_by_size", lambda: q.bandwidth_by_size(rollup, everything)),
        ("comms", "comm_by_rank", lambda: q.comm_by_rank(rollup, everything)),
        ("stragglers", "delay_heatmap", lambda: q.delay_heatmap(rollup, everything)),
        ("stragglers", "last_arrivals", lambda: q.last_arrivals(rollup, everything)),
        ("stragglers", "instances_at (drill-down)", lambda: q.instances_at(cat, run_id, 500, 0)),
        ("stragglers", "ranks", lambda: q.ranks(cat, run_id)),
        ("overview", "monitor_series", lambda: q.monitor_series(cat, run_id)),
        ("overview", "loss_scale", lambda: q.loss_scale(cat, run_id)),
        ("overview", "step_breakdown", lambda: q.step_breakdown(cat, run_id)),
        ("overview", "step_wall_ms", lambda: q.step_wall_ms(cat, run_id)),
        ("flops", "flops_profile", lambda: q.flops_profile(cat, run_id)),
        ("memory", "memory_lines", lambda: q.memory_lines(cat, run_id, 8)),
        ("moe", "moe_load", lambda: q.moe_load(cat, run_id)),
    ]
    rows = []
    for page, name, fn in page_queries:
        fn()  # warm the OS page cache and DuckDB's metadata cache, as a user's first click would
        p50, p95 = _timed(fn, reps)
        baseline = RAW_BASELINES.get(name)
        b50 = b95 = None
        if baseline:
            b50, b95 = _timed(lambda sql=baseline: raw(data_dir, sql, [run_id]), max(3, reps // 4))
        rows.append((page, name, p50, p95, b50, b95))
    return rows, {"rollup_build_ms": build_ms, "rollup_rows": rollup.num_rows}


def bench_browser(data_dir: str, run_id: str) -> list[tuple]:
    """Seconds from navigation to the first drawn Plotly chart, per page: a fresh
    dashboard process (cold: rollup built on first use), then the same pages again (warm)."""
    from playwright.sync_api import sync_playwright

    dashboard = DashboardProcess(data_dir)
    results = []
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            for attempt in ("cold", "warm"):
                for page in ("overview", "comms", "stragglers", "flops", "memory", "moe"):
                    t0 = time.perf_counter()
                    tab.goto(f"{dashboard.url}/{page}?run={run_id}")
                    tab.locator(".js-plotly-plot").first.wait_for(timeout=300_000)
                    results.append((attempt, page, time.perf_counter() - t0))
            browser.close()
    finally:
        dashboard.stop(timeout=10)
    return results


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return (
        f"{os.cpu_count()}-core VM ({cpu}), {platform.python_implementation()} {platform.python_version()}, "
        f"duckdb {__import__('duckdb').__version__}, streamlit {__import__('streamlit').__version__}"
    )


NOTES = """
## Reading these numbers

- Page queries read the per-run comm rollup (one row per rank, step, group, op and message
  size) instead of the raw records; the raw-Parquet columns are the same aggregations without
  it, and the straggler ones need the per-collective join across ranks, which is what makes
  them take seconds. The rollup costs one pass per data version (the build time above); a
  live run rebuilds it when a new segment lands, a finished run keeps it.
- `instances_at` is the Stragglers drill-down (a click, not a page load): it reads the raw
  records of one step, pruned by Parquet min/max statistics but still opening every
  segment's footer.
- `memory_lines` aggregates every (rank, step, kind) point of the run into the lines the page
  draws (all ranks' while few; else the highest ranks, median and max).
- Time to first chart includes the browser loading the page and Plotly, a fresh Streamlit
  session, and (cold) the first queries of the run; it is dominated by CPU share on this
  busy 2-core machine, not by the queries above.
"""


def report(records: int, reps: int, rows, extra, browser_rows, gen_s: float) -> str:
    lines = [
        "# Dashboard query latency",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}, shared with other jobs "
        f"(1-minute load average {extra['load'][0]:.1f} at the start, {extra['load'][1]:.1f} at the end: "
        "expect noisy tails).",
        f"Command: `python -m benches.dashboard_queries --records {records} --reps {reps}"
        f"{' --browser' if browser_rows else ''}`",
        "",
        f"Run: {records:,} comm records ({WORLD} ranks x {records // (WORLD * PER_STEP):,} steps x {PER_STEP} "
        f"collectives), generated in {gen_s:.0f} s. Per-run comm rollup: {extra['rollup_rows']:,} rows, "
        f"built once per data version in {extra['rollup_build_ms'] / 1e3:.1f} s (cached; rebuilt only when a "
        "new segment lands).",
        "",
        f"Page queries: collector/data/queries/, uncached, {reps} reps each. "
        "Baseline: the same aggregation over the raw Parquet views (no rollup), same run, same process.",
        "",
        "| page | query | p50 ms | p95 ms | raw Parquet p50 ms | raw Parquet p95 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for page, name, p50, p95, b50, b95 in rows:
        base = f"{b50:.0f} | {b95:.0f}" if b50 is not None else "– | –"
        lines.append(f"| {page} | {name} | {p50:.1f} | {p95:.1f} | {base} |")
    worst = max(rows, key=lambda r: r[3])
    lines += ["", f"Slowest page query p95: {worst[1]} at {worst[3]:.1f} ms (target 100 ms)."]
    if browser_rows:
        lines += [
            "",
            "## Time to first chart in Chromium",
            "",
            "Headless /usr/bin/chromium via Playwright, navigation to first `.js-plotly-plot` drawn.",
            "",
            "| load | page | seconds |",
            "|---|---|---:|",
        ]
        lines += [f"| {a} | {p} | {s:.2f} |" for a, p, s in browser_rows]
    return "\n".join(lines) + "\n" + NOTES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--browser", action="store_true", help="also time first chart in Chromium")
    ap.add_argument("--out", default=str(REPO / "benches" / "RESULTS-dashboard.md"))
    args = ap.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)

    steps = max(1, args.records // (WORLD * PER_STEP))
    run = FakeRun(
        run_id="bench-10m", name="bench", world_size=WORLD, steps=steps, collectives_per_step=PER_STEP, late_rank=3
    )
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
        t0 = time.perf_counter()
        data_dir = str(write_data_dir(Path(tmp), run))
        gen_s = time.perf_counter() - t0
        print(f"generated {steps * WORLD * PER_STEP:,} comm records in {gen_s:.0f} s", flush=True)
        load_before = os.getloadavg()[0]
        rows, extra = bench_queries(data_dir, run.run_id, args.reps)
        browser_rows = bench_browser(data_dir, run.run_id) if args.browser else []
        extra["load"] = (load_before, os.getloadavg()[0])
    text = report(steps * WORLD * PER_STEP, args.reps, rows, extra, browser_rows, gen_s)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
