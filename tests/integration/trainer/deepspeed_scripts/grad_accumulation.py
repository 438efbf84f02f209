"""Gradient accumulation as DeepSpeed scripts write it: step() after every micro-batch,
is_gradient_accumulation_boundary() to act once per optimizer step; gradient clipping, ZeRO stage 2."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

model = tiny_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
config = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 2},
    "steps_per_print": 1000,
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
gas = engine.gradient_accumulation_steps()

losses, boundaries, applied, steps, grad_norms = [], [], [], [], []
for micro_step in range(3 * gas):
    x, y = batch(micro_step // gas, engine.global_rank, 2, micro_step % gas)
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    boundary = engine.is_gradient_accumulation_boundary()
    engine.step()
    losses.append(loss.item())
    boundaries.append(boundary)
    applied.append(engine.was_step_applied())
    steps.append(engine.global_steps)
    if boundary:
        grad_norms.append(float(engine.get_global_grad_norm()))
report(
    args.out,
    "grad_accumulation",
    gas=gas,
    losses=losses,
    boundary=boundaries,
    step_applied=applied,
    global_steps=steps,
    grad_norm=grad_norms,
    lr=engine.get_lr(),
)
