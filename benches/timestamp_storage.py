"""Bytes on disk per rank-step, wall-clock columns in µs (this code) vs ns (the code of ``--before REV``).

A simulated run (``rankscope simulate``'s engine step) is written through the collector's Store and
compacted (``simulate --data-dir``); the bytes of every table under D/parquet are summed, and those of
the collector tables that hold the timestamps (runs, ranks, rank_ends, rank_events) apart. ``--before``
writes the same run with the collector code of git revision REV (exported to a temporary folder).

    python -m benches.timestamp_storage [--ranks 64 --steps 50] [--before REV]
Writes benches/RESULTS-timestamps.md.
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
from benches.retention_storage import _export

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TIMESTAMP_TABLES = ("runs", "ranks", "rank_ends", "rank_events")


def measure(ranks: int, steps: int, d: Path) -> dict:
    import pyarrow.parquet as pq

    from collector.tools import simulate

    simulate.write_data_dir(simulate.Simulation(ranks=ranks, steps=steps, run_id="bench-timestamps"), d)
    files = [p for p in (d / "parquet").rglob("*.parquet") if "run=@schema" not in p.parts[-2]]
    stamps = [p for p in files if p.parts[-3] in TIMESTAMP_TABLES]
    units = sorted({str(f.type) for p in stamps for f in pq.read_schema(p) if str(f.type).startswith("timestamp")})
    return {
        "total": sum(p.stat().st_size for p in files),
        "collector_tables": sum(p.stat().st_size for p in stamps),
        "units": units,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.timestamp_storage", description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=64)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--before", default=None, metavar="REV", help="also measure the collector code of git REV")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # the --before subprocess: JSON here
    p.add_argument("--out", default=str(HERE / "RESULTS-timestamps.md"))
    args = p.parse_args(argv)
    if args.only:
        with tempfile.TemporaryDirectory() as tmp:
            Path(args.only).write_text(json.dumps(measure(args.ranks, args.steps, Path(tmp) / "data")))
        return 0

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.before:
            old = _export(args.before, tmp / "before")
            out = tmp / "before.json"
            sub = ["--ranks", str(args.ranks), "--steps", str(args.steps), "--only", str(out)]
            env = dict(os.environ, PYTHONPATH=f"{old}{os.pathsep}{ROOT}")
            subprocess.run([sys.executable, "-m", "benches.timestamp_storage", *sub], cwd=old, env=env, check=True)
            rows[f"code of {args.before}"] = json.loads(out.read_text())
        rows["this code"] = measure(args.ranks, args.steps, tmp / "now")

    n = args.ranks * args.steps
    lines = [
        "# Timestamps in µs: bytes on disk per rank-step",
        "",
        f"- command: `{' '.join(['python -m benches.timestamp_storage', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version(ROOT)}",
        f"- run: {args.ranks} ranks x {args.steps} steps of `rankscope simulate`'s engine step, written through "
        "the Store and compacted (`simulate --data-dir`); placeholders left out",
        "",
        "| code | timestamp types | all tables B | B per rank-step | runs+ranks+rank_ends+rank_events B |",
        "|---|---|---:|---:|---:|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {', '.join(r['units'])} | {r['total']:,} | {r['total'] / n:.1f} | {r['collector_tables']:,} |"
        )
    lines += [
        "",
        "Only the collector tables hold timestamp columns (a row or two per rank per run), so the unit moves "
        "bytes per rank-step by a rounding error; the change is for the engines that refuse TIMESTAMP(NANOS).",
    ]
    publish(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
