"""A network partition between ranks and the collector, minutes long, under load (issue 49).

Target: training goes on at its speed through the partition; a rank's memory stays within
``telemetry.max_unacked_bytes`` plus what arrives before its keepalive pings fail, its spool within
``telemetry.max_spool_bytes`` (the oldest dropped beyond it, counted); after the heal every record
not counted as dropped is stored exactly once; the run's findings name the gap (``network_gap``)
and no rank stopped, silent or hung.

Method (collector.testing.partition): 2 gloo ranks in one network namespace, the collector in
another; each step 50 ms asleep, a 16 KiB all_reduce and ``--rows`` timers rows (200: ~4,000 rows
and ~100 KB of telemetry a second per rank). After ``--warm`` s every packet on the collector's
link is dropped (both ways: the ranks' stream hangs rather than being refused) for ``--partition``
s, then healed; the ranks train ``--after`` s more and stop. The step times, memory, un-acked bytes
and spool bytes are each rank's own (sampled every 0.5 s); before / during / after are the same run.

    .venv/bin/python -m benches.partition [--partition 600] [--max-spool-mib 8] [--rows 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benches._common import code_version
from collector.testing.partition import outcome, partition_run, phases

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _step_phases(run) -> dict[str, list[float]]:
    """Every step's seconds, by the phase its sample fell in (each sample is taken after a step)."""
    out = {"before": [], "during": [], "after": []}
    for report in run.reports:
        marks = [(s["step"], s["t"]) for s in report["samples"]]
        for step, secs in enumerate(report["step_s"]):
            t = next((t for k, t in marks if k >= step), marks[-1][1])
            out["before" if t < run.cut_at else "during" if t < run.healed_at else "after"].append(secs)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--partition", type=float, default=600.0)
    p.add_argument("--warm", type=float, default=20.0)
    p.add_argument("--after", type=float, default=30.0)
    p.add_argument("--rows", type=int, default=200)
    p.add_argument("--max-spool-mib", type=float, default=8.0, help="each rank's spool limit (0: the default)")
    a = p.parse_args(argv)
    limit = int(a.max_spool_mib * MIB) or None
    started = time.strftime("%H:%M", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="rankscope-partition-") as tmp:
        run = partition_run(
            Path(tmp),
            warm_s=a.warm,
            partition_s=a.partition,
            after_s=a.after,
            rows=a.rows,
            max_spool_bytes=limit,
            timeout_s=a.partition + 600,
        )
        got = outcome(run)
    steps, samples = _step_phases(run), phases(run)
    print("| phase | steps | step p50 | step p99 | step max | RSS max | un-acked max | spool max |")
    print("|---|---|---|---|---|---|---|---|")
    for phase in ("before", "during", "after"):
        s, sm = np.array(steps[phase]), samples[phase]
        print(
            f"| {phase} | {len(s):,} | {1e3 * np.median(s):.1f} ms | {1e3 * np.percentile(s, 99):.1f} ms | "
            f"{1e3 * s.max():.0f} ms | {max(x['rss'] for x in sm) / MIB:.0f} MiB | "
            f"{max(x['unacked'] for x in sm) / MIB:.2f} MiB | {max(x['spool'] for x in sm) / MIB:.2f} MiB |"
        )
    drained = [x["t"] - run.healed_at for x in samples["after"] if x["spool"] == 0 and x["unacked"] < MIB]
    gaps = [f for f in got.found if f.kind == "network_gap"]
    wrong = [f.text for f in got.found if f.kind in ("rank_stopped", "silent_rank", "hang", "stuck")]
    print(
        f"\nrows: made {got.made:,}, stored {got.stored:,} ({got.stored - got.distinct} twice), counted dropped "
        f"{got.dropped:,}, lost uncounted {max(0, got.made - got.stored - got.dropped):,}, counted dropped but "
        f"stored (their ack lost in the partition) {max(0, got.stored + got.dropped - got.made):,}; spool limit "
        f"{(limit or 0) / MIB:.0f} MiB per rank; spool empty {drained[0] if drained else float('nan'):.1f} s "
        f"after the heal\nfindings: {[f.text for f in gaps]}; stopped/silent/hung: {wrong or 'none'}\n"
        f"health (exit {got.health.returncode}):\n{got.health.stdout}"
    )
    load = os.getloadavg()
    print(
        f"{code_version(ROOT)}; {platform.node()}, {os.cpu_count()} cores, load {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end; Python {platform.python_version()}; {started}-"
        f"{time.strftime('%H:%M UTC %Y-%m-%d', time.gmtime())}"
    )
    counted = got.stored <= got.made <= got.stored + got.dropped
    ok = got.stored == got.distinct and counted and len(gaps) == 1 and not wrong
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
