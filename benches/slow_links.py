"""Slow links (collector/data/findings/links.py): how fast a slow host link is found, how often a
healthy run raises one, and what the analysis costs.

    python -m benches.slow_links [--ranks 1024] [--hosts 128] [--steps 120] [--seeds 3] [--world-only] [--out FILE]
    python -m benches.slow_links --only tie-break [--runs 4] [--healthy-runs 2] [--busy 0,10] [--raw-every N]

Targets (issue 31): a 4x slow link named within 10 steps of its onset, the right host, at 1,024
ranks on 128 hosts; no finding on healthy runs; `rankscope health` at that scale <= 3 s.

Method. `rankscope simulate` runs (collector/tools/simulate/: the ZeRO-2 template step plus an
all_reduce inside each host and with each neighbouring host, --host-groups), written into a data dir
through the collector's Store, then read back as `rankscope health` reads them:
- detection delay: one host's link FACTOR times slower (2x, 4x, 10x) from step S for each seed; the
  delay is the finding's ``detected_step`` (the CUSUM's alarm) less S, in steps and in the simulated
  step's seconds; the host named must be the slowed one;
- ``--world-only``: the same on runs whose only group is the world (plain DDP/FSDP: no host groups;
  the host is named by its telemetry's arrival, collector/tools/simulate/telemetry.py), its own
  section;
- false alarms: healthy --host-groups runs (each seed) and healthy runs with a 40 ms compute
  straggler: any slow_link finding counts;
- cost: ``findings.links.slow_links`` on the run's query results, per rank-step (median of 5), and its
  queries (``link_transfers``, ``group_members`` over the comm rollup); the whole `rankscope health
  RUN` as a fresh process (median of 3), with its findings.

The 2-host tie-break (``--only tie-break``; collector.data.findings.link_side): real gloo runs of
2 namespace hosts x 2 ranks (collector.testing.multihost.train_on_hosts, 55 steps), host 0's or
host 1's link (alternately) tbf-throttled to 50 mbit at loop index 20 and restored at 40, and
unthrottled runs; each run's slow_link finding counted as the throttled host named alone, an "or"
of both, the other host alone (wrong), or none, with the 1-minute load average at its start and
end. ``--busy K,...``: the same runs again beside K busy-looping processes of this bench, started a
minute before (the tie-break reads the spacing of the telemetry's arrivals, which a loaded host
jitters too). Needs
root and iproute2 (network namespaces); otherwise it says why and measures nothing.
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

from benches._common import code_version
from benches._sections import replace_section
from benches.dashboard_queries import machine
from collector.data import findings, queries
from collector.data.findings import links
from collector.testing import multihost, netns
from collector.testing.cpu_hog import cpu_hog
from collector.tools import simulate

REPO = Path(__file__).resolve().parents[1]


def write(sim: simulate.Simulation, work: Path) -> Path:
    d = work / sim.run_id
    simulate.write_data_dir(sim, d)
    return d


def found(d: Path, run_id: str) -> list[findings.Finding]:
    cat = queries.Catalog(d)
    try:
        return findings.for_run(cat, run_id)
    finally:
        cat.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Slow links: detection delay, false alarms, cost; the 2-host tie-break.")
    p.add_argument("--only", choices=("scale", "tie-break"), help="one part (default: both)")
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--hosts", type=int, default=128)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--world-only", action="store_true", help="scale: the world group only (plain DDP/FSDP)")
    p.add_argument("--runs", type=int, default=4, help="tie-break: throttled runs per load level")
    p.add_argument("--healthy-runs", type=int, default=2, help="tie-break: unthrottled runs per load level")
    p.add_argument("--busy", default="0", help="tie-break: busy-looping processes beside the runs, per level")
    p.add_argument("--raw-every", type=int, default=0, help="tie-break: the collector's collect --raw-every")
    p.add_argument("--out", default=str(REPO / "benches" / "RESULTS-slow-links.md"))
    args = p.parse_args(argv)
    parts = [args.only] if args.only else ["scale", "tie-break"]
    for part in parts:
        text = scale(args) if part == "scale" else tie_break(args)
        print(text)
        replace_section(Path(args.out), text)
    return 0


def scale(args) -> str:
    onset, slow_host = args.steps // 2, args.hosts // 3
    shape = dict(ranks=args.ranks, hosts=args.hosts, steps=args.steps, world_only=args.world_only)
    groups = {} if args.world_only else {"host_groups": True}
    delay_rows, alarm_rows, cost_rows = [], [], []
    with tempfile.TemporaryDirectory(prefix="rankscope-links-") as tmp:
        work = Path(tmp)
        for factor in (2.0, 4.0, 10.0):
            delays, named = [], 0
            for seed in range(args.seeds):
                link = simulate.SlowLink(slow_host, factor, onset)
                sim = simulate.Simulation(**shape, slow_links=(link,), seed=seed, run_id=f"slow{factor:g}x-{seed}")
                got = [f for f in found(write(sim, work), sim.run_id) if f.kind == "slow_link"]
                ok = [f for f in got if f.evidence["hosts"] == [[sim.host(slow_host * sim.ranks_per_host)]]]
                named += bool(ok) and len(got) == 1
                if ok:
                    delays.append(ok[0].evidence["detected_step"] - onset)
                period_s = sim.step_period_ns / 1e9
            med = statistics.median(delays) if delays else float("nan")
            delay_rows.append(
                f"| {factor:g}x | {named}/{args.seeds} | {med:.0f} ({min(delays, default=0)}-{max(delays, default=0)}) "
                f"| {med * period_s:.2f} s (step {1e3 * period_s:.0f} ms) |"
            )
        for label, extra in (
            ("healthy", {}),
            ("compute straggler 40 ms", {"stragglers": (simulate.Straggler(7, 40_000_000, onset),)}),
        ):
            alarms = 0
            for seed in range(args.seeds):
                sim = simulate.Simulation(
                    **shape, **groups, seed=seed, run_id=f"calm-{seed}-{len(alarm_rows)}", **extra
                )
                alarms += sum(f.kind == "slow_link" for f in found(write(sim, work), sim.run_id))
            alarm_rows.append(f"| {label} | {args.seeds} | {alarms} |")

        # cost, on the 4x run of seed 0
        sim = simulate.Simulation(**shape, slow_links=(simulate.SlowLink(slow_host, 4.0, onset),), run_id="cost")
        d = write(sim, work)
        cat = queries.Catalog(d)
        rollup = queries.comm_rollup(cat, "cost")
        t0 = time.perf_counter()
        frames = (
            queries.link_transfers(rollup, links.MIN_BYTES),  # as findings.for_run asks
            queries.group_members(rollup),
            queries.ranks(cat, "cost"),
        )
        query_s = time.perf_counter() - t0
        steps = queries.step_analysis(cat, "cost")
        cat.close()
        samples = []
        for _ in range(5):
            t0 = time.perf_counter()
            links.slow_links(*frames, steps)
            samples.append(time.perf_counter() - t0)
        analysis_s = statistics.median(samples)
        rank_steps = args.ranks * args.steps
        health = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "collector.tools.cli", "health", "cost", "--data-dir", str(d)],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            health.append(time.perf_counter() - t0)
        cost_rows += [
            f"| slow_links() on the query results | {1e3 * analysis_s:.0f} ms "
            f"| {1e6 * analysis_s / rank_steps:.2f} µs |",
            f"| its queries (link_transfers, group_members, ranks) | {1e3 * query_s:.0f} ms "
            f"| {1e6 * query_s / rank_steps:.2f} µs |",
            f"| `rankscope health RUN` (fresh process, median of 3) | {statistics.median(health):.2f} s "
            f"(max {max(health):.2f}) | {1e6 * statistics.median(health) / rank_steps:.2f} µs |",
        ]
        said = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]

    load = os.getloadavg()
    return "\n".join(
        [
            "# Slow links, world group only" if args.world_only else "# Slow links",
            "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}; {code_version(REPO)}; "
            f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}. Command: `python -m "
            f"benches.slow_links --ranks {args.ranks} --hosts {args.hosts} --steps {args.steps} --seeds {args.seeds}"
            f"{' --world-only' if args.world_only else ''}` "
            f"(`rankscope simulate`: host {slow_host}'s link slowed from step {onset}, {args.seeds} seeds each).",
            "",
            "Detection delay (the CUSUM's alarm less the onset):",
            "",
            "| link slower by | right host named, alone | delay in steps: median (range) | delay in time |",
            "|---|---:|---:|---:|",
            *delay_rows,
            "",
            "False alarms (slow_link findings on runs without a slow link):",
            "",
            "| runs | count | slow_link findings |",
            "|---|---:|---:|",
            *alarm_rows,
            "",
            f"Cost, {args.ranks} ranks x {args.steps} steps ({rank_steps:,} rank-steps), the 4x run:",
            "",
            "| what | time | per rank-step |",
            "|---|---:|---:|",
            *cost_rows,
            "",
            f"`rankscope health` said: {said}",
        ]
    )


TIE_BREAK_STEPS, THROTTLE = 55, "50mbit@20-40"  # as tests/integration/test_slow_links.py
WARM_UP_S = 60


def tie_break(args) -> str:
    """The 2-host tie-break's outcomes over real namespace runs, per load level (module docstring)."""
    if (reason := netns.unavailable()) is not None:
        return f"# Slow links: which of two hosts\n\nNot measured: network namespaces are unavailable ({reason})."
    levels = [int(x) for x in args.busy.split(",")]
    rows, summary = [], []
    with tempfile.TemporaryDirectory(prefix="rankscope-tie-") as tmp:
        for busy in levels:
            with cpu_hog(busy, settle_s=WARM_UP_S):  # until the 1-minute load average shows them
                plan = [i % 2 for i in range(args.runs)] + [None] * args.healthy_runs  # throttled host, or none
                got = [
                    one_hosts_run(Path(tmp) / f"busy{busy}-{i}", host, args.raw_every) for i, host in enumerate(plan)
                ]
            rows += [f"| {busy} | {run['row']} |" for run in got]
            throttled = [r["outcome"] for r in got if r["host"] is not None]
            healthy = [r["outcome"] for r in got if r["host"] is None]
            loads = [x for r in got for x in r["load"]]
            summary.append(
                f"| {busy} | {min(loads):.1f}-{max(loads):.1f} | {len(throttled)} | {throttled.count('alone')} "
                f"| {throttled.count('or')} | {throttled.count('wrong')} | {throttled.count('none')} "
                f"| {len(healthy)} | {len(healthy) - healthy.count('none')} |"
            )
    return "\n".join(
        [
            "# Slow links: which of two hosts",
            "",
            f"Measured {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on a {machine()}; {code_version(REPO)}. "
            f"Command: `python -m benches.slow_links --only tie-break --runs {args.runs} --healthy-runs "
            f"{args.healthy_runs} --busy {args.busy}{f' --raw-every {args.raw_every}' if args.raw_every else ''}` "
            f"(2 namespace hosts x 2 gloo ranks, {TIE_BREAK_STEPS} steps; a throttled run has host 0's or host 1's "
            f"link, alternately, at {THROTTLE.replace('@', ' from loop index ').replace('-', ' to ')}; "
            "collector.testing.multihost). Every cross-host group spans both hosts, so the groups' transfer times "
            "fit either host's link; the finding names one host alone only where that host's telemetry flushes "
            "arrived unevenly and the other's did not (collector.data.findings.link_side).",
            "",
            '| busy loops beside | 1-min load | throttled runs | named the throttled host alone | "or" of both '
            "| the other host alone (wrong) | no finding | unthrottled runs | with a slow_link finding |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
            *summary,
            "",
            "Per run (load: the 1-minute load average at its start and end; jitter: each host's median flush "
            "jitter during the slowdown, z: the one-sided Mann-Whitney test of the top host against the other):",
            "",
            "| busy loops | throttled | load | outcome | finding's hosts | jitter (ms) | z | onset / end |",
            "|---:|---|---|---|---|---|---:|---|",
            *rows,
        ]
    )


