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

``--live`` (issue 45; target: <= 0.3 s wall on a quiet machine, findings identical): a real
``rankscope collect`` process, a 1,024-rank run streamed into it by ``rankscope simulate`` (128
hosts, rank 517 a 40 ms straggler), held open by one more stream of its rank 0 (as a live job's
ranks are); once the collector's refresh has computed its findings, ``rankscope health RUN`` as a
fresh process answered by the live collector (its Health RPC; the CLI's fast path) against the
same command with ``--no-live`` (computed from the data dir, as before), alternately on the same
run, and ``python -c pass`` (the interpreter's own start) as the floor; the two ``--json``
outputs compared (identical but for ``captured``, which only the data dir adds).

    python -m benches.health --live [--reps 5] [--ranks 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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


def _hold(endpoint: str, run_id: str, world: int, name: str) -> threading.Event:
    """One more stream of the run's rank 0, open until the returned event is set: the collector
    follows the run as it follows a live job."""
    import grpc

    from proto import pb_grpc

    stop = threading.Event()

    def envelopes():
        yield fake_runs.hello("bench-holder", 1, run_id, 0, world, run_name=name)
        stop.wait()

    def run() -> None:
        with grpc.insecure_channel(endpoint) as channel:
            try:
                for _ in pb_grpc.CollectorStub(channel).Stream(envelopes()):
                    pass
            except grpc.RpcError:
                pass

    threading.Thread(target=run, daemon=True).start()
    return stop


def _children_cpu() -> float:
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def live_vs_data_dir(args) -> None:
    from collector.data.live_collector import fetch
    from collector.tools.launch import CollectorProcess

    name = "bench-live-health"
    py = [sys.executable, "-m", "collector.tools.cli"]
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
        data_dir = Path(tmp) / "data"
        collector = CollectorProcess(data_dir)
        try:
            sim = [
                *py,
                "simulate",
                "--ranks",
                str(args.ranks),
                "--steps",
                "60",
                "--hosts",
                str(max(1, args.ranks // 8)),
            ]
            sim += ["--straggler", "517:40", "--name", name, "--endpoint", collector.address]
            t0 = time.perf_counter()
            subprocess.run(sim, check=True, capture_output=True, timeout=1800)
            print(f"simulated {args.ranks} ranks in {time.perf_counter() - t0:.0f} s", flush=True)
            cat = q.Catalog(data_dir)
            run_id = q.resolve_run(cat.con, name)
            cat.close()
            stop = _hold(collector.address, run_id, args.ranks, name)
            t0 = time.perf_counter()
            while fetch(data_dir, run_id) is None:
                time.sleep(0.2)
            held_after = time.perf_counter() - t0
            live_cli = [*py, "health", run_id, "--data-dir", str(data_dir)]
            samples: dict[str, list[float]] = {"live": [], "data": [], "python": []}
            cpu: dict[str, list[float]] = {"live": [], "data": [], "python": []}  # the child's user + sys
            for _ in range(args.reps):  # alternately, so load drifts hit both alike
                for what, cmd in (
                    ("live", live_cli),
                    ("data", [*live_cli, "--no-live"]),
                    ("python", [sys.executable, "-c", "pass"]),
                ):
                    used0, t0 = _children_cpu(), time.perf_counter()
                    subprocess.run(cmd, capture_output=True, timeout=600)
                    samples[what].append(time.perf_counter() - t0)
                    cpu[what].append(_children_cpu() - used0)
            outputs = [
                json.loads(subprocess.run([*live_cli, "--json", *flag], capture_output=True, text=True).stdout)
                for flag in ((), ("--no-live",))
            ]
            live_found, data_found = ([{k: v for k, v in f.items() if k != "captured"} for f in o] for o in outputs)
            same = live_found == data_found
            top = next((f["text"] for f in live_found if f["severity"] == "warning"), "none")
            stop.set()
        finally:
            collector.stop()
    load.append(os.getloadavg()[0])
    lines = [
        "",
        f"## `rankscope health` from the live collector vs the data dir, {args.ranks:,} simulated ranks (issue 45)",
        "",
        f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}, shared with other jobs "
        f"(1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end). Code: {code_version(REPO)}.",
        f"Command: `python -m benches.health --live --reps {args.reps} --ranks {args.ranks}`. The collector held the "
        f'run\'s findings {held_after:.1f} s after its rank 0 stream opened. Top finding: "{top}". '
        f"Findings identical (--json, live vs --no-live): {'yes' if same else 'NO'} ({len(live_found)} findings).",
        "",
        "| `rankscope health RUN`, fresh process | wall median s | wall max s | CPU (user+sys) median s | target |",
        "|---|---:|---:|---:|---|",
    ]
    for what, label in (
        ("live", "answered by the live collector (Health RPC)"),
        ("data", "baseline, same run: `--no-live` (computed from the data dir, as before)"),
        ("python", "floor, same run: `python -c pass`"),
    ):
        lines.append(
            f"| {label} | {statistics.median(samples[what]):.2f} | {max(samples[what]):.2f} | "
            f"{statistics.median(cpu[what]):.2f} | {'<= 0.3 s wall, quiet' if what == 'live' else ''} |"
        )
    text = "\n".join(lines) + "\n"
    with open(args.out, "a") as f:
        f.write(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-baseline", action="store_true", help="skip the old step_analysis (slow at 10M)")
    ap.add_argument(
        "--through-collector", action="store_true", help="also stream it into a live collector and time health there"
    )
    ap.add_argument("--live", action="store_true", help="issue 45: live collector vs data dir, simulated ranks")
    ap.add_argument("--ranks", type=int, default=1024, help="--live: simulated ranks")
    ap.add_argument("--out", default=str(REPO / "benches" / "RESULTS-health.md"))
    args = ap.parse_args()
    if args.live:
        live_vs_data_dir(args)
        return
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
