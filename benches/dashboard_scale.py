"""The dashboard and the storage at thousands of ranks.

    python -m benches.dashboard_scale [--sizes 1024x500,8192x100] [--out benches/RESULTS-scale.md]

Same-run baseline: the shipped sample runs (4 ranks, the size the dashboard was built at):
every chart page on the run the dashboard opens on (the newest).
Then per size, a `rankscope simulate` run (rank 517 40 ms late) written into a fresh data dir:

- bytes on disk per rank-step, per table (zstd Parquet as the collector writes it), and
  records generated per second;
- time to first chart in headless Chromium per page, cold (a fresh dashboard: rollup built
  on first use) and warm (the same pages again), with the most rows/legend entries any chart
  on the page drew;
- the projection for 8,192 ranks x 100,000 steps from those measured per-record costs.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.parquet as pq

from benches._common import code_version
from benches.dashboard_queries import machine
from collector.data import layout, queries
from collector.server.compaction import Compactor
from collector.server.ledger import Ledger
from collector.testing.dashboard import DashboardProcess, drawn_charts, launch_chromium
from collector.tools import simulate

REPO = Path(__file__).resolve().parents[1]
PAGES = ("overview", "comms", "stragglers", "liveness", "memory")  # what a simulated run has data for
SAMPLE_PAGES = ("overview", "comms", "stragglers", "liveness", "flops", "memory", "moe")


def first_charts(data_dir, run_id: str, pages=PAGES) -> list[tuple]:
    """(load, page, seconds to first chart, seconds until the page finished, max rows, max legend)."""
    from playwright.sync_api import sync_playwright

    out = []
    dashboard = DashboardProcess(data_dir, timeout_s=120)
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            for load in ("cold", "warm"):
                for page in pages:
                    t0 = time.perf_counter()
                    tab.goto(f"{dashboard.url}/{page}?run={run_id}")
                    tab.locator(".js-plotly-plot").first.wait_for(timeout=600_000)
                    first = time.perf_counter() - t0
                    tab.wait_for_function(
                        "!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=600_000
                    )
                    done = time.perf_counter() - t0
                    charts = drawn_charts(tab)
                    rows = max((c["rows"] for c in charts), default=0)
                    legend = max((c["legend"] for c in charts), default=0)
                    out.append((load, page, first, done, rows, legend))
                    print(f"  {load} {page}: first chart {first:.2f} s, done {done:.2f} s, rows {rows}", flush=True)
            browser.close()
    finally:
        dashboard.stop(timeout=10)
    return out


def bytes_per_table(data_dir, run_id: str) -> dict[str, int]:
    out = {}
    for table in ("comm", "timers", "monitor", "memory"):
        part = layout.partition_dir(Path(data_dir), table, run_id)
        out[table] = sum(p.stat().st_size for p in part.glob(f"*{layout.SEGMENT_SUFFIX}"))
    return out


def store_rollups(data_dir, run_id: str) -> tuple[float, int, int]:
    """(seconds the collector's compaction takes to store the run's per-step rollups and step
    analysis, the comm rollup's rows, its bytes on disk)."""
    t0 = time.perf_counter()
    ledger = Ledger(data_dir)
    try:
        Compactor(data_dir, ledger).catch_up()
    finally:
        ledger.close()
    took = time.perf_counter() - t0
    files = list(layout.partition_dir(Path(data_dir), "comm_steps", run_id).glob(f"*{layout.SEGMENT_SUFFIX}"))
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    return took, rows, sum(f.stat().st_size for f in files)


def one_size(ranks: int, steps: int, tmp: Path, per_step: int = 0, browser: bool = True) -> dict:
    sim = simulate.Simulation(
        ranks=ranks,
        steps=steps,
        collectives_per_step=per_step,
        stragglers=(simulate.Straggler(min(517, ranks - 1), 40_000_000),),
        name="bench",
    )
    data_dir = tmp / f"sim-{ranks}x{steps}"
    t0 = time.perf_counter()
    records = simulate.write_data_dir(sim, data_dir, rollups=False)
    gen_s = time.perf_counter() - t0
    print(f"{ranks} x {steps}: {records:,} records in {gen_s:.0f} s", flush=True)
    sizes = bytes_per_table(data_dir, sim.run_id)  # raw, as flushed: before compaction merges them
    rollup_s, rollup_rows, rollup_bytes = store_rollups(data_dir, sim.run_id)
    return {
        "ranks": ranks,
        "steps": steps,
        "records": records,
        "per_step": sim.records_per_rank // steps,
        "comm_per_step": sim.per_step,
        "gen_s": gen_s,
        "bytes": sizes,
        "rollup_s": rollup_s,
        "rollup_rows": rollup_rows,
        "rollup_bytes": rollup_bytes,
        "browser": first_charts(data_dir, sim.run_id) if browser else [],
    }


def report(baseline, results, load, per_step: int = 0, sample: str = "") -> str:
    sizes = ",".join(f"{r['ranks']}x{r['steps']}" for r in results)
    if per_step:
        sizes += f" --collectives-per-step {per_step}"
    if not baseline:
        sizes += " --no-browser"
    lines = [
        "# Thousands of ranks: dashboard and storage",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}, {code_version(REPO)}, "
        f"shared with other jobs (1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end).",
        f"Command: `python -m benches.dashboard_scale --sizes {sizes}`",
        "",
        "Runs: `rankscope simulate` (the ZeRO-2 sample run's step: 7 collectives, 5 timers, 3 monitor tags, "
        "4 memory kinds a rank-step; rank 517 40 ms late). Baseline, same run of the benchmark: the shipped "
        f"sample runs' default (newest) run `{sample}` (4 ranks x 30 steps), every chart page.",
        "",
        "## Time to first chart in headless Chromium (seconds)",
        "",
        "Navigation to the first drawn Plotly chart; 'done' is until Streamlit finished the page. Rows: the most "
        "rows (heatmap rows, bar categories, lines) any chart of the page drew; legend: the most legend entries.",
        "",
        "| run | load | page | first chart s | done s | rows | legend |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, rows in [("sample 4 ranks", baseline)] + [
        (f"{r['ranks']:,} x {r['steps']}", r["browser"]) for r in results
    ]:
        lines += [f"| {name} | {a} | {p} | {f:.2f} | {d:.2f} | {n} | {lg} |" for a, p, f, d, n, lg in rows]
    lines += [
        "",
        "## Bytes on disk per rank-step (raw, zstd-1 Parquet as the collector writes it)",
        "",
        "| run | records | generated in s | comm B | timers B | monitor B | memory B | total B | comm rollup B | "
        "comm rollup rows | rollups stored in s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rs = r["ranks"] * r["steps"]
        b = r["bytes"]
        lines.append(
            f"| {r['ranks']:,} x {r['steps']} | {r['records']:,} | {r['gen_s']:.0f} | "
            + " | ".join(f"{b[t] / rs:.0f}" for t in ("comm", "timers", "monitor", "memory"))
            + f" | {sum(b.values()) / rs:.0f} | {r['rollup_bytes'] / rs:.0f}"
            + f" | {r['rollup_rows']:,} | {r['rollup_s']:.1f} |"
        )
    big = max(results, key=lambda r: r["records"])
    per_rank_step = sum(big["bytes"].values()) / (big["ranks"] * big["steps"])
    per_record = sum(big["bytes"].values()) / big["records"]
    rank_steps = 8192 * 100_000
    comm_b = big["bytes"]["comm"] / (big["ranks"] * big["steps"])
    other_b = per_rank_step - comm_b
    rollup_b = big["rollup_bytes"] / (big["ranks"] * big["steps"])
    comm_rate = big["ranks"] * big["steps"] * big["comm_per_step"] / big["rollup_s"]
    lines += [
        "",
        "## Projection: 8,192 ranks x 100,000 steps",
        "",
        f"From the largest run above ({big['ranks']:,} x {big['steps']}: {per_rank_step:.0f} B per rank-step, "
        f"{per_record:.1f} B per record, {big['per_step']} records per rank-step, "
        f"{big['comm_per_step']} of them comm):",
        "",
        f"- raw, every step kept: {rank_steps * per_rank_step / 1e12:.1f} TB, "
        f"{rank_steps * big['per_step'] / 1e9:.0f} G records;",
        *(
            f"- `--raw-every {n}` (plus steps with findings, assumed 1%): "
            f"{rank_steps * (other_b + rollup_b + comm_b * (1 / n + 0.01)) / 1e12:.1f} TB "
            f"(comm raw {rank_steps * comm_b * (1 / n + 0.01) / 1e12:.2f} TB "
            f"+ rollup {rank_steps * rollup_b / 1e12:.2f} TB "
            f"+ timers/monitor/memory {rank_steps * other_b / 1e12:.2f} TB);"
            for n in (10, 100)
        ),
        f"- per-step rollups and step analysis stored by compaction at the measured {comm_rate / 1e3:.0f} k raw "
        f"comm records/s: {rank_steps * big['comm_per_step'] / comm_rate / 3600:.0f} h of one compaction thread "
        "over the run, paid as steps settle, never per page.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1024x500,8192x100", help="RANKSxSTEPS, comma separated")
    ap.add_argument("--collectives-per-step", type=int, default=0, help="as rankscope simulate's (default 7)")
    ap.add_argument("--no-browser", action="store_true", help="storage and rollup figures only")
    ap.add_argument("--out", default=str(REPO / "benches" / "RESULTS-scale.md"))
    args = ap.parse_args()
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    load0 = os.getloadavg()[0]
    cat = queries.Catalog(REPO / "sample_runs")
    sample = queries.list_runs(cat).iloc[0]  # newest first: the run the dashboard opens on
    cat.close()
    print(f"baseline: sample run {sample['name']}", flush=True)
    baseline = [] if args.no_browser else first_charts(REPO / "sample_runs", sample.run_id, SAMPLE_PAGES)
    with tempfile.TemporaryDirectory(prefix="rankscope-scale-") as tmp:
        results = [one_size(r, s, Path(tmp), args.collectives_per_step, not args.no_browser) for r, s in sizes]
    text = report(baseline, results, (load0, os.getloadavg()[0]), args.collectives_per_step, sample["name"])
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
