"""Pipeline schedules: the bubble of trainer.pipe's 1F1B against Megatron's interleaved 1F1B (virtual stages),
measured on real gloo ranks against their ideal formulas, at m = 4, 8, 16 micro-batches on 2 and 4 stages.

    python -m benches.pipe_schedules [--stages 2,4] [--micro-batches 4,8,16] [--virtual 2] [--fwd-ms 40]
                                     [--steps 2] [--rounds 3]

Every stage's compute is made equal and known, so that 2 shared cores do not decide the result: the model is
2 p layers (tests/integration/_pipe_workers.SleepLayer: a Linear(8, 8) that sleeps fwd_ms / 2 in forward and
twice that in backward), cut ``uniform``, so a stage holds fwd_ms of forward and 2 fwd_ms of backward per
micro-batch under either schedule (1F1B: two layers a stage; interleaved, v = 2: one layer a chunk, two chunks a
stage). The ideal compute of a step is then m x 3 fwd_ms on every stage, and

    bubble = 1 - m x 3 fwd_ms / step time

against 1F1B's ideal (p - 1) / (m + p - 1) and the interleaved one's (p - 1) / (v m + p - 1) (the Megatron
paper's (p - 1) / (v m) of the compute, as a share of the step; trainer.pipe.schedule simulates both schedules at
equal stage times and finds exactly these). A step is ``train_batch``; the step time is a round's wall time
(a barrier, then ``--steps`` calls, the slowest rank) over its steps, median over ``--rounds`` rounds, the two
schedules' rank groups alternating which goes first. "busy" is the stages' own forward and backward time from
the engine's ``pipe`` rows (the sleeps plus what the layers and autograd add), so what the bubble holds beyond
busy is waiting: the pipeline's fill and drain and the point-to-point messages (v times as many interleaved).
Writes benches/RESULTS-pipe-schedules.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version, publish
from benches._rank_group import RankGroup, serve_rounds, worker_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "RESULTS-pipe-schedules.md"
WIDTH, MICRO = 8, 4


def _worker(rank: int, world: int, port: int, out: Path, a: dict) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.nn.functional as F

    import trainer
    from tests.integration._pipe_workers import SleepLayer
    from trainer.pipe import LayerSpec, PipelineModule

    torch.set_num_threads(1)
    trainer.init_distributed(dist_backend="gloo")
    layer_s = a["fwd_ms"] / 2 / 1e3  # two layers a stage
    engines = {}
    for m in a["micro_batches"]:
        torch.manual_seed(0)
        net = PipelineModule(
            layers=[LayerSpec(SleepLayer, WIDTH, layer_s, 2 * layer_s) for _ in range(2 * world)],
            num_stages=world,
            virtual_stages=a["virtual"],
            loss_fn=F.mse_loss,
            partition_method="uniform",
        )
        config = {
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": m,
            "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
            "steps_per_print": 10**9,
            "telemetry": {"enabled": False},
        }
        engines[m] = trainer.initialize(model=net, config=config)[0]
    g = torch.Generator().manual_seed(1)
    data = itertools.repeat((torch.randn(MICRO, WIDTH, generator=g), torch.randn(MICRO, WIDTH, generator=g)))
    for engine in engines.values():
        engine.train_batch(data)  # warm-up
    busy: dict[int, list[float]] = {m: [] for m in engines}

    def run_round(_: int) -> str:
        secs = {}
        for m, engine in engines.items():
            trainer.comm.barrier()
            t0 = time.perf_counter()
            for _ in range(a["steps"]):
                engine.train_batch(data)
                cols = engine.last_pipe_columns
                busy[m].append(
                    sum(e - s for k, s, e in zip(cols["kind"], cols["start_ns"], cols["end_ns"]) if k in ("fwd", "bwd"))
                    / 1e6
                )
            secs[m] = time.perf_counter() - t0
        return json.dumps(secs)

    serve_rounds(run_round)
    out.write_text(json.dumps({"busy_ms": busy, "torch": torch.__version__}))


def _measure(stages: int, a: dict, timeout: float, tmp: Path) -> dict:
    """{virtual: {"step_ms": {m: [per round]}, "busy_ms": {m: [per rank and step]}}} for one pipeline depth."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    groups = {
        v: RankGroup(
            "ranks",
            "benches.pipe_schedules",
            sys.executable,
            env,
            stages,
            tmp,
            [json.dumps(dict(a, virtual=v))],
            timeout,
            name=f"p{stages}-v{v}",
        )
        for v in (1, a["virtual"])
    }
    step_ms = {v: {m: [] for m in a["micro_batches"]} for v in groups}
    try:
        for i in range(a["rounds"]):
            for v in list(groups) if i % 2 == 0 else list(groups)[::-1]:
                per_rank = [json.loads(x) for x in groups[v].round(i)]
                for m in a["micro_batches"]:
                    step_ms[v][m].append(max(r[str(m)] for r in per_rank) / a["steps"] * 1e3)
            print(f"stages {stages} round {i}: " + "; ".join(
                f"v{v} " + ", ".join(f"m{m} {ms[m][-1]:.0f} ms" for m in ms) for v, ms in step_ms.items()
            ))  # fmt: skip
        fin = {v: g.finish() for v, g in groups.items()}
    finally:
        for g in groups.values():
            g.kill()
    return {
        v: {
            "step_ms": step_ms[v],
            "busy_ms": {m: [b for f in fin[v] for b in f["busy_ms"][str(m)]] for m in a["micro_batches"]},
        }
        for v in groups
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        _, rank, world, port, out, (a,) = worker_args(argv)
        _worker(rank, world, port, out, json.loads(a))
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.pipe_schedules", description=__doc__.split("\n")[0])
    p.add_argument("--stages", default="2,4")
    p.add_argument("--micro-batches", default="4,8,16")
    p.add_argument("--virtual", type=int, default=2)
    p.add_argument("--fwd-ms", type=float, default=40.0)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    a = {k: getattr(args, k) for k in ("virtual", "fwd_ms", "steps", "rounds")}
    a["micro_batches"] = [int(m) for m in args.micro_batches.split(",")]
    load, t0 = [os.getloadavg()], time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for stages in (int(s) for s in args.stages.split(",")):
            results[stages] = _measure(stages, a, args.timeout, Path(tmp))
    load.append(os.getloadavg())
    publish(args.out, _report(args, argv, a, results, load, time.monotonic() - t0))
    return 0


def _report(args, argv, a: dict, results: dict, load, elapsed: float) -> str:
    from trainer.pipe.schedule import ideal_bubble_fraction

    v, fwd = a["virtual"], a["fwd_ms"]
    cmd = ("python -m benches.pipe_schedules " + " ".join(argv)).strip()
    now = datetime.datetime.now(datetime.timezone.utc)
    avg = lambda xs: "/".join(f"{x:.1f}" for x in xs)
    pct = lambda x: f"{100 * x:.1f}%"
    lines = [
        "# Pipeline schedules: 1F1B vs interleaved 1F1B, bubbles on gloo CPU ranks",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, ended {now:%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM, shared with other jobs; load average "
        f"(1/5/15 min) at start {avg(load[0])}, at end {avg(load[1])}",
        f"- rankscope code: {code_version(ROOT)}; torch in .venv, gloo, one stage per rank, 1 thread each",
        f"- model: 2 p SleepLayers (Linear({WIDTH}, {WIDTH}) sleeping {fwd / 2:g} ms forward, {fwd:g} ms backward), "
        f"`uniform`: every stage {fwd:g} ms forward + {2 * fwd:g} ms backward per micro-batch under both schedules; "
        f"micro-batches of {MICRO} samples, SGD; 1 warm-up batch, then {a['rounds']} rounds of {a['steps']} "
        f"train_batch calls per m, the two schedules' ranks alternating which goes first",
        f"- bubble = 1 - m x {3 * fwd:g} ms / step time; ideal: 1F1B (p - 1) / (m + p - 1), interleaved "
        f"(p - 1) / ({v} m + p - 1); step time: median over rounds; busy: the stage's fwd + bwd from its `pipe` "
        "rows, median over ranks and steps",
        "",
        f"| stages | m | 1F1B ideal | 1F1B measured | interleaved v={v} ideal | interleaved measured | "
        "step ms 1F1B / interleaved | busy ms 1F1B / interleaved (ideal) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stages, by_v in results.items():
        for m in a["micro_batches"]:
            step = {k: statistics.median(r["step_ms"][m]) for k, r in by_v.items()}
            busy = {k: statistics.median(r["busy_ms"][m]) for k, r in by_v.items()}
            bubble = {k: 1 - m * 3 * fwd / s for k, s in step.items()}
            lines.append(
                f"| {stages} | {m} | {pct(ideal_bubble_fraction(stages, m))} | {pct(bubble[1])} | "
                f"{pct(ideal_bubble_fraction(stages, m, v))} | {pct(bubble[v])} | "
                f"{step[1]:.0f} / {step[v]:.0f} | {busy[1]:.0f} / {busy[v]:.0f} ({m * 3 * fwd:.0f}) |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
