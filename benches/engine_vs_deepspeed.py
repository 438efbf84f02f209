"""Engine samples/s vs DeepSpeed, per ZeRO stage, with comm logging on in both, and
the communication volume per step from our own comm table against the ZeRO paper.

    python -m benches.engine_vs_deepspeed [--stages 0 1 2 3] [--world 2] [--warmup 5] [--steps 8] [--rounds 5]

Same model, batch and config JSON for both: the example GPT (trainer/examples/gpt.py
at its default sizes; its definition is copied below because DeepSpeed runs in its own
venv, which cannot import ``trainer``: the ours side checks the copy against the
original), trainer/examples/configs/zero{N}.json read once and handed to both
``trainer.initialize`` and ``deepspeed.initialize``, with two keys added for both:
``optimizer.params.torch_adam`` (DeepSpeed would otherwise build its fused Adam C++ op;
ours uses torch.optim.AdamW anyway) and ``zero_allow_untested_optimizer``. The configs
already enable ``comms_logger`` (prof_all) in both. Ours also ships its telemetry to a
live collector (a separate process on the same 2 cores), whose comm table gives the
volume per step; DeepSpeed only logs in memory.

Per stage, one process pair per framework (DeepSpeed in .bench-venv-ds, see
benches/_deepspeed_venv.py) builds its engine and warms up; then this process drives
them in lock-step rounds, ``--steps`` optimizer steps per round, alternating which
framework goes first, so both see the same machine load. Samples/s per round =
steps x world x micro-batch / (slowest rank's wall time); the table gives medians.

Writes benches/RESULTS-engine-ds.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benches._common import code_version
from benches._rank_group import RankGroup, serve_timed_rounds, worker_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = ROOT / "trainer" / "examples" / "configs"
OUT = HERE / "RESULTS-engine-ds.md"
VOCAB, BLOCK = 128, 32


def bench_config(stage: int) -> dict:
    """The example's config for ``stage``, with the keys both frameworks need on CPU."""
    cfg = json.loads((CONFIGS / f"zero{stage}.json").read_text())
    cfg["optimizer"]["params"]["torch_adam"] = True
    cfg["zero_allow_untested_optimizer"] = True
    return cfg


# ---------------------------------------------------------------------------
# The model: a copy of trainer/examples/gpt.py's GPT and synthetic_batch (the block
# comes from trainer/examples/_common.py, loaded by file path: it imports only torch).


