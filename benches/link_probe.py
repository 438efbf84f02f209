"""What a link probe costs the job, and what it says: ``rankscope probe`` beside real training.

Gloo ranks on network namespace hosts (collector/testing/multihost.py, the world group only) stream
to a collector in a third namespace; at loop index PROBE_AT the CLI probes the run from the
collector's namespace, as a user would. Per run: how long the probe took, the steps it overlapped
(its rows' steps), rank 0's step time over those steps against the median of the BASELINE steps
before it (the same run's side-by-side baseline), the extra seconds the job spent, and the verdict.
A throttled case (host-0's link at 120 Mbit/s from loop index THROTTLE_AT) shows the probe naming the
host the telemetry could not; its cost there is on steps already slowed by the link.

    python -m benches.link_probe [--runs 2]     # writes benches/RESULTS-link-probe.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE_AT, THROTTLE_AT, STEPS, BASELINE = 25, 15, 45, 8
CASES = (  # name, mode, hosts, ranks a host, throttle or None
    ("ddp 3x1 healthy", "ddp", 3, 1, None),
    ("fsdp2 2x2 healthy", "fsdp2", 2, 2, None),
    ("fsdp2 2x2 host-0 at 120 Mbit/s", "fsdp2", 2, 2, f"0:120mbit@{THROTTLE_AT}"),
)


def one(name: str, mode: str, hosts: int, per_host: int, throttle: str | None, work: Path) -> dict:
    from collector.data import queries
    from collector.testing import multihost

    out = work / "probe.out"
    data = work / "run" / "data"

    def probe_now(net) -> None:
        endpoint = f"{net.ip('collector')}:{multihost.COLLECTOR_PORT}"
        argv = [sys.executable, "-m", "collector.tools.cli", "probe", "hosts", "--json", "--endpoint", endpoint]
        argv += ["--data-dir", str(data)]
        net.popen("collector", argv, stdout=out.open("w"), stderr=subprocess.DEVNULL, cwd=REPO)

    run = multihost.train_on_hosts(
        work / "run",
        hosts=hosts,
        ranks_per_host=per_host,
        steps=STEPS,
        workload=multihost.WORLD_WORKLOAD,
        workload_args=("--mode", mode, "--width", "256", "--layers", "8"),
        throttle=multihost.Throttle.parse(throttle) if throttle else None,
        at_steps={PROBE_AT: probe_now},
    )
    cat = queries.Catalog(run.data_dir)
    try:
        probes = queries.probes(cat, queries.resolve_run(cat.con, run.name))
    finally:
        cat.close()
    report = json.loads(out.read_text())
    measured = probes[probes.status == "measured"]
    # hook steps count from 1: loop index = step - 1; the probe overlapped these loop indexes
    first, last = int(measured.step.min()) - 1, int(measured.step.max()) - 1
    t = run.step_times
    base = statistics.median(t[first - BASELINE : first])
    during = t[first : last + 1]
    return {
        "case": name,
        "probe_s": report["seconds"],
        "steps": len(during),
        "base_ms": 1e3 * base,
        "during_ms": 1e3 * statistics.mean(during),
        "extra_s": sum(during) - base * len(during),
        "verdict": report["sentence"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="runs of each case (default 2)")
    p.add_argument("--out", default=str(REPO / "benches" / "RESULTS-link-probe.md"))
    args = p.parse_args(argv)
    from collector.testing import netns

    why = netns.unavailable()
    if why is not None:
        print(f"benches.link_probe: skipped, network namespaces: {why}")
        return 0
    rows = []
    t0 = time.monotonic()
    for name, mode, hosts, per_host, throttle in CASES:
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="rankscope-probe-") as tmp:
                row = one(name, mode, hosts, per_host, throttle, Path(tmp))
            rows.append(row)
            print(row, flush=True)
    lines = [
        "# Link probe: what it costs the job, what it says",
        "",
        f"Command: `python -m benches.link_probe --runs {args.runs}`; {platform.node()}, "
        f"{platform.machine()}, {os.cpu_count()} cores; {(time.monotonic() - t0) / 60:.1f} min. "
        f"Probe: 4 MiB each way per pair (the default), one pair at a time, at loop index {PROBE_AT}; baseline: "
        f"rank 0's median step over the {BASELINE} steps before the probe, same run.",
        "",
        "| case | probe s | steps overlapped | step before, ms | step during, ms | job's extra s | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['probe_s']:.1f} | {r['steps']} | {r['base_ms']:.0f} | {r['during_ms']:.0f} | "
            f"{r['extra_s']:+.2f} | {r['verdict']} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
