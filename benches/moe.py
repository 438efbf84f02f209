"""MoE layer throughput and all_to_all volume on 2 gloo ranks (CPU).

Same layer, same tokens, two placements run back to back in one job:
  ep 1   every rank holds all experts; no all_to_all (the baseline)
  ep 2   experts split over the 2 ranks; dispatch + combine all_to_all,
         forward and backward (4 per step)

Per step each all_to_all's input is the [E, C, M] slot buffer, E*C = k*S*cf
slots for S tokens per rank (S divisible by E), so the analytic volume is

    bytes per all_to_all      = S * k * cf * M * itemsize          (comm.bytes, nccl-tests' S)
    bytes leaving the rank    = that * (ep - 1) / ep

and the bench checks the recorded comm bytes against it. tokens/s is S per
rank / median step time (forward + backward), timing is reported, not asserted.

    python -m benches.moe [--tokens 1024 --hidden 256 --experts 4 --steps 20]
Writes benches/RESULTS-moe.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from collector.testing.ports import free_port

HERE = Path(__file__).resolve().parent
WORLD = 2


def _rank(rank: int, port: int, args: dict, out_dir: str) -> None:
    import torch
    from torch import nn

    from trainer import comm
    from trainer.moe import MoE

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    comm.init_process_group("gloo", rank=rank, world_size=WORLD)
    comm.configure({"enabled": True})
    M, S, E = args["hidden"], args["tokens"], args["experts"]
    layers = {}
    for ep in (1, 2):
        torch.manual_seed(0)
        expert = nn.Sequential(nn.Linear(M, 4 * M), nn.GELU(), nn.Linear(4 * M, M))
        layers[ep] = MoE(M, expert, num_experts=E, ep_size=ep, k=1, capacity_factor=1.0, min_capacity=0)
    # tokens come from a previous layer in a real model, so they need a gradient too
    x = torch.randn(S, M, generator=torch.Generator().manual_seed(rank)).requires_grad_(True)
    times = {1: [], 2: []}

    def step(ep: int) -> float:
        t0 = time.perf_counter()
        y, aux, _ = layers[ep](x)
        (y.square().mean() + aux).backward()
        return time.perf_counter() - t0

    for ep in (1, 2):
        for _ in range(args["warmup"]):
            step(ep)
    comm.barrier()
    comm.flush()  # warm-up records still queued for the drain thread would land after the reset
    comm.reset_summary()
    for _ in range(args["steps"]):  # interleaved, so load from other jobs hits both placements alike
        for ep in (1, 2):
            times[ep].append(step(ep))
    calls, nbytes = _a2a_bytes()
    results = []
    for ep in (1, 2):
        step_s = statistics.median(times[ep])
        moved = (calls, nbytes) if ep == 2 else (0, 0)  # only ep 2 issues all_to_all
        results.append(
            {
                "ep": ep,
                "step_ms": step_s * 1e3,
                "tokens_per_s": S / step_s,
                "a2a_calls_per_step": moved[0] / args["steps"],
                "a2a_bytes_per_step": moved[1] / args["steps"],
            }
        )
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    comm.destroy_process_group()


def _a2a_bytes() -> tuple[int, int]:
    """(calls, bytes) of the MoE token all_to_alls since the last reset, from the comms summary
    (the E-int64 ``moe.fill_counts`` exchange is left out: it carries no tokens)."""
    import contextlib
    import io

    from trainer import comm

    with contextlib.redirect_stdout(io.StringIO()):  # log_summary prints DeepSpeed's table
        summary = comm.log_summary(return_dict=True)
    calls = total = 0
    for name, sizes in summary.items():
        if name.startswith("moe.") and name != "moe.fill_counts":
            for size, stats in sizes.items():
                calls += stats["count"]
                total += size * stats["count"]
    return calls, total


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = vars(p.parse_args())
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank, args=(free_port(), args, out), nprocs=WORLD, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]

    S, M = args["tokens"], args["hidden"]
    analytic = S * 1 * 1.0 * M * 4  # bytes per all_to_all: S * k * cf * M * fp32
    lines = [
        "# MoE layer (trainer.moe) on 2 ranks: ep 1 (baseline) vs ep 2",
        "",
        f"Command: `python -m benches.moe --tokens {S} --hidden {M} --experts {args['experts']} "
        f"--steps {args['steps']}`  ",
        f"Machine: {platform.machine()} 2-core CPU VM (shared with other jobs), Python {platform.python_version()}, "
        "torch gloo on CPU, 1 thread per rank, float32.  ",
        f"Layer: hidden {M}, expert MLP {M}->{4 * M}->{M}, {args['experts']} experts, top-1, capacity_factor 1.0, "
        f"{S} tokens per rank per step (input requires grad, as inside a model); step = forward + backward; "
        f"median of {args['steps']} steps per placement, ep 1 and ep 2 steps interleaved, after "
        f"{args['warmup']} warm-up steps each.",
        "",
        "| ep | rank | step (ms) | tokens/s per rank | all_to_all per step | all_to_all bytes per step "
        "(comm.bytes) | analytic 4 x S*k*cf*M*4 | bytes leaving the rank per step (x (ep-1)/ep) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rank, results in enumerate(ranks):
        for r in results:
            ep = r["ep"]
            expect = 4 * analytic if ep > 1 else 0
            lines.append(
                f"| {ep} | {rank} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | "
                f"{r['a2a_calls_per_step']:.0f} | {r['a2a_bytes_per_step']:.0f} | {expect:.0f} | "
                f"{r['a2a_bytes_per_step'] * (ep - 1) / ep:.0f} |"
            )
    lines += [
        "",
        "ep 1 moves no tokens (both ranks compute all experts for their own tokens). At ep 2 each rank",
        "computes half the experts for both ranks' tokens, so compute per rank is the same and the",
        "difference is the four all_to_alls (gloo over loopback on 2 shared cores), the copies around them",
        "and one 32-byte all_to_all of per-expert fill counts (so experts skip empty capacity slots).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "RESULTS-moe.md").write_text(text)
    for results in ranks:
        for r in results:
            if r["ep"] > 1 and r["a2a_bytes_per_step"] != 4 * analytic:
                raise SystemExit(f"all_to_all bytes per step {r['a2a_bytes_per_step']} != analytic {4 * analytic}")


if __name__ == "__main__":
    main()
