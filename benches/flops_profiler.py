"""Flops profiler: what a profiled training step costs, that an unprofiled
step afterwards costs nothing, and how our totals compare with torch's
FlopCounterMode (and DeepSpeed's get_model_profile when .bench-venv-ds has it).

Overhead: a GPT (SDPA attention) trained with SGD at two sizes, one step =
forward + backward + optimizer step, on one CPU thread. Per round, in this
order, each timed alone:
  baseline        a model that is never profiled
  profiled        the same step under StepProfiler (hooks, counting mode,
                  backward node hooks, report rendered to /dev/null, rows built)
  flop_counter    the same step under torch.utils.flop_counter.FlopCounterMode
  after_end       a second copy of the model, profiled and ended before: the
                  step after end_profile()
Medians over the rounds of wall time and of this thread's CPU time (with one
torch thread the step runs on it, so CPU time is far less disturbed by other
jobs on the shared cores); all paths interleaved, so drift hits all of them.

Totals: the models of collector.testing.flops_models (the ones the flops tests
check per module), one forward each.

    python -m benches.flops_profiler [--rounds 20]
Writes benches/RESULTS-flops.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from collector.testing.flops_models import MODELS, sdpa_flops
from trainer.profiling import FlopsProfiler, StepProfiler
from trainer.profiling.report import fmt_count

HERE = Path(__file__).resolve().parent
# Optional: python -m venv .bench-venv-ds && .bench-venv-ds/bin/pip install torch deepspeed pytest
DS_PYTHON = HERE.parent / ".bench-venv-ds" / "bin" / "python"


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, seq: int, layers: int, heads: int = 4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        return self.head(self.blocks(self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))))


def _timed_step(model, opt, idx, wrap=None) -> tuple[int, int]:
    """(wall ns, this thread's CPU ns) of one training step."""
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    if wrap is not None:
        wrap.begin(0)
    logits = model(idx)
    F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if wrap is not None:
        wrap.end(0, fwd_ns=None, bwd_ns=None, step_ns=None, samples=idx.shape[0])
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


class _CounterStep:
    """FlopCounterMode around the same step (the reference tool's cost)."""

    def begin(self, step):
        self.mode = FlopCounterMode(display=False)
        self.mode.__enter__()

    def end(self, step, **_):
        self.mode.__exit__(None, None, None)


SIZES = {  # name: (dim, seq, batch, layers)
    "tiny": (64, 32, 4, 2),
    "small": (256, 128, 8, 4),
}
PATHS = {
    "baseline": "baseline (never profiled)",
    "profiled": "profiled step (StepProfiler: hooks + counting + report + rows)",
    "flop_counter": "FlopCounterMode around the step (reference tool)",
    "after_end": "after end_profile() (same model, profiled before)",
}


def overhead(size: str, rounds: int) -> dict:
    dim, seq, batch, layers = SIZES[size]
    torch.manual_seed(0)
    vocab = 512
    base = GPT(vocab, dim, seq, layers)
    other = copy.deepcopy(base)
    idx = torch.randint(0, vocab, (batch, seq))
    opt_a = torch.optim.SGD(base.parameters(), lr=1e-3)
    opt_b = torch.optim.SGD(other.parameters(), lr=1e-3)
    rows: list = []
    profiled = StepProfiler(
        {"enabled": True, "profile_step": 0, "output_file": os.devnull},
        other,
        sink=lambda table, r: rows.append(len(r)),
    )
    for _ in range(2):  # warm up every path (the first dispatch-mode use compiles a lot)
        _timed_step(base, opt_a, idx)
        _timed_step(other, opt_b, idx, profiled)
        _timed_step(base, opt_a, idx, _CounterStep())
    times: dict[str, list[tuple[int, int]]] = {k: [] for k in PATHS}
    for _ in range(rounds):
        times["baseline"].append(_timed_step(base, opt_a, idx))
        times["profiled"].append(_timed_step(other, opt_b, idx, profiled))
        times["flop_counter"].append(_timed_step(base, opt_a, idx, _CounterStep()))
        times["after_end"].append(_timed_step(other, opt_b, idx))
    prof = FlopsProfiler(other)
    prof.start_profile()
    other(idx)
    prof.end_profile()
    return {
        "size": size,
        "dims": SIZES[size],
        "rounds": rounds,
        "wall_ms": {k: statistics.median(w for w, _ in v) / 1e6 for k, v in times.items()},
        "cpu_ms": {k: statistics.median(c for _, c in v) / 1e6 for k, v in times.items()},
        "modules": rows[-1],
        "flops": prof.get_total_flops(),
        "params": prof.get_total_params(),
    }


def totals() -> list[dict]:
    out = []
    for name, (make, inputs) in MODELS.items():
        torch.manual_seed(0)
        model, args = make(), inputs()
        prof = FlopsProfiler(model)
        prof.start_profile()
        with torch.no_grad():
            model(*args)
        prof.end_profile()
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(*args)
        out.append(
            {
                "model": name,
                "flops": prof.get_total_flops(),
                "matmul_flops": 2 * prof.get_total_macs(),
                "flop_counter": counter.get_total_flops(),
                "sdpa_analytic": sdpa_flops() * sum(type(m).__name__ == "SelfAttention" for m in model.modules())
                if name == "gpt_sdpa"
                else 0,
                "deepspeed": _deepspeed_flops(name),
            }
        )
    return out


def _deepspeed_flops(name: str) -> dict | None:
    """DeepSpeed's get_model_profile on the same model, in its own venv (optional)."""
    if not DS_PYTHON.exists():
        return None
    code = (
        "import json, torch; "  # `python -c` in the repo root: the kit imports from the working tree
        "from deepspeed.profiling.flops_profiler import get_model_profile; "
        "from collector.testing.flops_models import MODELS; "
        f"make, inputs = MODELS[{name!r}]; torch.manual_seed(0); m, a = make(), inputs(); "
        "f, mac, p = get_model_profile(m, args=list(a), print_profile=False, as_string=False, warm_up=0); "
        "print(json.dumps({'flops': f, 'macs': mac, 'version': __import__('deepspeed').__version__}))"
    )
    try:
        res = subprocess.run(
            [str(DS_PYTHON), "-c", code],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, DS_ACCELERATOR="cpu"),
        )
        return json.loads(res.stdout.strip().splitlines()[-1])
    except Exception as e:  # report what went wrong instead of a number
        return {"error": str(e)[:120]}