def _common():
    spec = importlib.util.spec_from_file_location("_gpt_common", ROOT / "trainer" / "examples" / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_model(**sizes):
    """The example GPT (its defaults, or other ``dim`` / ``layers`` / ``heads``), seeded alike."""
    import torch
    from torch import nn

    common = _common()

    class GPT(nn.Module):  # copy of trainer.examples.gpt.GPT (same defaults)
        def __init__(self, vocab: int = VOCAB, block_size: int = BLOCK, dim: int = 64, layers: int = 2, heads: int = 4):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(block_size, dim)
            self.blocks = nn.ModuleList(common.Block(dim, heads, causal=True) for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)
            self.lm_head = nn.Linear(dim, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
            self.apply(common.init_weights)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    return GPT(**sizes)


def synthetic_batch(step: int, micro: int, rank: int, batch: int):  # copy of trainer.examples.gpt.synthetic_batch
    import torch

    g = torch.Generator().manual_seed(step * 1_000_003 + micro * 1009 + rank)
    start = torch.randint(0, VOCAB, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    seq = (start + stride * torch.arange(BLOCK + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


# ---------------------------------------------------------------------------
# workers: `python -m benches.engine_vs_deepspeed --worker ours|deepspeed STAGE RANK WORLD PORT OUT ENDPOINT WARMUP
# STEPS`


def _worker(
    kind: str, stage: int, rank: int, world: int, port: int, out: Path, endpoint: str, warmup: int, steps: int
) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    cfg = bench_config(stage)
    model = build_model()
    if kind == "ours":
        import torch.distributed as dist

        import trainer
        from trainer.examples.gpt import GPT

        torch.manual_seed(0)
        ref = GPT()
        mine = model.state_dict()
        assert (
            all(torch.equal(v, mine[k]) for k, v in ref.state_dict().items()) and ref.state_dict().keys() == mine.keys()
        ), "the bench's GPT copy drifted from trainer/examples/gpt.py"
        dist.init_process_group("gloo", rank=rank, world_size=world)
        cfg["telemetry"] = {"endpoint": endpoint, "run": f"engine-vs-ds-zero{stage}-w{world}"}
        engine, *_ = trainer.initialize(model=model, config=cfg)
    else:
        import logging

        import deepspeed

        deepspeed.utils.logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    micro = cfg["train_micro_batch_size_per_gpu"]
    losses = []

    def step() -> None:
        s = engine.global_steps
        x, y = synthetic_batch(s, 0, rank, micro)
        loss = F.cross_entropy(engine(x).float().reshape(-1, VOCAB), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())

    for _ in range(warmup):
        step()
    if kind == "deepspeed":
        import deepspeed.comm as ds

        ds.comms_logger.comms_dict.clear()  # count only the timed steps
    first_timed = engine.global_steps
    serve_timed_rounds(step, steps)
    timed_steps = engine.global_steps - first_timed
    result = {
        "first_timed_step": first_timed,
        "timed_steps": timed_steps,
        "losses": losses,
        "params": sum(p.numel() for p in model.parameters()) if kind == "ours" else None,
    }
    if kind == "deepspeed":
        import deepspeed.comm as ds

        result["ds_comms"] = {
            name: {str(size): v[0] for size, v in sizes.items()} for name, sizes in ds.comms_logger.comms_dict.items()
        }
        result["versions"] = {"deepspeed": deepspeed.__version__, "torch": torch.__version__}
        ds.barrier()
    else:
        engine.close()
    out.write_text(json.dumps(result))
    if kind == "ours":
        import torch.distributed as dist

        dist.destroy_process_group()


def _ranks(kind, python, env, stage, world, out_dir: Path, endpoint, warmup, steps, timeout) -> RankGroup:
    """One framework's ranks at one ZeRO stage; each round's payload is its wall seconds."""
    return RankGroup(
        kind,
        "benches.engine_vs_deepspeed",
        python,
        env,
        world,
        out_dir,
        [str(stage), endpoint, str(warmup), str(steps)],
        timeout,
        name=f"{kind}-zero{stage}",
    )


def _comm_volume(data_dir: Path, run: str, first: int, last: int):
    """Per (op, log_name): calls and bytes (nccl-tests S) per step on rank 0, over steps first..last."""
    from collector.data import catalog

    con = catalog.connect(data_dir)
    try:
        rows = con.execute(
            "SELECT c.op, c.log_name, c.group_size, count(*) AS calls, sum(c.bytes) AS bytes, "
            "count(DISTINCT c.step) AS steps "
            "FROM comm c JOIN runs r USING (run_id) WHERE r.name = ? AND c.rank = 0 AND c.step BETWEEN ? AND ? "
            "GROUP BY ALL ORDER BY bytes DESC",
            [run, first, last],
        ).fetchall()
    finally:
        con.close()
    return rows


_RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_reduce_coalesced": lambda n: 2 * (n - 1) / n}


def _ring_factor(op: str, n: int) -> float:
    """Bytes a rank sends per byte of S with the ring algorithm (= nccl-tests' busbw factor)."""
    if op in _RING:
        return _RING[op](n)
    if op.startswith(("all_gather", "reduce_scatter", "all_to_all")):
        return (n - 1) / n
    return 1.0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--worker"]:
        k, rank, world, port, out, (stage, endpoint, warmup, steps) = worker_args(argv)
        _worker(k, int(stage), rank, world, port, out, endpoint, int(warmup), int(steps))
        return 0
    p = argparse.ArgumentParser(prog="python -m benches.engine_vs_deepspeed", description=__doc__.split("\n")[0])
    p.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5, help="steps before timing (the flops profiler runs at step 3)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per round")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per stage")
    p.add_argument("--timeout", type=float, default=300, help="seconds a pair may take to start or finish")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--keep-data", default=None, help="keep the collector's data dir here (default: a temp dir)")
    args = p.parse_args(argv)

    from benches import _deepspeed_venv
    from collector.tools.launch import CollectorProcess

    ds_python = str(_deepspeed_venv.ensure())
    ds_env = _deepspeed_venv.env()
    our_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    load = [os.getloadavg()[0]]
    t_start = time.monotonic()
    results, failures, volumes = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = Path(args.keep_data) if args.keep_data else tmp / "data"
        with CollectorProcess(data) as coll:
            for stage in args.stages:
                pairs, rates = {}, {"ours": [], "deepspeed": []}
                try:
                    for kind, py, env in (("ours", sys.executable, our_env), ("deepspeed", ds_python, ds_env)):
                        try:
                            pairs[kind] = _ranks(
                                kind,
                                py,
                                env,
                                stage,
                                args.world,
                                tmp,
                                coll.address,
                                args.warmup,
                                args.steps,
                                args.timeout,
                            )
                        except RuntimeError as e:
                            failures[(stage, kind)] = str(e)
                            print(f"[zero{stage}] {kind} failed to start:\n{e}", flush=True)
                    for i in range(args.rounds):
                        order = list(pairs) if i % 2 == 0 else list(pairs)[::-1]
                        for kind in order:
                            secs = max(float(x.split()[0]) for x in pairs[kind].round(i))  # the slowest rank
                            rates[kind].append(
                                args.steps * args.world * bench_config(stage)["train_micro_batch_size_per_gpu"] / secs
                            )
                        print(
                            f"[zero{stage}] round {i}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items() if v),
                            flush=True,
                        )
                    finished = {kind: pair.finish() for kind, pair in pairs.items()}
                except RuntimeError as e:
                    failures[(stage, "run")] = str(e)
                    print(f"[zero{stage}] failed: {e}", flush=True)
                    finished = {}
                finally:
                    for pair in pairs.values():
                        pair.kill()
                results[stage] = {"rates": rates, "finished": finished}
                load.append(os.getloadavg()[0])
        # the collector has flushed and stopped: read our comm table
        for stage in args.stages:
            fin = results[stage]["finished"].get("ours")
            if fin:
                first = fin[0]["first_timed_step"]
                volumes[stage] = (
                    _comm_volume(
                        data, f"engine-vs-ds-zero{stage}-w{args.world}", first, first + fin[0]["timed_steps"] - 1
                    ),
                    fin[0]["timed_steps"],
                )
    elapsed = time.monotonic() - t_start
    text = _report(args, argv, results, failures, volumes, load, elapsed)
    Path(args.out).write_text(text)
    print(text)
    return 0 if not failures else 1


def _report(args, argv, results, failures, volumes, load, elapsed) -> str:
    cfg0 = bench_config(args.stages[0])
    micro = cfg0["train_micro_batch_size_per_gpu"]
    params = next((f["ours"][0]["params"] for r in results.values() for f in [r["finished"]] if "ours" in f), None)
    versions = next(
        (f["deepspeed"][0]["versions"] for r in results.values() for f in [r["finished"]] if "deepspeed" in f), None
    )
    n = args.world
    cmd = ("python -m benches.engine_vs_deepspeed " + " ".join(argv)).strip()
    lines = [
        "# Engine vs DeepSpeed: samples/s per ZeRO stage, comm volume per step",
        "",
        f"- command: `{cmd}` ({elapsed:.0f} s, "
        f"ended {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)",
        f"- machine: {platform.machine()} {os.cpu_count()}-core CPU VM shared with ~8 other jobs; 1-minute load "
        f"average " + " -> ".join(f"{x:.1f}" for x in load) + " (start, then after each stage)",
        f"- rankscope code: {code_version(ROOT)}",
        f"- {n} gloo ranks on CPU, 1 intra-op thread per rank; rankscope engine with torch from .venv; "
        + (
            f"DeepSpeed {versions['deepspeed']} with torch {versions['torch']} from .bench-venv-ds (DS_ACCELERATOR=cpu)"
            if versions
            else "DeepSpeed: did not run"
        ),
        f"- model: example GPT (trainer/examples/gpt.py defaults: vocab 128, seq 32, dim 64, 2 layers, 4 heads, tied "
        f"embedding), {params} parameters, fp32; micro-batch {micro} per rank, {n * micro} samples per step",
        "- config: trainer/examples/configs/zero{N}.json for both (comms_logger enabled, prof_all; "
        "wall_clock_breakdown; flops profiler at step 3, inside the warm-up) + optimizer.params.torch_adam and "
        "zero_allow_untested_optimizer; ours also streams telemetry to a live collector process on the same cores",
        f"- {args.warmup} warm-up steps, then {args.rounds} rounds x {args.steps} steps per framework, "
        "frameworks alternating within each stage (A/B/B/A...)",
        "",
        "## Samples/s (median over rounds; min-max in brackets)",
        "",
        "| ZeRO stage | ours | DeepSpeed | ours / DeepSpeed (ratio of medians) "
        "| per-round ratios (median [min, max]) |",
        "|---|---:|---:|---:|---:|",
    ]
    for stage, r in results.items():
        ours, ds = r["rates"]["ours"], r["rates"]["deepspeed"]

        def cell(v):
            return f"{statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]" if v else "did not run"

        ratio = f"{statistics.median(ours) / statistics.median(ds):.2f}x" if ours and ds else "-"
        per = [a / b for a, b in zip(ours, ds)]
        per_s = f"{statistics.median(per):.2f} [{min(per):.2f}, {max(per):.2f}]" if per else "-"
        lines.append(f"| {stage} | {cell(ours)} | {cell(ds)} | {ratio} | {per_s} |")
    losses = []
    for stage, r in results.items():
        f = r["finished"]
        if "ours" in f and "deepspeed" in f:
            lo, ld = f["ours"][0]["losses"], f["deepspeed"][0]["losses"]
            diff = [i for i, (a, b) in enumerate(zip(lo, ld)) if abs(a - b) > 1e-3 * max(1.0, abs(b))]
            where = (
                (
                    f"first differs by > 0.1% at step {diff[0]} ({lo[diff[0]]:.4f} vs {ld[diff[0]]:.4f}), "
                    f"max |diff| {max(abs(a - b) for a, b in zip(lo, ld)):.4f}"
                )
                if diff
                else "equal within 0.1% every step"
            )
            losses.append(
                f"zero{stage}: ours {lo[0]:.3f} -> {lo[-1]:.3f}, DeepSpeed {ld[0]:.3f} -> {ld[-1]:.3f} "
                f"({len(lo)} steps; {where})"
            )
    if losses:
        lines += [
            "",
            "Rank-0 loss, first -> last step (same data, same init, same config):",
            "",
            *[f"- {x}" for x in losses],
        ]
    if failures:
        lines += ["", "## Failures", ""]
        for (stage, kind), msg in failures.items():
            tail = "\n".join(msg.strip().splitlines()[-12:])
            lines += [f"zero{stage} {kind}:", "", "```", tail, "```", ""]
    if params and volumes:
        psi = params * 4
        lines += [
            "",
            f"## Communication volume per step (rank 0, from our comm table; Psi = {params} params x 4 bytes = "
            f"{psi} bytes)",
            "",
            "S = the comm table's `bytes` (the op's data size as nccl-tests defines it: all_reduce the buffer, "
            "all_gather the gathered output, reduce_scatter the full input). Ring traffic = bytes one rank sends "
            f"with the ring algorithm = S x 2(n-1)/n for all_reduce, S x (n-1)/n for all_gather / reduce_scatter "
            f"(n = {n}), S for broadcast. The ZeRO paper's 2Psi (DP, stages 1-2) and 3Psi (stage 3) are ring "
            "traffic with (n-1)/n taken as 1, so they compare with S summed over the gradient/parameter "
            f"collectives; the exact ring figure is (n-1)/n of that ({(n - 1) / n:.2f} here).",
            "",
            "| stage | op | log_name | calls/step | S/step (bytes) | S/step / Psi | ring traffic/step (bytes) |",
            "|---|---|---|---:|---:|---:|---:|",
        ]
        summary = [
            "",
            "| stage | S/step, all ops (bytes) | S / Psi | ring traffic / Psi | paper (n-1)/n -> 1 | "
            "paper exact ring ((n-1)/n x) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for stage, (rows, steps) in volumes.items():
            tot_s = tot_ring = 0.0
            for op, log_name, gsize, calls, nbytes, _ in rows:
                s = nbytes / steps
                ring = s * _ring_factor(op, gsize)
                tot_s += s
                tot_ring += ring
                lines.append(
                    f"| {stage} | {op} | {log_name} | {calls / steps:.1f} | {s:,.0f} | {s / psi:.3f} | {ring:,.0f} |"
                )
            paper = 3 if stage == 3 else 2
            summary.append(
                f"| {stage} | {tot_s:,.0f} | {tot_s / psi:.3f} | {tot_ring / psi:.3f} | {paper}Psi | "
                f"{paper * (n - 1) / n:.2f}Psi |"
            )
        lines += summary
    ds_rows = []
    for stage, r in results.items():
        f = r["finished"].get("deepspeed")
        if f:
            steps = f[0]["timed_steps"]
            for name, sizes in f[0]["ds_comms"].items():
                for size, count in sizes.items():
                    ds_rows.append(f"| {stage} | {name} | {size} | {count / steps:.1f} |")
    if ds_rows:
        lines += [
            "",
            "DeepSpeed's own comms logger over the same timed steps (rank 0; msg size in DeepSpeed's "
            "convention (get_msg_size_from_args): here its all_gather_into_tensor sizes sum to Psi/n, the per-rank "
            "chunk, and its reduce_scatter_tensor sizes to Psi, the full input):",
            "",
            "| stage | log name | msg size (bytes) | calls/step |",
            "|---|---|---:|---:|",
            *ds_rows,
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
