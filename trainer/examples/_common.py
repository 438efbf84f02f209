"""What the examples share: a small pre-norm transformer block, the command line and the loop."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn
from torch.nn import functional as F

CONFIG_DIR = Path(__file__).parent / "configs"
USER_ERROR_EXIT = 2  # a user's mistake (config, world size, missing file): one line, no traceback
DEBUG_ENV = "RANKSCOPE_DEBUG"  # =1: the traceback too


class Block(nn.Module):
    """Pre-norm transformer block; every parameter is used inside the forward of the module
    that owns it, so ZeRO-3 can gather it with that module's hooks."""

    def __init__(self, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))  # [B, H, T, D/H]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


def init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def parse_args(description: str, default_config: str, add_arguments=None) -> argparse.Namespace:
    """The examples' shared flags; ``add_arguments(parser)`` adds an example's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--config",
        default=default_config,
        help=f"ds_config.json path, or the name of a bundled example config "
        f"({', '.join(sorted(p.name for p in CONFIG_DIR.glob('*.json')))})",
    )
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    # --run-name: under torchrun, "--run" is taken as an abbreviation of torchrun's own --run-path.
    p.add_argument("--run", "--run-name", dest="run", default=None, help="telemetry run name (sets telemetry.run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="save a checkpoint here at the end")
    p.add_argument("--load", default=None, help="resume from the latest checkpoint here")
    if add_arguments is not None:
        add_arguments(p)
    return p.parse_args()


def config_path(name: str) -> Path:
    """A config file path as given, else the bundled example config of that name."""
    path = Path(name)
    if not path.exists() and (CONFIG_DIR / path.name).exists() and path.name == name:
        return CONFIG_DIR / path.name
    return path


def user_error(message: str) -> NoReturn:
    """Say a user's mistake in one line (``error: ...``, as collector.tools.supervise says it for the
    demo's ranks) and exit USER_ERROR_EXIT. Every rank says it: each hits the same mistake."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT)


def run_main(main: Callable[[], None]) -> None:
    """An example's ``main()`` as torchrun runs it: a bad config value or a world size its layout
    cannot take (ConfigError, naming the dotted key), or a checkpoint that cannot be resumed here
    (CheckpointError, naming the file or setting) is one line and exit 2 instead of a traceback on
    every rank; the traceback only with RANKSCOPE_DEBUG=1."""
    from trainer.checkpoint.layout import CheckpointError
    from trainer.config import ConfigError

    try:
        main()
    except (ConfigError, CheckpointError) as exc:
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        user_error(f"{exc} ({DEBUG_ENV}=1 shows the traceback)")


def load_config(args: argparse.Namespace) -> dict:
    try:
        with open(config_path(args.config)) as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        user_error(f"cannot read --config {args.config}: {e}")
    if args.run:
        config.setdefault("telemetry", {})["run"] = args.run
    return config


def train_loop(engine, batches, args: argparse.Namespace, name: str) -> None:
    """``batches(step, micro) -> (inputs, loss_fn)``; prints rank 0's loss every step."""
    rank = int(os.environ.get("RANK", 0))
    if args.load:
        engine.load_checkpoint(args.load)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step, total = engine.global_steps, 0.0
        for micro in range(engine.gradient_accumulation_steps()):
            inputs, loss_fn = batches(step, micro)
            loss = loss_fn(engine(inputs))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        if rank == 0:
            print(
                f"[{name}] step {engine.global_steps} loss {total / engine.gradient_accumulation_steps():.4f}",
                flush=True,
            )
    if rank == 0:
        elapsed = time.perf_counter() - t0
        print(
            f"[{name}] {args.steps} steps in {elapsed:.1f}s, "
            f"{args.steps * engine.train_batch_size() / elapsed:.1f} samples/s",
            flush=True,
        )
    if args.save:
        engine.save_checkpoint(args.save)
    engine.close()
