"""Scenario runs: the example GPT under the bundled engine, each with one thing wrong
that the dashboard should make obvious. They are what ``sample_runs/`` holds
(``python -m collector.tools.sample_runs``), and can be run on their own:

    RANKSCOPE_ENDPOINT=127.0.0.1:50051 RANKSCOPE_RUN=zero2-slow-rank3 \\
        torchrun --nproc_per_node 4 -m trainer.examples.scenarios --scenario zero2-slow-rank3 --steps 30

- ``zero2-slow-rank3``: ZeRO-2 on 4 ranks; rank 3 sleeps before every forward, so
  it is last at every gradient reduce_scatter (the ``stragglers`` view names it).
- ``zero3-fp16-overflows``: ZeRO-3 + fp16 on 2 ranks starting from a loss scale of
  2^24: the first steps overflow and are skipped while the scale backs off.
- ``moe-skewed-expert``: the GPT with MoE blocks (``GPT(moe=...)``), 4 experts over
  ep_size 2, whose routers are biased toward expert 0: that expert gets most tokens
  and overflows its capacity, so tokens are dropped.
- ``zero2-hang-rank2``: ZeRO-2 on 4 ranks; at step 20 rank 2 waits forever for a batch,
  so the other three wait in the step's first gradient reduction: a hang
  (``hang_after_s`` 5 s) with the missing rank's stack. The job never ends on its
  own; ``collector.tools.sample_runs`` kills it once the hang is recorded, as a
  scheduler's job timeout would, so the recorded run still shows the hang.

Each scenario starts from a shipped config (trainer/examples/configs/) and
changes only what the scenario is about.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import trainer
from trainer.engine import init_distributed
from trainer.examples._common import CONFIG_DIR, train_loop
from trainer.examples.gpt import GPT, synthetic_batch
from trainer.moe import MoE

VOCAB, BLOCK_SIZE = 128, 32  # GPT()'s defaults, which synthetic_batch must match


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    nproc: int  # torchrun --nproc_per_node
    base_config: str  # file in trainer/examples/configs/
    overrides: dict  # merged into the base config, key by key
    model: Callable[[], nn.Module]
    prepare: Callable[[nn.Module, int], None] = lambda model, rank: None  # (model, rank), before training
    loss: Callable[[object, torch.Tensor], torch.Tensor] = _lm_loss  # (model output, targets)
    # (rank, step): that rank never gets its batch for that step, so the job never ends on its own
    # and whoever runs it must end it once the hang is recorded.
    hang: tuple[int, int] | None = None

    def config(self) -> dict:
        with open(CONFIG_DIR / self.base_config) as f:
            return _merge(json.load(f), self.overrides)


def _merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# ---------------------------------------------------------------- zero2-slow-rank3

SLOW_RANK, SLOW_SECONDS = 3, 0.04


def _slow_down(model: nn.Module, rank: int) -> None:
    """Rank 3 sleeps before each forward. Gradient reductions are launched async from
    backward, so every one of rank 3's is issued ~40 ms after the others'."""
    if rank == SLOW_RANK:
        model.register_forward_pre_hook(lambda module, args: time.sleep(SLOW_SECONDS))


# ---------------------------------------------------------------- zero2-hang-rank2


def wait_for_a_batch_that_never_comes() -> None:
    """Where the stuck rank is: its stack, captured on the collector's request, names this."""
    while True:
        time.sleep(1.0)


# ---------------------------------------------------------------- moe-skewed-expert

# gpt.py's MoE GPT: 4 blocks, the MoE ones (1 and 3) with 4 experts over ep_size 2, top-1.
MOE = dict(num_experts=[4], ep_size=2, k=1, use_residual=False)
FAVOURED_EXPERT, ROUTER_BIAS = 0, 1.5


def _skew_router(model: nn.Module, rank: int) -> None:
    """Bias every router toward one expert: a pre-hook on the gate shifts the tokens it
    sees along that expert's gate-weight row so that its logit is ROUTER_BIAS higher for
    every token (the experts still get the unshifted tokens). Recomputed from the current
    weight at each forward, so training does not wear the skew off."""

    def shift(gate, args):
        row = gate.weight.detach()[FAVOURED_EXPERT].to(args[0].dtype)  # [M]
        return (args[0] + row * (ROUTER_BIAS / row.dot(row)),)

    for module in model.modules():
        if isinstance(module, MoE):
            module.gate.register_forward_pre_hook(shift)


def _moe_loss(out, targets: torch.Tensor) -> torch.Tensor:
    logits, aux = out
    return _lm_loss(logits, targets) + 0.01 * aux


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    # In the order they are recorded: the last is the newest run, the one the dashboard opens on.
    for s in (
        Scenario(
            name="zero2-hang-rank2",
            nproc=4,
            base_config="zero2.json",
            model=GPT,
            hang=(2, 20),
            overrides={"flops_profiler": {"enabled": True, "profile_step": 2}, "telemetry": {"hang_after_s": 5.0}},
        ),
        Scenario(
            name="zero2-slow-rank3",
            nproc=4,
            base_config="zero2.json",
            model=GPT,
            prepare=_slow_down,
            overrides={
                "comms_logger": {"enabled": True, "prof_all": True},
                "wall_clock_breakdown": True,
                "flops_profiler": {"enabled": True, "profile_step": 2},
            },
        ),
        Scenario(
            name="zero3-fp16-overflows",
            nproc=2,
            base_config="zero3.json",
            model=GPT,
            overrides={
                "fp16": {
                    "enabled": True,
                    "loss_scale": 0,
                    "initial_scale_power": 24,
                    "loss_scale_window": 10,
                    "hysteresis": 2,
                    "min_loss_scale": 1,
                },
                "flops_profiler": {"enabled": True, "profile_step": 5},
            },
        ),
        Scenario(
            name="moe-skewed-expert",
            nproc=4,
            base_config="zero0.json",
            model=lambda: GPT(layers=4, moe=MOE),
            prepare=_skew_router,
            loss=_moe_loss,
            overrides={"flops_profiler": {"enabled": True, "profile_step": 2}},
        ),
    )
}


def main() -> None:
    p = argparse.ArgumentParser(description="Run one scenario of the shipped sample runs under torchrun.")
    p.add_argument("--scenario", choices=sorted(SCENARIOS))
    p.add_argument(
        "--list", action="store_true", help='print {scenario: {"ranks": N, "hang_step": S or null}} as JSON and exit'
    )
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.list:  # how collector.tools.sample_runs learns the scenarios without importing the engine
        listing = {name: {"ranks": s.nproc, "hang_step": s.hang and s.hang[1]} for name, s in SCENARIOS.items()}
        print(json.dumps(listing))
        return
    if args.scenario is None:
        p.error("--scenario is required")
    scenario = SCENARIOS[args.scenario]
    rank = int(os.environ.get("RANK", 0))
    torch.manual_seed(args.seed)
    init_distributed()  # before the model: MoE layers build their expert-parallel groups
    model = scenario.model()
    scenario.prepare(model, rank)
    engine, *_ = trainer.initialize(model=model, config=scenario.config())

    def batches(step, micro):
        if scenario.hang == (rank, step):
            wait_for_a_batch_that_never_comes()
        x, y = synthetic_batch(
            step, micro, rank, engine.train_micro_batch_size_per_gpu(), VOCAB, BLOCK_SIZE, engine.device
        )
        return x, lambda out: scenario.loss(out, y)

    train_loop(engine, batches, argparse.Namespace(steps=args.steps, load=None, save=None), scenario.name)


if __name__ == "__main__":
    main()
