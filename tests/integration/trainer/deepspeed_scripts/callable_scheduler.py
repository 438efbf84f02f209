"""A callable scheduler (optimizer -> torch LambdaLR) with the config's optimizer block, which DeepSpeed
builds; torch_adam keeps DeepSpeed on torch's Adam on CPU. ZeRO stage 1."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

config = {
    "train_batch_size": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 0.005, "torch_adam": True}},
    "zero_optimization": {"stage": 1},
    "steps_per_print": 1000,
}
model = tiny_model()
engine, _, _, scheduler = deepspeed.initialize(
    model=model,
    model_parameters=model.parameters(),
    lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
    config=config,
)

losses, lrs = [], []
for step in range(5):
    x, y = batch(step, engine.global_rank, 4)
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    lrs.append(engine.get_lr())
report(args.out, "callable_scheduler", losses=losses, lr=lrs, global_steps=engine.global_steps, mom=engine.get_mom())
