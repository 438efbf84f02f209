"""`rankscope import` of Flight Recorder dumps: records (entries) per second, from real dumps.

A 2-rank gloo job (torch.distributed.run) with ``TORCH_FR_BUFFER_SIZE`` issues ``--collectives``
all_reduces and dumps its Flight Recorder: rank 0 as JSON, rank 1 as a pickle. Timed, best of
``--rounds``: parsing the dumps (collector.tools.importers.dispatch.parse_path: load, map, settle
across ranks) and the whole import into a fresh data dir (rows through the collector's Store,
durable). Baseline in the same run: ``json.load`` / ``pickle.load`` of the same files alone.

    python -m benches.flight_recorder_import [--collectives 20000 --rounds 3]
Writes benches/RESULTS-flight-recorder.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version, publish
from benches._import_timing import time_import

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

JOB = r"""
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
r, t = dist.get_rank(), torch.ones(256)
for _ in range(int(sys.argv[2])):
    dist.all_reduce(t)
c10d = torch._C._distributed_c10d
data = c10d._dump_fr_trace(True, True) if r % 2 else c10d._dump_fr_trace_json(True, True)
name = f"nccl_trace_rank_{r}" if r % 2 else f"fr{r}.json"
open(os.path.join(sys.argv[1], name), "wb").write(data if isinstance(data, bytes) else data.encode())
dist.destroy_process_group()
"""


def make_dumps(out: Path, collectives: int) -> None:
    from collector.testing.ports import free_port

    script = out.parent / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(collectives + 100), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    subprocess.run([*cmd, str(script), str(out), str(collectives)], env=env, check=True, capture_output=True)


def _load(f: Path):
    """A dump as torch wrote it: a pickle (NCCL's watchdog) or JSON."""
    return pickle.loads(f.read_bytes()) if f.name.startswith("nccl") else json.loads(f.read_bytes())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.flight_recorder_import", description=__doc__.split("\n")[0])
    p.add_argument("--collectives", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(HERE / "RESULTS-flight-recorder.md"))
    args = p.parse_args(argv)

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        dumps = Path(tmp) / "dumps"
        dumps.mkdir()
        make_dumps(dumps, args.collectives)
        sizes = {f.name: f.stat().st_size for f in dumps.iterdir()}
        records = sum(len(_load(f)["entries"]) for f in dumps.iterdir())
        best, parsed = time_import(dumps, _load, args.rounds, Path(tmp), "fr-bench")
        assert parsed.row_count("comm") == records and not parsed.problems, parsed.problems[:3]
    load.append(os.getloadavg()[0])

    lines = [
        "# Flight Recorder import",
        "",
        f"- command: `{' '.join(['python -m benches.flight_recorder_import', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version(ROOT)}, "
        f"{os.cpu_count()}-core VM shared with other jobs (1-minute load {load[0]:.1f} -> {load[-1]:.1f})",
        f"- dumps: a real 2-rank gloo job of {args.collectives:,} all_reduces, torch's Flight Recorder "
        f"({', '.join(f'{n} {s / 1e6:.1f} MB' for n, s in sorted(sizes.items()))}); {records:,} entries; "
        f"best of {args.rounds} rounds",
        "",
        "| what | s | records/s |",
        "|---|---:|---:|",
        f"| baseline: json.load + pickle.load of the dumps alone | {best['load']:.2f} | "
        f"{records / best['load']:,.0f} |",
        f"| parse (load, map to comm rows, settle across ranks) | {best['parse']:.2f} | "
        f"{records / best['parse']:,.0f} |",
        f"| **import into a data dir, durable** | {best['import']:.2f} | **{records / best['import']:,.0f}** |",
    ]
    publish(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
