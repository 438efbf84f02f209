"""Pipeline parallelism: samples/s of trainer.pipe's PipelineEngine vs DeepSpeed's PipelineEngine on
gloo CPU ranks (one stage per rank, 2 and 4 stages), interleaved rounds; the bubble fraction our
``pipe`` rows measure against 1F1B's ideal (p - 1) / (m + p - 1) for m = 2, 4, 8; and what the
telemetry costs per micro-batch.

    python -m benches.pipe_vs_deepspeed [--worlds 2,4] [--layers 8] [--hidden 256] [--micro 16]
                                        [--micro-batches 8] [--warmup 2] [--steps 4] [--rounds 6]

Same script on both sides: ``PipelineModule`` of LayerSpecs (Linear(H, H) + ReLU, ``--layers`` of
each), ``loss_fn`` mse, partition_method 'parameters', AdamW, ZeRO 0, fp32, micro-batches of
``--micro`` samples, gradient_accumulation_steps = m; ``train_batch`` over an iterator repeating
one (x, y) pair. DeepSpeed runs in .bench-venv-ds (DS_ACCELERATOR=cpu). Ours runs with telemetry
enabled towards a port nobody listens on (rows spool to a temp dir), so its cost is in the number.
samples/s = steps x micro x m / the slowest rank's seconds (a step is a whole pipeline batch).
Bubbles: ours only (DeepSpeed records none), from the ranks' own ``pipe`` rows of the timed steps
through collector.data.pipeline.bubbles_of. Writes benches/RESULTS-pipe.md.
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

from benches._common import code_version
from benches._rank_group import RankGroup, serve_rounds, worker_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "RESULTS-pipe.md"


def _worker(kind: str, rank: int, world: int, port: int, out: Path, a: dict) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    if kind == "ours":
        import trainer as deepspeed
    else:
        import logging

        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo")
    H = a["hidden"]
    config = {
        "train_micro_batch_size_per_gpu": a["micro"],
        "gradient_accumulation_steps": a["m"],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    if kind == "ours":
        config["telemetry"] = {"enabled": True, "endpoint": a["endpoint"], "run": f"bench-pipe-{world}"}
    torch.manual_seed(0)
    layers = []
    for _ in range(a["layers"]):
        layers += [deepspeed.pipe.LayerSpec(nn.Linear, H, H), deepspeed.pipe.LayerSpec(nn.ReLU)]
    net = deepspeed.pipe.PipelineModule(layers=layers, num_stages=world, loss_fn=F.mse_loss)
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    g = torch.Generator().manual_seed(1)
    data = itertools.repeat((torch.randn(a["micro"], H, generator=g), torch.randn(a["micro"], H, generator=g)))
    for _ in range(a["warmup"]):
        engine.train_batch(data)
    rows: list[dict] = []

    def run_round(_: int) -> str:
        deepspeed.comm.barrier()
        t0 = time.perf_counter()
        for _ in range(a["steps"]):
            engine.train_batch(data)
            if kind == "ours":
                cols = engine.last_pipe_columns
                rows.extend(dict(zip(cols, values, strict=True), rank=rank) for values in zip(*cols.values()))
        return f"{time.perf_counter() - t0:.6f}"

    serve_rounds(run_round)
    result = {"versions": {"torch": torch.__version__}, "rows": rows}
    if kind == "ours":
        result["record_ns"] = _record_cost(engine, a["m"])
        engine.close()
    else:
        result["versions"]["deepspeed"] = deepspeed.__version__
    out.write_text(json.dumps(result))


def _record_cost(engine, m: int) -> float:
    """ns per micro-batch for the timeline: 3 records (a receive, fwd, bwd), the step's rows sent every
    ``m`` micro-batches (as train_batch does)."""
    from collector.rank.clock import perf_ns

    timeline, n = engine.timeline, 20_000
    t0 = time.perf_counter_ns()
    for i in range(n):
        start = perf_ns()
        timeline.record("recv_act", i, start)
        timeline.record("fwd", i, start)
        timeline.record("bwd", i, start)
        if i % m == m - 1:
            timeline.emit(0, m)
    timeline.emit(0, m)
    return (time.perf_counter_ns() - t0) / n


def _groups(world: int, a: dict, envs: dict, tmp: Path, timeout: float) -> dict[str, RankGroup]:
    return {
        kind: RankGroup(
            kind, "benches.pipe_vs_deepspeed", py, env, world, tmp, [json.dumps(a)], timeout, name=f"{kind}-{world}"
        )
        for kind, (py, env) in envs.items()
    }


def _compare(world: int, a: dict, envs: dict, rounds: int, timeout: float) -> tuple[dict, dict]:
    """{kind: [samples/s per round]} and {kind: finished results} for one world size."""
    rate: dict[str, list[float]] = {k: [] for k in envs}
    with tempfile.TemporaryDirectory() as tmp:
        groups = _groups(world, a, envs, Path(tmp), timeout)
        try:
            for i in range(rounds):
                for kind in list(groups) if i % 2 == 0 else list(groups)[::-1]:
                    secs = max(float(x) for x in groups[kind].round(i))
                    rate[kind].append(a["steps"] * a["micro"] * a["m"] / secs)
                print(f"world {world} round {i}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rate.items()))
            fin = {k: g.finish() for k, g in groups.items()}
        finally:
            for g in groups.values():
                g.kill()
    return rate, fin


def _bubbles(fin_ours: list[dict]):
    import pandas as pd

    from collector.data.pipeline import bubbles_of

    rows = pd.DataFrame([r for f in fin_ours for r in f["rows"]])
    return bubbles_of(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        kind, rank, world, port, out, (a,) = worker_args(argv)
        _worker(kind, rank, world, port, out, json.loads(a))
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.pipe_vs_deepspeed", description=__doc__.split("\n")[0])
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--bubble-micro-batches", default="2,4,8")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    from benches import _deepspeed_venv
    from collector.testing.ports import free_port

    ds_python = str(_deepspeed_venv.ensure())
    spool = tempfile.mkdtemp(prefix="bench-pipe-spool-")
    ours_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", RANKSCOPE_SPOOL_DIR=spool)
    envs = {"ours": (sys.executable, ours_env), "deepspeed": (ds_python, _deepspeed_venv.env())}
    base = {k: getattr(args, k) for k in ("layers", "hidden", "micro", "warmup", "steps")}
    base["endpoint"] = f"127.0.0.1:{free_port()}"
    load, t0 = [os.getloadavg()], time.monotonic()
    speed, versions, record_ns = {}, None, []
    for world in (int(w) for w in args.worlds.split(",")):
        rate, fin = _compare(world, dict(base, m=args.micro_batches), envs, args.rounds, args.timeout)
        speed[world] = (rate, _bubbles(fin["ours"]))
        versions = fin["deepspeed"][0]["versions"]
        record_ns += [f["record_ns"] for f in fin["ours"]]
    bubble = {}
    for world in (int(w) for w in args.worlds.split(",")):
        for m in (int(x) for x in args.bubble_micro_batches.split(",")):
            _, fin = _compare(world, dict(base, m=m), {"ours": envs["ours"]}, 2, args.timeout)
            bubble[(world, m)] = _bubbles(fin["ours"])
    load.append(os.getloadavg())
    text = _report(args, argv, speed, bubble, versions, record_ns, load, time.monotonic() - t0)
    from benches._sections import replace_section

    replace_section(Path(args.out), text)
    print(text)
    return 0


def _report(args, argv, speed, bubble, versions, record_ns, load, elapsed) -> str:
    cell = lambda v: f"{statistics.median(v):,.0f} [{min(v):,.0f}-{max(v):,.0f}]"
    cmd = ("python -m benches.pipe_vs_deepspeed " + " ".join(argv)).strip()
    H, now = args.hidden, datetime.datetime.now(datetime.timezone.utc)
    avg = lambda xs: "/".join(f"{x:.1f}" for x in xs)
    lines = [
        "# Pipeline parallelism: trainer.pipe vs DeepSpeed's PipelineEngine, gloo CPU ranks",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, ended {now:%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM, shared with other jobs; load average "
        f"(1/5/15 min) at start {avg(load[0])}, at end {avg(load[1])}",
        f"- rankscope code: {code_version(ROOT)}; ours in .venv (telemetry on, spooling); DeepSpeed "
        f"{versions['deepspeed']} with torch {versions['torch']} in .bench-venv-ds (DS_ACCELERATOR=cpu)",
        f"- model: {args.layers} x (Linear({H}, {H}) + ReLU) as LayerSpecs, mse loss, AdamW, ZeRO 0, fp32; "
        f"micro-batch {args.micro} samples; one stage per rank, 1 thread each; {args.warmup} warm-up batches, then "
        f"{args.rounds} rounds of {args.steps} train_batch calls per engine, engines alternating which goes first",
        "",
        f"## Samples/s, m = {args.micro_batches} micro-batches (median over rounds [min-max])",
        "",
        "| stages (ranks) | ours | DeepSpeed | ours / DeepSpeed (ratio of medians) | per-round ratios [min, max] |",
        "|---:|---:|---:|---:|---:|",
    ]
    for world, (rate, _) in speed.items():
        o, d = rate["ours"], rate["deepspeed"]
        per = [x / y for x, y in zip(o, d, strict=True)]
        lines.append(
            f"| {world} | {cell(o)} | {cell(d)} | {statistics.median(o) / statistics.median(d):.2f}x | "
            f"{statistics.median(per):.2f} [{min(per):.2f}, {max(per):.2f}] |"
        )
    lines += [
        "",
        "## Bubble fraction per stage, measured (ours, timed steps) vs 1F1B's ideal (p - 1) / (m + p - 1)",
        "",
        "Median over the timed steps of each stage's idle share of the pipeline's span (first forward to last "
        "backward over all stages). With more ranks than cores (4 stages on 2 cores) stages also wait for a CPU, "
        "which shows as bubble.",
        "",
        "| stages | m | ideal | measured per stage (stage 0, 1, ...) | mean of stages |",
        "|---:|---:|---:|---|---:|",
    ]
    for (world, m), b in bubble.items():
        per_stage = b.groupby("stage").bubble_fraction.median()
        lines.append(
            f"| {world} | {m} | {100 * (world - 1) / (m + world - 1):.0f}% | "
            + ", ".join(f"{100 * v:.0f}%" for v in per_stage)
            + f" | {100 * per_stage.mean():.0f}% |"
        )
    lines += [
        "",
        "## Telemetry cost",
        "",
        f"Recording a micro-batch's timeline (a receive, a forward and a backward event; the step's rows handed "
        f"to the session's buffer once per step of {args.micro_batches} micro-batches): "
        f"{statistics.median(record_ns) / 1e3:.1f} µs per micro-batch "
        f"(median over ranks, {len(record_ns)} ranks), against a micro-batch forward + backward of "
        f"{_mb_ms(speed):.1f} ms here.",
    ]
    return "\n".join(lines) + "\n"


def _mb_ms(speed) -> float:
    _, b = next(iter(speed.values()))
    return float((b.busy_ms / b.micro_batches).median())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
