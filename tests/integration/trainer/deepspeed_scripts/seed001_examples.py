"""Seed 001's config-JSON examples, made runnable on a tiny model: its Adam optimizer example (with
torch_adam, so DeepSpeed uses torch's Adam on CPU), each of its scheduler examples (WarmupLR,
WarmupDecayLR, LRRangeTest, OneCycle without momentum cycling: DeepSpeed would overwrite Adam's
beta2), gradient_clipping, and its ZeRO stage-2 example block; 2 steps of each."""

import argparse

import deepspeed
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

OPTIMIZER = {
    "type": "Adam",
    "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8, "weight_decay": 3e-7, "torch_adam": True},
}
SCHEDULERS = [
    {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000}},
    {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "total_num_steps": 10000},
    },
    {
        "type": "LRRangeTest",
        "params": {
            "lr_range_test_min_lr": 0.0001,
            "lr_range_test_step_size": 200,
            "lr_range_test_step_rate": 5,
            "lr_range_test_staircase": False,
        },
    },
    {
        "type": "OneCycle",
        "params": {
            "cycle_min_lr": 0.002,
            "cycle_max_lr": 0.005,
            "cycle_first_step_size": 2000,
            "cycle_second_step_size": 2000,
            "cycle_momentum": False,
        },
    },
]
ZERO = {
    "stage": 2,
    "allgather_partitions": True,
    "allgather_bucket_size": 5e8,
    "overlap_comm": False,
    "reduce_scatter": True,
    "reduce_bucket_size": 5e8,
    "contiguous_gradients": True,
}

observed = {}
for scheduler in SCHEDULERS:
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": OPTIMIZER,
        "scheduler": scheduler,
        "gradient_clipping": 1.0,
        "zero_optimization": ZERO,
        "steps_per_print": 1000,
        "wall_clock_breakdown": False,
    }
    model = tiny_model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    losses, lrs = [], []
    for step in range(2):
        x, y = batch(step, engine.global_rank, 4)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr())
    observed[scheduler["type"]] = {"losses": losses, "lr": lrs, "global_steps": engine.global_steps}
report(args.out, "seed001_examples", **observed)
