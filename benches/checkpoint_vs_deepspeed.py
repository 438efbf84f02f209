"""Checkpoint save and load vs DeepSpeed 0.19.8: seconds and bytes per parameter, same model, ranks, run.

    python -m benches.checkpoint_vs_deepspeed [--world 2] [--stages 2 3] [--dim 512] [--layers 8] [--rounds 5]

Target (issue 19): a checkpoint any world size / ZeRO stage can resume from, at no more cost than
DeepSpeed's per-rank checkpoint (save + fsync and load <= 1.0x). Method: the example GPT
(benches/engine_vs_deepspeed.py's copy, at --dim / --layers), fp32, AdamW (torch's in both), ZeRO
stage N, ``--world`` gloo ranks per framework; each framework trains 2 steps (so the Adam moments
exist), then every round: barrier, save to a fresh tag (timed: until every rank returned), fsync
every file of the tag (timed apart: the frameworks leave the data in the page cache, this is what
making it durable costs), barrier, load that tag back into the same engine (timed; a fresh engine's
cost would add the same model build to both). Rounds alternate which framework goes first. A
round's time is the slowest rank's; the table gives the best and the median round. Bytes are the
tag folder's on disk: DeepSpeed's mp_rank_00_model_states.pt (module weights) +
zero_pp_rank_*_optim_states.pt (fp32 partitions + moments); ours the fragments (fp32 master +
moments, by parameter name) + index. Writes benches/RESULTS-checkpoint.md.
"""

from __future__ import annotations

import argparse
import datetime
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
from benches.engine_vs_deepspeed import BLOCK, VOCAB, bench_config, build_model, synthetic_batch

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "RESULTS-checkpoint.md"


