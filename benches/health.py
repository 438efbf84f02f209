"""`rankscope health` on a synthetic 10M-comm-record run.

    python -m benches.health [--records 10000000] [--reps 5] [--no-baseline] [--out benches/RESULTS-health.md]

Generates the run once (collector.testing.fake_runs: 8 ranks, rank 3 late to every all_reduce,
step timers on every rank), then times, in one process and on the same run:
- ``findings.for_run``: every query and rule of the health summary (step analysis: interval
  unions and imposed waits per rank and step; the comm rollup; signals; loss scale);
- its parts: ``step_analysis`` alone, the comm rollup alone, the desyncs view alone;
- the same-run baseline of ``step_analysis``: the statement before the one-pass rewrite
  (benches/_health_baseline.py: window islands, a second join for the runner-up arrival),
  checked to give the same frame; ``--no-baseline`` leaves it out (it is slow at 10M);
- the queries the health rules ran before exposed communication and straggler cost (the rollup
  and the page queries over it, step_wall_ms, loss_scale): what the summary cost before it said more;
- the whole command, `rankscope health RUN --json`, as a fresh process (Python start-up and
  imports included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from benches import _health_baseline
from benches._common import code_version
from benches.dashboard_queries import machine
from collector.data import findings
from collector.data import queries as q
from collector.server.compaction import CompactionConfig
from collector.testing import fake_runs
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import FakeRun, write_data_dir

REPO = Path(__file__).resolve().parents[1]
WORLD, PER_STEP = 8, 1000


def timed(fn, reps: int) -> tuple[float, float]:
    """(median, max) seconds over ``reps`` calls."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), max(samples)


def old_rules_queries(cat: q.Catalog, run_id: str) -> None:
    rollup = q.comm_rollup(cat, run_id)
    everything = q.CommFilter()
    q.last_arrivals(rollup, everything)
    q.log_summary(rollup, everything)
    q.comm_by_rank(rollup, everything)
    q.step_wall_ms(cat, run_id)
    q.loss_scale(cat, run_id)


def through_collector(run: FakeRun, data_dir: Path, reps: int) -> list[tuple[str, float, float]]:
    """The same run streamed into a live collector, whose compaction stores each settled window's
    rollup and step analysis: the health queries read those and compute only the unsettled tail."""
    config = CompactionConfig(interval=1.0)
    t0 = time.perf_counter()
    with live_collector(data_dir, compaction_config=config) as collector:
        fake_runs.stream(collector.endpoint, run)
        streamed = time.perf_counter() - t0
        retention = collector.state.compactor.retention
        while retention._analysed_through(run.run_id) < run.steps - 1:
            time.sleep(0.5)
        settled = time.perf_counter() - t0 - streamed
        busy = retention.busy_s
    print(f"streamed in {streamed:.0f} s, rollups stored {settled:.0f} s later", flush=True)
    cat = q.Catalog(data_dir)
    findings.for_run(cat, run.run_id)  # warm, as above
    rows = [
        ("**recorded by a collector** (rollups stored as steps settle): findings.for_run",
         *timed(lambda: findings.for_run(cat, run.run_id), reps)),
        ("  step_analysis", *timed(lambda: q.step_analysis(cat, run.run_id), reps)),
        ("  comm_rollup", *timed(lambda: q.comm_rollup(cat, run.run_id), reps)),
        ("  desyncs", *timed(lambda: q.desyncs(cat, run.run_id), reps)),
        ("  the collector's compaction storing them (wall time of its rollup passes, once per run)", busy, busy),
    ]  # fmt: skip
    cat.close()
    cli = [sys.executable, "-m", "collector.tools.cli", "health", run.run_id, "--data-dir", str(data_dir), "--json"]
    rows.append(
        (
            "  `rankscope health RUN --json` (fresh process)",
            *timed(lambda: subprocess.run(cli, capture_output=True, timeout=600), max(2, reps // 2)),
        )
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-baseline", action="store_true", help="skip the old step_analysis (slow at 10M)")
    ap.add_argument(
        "--through-collector", action="store_true", help="also stream it into a live collector and time health there"
    )
    ap.add_argument("--out", default=str(REPO / "benches" / "RESULTS-health.md"))
    args = ap.parse_args()
    steps = max(1, args.records // (WORLD * PER_STEP))
    run = FakeRun(
        run_id="bench-health", name="bench", world_size=WORLD, steps=steps, collectives_per_step=PER_STEP, late_rank=3
    )
    records = steps * WORLD * PER_STEP
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
        t0 = time.perf_counter()
        data_dir = str(write_data_dir(Path(tmp), run))
        print(f"generated {records:,} comm records in {time.perf_counter() - t0:.0f} s", flush=True)
        load = [os.getloadavg()[0]]
        cat = q.Catalog(data_dir)
        found = findings.for_run(cat, run.run_id)  # warm the page cache and the Parquet footers
        rows = [
            (
                "findings.for_run (the whole health summary)",
                *timed(lambda: findings.for_run(cat, run.run_id), args.reps),
            ),
            (
                "  step_analysis (exposed comm + imposed waits)",
                *timed(lambda: q.step_analysis(cat, run.run_id), args.reps),
            ),
            ("  comm_rollup", *timed(lambda: q.comm_rollup(cat, run.run_id), args.reps)),
            ("  desyncs (collective mismatches)", *timed(lambda: q.desyncs(cat, run.run_id), args.reps)),
        ]
        if not args.no_baseline:
            pd.testing.assert_frame_equal(
                q.step_analysis(cat, run.run_id).drop(columns="late_op"),
                _health_baseline.step_analysis(cat, run.run_id).drop(columns="late_op"),
                check_dtype=False,
            )
            rows.append(
                (
                    "baseline: step_analysis before the one-pass rewrite (same frame)",
                    *timed(lambda: _health_baseline.step_analysis(cat, run.run_id), args.reps),
                )
            )
        rows += [
            (
                "the rules' queries before exposed communication and straggler cost",
                *timed(lambda: old_rules_queries(cat, run.run_id), args.reps),
            ),
        ]
        cat.close()
        cli = [sys.executable, "-m", "collector.tools.cli", "health", run.run_id, "--data-dir", data_dir, "--json"]
        rows.append(
            (
                "`rankscope health RUN --json` (fresh process)",
                *timed(lambda: subprocess.run(cli, capture_output=True, timeout=600), max(2, args.reps // 2)),
            )
        )
        if args.through_collector:
            rows += through_collector(run, Path(tmp) / "collected", args.reps)
        load.append(os.getloadavg()[0])
    top = next((f.text for f in found if f.severity == "warning"), "none")
    lines = [
        f"# `rankscope health` on a {records / 1e6:g}M-record run",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}, shared with other jobs "
        f"(1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end). Code: {code_version(REPO)}.",
        f"Command: `python -m benches.health --records {args.records} --reps {args.reps}"
        f"{' --no-baseline' if args.no_baseline else ''}{' --through-collector' if args.through_collector else ''}`",
        "",
        f"Run: {records:,} comm records ({WORLD} ranks x {steps:,} steps x {PER_STEP} collectives), step timers on "
        f'every rank, rank 3 late to every all_reduce. Top finding: "{top}".',
        "",
        "| what | median s | max s |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {med:.2f} | {worst:.2f} |" for name, med, worst in rows]
    lines += ["", "Target: `rankscope health` <= 1 s on a 10M-record run."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
