"""ZeRO-3 with parameters on NVMe: samples/s and the swap-in wait, before and after per-unit prefetching.

    python -m benches.nvme_prefetch [--before REV] [--dim 256] [--layers 4] [--steps 5] [--rounds 4] [--dir D]

Target (issue 19): NVMe parameter partitions read one unit ahead of use, so the ``nvme.param_swap_in``
time the ``timers`` table shows (the training thread waiting for partition reads) shrinks and samples/s
rises. Method: the same worker runs against two code versions in one run: --before (default da0a923,
the last commit before the change: every partition load waited for all reads in flight, and locked
buffers were posix_memalign'ed 4 KiB pages) exported with ``git archive``, and this working tree. Each
builds the example GPT at --dim / --layers on 1 rank, trainer/examples/configs/zero3.json (AdamW,
stage3_prefetch_bucket_size 50,000 elements: about one unit) with offload_param nvme in --dir and
offload_optimizer cpu, logging and profiling off, and trains 2 warm-up steps. Then rounds alternate
between the versions (A B B A ...), --steps optimizer steps each; per round: samples/s and the summed
``nvme.param_swap_in`` rows per step (the engine's own telemetry rows, captured in the worker). The
table gives medians over rounds. Writes its section of benches/RESULTS-native.md.
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

from benches._common import code_version
from benches._rank_group import RankGroup, serve_rounds, worker_args
from benches._sections import replace_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS-native.md"
BEFORE = "da0a923"


def _worker(
    kind: str, rank: int, world: int, port: int, out: Path, dim: int, layers: int, steps: int, swap_dir: str
) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    import trainer
    from benches.engine_vs_deepspeed import bench_config
    from collector.rank import session
    from trainer.examples.gpt import GPT, synthetic_batch

    rows = []
    real_emit = session.emit

    def capture(table, **row):  # the nvme.* timers rows the engine emits
        if table == "timers" and str(row.get("name", "")).startswith("nvme."):
            rows.append(row)
        return real_emit(table, **row)

    session.emit = capture
    cfg = bench_config(3)
    cfg.pop("flops_profiler", None)
    cfg.update(wall_clock_breakdown=False, comms_logger={"enabled": False}, telemetry={"enabled": False})
    cfg["zero_optimization"].update(
        offload_param={"device": "nvme", "nvme_path": swap_dir}, offload_optimizer={"device": "cpu"}
    )
    torch.manual_seed(0)
    engine, *_ = trainer.initialize(model=GPT(dim=dim, layers=layers, heads=4), config=cfg)
    micro = engine.train_micro_batch_size_per_gpu()
    losses = []

    def step() -> None:
        x, y = synthetic_batch(engine.global_steps, 0, rank, micro, 128, 32, "cpu")
        loss = F.cross_entropy(engine(x).float().reshape(-1, 128), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())

    for _ in range(2):
        step()

    def run_round(_: int) -> str:
        rows.clear()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - t0
        swap_in = sum(r["dur_ns"] for r in rows if r["name"] == "nvme.param_swap_in") / 1e9
        return json.dumps(
            {"wall": wall, "swap_in": swap_in, "loads": sum(r["name"] == "nvme.param_swap_in" for r in rows)}
        )

    serve_rounds(run_round)
    params = sum(s.numel for b in engine.optimizer.buckets for s in b.slots)
    engine.close()
    out.write_text(json.dumps({"losses": losses, "params": params, "micro": micro}))


def _export(rev: str, into: Path) -> Path:
    """``rev`` of this repository as a plain tree (git archive), with this bench file added."""
    tree = into / f"rankscope-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / "benches" / "nvme_prefetch.py").write_bytes(Path(__file__).read_bytes())
    return tree


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        kind, rank, world, port, out, (dim, layers, steps, swap_dir) = worker_args(argv)
        _worker(kind, rank, world, port, out, int(dim), int(layers), int(steps), swap_dir)
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.nvme_prefetch", description=__doc__.split("\n")[0])
    p.add_argument("--before", default=BEFORE, help="the code version to compare with (a git revision)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per round")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the swap files go")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    load = [os.getloadavg()[0]]
    started = time.monotonic()
    rounds: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-nvme-", dir=args.dir) as tmp:
        tmp = Path(tmp)
        trees = {"before": _export(args.before, tmp), "after": ROOT}
        groups = {}
        try:
            for kind, tree in trees.items():
                env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(tree))
                swap = tmp / f"swap-{kind}"
                swap.mkdir()
                groups[kind] = RankGroup(
                    kind,
                    "benches.nvme_prefetch",
                    sys.executable,
                    env,
                    1,
                    tmp,
                    [str(args.dim), str(args.layers), str(args.steps), str(swap)],
                    args.timeout,
                    cwd=tree,
                )
            for i in range(args.rounds):
                for kind in list(groups) if i % 2 == 0 else list(groups)[::-1]:
                    rounds[kind].append(json.loads(groups[kind].round(i)[0]))
                    print(f"round {i} {kind}: {rounds[kind][-1]}", flush=True)
            finished = {kind: g.finish()[0] for kind, g in groups.items()}
        finally:
            for g in groups.values():
                g.kill()
    load.append(os.getloadavg()[0])
    text = _report(args, argv, rounds, finished, load, time.monotonic() - started)
    print(text)
    replace_section(RESULTS, text)
    print(f"\nwrote {RESULTS}")
    return 0


def _report(args, argv, rounds, finished, load, elapsed) -> str:
    micro, params = finished["after"]["micro"], finished["after"]["params"]
    same = finished["before"]["losses"] == finished["after"]["losses"]
    med = {
        k: {
            "sps": statistics.median(args.steps * micro / r["wall"] for r in v),
            "swap": statistics.median(1e3 * r["swap_in"] / args.steps for r in v),
            "step": statistics.median(1e3 * r["wall"] / args.steps for r in v),
            "loads": v[0]["loads"] / args.steps,
        }
        for k, v in rounds.items()
    }
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout.splitlines()[-1].split()
    cmd = ("python -m benches.nvme_prefetch " + " ".join(argv)).strip()
    lines = [
        "# ZeRO-3 NVMe parameter offload: prefetching one unit ahead",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        f"- machine: {os.cpu_count()}-core CPU VM ({platform.machine()}), swap files on {fs[0]} ({fs[1]}); load "
        f"average {load[0]:.1f} before / {load[-1]:.1f} after (other jobs shared the machine and its disk)",
        f"- code: before = {args.before} (git archive), after = {code_version(ROOT)}",
        f"- example GPT at dim {args.dim}, {args.layers} layers ({params:,} trainable parameters), 1 rank, micro-batch "
        f"{micro}, configs/zero3.json + offload_param nvme + offload_optimizer cpu; {args.rounds} rounds x "
        f"{args.steps} steps per version, alternating; medians over rounds",
        "",
        "| code | samples/s | ms per step | nvme.param_swap_in ms per step | partition loads per step |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in ("before", "after"):
        m = med[kind]
        lines.append(f"| {kind} | {m['sps']:.1f} | {m['step']:.0f} | {m['swap']:.1f} | {m['loads']:.0f} |")
    lines += [
        "",
        f"After / before: {med['after']['sps'] / med['before']['sps']:.2f}x samples/s; the swap-in wait per step "
        f"went from {med['before']['swap']:.1f} ms to {med['after']['swap']:.1f} ms. Losses of the two versions "
        + ("are identical at every step." if same else "differ (see the worker results)."),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
