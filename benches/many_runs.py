"""Many runs: a data dir holding 10,000 runs (a Hello each, then the stream closes), before and after.

    python -m benches.many_runs [--runs 10000] [--before 23a6b92] [--idle-s 60]

Each side (``--before REV``: the collector and query code of git revision REV, exported to a
temporary folder; then this tree's) runs the same steps in a child process of its own:

1. a collector (``rankscope collect``, defaults) receives ``--runs`` runs, one rank each: a stream
   opens, sends its Hello, is acked, and closes (the way a short job, or a job killed at once, looks);
   after ``--settle-s`` (its compaction passes) its CPU time over ``--idle-s`` seconds of idleness is
   taken, then it stops (SIGTERM);
2. the data dir's Parquet files are counted;
3. the run list as the dashboard loads it (``queries.list_runs`` on a fresh ``queries.Catalog``:
   cold, then warm, best of 3) and ``select count(*) from runs`` through ``rankscope sql``'s guarded
   path (``catalog.run_readonly_query``) and through ``catalog.connect`` (best of 3), each timed;
4. a collector is started again on the data dir with ``--metrics-port`` (every run is "running": none
   sent RunEnd) and, after ``--settle-s``, its CPU time over ``--idle-s`` seconds is taken.

Writes benches/RESULTS-many-runs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "23a6b92"  # main before the compact runs table (issue 28, item 9)
BATCH = 500  # streams open at once while the runs are sent


def send_runs(endpoint: str, n: int) -> None:
    """``n`` one-rank runs, each a stream that sends its Hello, is acked and closes."""
    from collector.testing.fake_runs import hello
    from collector.testing.streams import HeldStreams

    for start in range(0, n, BATCH):
        ids = range(start, min(n, start + BATCH))
        first = [[hello(f"c{i}", 1, f"many-{i:05d}", 0, 1)] for i in ids]
        with HeldStreams(endpoint, len(first), first=first) as held:
            deadline = time.monotonic() + 120
            while held.acked < len(first) and time.monotonic() < deadline:
                time.sleep(0.02)
            if held.acked < len(first):
                raise RuntimeError(f"only {held.acked} of {len(first)} Hellos acked")


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _idle_share(collector, idle_s: float) -> float:
    """Share of one core ``collector`` (a CollectorProcess) uses over the next ``idle_s`` seconds."""
    from benches._common import cpu_seconds

    c0, t0 = cpu_seconds(collector.proc.pid), time.monotonic()
    time.sleep(idle_s)
    return (cpu_seconds(collector.proc.pid) - c0) / (time.monotonic() - t0)


def measure(runs: int, settle_s: float, idle_s: float) -> dict:
    """Every figure for the code this process imports (run from a tree of its own by ``main``)."""
    from collector.data import catalog, layout, queries
    from collector.tools.launch import CollectorProcess

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rankscope-many-runs-") as tmp:
        data_dir = Path(tmp) / "data"
        t0 = time.perf_counter()
        with CollectorProcess(data_dir) as collector:
            send_runs(collector.address, runs)
            out["send_s"] = time.perf_counter() - t0
            time.sleep(settle_s)  # its compaction passes (the "after" code folds the runs' small segments)
            out["idle_cpu"] = _idle_share(collector, idle_s)
            collector.stop()

        files = [p for p in (data_dir / layout.PARQUET_DIR).rglob(f"*{layout.SEGMENT_SUFFIX}")]
        out["files"] = sum(1 for p in files if p.parent.name != layout.PLACEHOLDER_PARTITION)

        t0 = time.perf_counter()
        cat = queries.Catalog(data_dir)
        listed = queries.list_runs(cat)
        out["list_runs_cold_s"] = time.perf_counter() - t0
        assert len(listed) == runs, len(listed)
        out["list_runs_warm_s"] = _best(lambda: queries.list_runs(cat))
        cat.close()

        def guarded():
            n = catalog.run_readonly_query(data_dir, "select count(*) from runs").column(0)[0].as_py()
            assert n == runs, n

        def connected():
            con = catalog.connect(data_dir)
            try:
                (n,) = con.execute("select count(*) from runs").fetchone()
                assert n == runs, n
            finally:
                con.close()

        out["count_sql_s"] = _best(guarded)
        out["count_connect_s"] = _best(connected)

        # a collector started on the data dir with /metrics: every run is 'running' (no RunEnd)
        with CollectorProcess(data_dir, "--metrics-port", "0") as collector:
            time.sleep(settle_s)
            out["idle_cpu_metrics"] = _idle_share(collector, idle_s)
    return out


def _side(tree: Path, label: str, args) -> dict:
    """``measure`` in a child process importing the code of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # this file run as a script: its own folder first on the path, then ``tree``'s collector and benches
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", "--runs", str(args.runs)]
    cmd += ["--settle-s", str(args.settle_s), "--idle-s", str(args.idle_s)]
    print(f"[many-runs] {label}: {args.runs} runs ...", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{label} failed: {proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    print(f"[many-runs] {label}: {result} ({time.monotonic() - t0:.0f} s)", flush=True)
    return result


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--before", default=BEFORE, help="git revision of the baseline ('' to skip it)")
    parser.add_argument("--settle-s", type=float, default=20.0)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--out", default=str(HERE / "RESULTS-many-runs.md"))
    parser.add_argument("--measure", action="store_true", help="one side only, printed as JSON (what main runs)")
    args = parser.parse_args(argv)
    if args.measure:
        print("RESULT", json.dumps(measure(args.runs, args.settle_s, args.idle_s)), flush=True)
        return 0

    from benches._common import baseline_tree, code_version

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = _load()
    sides = []
    with tempfile.TemporaryDirectory(prefix="rankscope-many-runs-tree-") as tmp:
        if args.before:
            tree = baseline_tree(ROOT, args.before, Path(tmp) / "before")
            sides.append((f"code of {args.before} (before)", _side(tree, args.before, args)))
        sides.append((f"this code ({code_version(ROOT)})", _side(ROOT, "this code", args)))
    load_after = _load()

    command = f"python -m benches.many_runs --runs {args.runs}" + (f" --before {args.before}" if args.before else "")
    lines = [
        f"# Many runs: {args.runs:,} runs in one data dir",
        "",
        f"- command: `{command}` (idle window {args.idle_s:g} s after {args.settle_s:g} s of start-up)",
        f"- measured {started}, {code_version(ROOT)}; {os.cpu_count()} cores, no GPU, "
        f"{platform.machine()} Linux VM shared with other jobs (load {load_before} -> {load_after})",
        f"- data: {args.runs:,} one-rank runs, each a stream that sent its Hello and closed (no RunEnd), "
        "written through a `rankscope collect` of the code measured, whose idle CPU is then taken "
        f"({args.settle_s:g} s after the last Hello); files counted once it stopped; the `--metrics-port` "
        "figure is a second collector started on that data dir",
        "",
        "| code | Parquet files | run list, cold s | run list, warm s | `select count(*) from runs`, "
        "`rankscope sql` s | same, `catalog.connect` s | idle collector, share of a core "
        "| idle with `--metrics-port` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in sides:
        lines.append(
            f"| {label} | {r['files']:,} | {r['list_runs_cold_s']:.2f} | {r['list_runs_warm_s']:.2f} "
            f"| {r['count_sql_s']:.2f} | {r['count_connect_s']:.2f} | {100 * r['idle_cpu']:.1f}% "
            f"| {100 * r['idle_cpu_metrics']:.1f}% |"
        )
    lines += [
        "",
        "Run list: `collector.data.queries.list_runs` (what the dashboard's sidebar and Runs page load) on a "
        "fresh `queries.Catalog` (cold: the catalog opened and the first query; warm: best of 3 more). "
        "`select count(*)`: best of 3. Idle CPU: user + system time of the collector process over the window.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
