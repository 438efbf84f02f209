"""A client optimizer object (torch.optim.AdamW) and no optimizer block, ZeRO stage 1, config=."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

model = tiny_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}, "steps_per_print": 1000}
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

losses, lrs, steps = [], [], []
for step in range(5):
    x, y = batch(step, engine.global_rank, 4)
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    lrs.append(engine.get_lr())
    steps.append(engine.global_steps)
report(
    args.out,
    "client_optimizer",
    losses=losses,
    lr=lrs,
    global_steps=steps,
    global_samples=engine.global_samples,
    mom=engine.get_mom(),
    world_size=engine.world_size,
    batch=[engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()],
)
