"""What the collector spends decoding one envelope, by batch size: this tree's codec against a
baseline commit's, interleaved in the same run.

    python -m benches.decode [--baseline COMMIT] [--sizes 1,10,100,1000,16384]

At thousands of ranks each rank sends small batches (a step's few collectives, flushed every
100 ms), so the fixed cost per envelope, not the cost per record, bounds the ranks x records/s a
collector core holds. Timed: `pb.Envelope.FromString` + `codec.envelope_rows` of a comm batch
(fake-run rows, 15 columns), each side in its own process, rounds alternating.
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
from datetime import datetime, timezone
from pathlib import Path

from benches._common import baseline_tree, code_version
from benches._sections import replace_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = "c89f01e"  # the codec before it wrapped the wire's buffers
ROUNDS = 5

TIMER = r"""
import json, sys, time
from collector.data.codec import encode_batch, envelope_rows
from collector.testing.fake_runs import FakeRun
from proto import SCHEMA_VERSION, pb
out = {}
for rows in json.loads(sys.argv[1]):
    cols = FakeRun(run_id="bench", world_size=16).comm_columns(3, 0, rows)
    raw = pb.Envelope(schema_version=SCHEMA_VERSION, client_id="c", seq=2,
                      table=encode_batch("comm", "bench", 3, cols)).SerializeToString()
    n = max(3, 200_000 // max(rows, 100))
    envelope_rows(pb.Envelope.FromString(raw))
    t = time.process_time()
    for _ in range(n):
        envelope_rows(pb.Envelope.FromString(raw))
    out[rows] = (time.process_time() - t) / n * 1e6
print(json.dumps(out))
"""


def time_tree(tree: Path, sizes: list[int]) -> dict[int, float]:
    """CPU-µs per envelope, by rows, with the codec of ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    run = subprocess.run(
        [sys.executable, "-c", TIMER, json.dumps(sizes)], env=env, cwd=tree, capture_output=True, text=True, check=True
    )
    return {int(k): v for k, v in json.loads(run.stdout).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--sizes", default="1,10,100,1000,16384")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS-ingest.md")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    now, before = {r: [] for r in sizes}, {r: [] for r in sizes}
    with tempfile.TemporaryDirectory(prefix="rankscope-decode-") as tmp:
        base = baseline_tree(ROOT, args.baseline, Path(tmp) / "tree")
        for i in range(ROUNDS):
            for side, tree in ((now, ROOT), (before, base)) if i % 2 == 0 else ((before, base), (now, ROOT)):
                for rows, us in time_tree(tree, sizes).items():
                    side[rows].append(us)
            print(f"round {i + 1}/{ROUNDS}", flush=True)
    lines = []
    for rows in sizes:
        a, b = statistics.median(now[rows]), statistics.median(before[rows])
        lines.append(
            f"| {rows:,} | {a:,.0f} | {b:,.0f} | {a / rows:.2f} | {b / rows:.2f} | {b / a:.2f}x | "
            f"{1e6 / a * rows:,.0f} |"
        )
        print(lines[-1])
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    replace_section(
        args.out,
        f"""# Decoding an envelope, by batch size

Command: `python -m benches.decode --sizes {args.sizes}` &nbsp; Machine: {platform.machine()}, {os.cpu_count()} CPU
cores, {platform.system()}; {stamp}, commit {code_version(ROOT)}, 1-minute load average {load:.1f}.

CPU time of `pb.Envelope.FromString` + `codec.envelope_rows` for one comm batch (fake-run rows, 15 columns),
this tree against the codec of commit {args.baseline} (before it wrapped the wire's buffers instead of
building arrays with `pa.array`), each in its own process, {ROUNDS} rounds alternating; medians.

| rows | µs per envelope | baseline | µs per record | baseline | speed-up | records per CPU-s (decode alone) |
|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

At 100 rows per envelope (a rank's few steps of collectives) the decode alone bounds one collector core
to the last column's records per second; the Parquet write and the gRPC receive come on top.
""",
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