WHY = {
    "gpt_explicit_attention": "FlopCounterMode counts only mm/bmm; we add bias adds, LayerNorm (5/elt), GELU, "
    "residual adds, scale, masked_fill, softmax (1/elt).",
    "gpt_sdpa": "FlopCounterMode has no formula for CPU SDPA (_scaled_dot_product_flash_attention_for_cpu) and "
    "counts 0; we count 4*B*H*Lq*Lk*D per call (its CUDA formula), plus the non-matmul ops above.",
    "bert": "einsum and baddbmm arrive as bmm: identical matmul flops. We add the baddbmm mask add, bias adds, "
    "LayerNorm, GELU, tanh, softmax, residual adds.",
    "cnn": "Convolution MACs identical; we add conv bias adds, BatchNorm (eval 2/elt, train 5/elt), GroupNorm, "
    "ReLU/SiLU, pooling (1 per input element).",
}

# What DeepSpeed (0.19.8: monkeypatched torch functions) does differently on the same models.
WHY_DS = {
    "gpt_explicit_attention": "DeepSpeed: same MACs; its flops leave Linear bias adds out and count some "
    "elementwise ops differently.",
    "gpt_sdpa": "DeepSpeed: same MACs (it patches F.scaled_dot_product_attention too).",
    "bert": "DeepSpeed: torch.einsum gets flops from numpy's einsum_path but 0 MACs, so the "
    "attention-times-values MACs of every layer are missing from its MACs.",
    "cnn": "DeepSpeed: same MACs; small differences in norm/pool/activation conventions.",
}


def _platform() -> str:
    return (
        f"{platform.machine()} {os.cpu_count()}-core CPU VM (shared with other jobs), "
        f"Python {platform.python_version()}, torch {torch.__version__}, torch.set_num_threads(1)"
    )


