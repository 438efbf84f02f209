"""`rankscope import` of torch.profiler traces: records per second, from real traces.

A 2-rank gloo job (torch.distributed.run) runs ``--steps`` steps of ``--per-step`` all_reduces
(256 floats) under torch.profiler (CPU, ``record_shapes=True``, a schedule recording every step
after one warm-up step, ``prof.step()`` per step); ``tensorboard_trace_handler`` writes each
rank's Chrome trace, rank 0's as JSON, rank 1's gzipped. Timed, best of ``--rounds``: parsing the
traces (collector.tools.importers.dispatch.parse_path: load, pair each ``c10d::`` op with its
``gloo:`` worker event, steps, settle across ranks) and the whole import into a fresh data dir
(rows through the collector's Store, durable). Baseline in the same run: ``json.load`` of the
same files alone. Records: the rows imported (comm + timers); the traces' events are counted too.

    python -m benches.torch_profiler_import [--steps 100 --per-step 100 --rounds 3]
Writes benches/RESULTS-torch-profiler.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
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
import sys, torch, torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
dist.init_process_group("gloo")
r, t, steps = dist.get_rank(), torch.ones(256), int(sys.argv[2])
handler = tensorboard_trace_handler(sys.argv[1], worker_name=f"rank{r}", use_gzip=r == 1)
plan = schedule(wait=0, warmup=1, active=steps, repeat=1)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan, on_trace_ready=handler) as prof:
    for _ in range(steps + 1):
        for _ in range(int(sys.argv[3])):
            dist.all_reduce(t)
        prof.step()
dist.destroy_process_group()
"""


def make_traces(out: Path, steps: int, per_step: int) -> None:
    from collector.testing.ports import free_port

    script = out.parent / "job.py"
    script.write_text(JOB)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    subprocess.run([*cmd, str(script), str(out), str(steps), str(per_step)], env=env, check=True, capture_output=True)


def _load(f: Path):
    return json.loads(gzip.decompress(f.read_bytes()) if f.name.endswith(".gz") else f.read_bytes())


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.torch_profiler_import", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--per-step", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(HERE / "RESULTS-torch-profiler.md"))
    args = p.parse_args(argv)

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        traces = Path(tmp) / "traces"
        traces.mkdir()
        make_traces(traces, args.steps, args.per_step)
        sizes = {f.name: f.stat().st_size for f in traces.iterdir()}
        events = sum(len(_load(f)["traceEvents"]) for f in traces.iterdir())
        best, parsed = time_import(traces, _load, args.rounds, Path(tmp), "profiler-bench")
        records, collectives = parsed.row_count(), parsed.row_count("comm")
        assert collectives == 2 * args.steps * args.per_step and not parsed.problems, parsed.problems[:3]
    load.append(os.getloadavg()[0])

    lines = [
        "# torch.profiler trace import",
        "",
        f"- command: `{' '.join(['python -m benches.torch_profiler_import', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version(ROOT)}, "
        f"{os.cpu_count()}-core VM shared with other jobs (1-minute load {load[0]:.1f} -> {load[-1]:.1f})",
        f"- traces: a real 2-rank gloo job, {args.steps} profiled steps of {args.per_step} all_reduces, "
        f"torch.profiler with record_shapes ({', '.join(f'{n} {s / 1e6:.1f} MB' for n, s in sorted(sizes.items()))}); "
        f"{events:,} events, {records:,} records ({collectives:,} comm rows, the rest step timers); "
        f"best of {args.rounds} rounds",
        "",
        "| what | s | records/s | events/s |",
        "|---|---:|---:|---:|",
        f"| baseline: json.load of the traces alone | {best['load']:.2f} | {records / best['load']:,.0f} | "
        f"{events / best['load']:,.0f} |",
        f"| parse (load, pair c10d ops with gloo events, steps, settle) | {best['parse']:.2f} | "
        f"{records / best['parse']:,.0f} | {events / best['parse']:,.0f} |",
        f"| **import into a data dir, durable** | {best['import']:.2f} | **{records / best['import']:,.0f}** | "
        f"{events / best['import']:,.0f} |",
    ]
    publish(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
