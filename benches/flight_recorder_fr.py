"""`rankscope fr DIR` on 1,024 ranks' Flight Recorder dumps beside torch's analyzer on the same files.

Target (issue 44): import + verdict of 1,024 ranks' dumps in <= 10 s, with fr_trace's time beside it.

Dumps (``--dumps``):

- ``expanded`` (the default): 1,024 ranks' dumps EXPANDED FROM A REAL gloo JOB's
  (collector/testing/flight_recorder_scale.py): ``--small`` real ranks (TP pairs, DP groups, the world)
  run ``--entries / 5`` steps of five collectives with torch's Flight Recorder on; in the last step rank
  ``--missing % --small`` never enters the world all_reduce and every other rank dumps while waiting in it.
  The dumps are copied side by side into one 1,024-rank job (TP and DP groups renamed per copy, the world
  spanning every rank), the fault kept in one copy only: rank ``--missing`` is the one missing rank.
  gloo's states (every entry ``scheduled``) and torch's own stacks.
- ``synthetic``: NCCL-style pickles written here (``nccl_trace_rank_<r>``, the fields and ``pg_config``
  torch 2.13 writes, each entry with a 12-frame stack) of a 3D-ish job: the world, 128 TP groups of 8,
  8 DP groups of 128; each step two TP all_reduces, a DP reduce_scatter and all_gather and a world
  all_reduce. In the last step rank ``--missing`` never enters the world all_reduce: every other rank
  waits in it (``started``), everything before is ``completed`` (NCCL's tracked states).

Timed, wall clock and CPU (user + sys: what a shared machine's load does not change), one process each
as a user runs them, ``--rounds`` rounds, alternating: ``python -m collector.tools.cli fr DIR --data-dir
<fresh>`` (import into a fresh data dir, durable, then the verdict) and ``python -m
torch.distributed.flight_recorder.fr_trace DIR -p nccl_trace_rank_`` (the baseline: same files, same
machine, same run). Both must name the hang: its seq and the missing rank.

    python -m benches.flight_recorder_fr [--dumps expanded --ranks 1024 --entries 200 --rounds 3]
Writes benches/RESULTS-flight-recorder-fr.md (``--dumps synthetic``: RESULTS-flight-recorder-fr-synthetic.md).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version, publish

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TP, STEP_OPS = 8, 5
FRAMES = [
    {"name": name, "filename": f"/opt/job/{file}.py", "line": line}
    for name, file, line in [
        ("all_reduce", "torch/distributed/distributed_c10d", 3245),
        ("wrapper", "torch/distributed/c10d_logger", 83),
        ("_reduce_grads", "train/fsdp_step", 211),
        ("backward_hook", "train/fsdp_step", 180),
        ("_call_impl", "torch/nn/modules/module", 1784),
        ("forward", "model/block", 96),
        ("forward", "model/transformer", 140),
        ("train_step", "train/loop", 57),
        ("run_epoch", "train/loop", 88),
        ("main", "train/main", 31),
        ("<module>", "train/main", 40),
        ("run_path", "runpy", 291),
    ]
]


def make_dumps(out: Path, ranks: int, entries: int, missing: int) -> int:
    """Writes the dumps; returns the world all_reduce's seq that ``missing`` never enters."""
    dp = ranks // TP
    steps = max(1, entries // STEP_OPS)
    t0 = 1_795_000_000_000_000_000
    for rank in range(ranks):
        tp_pg, dp_pg = str(1 + rank // TP), str(1 + dp + rank % TP)
        pg_config = {
            "0": {"desc": "default_pg", "ranks": str(list(range(ranks)))},
            tp_pg: {"desc": "TP", "ranks": str(list(range(rank // TP * TP, rank // TP * TP + TP)))},
            dp_pg: {"desc": "DP", "ranks": str(list(range(rank % TP, ranks, TP)))},
        }
        seqs = {"0": 0, tp_pg: 0, dp_pg: 0}
        out_entries = []
        for step in range(steps):
            plan = [(tp_pg, "TP", "all_reduce", 4096), (tp_pg, "TP", "all_reduce", 4096)]
            plan += [(dp_pg, "DP", "_reduce_scatter_base", 1 << 13), (dp_pg, "DP", "_all_gather_base", 1 << 13)]
            plan += [("0", "default_pg", "all_reduce", 1)]
            for pg, desc, op, numel in plan:
                last = step == steps - 1 and pg == "0"
                if last and rank == missing:
                    break
                seqs[pg] += 1
                n = len(out_entries)
                # a gather's output and a reduce_scatter's input are the group's size times the other side
                in_sizes = [[numel * dp]] if op == "_reduce_scatter_base" else [[numel]]
                out_sizes = [[numel * dp]] if op == "_all_gather_base" else [[numel]]
                out_entries.append(
                    {
                        "frames": FRAMES,
                        "record_id": n,
                        "pg_id": int(pg),
                        "process_group": (pg, desc),
                        "collective_seq_id": seqs[pg],
                        "p2p_seq_id": 0,
                        "op_id": n + 1,
                        "profiling_name": f"nccl:{op}",
                        "time_created_ns": t0 + n * 1_000_000,
                        "input_sizes": in_sizes,
                        "input_dtypes": ["BFloat16"],
                        "output_sizes": out_sizes,
                        "output_dtypes": ["BFloat16"],
                        "state": "started" if last else "completed",
                        "time_discovered_started_ns": t0 + n * 1_000_000 + 1000,
                        "time_discovered_completed_ns": None if last else t0 + n * 1_000_000 + 500_000,
                        "retired": not last,
                        "timeout_ms": 600_000,
                        "is_p2p": False,
                    }
                )
        dump = {"version": "2.10", "pg_config": pg_config, "pg_status": {}, "entries": out_entries, "rank": rank}
        (out / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return steps


def _expanded(tmp: Path, dumps: Path, args) -> tuple[int, str]:
    """A real gloo job of ``--small`` ranks, its dumps expanded to ``--ranks``: (the hung world seq, what the
    dumps are)."""
    from collector.testing.flight_recorder_scale import expand, run_small_job

    steps = max(2, args.entries // STEP_OPS)
    started = time.perf_counter()
    case = run_small_job(tmp / "small", args.small, tp=2, steps=steps, culprit=args.missing % args.small)
    ran = time.perf_counter() - started
    facts = expand(case / "fr_trace", dumps, args.ranks, fault_block=args.missing // args.small)
    assert facts["missing"] == [args.missing] and facts["group"] == "world", facts
    source = (
        f"{args.ranks:,} ranks' pickles expanded from a real {args.small}-rank gloo job's (ran {ran:.0f} s: TP pairs, "
        f"DP groups of {args.small // 2}, the world; {steps} steps of 5 collectives; collector/testing/"
        f"flight_recorder_scale.py), {facts['entries']:,} entries with torch's own stacks"
    )
    return facts["seq"], source


def _timed(cmd: list[str], timeout: float) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall s, CPU s of the process: user + sys, what the load on a shared machine does not change, the result)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def _row(what: str, runs: list[tuple[float, float]]) -> str:
    walls = sorted(w for w, _ in runs)
    return f"| {what} | {walls[0]:.1f} | {walls[len(walls) // 2]:.1f} | {', '.join(f'{c:.1f}' for _, c in runs)} |"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.flight_recorder_fr", description=__doc__.split("\n")[0])
    p.add_argument("--dumps", choices=("expanded", "synthetic"), default="expanded")
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--small", type=int, default=8, help="--dumps expanded: ranks of the real gloo job")
    p.add_argument("--entries", type=int, default=200, help="entries per rank (steps x 5)")
    p.add_argument("--missing", type=int, default=1007)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fr-trace-timeout", type=float, default=1800)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    suffix = "" if args.dumps == "expanded" else "-synthetic"
    args.out = args.out or str(HERE / f"RESULTS-flight-recorder-fr{suffix}.md")

    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        dumps = Path(tmp) / "dumps"
        if args.dumps == "expanded":
            world_seq, source = _expanded(Path(tmp), dumps, args)
        else:
            dumps.mkdir()
            world_seq = make_dumps(dumps, args.ranks, args.entries, args.missing)
            entries = args.ranks * world_seq * STEP_OPS
            source = f"{args.ranks:,} ranks' NCCL-style pickles written here, ~{entries:,} entries with 12-frame stacks"
        size = sum(f.stat().st_size for f in dumps.iterdir())
        ours, theirs = [], []
        for i in range(args.rounds):
            cmd = [sys.executable, "-m", "collector.tools.cli", "fr", str(dumps), "--data-dir", f"{tmp}/d{i}"]
            took, cpu, done = _timed(cmd, 600)
            said = done.stdout.splitlines()[0] if done.stdout else done.stderr[-500:]
            assert done.returncode == 2 and f"#{world_seq} of world" in said and f"rank {args.missing}" in said, said
            ours.append((took, cpu))
            cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps)]
            took, cpu, done = _timed([*cmd, "-p", "nccl_trace_rank_"], args.fr_trace_timeout)
            heard = done.stdout + done.stderr
            seq = re.search(r"Not all ranks joining collective, sequence number: (\d+)", heard)
            assert seq and int(seq.group(1)) == world_seq and f"missing ranks: {{{args.missing}}}" in heard, heard[
                -800:
            ]
            theirs.append((took, cpu))
            load.append(os.getloadavg()[0])
    lines = [
        "# rankscope fr vs torch's fr_trace" + ("" if args.dumps == "expanded" else ": synthetic NCCL-style dumps"),
        "",
        f"- command: `{' '.join(['python -m benches.flight_recorder_fr', *argv])}`",
        f"- measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, code {code_version(ROOT)}, "
        f"{os.cpu_count()}-core VM, no GPU, shared with other jobs "
        f"(1-minute load {', '.join(f'{x:.1f}' for x in load)})",
        f"- dumps: {source}, {size / 1e6:.0f} MB; rank {args.missing} never enters world all_reduce #{world_seq}; "
        f"{args.rounds} rounds, alternating; both name seq {world_seq} and rank {args.missing}",
        "",
        "| command (whole process) | best wall s | median wall s | CPU s (user+sys), each round |",
        "|---|---:|---:|---|",
        _row("baseline: `python -m torch.distributed.flight_recorder.fr_trace DIR`", theirs),
        _row("**`rankscope fr DIR`** (import, durable, + verdict)", ours),
    ]
    publish(args.out, "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