def write(rounds: int, overheads: list[dict], tot: list[dict]) -> str:
    lines = [
        "# Flops profiler (trainer.profiling)",
        "",
        f"Command: `python -m benches.flops_profiler --rounds {rounds}`  ",
        f"Machine: {_platform()}.",
        "",
        "## Step cost (forward + backward + SGD step)",
        "",
        "GPT with SDPA attention, vocab 512; medians over interleaved rounds. CPU = this thread's CPU time",
        "(`time.thread_time_ns`; with one torch thread the whole step runs on it), less disturbed by the",
        "other jobs sharing the 2 cores than wall time.",
        "",
        "| model | path | wall median (ms) | wall vs baseline | CPU median (ms) | CPU vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    for ov in overheads:
        dim, seq, batch, layers = ov["dims"]
        model = (
            f"{ov['size']}: dim {dim}, seq {seq}, batch {batch}, {layers} layers, "
            f"{fmt_count(ov['params'])} params, {ov['modules']} modules, "
            f"{fmt_count(ov['flops'])} fwd flops, {ov['rounds']} rounds"
        )
        wall, cpu = ov["wall_ms"], ov["cpu_ms"]
        for key, label in PATHS.items():
            lines.append(
                f"| {model} | {label} | {wall[key]:.2f} | {wall[key] / wall['baseline']:.2f}x | "
                f"{cpu[key]:.2f} | {cpu[key] / cpu['baseline']:.2f}x |"
            )
            model = ""
    lines.append("")
    for ov in overheads:
        cpu = ov["cpu_ms"]
        lines.append(
            f"- {ov['size']}: the profiled step costs {cpu['profiled'] - cpu['baseline']:+.2f} ms CPU "
            f"({cpu['profiled'] / cpu['baseline']:.2f}x) against FlopCounterMode's "
            f"{cpu['flop_counter'] - cpu['baseline']:+.2f} ms ({cpu['flop_counter'] / cpu['baseline']:.2f}x); "
            f"the step after end_profile() {cpu['after_end'] - cpu['baseline']:+.2f} ms."
        )
    lines += [
        "",
        "Only the profile step pays: `end_profile()` removes every hook and the dispatch mode is active only",
        "inside a profiled forward, so the step after it runs the plain model (the after_end row is the same",
        "code path as baseline; any gap is noise on the shared cores). The profiled step's extra time is the",
        "per-operator Python dispatch (one `__torch_dispatch__` per ATen op in forward), module hooks, a",
        "timestamp per module and per autograd node in backward, and rendering the report.",
        "",
        "## Totals vs FlopCounterMode (one forward, models of collector/testing/flops_models.py)",
        "",
        "| model | ours: flops | ours: 2 x MACs (matmul-class) | FlopCounterMode | ours - FlopCounterMode | "
        "DeepSpeed flops | DeepSpeed 2 x MACs | ours - DeepSpeed (2 x MACs) | why they differ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tot:
        diff = t["matmul_flops"] - t["flop_counter"]
        note = f"{diff:+,}" + (f" (= SDPA analytic {t['sdpa_analytic']:,})" if t["sdpa_analytic"] else "")
        ds = t["deepspeed"]
        if ds is None or "error" in ds:
            missing = "not run (no .bench-venv-ds)" if ds is None else f"error: {ds['error']}"
            ds_cells = [missing, "", ""]
        else:
            ds_cells = [f"{ds['flops']:,}", f"{2 * ds['macs']:,}", f"{t['matmul_flops'] - 2 * ds['macs']:+,}"]
        why = WHY[t["model"]] + (" " + WHY_DS[t["model"]] if ds and "error" not in ds else "")
        lines.append(
            f"| {t['model']} | {t['flops']:,} | {t['matmul_flops']:,} | {t['flop_counter']:,} | {note} | "
            + " | ".join(ds_cells)
            + f" | {why} |"
        )
    versions = {t["deepspeed"].get("version") for t in tot if t["deepspeed"] and "version" in t["deepspeed"]}
    if versions:
        lines += [
            "",
            f"DeepSpeed {', '.join(sorted(versions))} from .bench-venv-ds: "
            "`get_model_profile(model, args=..., warm_up=0, as_string=False)` on the same models.",
        ]
    lines += [
        "",
        "Matmul-class flops (2 x MACs) equal FlopCounterMode exactly on every model except SDPA on CPU,",
        "where the difference is exactly the analytic 4*B*H*Lq*Lk*D per attention call (the tests assert this",
        "per module). Our total flops are higher by the non-matmul operators FlopCounterMode does not count.",
    ]
    text = "\n".join(lines) + "\n"
    (HERE / "RESULTS-flops.md").write_text(text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds for the tiny model (half for the small one)")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be at least 2")
    torch.set_num_threads(1)
    overheads = [overhead("tiny", args.rounds), overhead("small", max(args.rounds // 2, 1))]
    print(write(args.rounds, overheads, totals()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
