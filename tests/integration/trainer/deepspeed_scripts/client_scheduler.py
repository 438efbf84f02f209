"""A client scheduler object (torch StepLR over the client optimizer) under gradient accumulation:
it steps once per optimizer step, not per micro-step. ZeRO stage 2."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

model = tiny_model()
optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2},
    "steps_per_print": 1000,
}
engine, optimizer, _, scheduler = deepspeed.initialize(
    model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
)

losses, lrs, last_lr = [], [], []
for step in range(5):
    for micro in range(engine.gradient_accumulation_steps()):
        x, y = batch(step, engine.global_rank, 2, micro)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
        lrs.append(engine.get_lr())
    last_lr.append(scheduler.get_last_lr())
report(args.out, "client_scheduler", losses=losses, lr=lrs, last_lr=last_lr, global_steps=engine.global_steps)
