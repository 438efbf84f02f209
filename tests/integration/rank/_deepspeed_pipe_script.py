"""A DeepSpeed pipeline script as users write one, with nothing of rankscope in it: a PipelineModule of
LayerSpecs on 2 stages (``partition_method="uniform"``), 4 micro-batches a step, AdamW, gloo. Stage 1's
layers sleep ``SLOW_S`` more per forward than stage 0's, so stage 1 is the slow stage. Run by
tests/integration/rank/test_deepspeed_pipe_hook.py in the DeepSpeed venv:

    torchrun --nproc-per-node 2 -m collector.hook --run-name ds-pipe _deepspeed_pipe_script.py OUT

Each rank writes ``OUT/rank<r>.json``: its stage and the losses ``train_batch`` returned.
"""

import json
import sys
import time
from pathlib import Path

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, PipelineModule
from torch import nn

STEPS, MICRO_BATCHES, WIDTH, LAYERS = 8, 4, 8, 4
FWD_S, BWD_S, SLOW_S = 0.005, 0.01, 0.02  # per layer; stage 1's layers add SLOW_S / LAYERS each


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class SleepLayer(nn.Module):
    def __init__(self, fwd_s: float, bwd_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)
        self.fwd_s, self.bwd_s = fwd_s, bwd_s

    def forward(self, x):
        time.sleep(self.fwd_s)
        return _SleepInBackward.apply(self.linear(x), self.bwd_s)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    specs = [LayerSpec(SleepLayer, FWD_S, BWD_S) for _ in range(LAYERS)]
    specs += [LayerSpec(SleepLayer, FWD_S + SLOW_S / LAYERS, BWD_S) for _ in range(LAYERS)]
    torch.manual_seed(0)
    net = PipelineModule(layers=specs, num_stages=2, loss_fn=F.mse_loss, partition_method="uniform")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": MICRO_BATCHES,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    g = torch.Generator().manual_seed(1)
    data = iter([(torch.randn(2, WIDTH, generator=g), torch.randn(2, WIDTH, generator=g))
                 for _ in range(STEPS * MICRO_BATCHES)])  # fmt: skip
    losses = [float(engine.train_batch(data)) for _ in range(STEPS)]
    rank = torch.distributed.get_rank()
    (out / f"rank{rank}.json").write_text(json.dumps({"stage": engine.stage_id, "losses": losses}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
