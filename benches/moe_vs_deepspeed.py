"""MoE layer tokens/s, ours (trainer.moe.MoE) vs DeepSpeed (deepspeed.moe.layer.MoE), on
gloo CPU ranks, ep_size 2 and 1, interleaved rounds; plus all_to_all bytes per step
against the analytic volume.

    python -m benches.moe_vs_deepspeed [--world 2] [--tokens 1024] [--hidden 256] [--experts 4]
                                       [--warmup 3] [--steps 10] [--rounds 8]
                                       [--capacity-factors 1.0,1.25]

Same layer on both sides: hidden M, expert MLP M -> 4M -> M (Linear, GELU, Linear), E
experts, top-1, capacity_factor 1.0 and 1.25 (one section each), min_capacity 0, drop_tokens and use_rts at their
defaults (on); S tokens per rank with requires_grad (as inside a model); step = forward
+ backward of ``y.square().mean() + aux``; fp32; 1 intra-op thread per rank.

DeepSpeed runs in .bench-venv-ds (benches/_deepspeed_venv.py; DS_ACCELERATOR=cpu):
``deepspeed.init_distributed("gloo")``, then per layer ``moe.set_deepspeed_parallelism()``
(what deepspeed.initialize does for MoE layers: groups._create_expert_and_data_parallel
(ep_size) and the layer's expert group handle). Comm logging is on in both:
ours ``trainer.comm.configure({"enabled": True})`` (as benches/moe.py), DeepSpeed
``deepspeed.comm.configure(enabled=True, prof_all=True)``; each side's own log gives its
all_to_all count and bytes per step.

Analytic volume: each all_to_all's input is the [E, C, M] slot buffer, E*C = k*S*cf, so
S_a2a = S * k * cf * M * 4 bytes (nccl-tests' S), 4 per step (dispatch + combine,
forward + backward); bytes leaving a rank = S_a2a * (ep-1)/ep.

One process group per framework builds both placements and warms up; this process then
drives them in lock-step rounds (framework order alternating per round; within a round
each worker runs ``--steps`` steps of each placement, placement order alternating).
Writes benches/RESULTS-moe-ds.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version
from benches._rank_group import RankGroup, serve_rounds, worker_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "RESULTS-moe-ds.md"
EPS = (2, 1)


def _worker(kind: str, rank: int, world: int, port: int, out: Path, a: dict) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        LOCAL_SIZE=str(world),
    )
    import torch
    from torch import nn

    torch.set_num_threads(1)
    M, S, E = a["hidden"], a["tokens"], a["experts"]

    def expert():
        return nn.Sequential(nn.Linear(M, 4 * M), nn.GELU(), nn.Linear(4 * M, M))

    layers = {}
    if kind == "ours":
        from trainer import comm
        from trainer.moe import MoE

        comm.init_process_group("gloo", rank=rank, world_size=world)
        comm.configure({"enabled": True})
        for ep in EPS:
            torch.manual_seed(0)
            layers[ep] = MoE(M, expert(), num_experts=E, ep_size=ep, k=1, capacity_factor=a["cf"], min_capacity=0)
        barrier = comm.barrier
    else:
        import logging

        import deepspeed
        import deepspeed.comm as ds
        from deepspeed.moe.layer import MoE

        deepspeed.utils.logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        ds.configure(enabled=True, prof_all=True)
        for ep in EPS:
            torch.manual_seed(0)
            layers[ep] = MoE(M, expert(), num_experts=E, ep_size=ep, k=1, capacity_factor=a["cf"], min_capacity=0)
            layers[ep].set_deepspeed_parallelism()
        barrier = ds.barrier
    x = torch.randn(S, M, generator=torch.Generator().manual_seed(rank)).requires_grad_(True)

    def step(ep: int) -> float:
        t0 = time.perf_counter()
        y, aux, _ = layers[ep](x)
        (y.square().mean() + aux).backward()
        return time.perf_counter() - t0

    for ep in EPS:
        for _ in range(a["warmup"]):
            step(ep)
    barrier()
    if kind == "ours":
        comm.flush()
        comm.reset_summary()
    else:
        ds.comms_logger.comms_dict.clear()
    timed = {ep: 0 for ep in EPS}

    def run_round(i: int) -> str:
        secs = {}
        for ep in EPS if i % 2 == 0 else EPS[::-1]:  # placement order alternates per round
            barrier()
            secs[ep] = sum(step(ep) for _ in range(a["steps"]))
            timed[ep] += a["steps"]
        return json.dumps(secs)

    serve_rounds(run_round)
    barrier()
    a2a = {}
    if kind == "ours":
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            summary = comm.log_summary(return_dict=True)
        for name, sizes in summary.items():
            if "all_to_all" in name or name.startswith("moe."):
                for size, st in sizes.items():
                    a2a.setdefault(name, {})[str(size)] = st["count"]
        comm.destroy_process_group()
        versions = {"torch": torch.__version__}
    else:
        for name, sizes in ds.comms_logger.comms_dict.items():
            if "all_to_all" in name:
                for size, v in sizes.items():
                    a2a.setdefault(name, {})[str(size)] = v[0]
        versions = {"torch": torch.__version__, "deepspeed": deepspeed.__version__}
    out.write_text(json.dumps({"a2a": a2a, "timed_ep2_steps": timed[2], "versions": versions}))


def _ranks(kind, python, env, world, tmp: Path, a: dict, timeout) -> RankGroup:
    """One framework's ranks; each round's payload is JSON seconds per ep_size."""
    return RankGroup(kind, "benches.moe_vs_deepspeed", python, env, world, tmp, [json.dumps(a)], timeout)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        kind, rank, world, port, out, (a,) = worker_args(argv)
        _worker(kind, rank, world, port, out, json.loads(a))
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.moe_vs_deepspeed", description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument(
        "--capacity-factors", default="1.0,1.25", help="comma-separated; one section of results per capacity factor"
    )
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    from benches import _deepspeed_venv

    ds_python = str(_deepspeed_venv.ensure())
    envs = {
        "ours": (sys.executable, dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")),
        "deepspeed": (ds_python, _deepspeed_venv.env()),
    }
    failed = False
    for cf in (float(x) for x in args.capacity_factors.split(",")):
        text, failures = _compare(args, cf, envs, argv)
        from benches._sections import replace_section

        replace_section(Path(args.out), text)
        print(text)
        failed = failed or bool(failures)
    return 1 if failed else 0


def _compare(args, cf: float, envs: dict, argv: list[str]) -> tuple[str, dict]:
    """One interleaved comparison at capacity factor ``cf``: the results section and any failures."""
    a = {k: getattr(args, k) for k in ("tokens", "hidden", "experts", "warmup", "steps")} | {"cf": cf}
    load = [os.getloadavg()]
    t0 = time.monotonic()
    secs = {k: {ep: [] for ep in EPS} for k in envs}
    groups, failures, fin = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for kind, (py, env) in envs.items():
                try:
                    groups[kind] = _ranks(kind, py, env, args.world, Path(tmp), a, args.timeout)
                except RuntimeError as e:
                    failures[kind] = str(e)
                    print(f"{kind} failed to start:\n{e}", flush=True)
            for i in range(args.rounds):
                order = list(groups) if i % 2 == 0 else list(groups)[::-1]
                for kind in order:
                    per_rank = [json.loads(x) for x in groups[kind].round(i)]
                    for ep in per_rank[0]:
                        secs[kind][int(ep)].append(max(r[ep] for r in per_rank))  # the slowest rank
                print(
                    f"round {i}: "
                    + ", ".join(
                        f"{k} ep{ep} {args.steps * args.tokens / v[ep][-1]:.0f} tok/s"
                        for k, v in secs.items()
                        if k in groups
                        for ep in EPS
                    ),
                    flush=True,
                )
            fin = {k: g.finish() for k, g in groups.items()}
        finally:
            for g in groups.values():
                g.kill()
    load.append(os.getloadavg())
    elapsed = time.monotonic() - t0
    S, M, n = args.tokens, args.hidden, args.world
    C = math.ceil(S / args.experts * cf)  # expert_capacity with k 1, min_capacity 0
    analytic = args.experts * C * M * 4
    rate = {k: {ep: [args.steps * S / s for s in v] for ep, v in d.items()} for k, d in secs.items()}
    cell = lambda v: f"{statistics.median(v):,.0f} [{min(v):,.0f}-{max(v):,.0f}]" if v else "did not run"
    versions = fin.get("deepspeed", [{}])[0].get("versions") if "deepspeed" in fin else None
    cmd = ("python -m benches.moe_vs_deepspeed " + " ".join(argv)).strip()
    lines = [
        f"# MoE layer: trainer.moe.MoE vs DeepSpeed deepspeed.moe.layer.MoE, 2 gloo ranks, capacity_factor {cf}",
        "",
        f"- command: `timeout 600 {cmd}` ({elapsed:.0f} s, ended "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM, shared with other jobs (see the load "
        f"average); load average (1/5/15 min) at start "
        f"{'/'.join(f'{x:.1f}' for x in load[0])}, at end {'/'.join(f'{x:.1f}' for x in load[1])}",
        f"- rankscope code: {code_version(ROOT)}; ours in .venv; "
        + (
            f"DeepSpeed {versions['deepspeed']} with torch {versions['torch']} in .bench-venv-ds (DS_ACCELERATOR=cpu)"
            if versions
            else "DeepSpeed: did not run"
        ),
        f"- layer: hidden {M}, expert MLP {M}->{4 * M}->{M}, {args.experts} experts, top-1, capacity_factor {cf}, "
        f"min_capacity 0, {S} tokens per rank (requires grad), fp32, forward + backward per step; comm logging on "
        "in both (ours trainer.comm, DeepSpeed's comms logger prof_all)",
        f"- {n} ranks, 1 thread each; {args.warmup} warm-up steps per placement, then {args.rounds} rounds; per "
        f"round each framework runs {args.steps} steps of ep 2 and {args.steps} of ep 1 (order alternating), "
        "frameworks alternating which goes first; tokens/s per rank = steps x S / slowest rank's time",
        "",
        "## Tokens/s per rank (median over rounds [min-max])",
        "",
        "| ep_size | ours | DeepSpeed | ours / DeepSpeed (ratio of medians) | per-round ratios median [min, max] |",
        "|---|---:|---:|---:|---:|",
    ]
    for ep in EPS:
        o, d = rate["ours"][ep], rate["deepspeed"][ep]
        ratio = f"{statistics.median(o) / statistics.median(d):.2f}x" if o and d else "-"
        per = [x / y for x, y in zip(o, d)]
        per_s = f"{statistics.median(per):.2f} [{min(per):.2f}, {max(per):.2f}]" if per else "-"
        lines.append(f"| {ep} | {cell(o)} | {cell(d)} | {ratio} | {per_s} |")
    lines += [
        "",
        "## all_to_all per step at ep_size 2 (rank 0, each side's own comm log)",
        "",
        f"Analytic: S_a2a = E x C x M x 4 = {args.experts} x {C} x {M} x 4 = {analytic:,.0f} bytes per "
        f"all_to_all, 4 per step = {4 * analytic:,.0f} bytes; leaving the rank x (ep-1)/ep = "
        f"{4 * analytic * (n - 1) / n:,.0f} bytes per step.",
        "",
        "| side | log name | msg size (bytes) | calls/step | bytes/step | vs analytic 4 x S_a2a | "
        "bytes leaving rank/step (x (ep-1)/ep) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for kind, f in fin.items():
        steps = f[0]["timed_ep2_steps"]
        for name, sizes in f[0]["a2a"].items():
            for size, count in sizes.items():
                b = int(size) * count / steps
                lines.append(
                    f"| {kind} | {name} | {int(size):,} | {count / steps:.1f} | {b:,.0f} | "
                    f"{b / (4 * analytic):.3f} | {b * (n - 1) / n:,.0f} |"
                )
    if failures:
        lines += ["", "## Failures", ""]
        for kind, msg in failures.items():
            lines += [f"{kind}:", "", "```", "\n".join(msg.strip().splitlines()[-15:]), "```", ""]
    return "\n".join(lines) + "\n", failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
