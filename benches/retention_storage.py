"""Bytes on disk with ``--raw-every 10``: a run kept fully raw vs thinned by retention, live-style.

A simulated run (``rankscope simulate``'s engine step, one rank 40 ms late over the last quarter
of the steps) arrives the way a live run does: every rank's comm rows a few steps at a time, one
store flush per chunk, retention passes in between (collector.server.retention, windows of
``--window`` settled steps). Chunks do not line up with windows, so most windows cut through a
flushed segment: the case where retention used to keep the straddling segment's raw rows whole.

Baseline in the same run: the same rows written with every step kept (``simulate --data-dir``).
``--before REV`` also runs the thinned half with the collector code of git revision REV (exported
to a temporary folder; this bench's own code drives it), so the code before and after a change
are measured side by side.

    python -m benches.retention_storage [--ranks 32 --steps 300 --collectives-per-step 100 --chunk 7
                                         --window 50] [--before REV]
Writes benches/RESULTS-retention.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RAW_EVERY = 10


def _bytes(d: Path, table: str) -> int:
    return sum(p.stat().st_size for p in (d / "parquet" / table).rglob("*.parquet"))


def _raw_steps(d: Path) -> list[int]:
    import pyarrow.parquet as pq

    files = list((d / "parquet" / "comm").rglob("*.parquet"))
    return sorted({s for f in files for s in pq.read_table(f, columns=["step"])["step"].to_pylist()})


def _simulation(args):
    from collector.tools import simulate

    late = simulate.Straggler(5, 40_000_000, args.steps * 3 // 4)
    return simulate.Simulation(
        ranks=args.ranks,
        steps=args.steps,
        collectives_per_step=args.collectives_per_step,
        stragglers=(late,),
        run_id="bench-retention",
    )


def thinned(args, d: Path) -> dict:
    """Stream the run into a Store chunk by chunk with retention passes between; the figures."""
    from collector.data import catalog
    from collector.data.codec import envelope_rows
    from collector.server.compaction import CompactionConfig
    from collector.server.retention import Retention
    from collector.server.store import Store
    from collector.tools.importers.sink import envelope

    sim = _simulation(args)
    comm = sim.block(0, sim.ranks)["comm"]
    step = comm.column("step").to_numpy()
    catalog.ensure_catalog(d)
    store = Store(d)
    retention = Retention(d, store.ledger, CompactionConfig(raw_every=RAW_EVERY, retention_window=args.window))
    partition = d / "parquet" / "comm" / f"run={sim.run_id}"
    seq = iter(range(1, 1 << 30))

    def submit(rows) -> None:
        store.submit("bench", next(seq), rows, lambda e: None)
        store.flush()
        while retention.run(partition):
            pass

    t0 = time.perf_counter()
    submit([r for rank in range(sim.ranks) for r in envelope_rows(envelope("h", 1, hello=sim.hello(rank)))])
    for first in range(0, sim.steps, args.chunk):
        submit([("comm", sim.run_id, comm.filter((step >= first) & (step < first + args.chunk)))])
    submit([r for rank in range(sim.ranks) for r in envelope_rows(envelope("e", 1, end=sim.run_end(rank)))])
    took = time.perf_counter() - t0
    store.close()
    kept = _raw_steps(d)
    return {
        "comm_bytes": _bytes(d, "comm"),
        "rollup_bytes": _bytes(d, "comm_steps"),
        "raw_steps": len(kept),
        "off_sample": len([s for s in kept if s % RAW_EVERY]),
        "windows": retention.windows,
        "seconds": took,
    }


def _export(rev: str, into: Path) -> Path:
    """``collector`` and ``proto`` of git revision ``rev``, stubs generated, under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "collector", "proto"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    env = dict(os.environ, PYTHONPATH=str(into))
    subprocess.run([sys.executable, "-m", "proto.generate"], cwd=into, env=env, check=True, capture_output=True)
    return into


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.retention_storage", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=32)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument(
        "--collectives-per-step", type=int, default=100, help="the engine step's pattern repeated (ZeRO-3-like)"
    )
    p.add_argument("--chunk", type=int, default=7, help="steps per flush (as a live run's ranks deliver them)")
    p.add_argument("--window", type=int, default=50, help="retention_window: settled steps per retention pass")
    p.add_argument("--before", default=None, metavar="REV", help="also measure the collector code of git REV")
    p.add_argument("--thinned-only", default=None, help=argparse.SUPPRESS)  # the --before subprocess: JSON here
    p.add_argument("--out", default=str(HERE / "RESULTS-retention.md"))
    args = p.parse_args(argv)
    if args.thinned_only:
        with tempfile.TemporaryDirectory() as tmp:
            Path(args.thinned_only).write_text(json.dumps(thinned(args, Path(tmp) / "data")))
        return 0

    from collector.tools import simulate

    load = [os.getloadavg()[0]]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        full = tmp / "full"
        sim = _simulation(args)
        simulate.write_data_dir(sim, full)
        rows["every step kept (baseline)"] = {
            "comm_bytes": _bytes(full, "comm"),
            "rollup_bytes": 0,
            "raw_steps": len(_raw_steps(full)),
            "off_sample": len([s for s in _raw_steps(full) if s % RAW_EVERY]),
            "windows": 0,
            "seconds": float("nan"),
        }
        if args.before:
            old = _export(args.before, tmp / "before")
            out = tmp / "before.json"
            sub = [a for a in argv if a != "--before" and a != args.before] + ["--thinned-only", str(out)]
            env = dict(os.environ, PYTHONPATH=f"{old}{os.pathsep}{ROOT}")
            subprocess.run([sys.executable, "-m", "benches.retention_storage", *sub], cwd=old, env=env, check=True)
            rows[f"--raw-every {RAW_EVERY}, code of {args.before}"] = json.loads(out.read_text())
        rows[f"--raw-every {RAW_EVERY}, this code"] = thinned(args, tmp / "thinned")
    load.append(os.getloadavg()[0])

    n = args.ranks * args.steps
    lines = [
        f"# Retention: bytes on disk with --raw-every {RAW_EVERY}",
        "",
        f"- command: `{' '.join(['python -m benches.retention_storage', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version(ROOT)}, "
        f"{os.cpu_count()}-core VM shared with other jobs (1-minute load {load[0]:.1f} -> {load[-1]:.1f})",
        f"- run: {args.ranks} ranks x {args.steps} steps of `rankscope simulate`'s engine step ({sim.per_step} "
        f"collectives a rank-step), rank 5 40 ms late from step {args.steps * 3 // 4}; delivered {args.chunk} steps "
        f"per flush, retention windows of {args.window} settled steps",
        "",
        "| run | comm raw B | comm_steps rollup B | total comm B | B per rank-step | raw steps kept | "
        f"of them off the every-{RAW_EVERY} sample | retention passes | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        total = r["comm_bytes"] + r["rollup_bytes"]
        lines.append(
            f"| {name} | {r['comm_bytes']:,} | {r['rollup_bytes']:,} | {total:,} | {total / n:.0f} | "
            f"{r['raw_steps']} | {r['off_sample']} | {r['windows']} | {r['seconds']:.1f} |"
        )
    lines += [
        "",
        f"Raw steps off the sample are the steps with findings (the late rank's, from step {args.steps * 3 // 4}) "
        "and, before segments straddling a window were split, the steps of those segments kept whole.",
    ]
    publish(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