def one_hosts_run(work: Path, host: int | None, raw_every: int) -> dict:
    """One 2-host run, host ``host``'s link throttled (None: none); its outcome and its table row."""
    throttle = multihost.Throttle.parse(f"{host}:{THROTTLE}") if host is not None else None
    before = os.getloadavg()[0]
    run = multihost.train_on_hosts(
        work, hosts=2, ranks_per_host=2, steps=TIE_BREAK_STEPS, throttle=throttle, raw_every=raw_every
    )
    after = os.getloadavg()[0]
    cat = queries.Catalog(run.data_dir)
    try:
        got = [f for f in findings.for_run(cat, queries.resolve_run(cat.con, run.name)) if f.kind == "slow_link"]
    finally:
        cat.close()
    named = [sorted(h for c in f.evidence["hosts"] for h in c) for f in got]
    if not got:
        outcome = "none"
    elif host is None:
        outcome = "found"  # a false alarm
    elif got[0].evidence["hosts"] == [[f"host-{host}"]]:
        outcome = "alone"
    elif got[0].evidence["hosts"] == [[f"host-{1 - host}"]]:
        outcome = "wrong"
    else:
        outcome = "or"
    first = got[0].evidence if got else {}
    jitter = ", ".join(f"{h} {ms:.1f}" for h, ms in sorted((first.get("telemetry_jitter_ms") or {}).items()))
    z = first.get("telemetry_jitter_z")
    row = (
        f"{'-' if host is None else f'host-{host}'} | {before:.1f} -> {after:.1f} | {outcome} "
        f"| {'; '.join(' or '.join(n) for n in named) or '-'} | {jitter or '-'} | {'-' if z is None else f'{z:.1f}'} "
        f"| {first.get('onset_step', '-')} / {first.get('end_step', '-')} "
    )
    return {"host": host, "outcome": outcome, "load": (before, after), "row": row}


if __name__ == "__main__":
    sys.exit(main())