def _fsync_tree(path: str) -> None:
    for folder, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _worker(
    kind: str, rank: int, world: int, port: int, out: Path, stage: int, dim: int, layers: int, root: str
) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    torch.set_num_threads(1)
    cfg = bench_config(stage)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    cfg.pop("flops_profiler", None)
    cfg["wall_clock_breakdown"] = False
    cfg["comms_logger"] = {"enabled": False}
    model = build_model(dim=dim, layers=layers)
    params = sum(p.numel() for p in model.parameters())
    if kind == "ours":
        import trainer

        dist.init_process_group("gloo", rank=rank, world_size=world)
        cfg["telemetry"] = {"enabled": False}
        engine, *_ = trainer.initialize(model=model, config=cfg)
    else:
        import logging

        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    micro = cfg["train_micro_batch_size_per_gpu"]
    for _ in range(2):
        x, y = synthetic_batch(engine.global_steps, 0, rank, micro)
        engine.backward(F.cross_entropy(engine(x).float().reshape(-1, VOCAB), y.reshape(-1)))
        engine.step()
    save_dir = os.path.join(root, kind)

    def run_round(i: int) -> str:
        tag = f"round{i}"
        dist.barrier()
        t0 = time.perf_counter()
        engine.save_checkpoint(save_dir, tag=tag)
        dist.barrier()
        t1 = time.perf_counter()
        if rank == 0:
            _fsync_tree(os.path.join(save_dir, tag))
        dist.barrier()
        t2 = time.perf_counter()
        path, _ = engine.load_checkpoint(save_dir, tag=tag)
        dist.barrier()
        t3 = time.perf_counter()
        assert path is not None
        nbytes = _tree_bytes(os.path.join(save_dir, tag)) if rank == 0 else 0
        return json.dumps({"save": t1 - t0, "fsync": t2 - t1, "load": t3 - t2, "bytes": nbytes})

    serve_rounds(run_round)
    result = {"params": params, "block": BLOCK}
    if kind == "deepspeed":
        result["versions"] = {"deepspeed": deepspeed.__version__, "torch": torch.__version__}
    else:
        engine.close()
    out.write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        kind, rank, world, port, out, (stage, dim, layers, root) = worker_args(argv)
        _worker(kind, rank, world, port, out, int(stage), int(dim), int(layers), root)
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.checkpoint_vs_deepspeed", description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir on the same disk)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)

    from benches import _deepspeed_venv

    ds_python = str(_deepspeed_venv.ensure())
    envs = {
        "ours": (sys.executable, dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")),
        "deepspeed": (ds_python, _deepspeed_venv.env()),
    }
    load = [os.getloadavg()[0]]
    started = time.monotonic()
    results, finished = {}, {}
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-ckpt-", dir=args.dir) as tmp:
        for stage in args.stages:
            rounds = {"ours": [], "deepspeed": []}
            groups = {}
            try:
                for kind, (python, env) in envs.items():
                    root = os.path.join(tmp, f"zero{stage}")
                    groups[kind] = RankGroup(
                        kind,
                        "benches.checkpoint_vs_deepspeed",
                        python,
                        env,
                        args.world,
                        Path(tmp),
                        [str(stage), str(args.dim), str(args.layers), root],
                        args.timeout,
                        name=f"{kind}-zero{stage}",
                    )
                for i in range(args.rounds):
                    for kind in list(groups) if i % 2 == 0 else list(groups)[::-1]:
                        per_rank = [json.loads(x) for x in groups[kind].round(i)]
                        rounds[kind].append(
                            {k: max(r[k] for r in per_rank) for k in ("save", "fsync", "load", "bytes")}
                        )
                        print(f"[zero{stage}] round {i} {kind}: {rounds[kind][-1]}", flush=True)
                finished[stage] = {kind: g.finish() for kind, g in groups.items()}
            finally:
                for g in groups.values():
                    g.kill()
            results[stage] = rounds
            load.append(os.getloadavg()[0])
    text = _report(args, argv, results, finished, load, time.monotonic() - started)
    Path(args.out).write_text(text)
    print(text)
    return 0


def _report(args, argv, results, finished, load, elapsed) -> str:
    any_stage = next(iter(finished.values()))
    params = any_stage["ours"][0]["params"]
    versions = any_stage["deepspeed"][0]["versions"]
    cmd = ("python -m benches.checkpoint_vs_deepspeed " + " ".join(argv)).strip()
    lines = [
        "# Checkpoint save / load vs DeepSpeed",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, ended "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM, ext4 on a virtual disk, shared with other "
        "jobs; 1-minute load average " + " -> ".join(f"{x:.1f}" for x in load) + " (start, then after each stage)",
        f"- rankscope code: {code_version(ROOT)}",
        f"- {args.world} gloo ranks per framework on CPU; DeepSpeed {versions['deepspeed']} with torch "
        f"{versions['torch']} (.bench-venv-ds, DS_ACCELERATOR=cpu), rankscope with the torch in .venv",
        f"- model: example GPT at dim {args.dim}, {args.layers} layers: {params:,} parameters, fp32, AdamW "
        "(torch's in both); trainer/examples/configs/zero{N}.json with logging and profiling off",
        f"- {args.rounds} rounds per stage, frameworks alternating; per round the slowest rank's seconds; "
        "best / median over rounds",
        "",
        "| ZeRO stage | framework | save s (best / median) | save + fsync s (median) | load s (best / median) | "
        "bytes / param | ours / DS: save | save + fsync | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stage, rounds in results.items():
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("save", "load")} for k, v in rounds.items()}
        for k, v in rounds.items():
            med[k]["durable"] = statistics.median(r["save"] + r["fsync"] for r in v)
        for kind in ("ours", "deepspeed"):
            v = rounds[kind]
            ratios = [
                f"{med['ours'][m] / med['deepspeed'][m]:.2f}x" if kind == "ours" else ""
                for m in ("save", "durable", "load")
            ]
            lines.append(
                f"| {stage} | {'rankscope' if kind == 'ours' else 'DeepSpeed'} | "
                f"{min(r['save'] for r in v):.3f} / {med[kind]['save']:.3f} | {med[kind]['durable']:.3f} | "
                f"{min(r['load'] for r in v):.3f} / {med[kind]['load']:.3f} | {v[-1]['bytes'] / params:.2f} | "
                + " | ".join(ratios)
                + " |"
            )
    lines += [
        "",
        "Ratios are of medians (below 1: rankscope faster). Neither framework syncs: a save returns once the",
        "data is in the page cache, and how long that takes depends on how much dirty data the kernel already",
        "holds (it throttles writers), so 'save + fsync' (durable on disk) is the steadier comparison. Loads",
        "read back what was just written, mostly from the page cache, for both. Bytes per parameter: Adam in",
        "fp32 needs 12 (master + two moments); DeepSpeed's ZeRO-2 also writes the module's fp32 weights in",
        "mp_rank_00_model_states.pt (4 more).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
