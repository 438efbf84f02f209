"""CPU Adam step time: native.CPUAdam vs torch.optim.AdamW (fused=True, foreach=True).

    python -m benches.cpu_adam [--sizes 10000000 100000000] [--steps 5]

Each optimizer runs on the same fp32 parameter/gradient tensors, one at a time
(its state freed before the next); the figure is the median step time after
one warm-up step. Also times the offload path: the step plus refreshing a
bf16 copy of the weights -- fused in one pass for CPUAdam (step(copy_to=...)),
step + a separate copy_ for torch. Achieved GB/s counts the bytes an Adam step
must move (read p, g, m, v; write p, m, v: 28 B/element, +2 B for a bf16
copy), against the memory bandwidth of a large in-place torch add measured in
the same run. Prints the table and writes its section of benches/RESULTS-native.md.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from benches._sections import replace_section
from native import CPUAdam, cpu_adam

RESULTS = Path(__file__).resolve().parent / "RESULTS-native.md"


def _median_seconds(fn, steps: int) -> float:
    fn()  # warm-up: allocates optimizer state
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def memory_bandwidth_gbs(nbytes: int = 512 * 1024 * 1024, repeats: int = 7) -> float:
    """GB/s of an in-place a.add_(b) on nbytes fp32 buffers (read a, b; write a),
    best of `repeats`: the same in-place streaming pattern as an Adam step, so
    no write-allocate traffic is hidden from the count."""
    a = torch.ones(nbytes // 4)
    b = torch.ones(nbytes // 4)
    a.add_(b)
    best = min(_timed(lambda: a.add_(b)) for _ in range(repeats))
    return 3 * nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_size(numel: int, steps: int) -> list[tuple[str, float, float]]:
    """[(label, seconds per step, achieved GB/s)] for one parameter size."""
    param = torch.randn(numel)
    param.grad = torch.randn(numel)
    bf16_copy = torch.empty(numel, dtype=torch.bfloat16)
    rows = []

    def run(label, optimizer, step, bytes_per_elem):
        seconds = _median_seconds(step, steps)
        rows.append((label, seconds, bytes_per_elem * numel / seconds / 1e9))
        optimizer.state.clear()
        gc.collect()

    ours = CPUAdam([param], lr=1e-3, weight_decay=0.01)
    run(f"rankscope CPUAdam ({cpu_adam.BACKEND})", ours, ours.step, 28)
    fused = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, fused=True)
    run("torch AdamW fused=True", fused, fused.step, 28)
    foreach = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, foreach=True)
    run("torch AdamW foreach=True", foreach, foreach.step, 28)
    run("rankscope CPUAdam + bf16 copy (fused)", ours, lambda: ours.step(copy_to=[bf16_copy]), 30)

    def torch_step_and_copy():
        fused.step()
        bf16_copy.copy_(param)

    run("torch AdamW fused=True + bf16 copy_", fused, torch_step_and_copy, 30)
    return rows


def _with_share(row: str, bandwidth: float) -> str:
    gbs = float(row.rstrip(" |").split("|")[-1])
    return f"{row}{100 * gbs / bandwidth:.0f}% |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benches.cpu_adam", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000_000, 100_000_000])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    bandwidth_before = memory_bandwidth_gbs()
    table = ["| params | optimizer | ms/step (median) | vs torch fused | GB/s | % of bandwidth |",
             "|---:|---|---:|---:|---:|---:|"]
    for numel in args.sizes:
        rows = bench_size(numel, args.steps)
        baseline = {label: s for label, s, _ in rows}
        for label, seconds, gbs in rows:
            ref = baseline["torch AdamW fused=True + bf16 copy_" if "bf16" in label else "torch AdamW fused=True"]
            table.append(f"| {numel:,} | {label} | {seconds * 1e3:.1f} | {ref / seconds:.2f}x | {gbs:.1f} | ")
            print(table[-1], flush=True)
        gc.collect()
    bandwidth = max(bandwidth_before, memory_bandwidth_gbs())
    table = [row if not row.startswith("| 1") else _with_share(row, bandwidth) for row in table]
    text = "\n".join([
        "# CPU Adam (native.CPUAdam vs torch.optim.AdamW)",
        "",
        f"- command: `python -m benches.cpu_adam --sizes {' '.join(map(str, args.sizes))} --steps {args.steps}`",
        f"- machine: {os.cpu_count()}-core CPU VM ({platform.machine()}), torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads; load average {load_before:.1f} before / "
        f"{os.getloadavg()[0]:.1f} after (other jobs shared the cores); date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- memory bandwidth baseline: in-place `a.add_(b)` on 512 MiB fp32 buffers (12 B/element: read a, b; "
        f"write a), best of 7, measured before and after the runs, higher kept: {bandwidth:.1f} GB/s",
        "- GB/s counts 28 B/element moved per step (read p, g, m, v; write p, m, v), 30 B with the bf16 copy;",
        "  \"vs torch fused\" is torch's time / ours (bf16 rows against torch fused step + separate copy_)",
        "",
        *table,
    ])
    replace_section(RESULTS, text)
    print(f"\nwrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
