"""config_params= (the older spelling), a client optimizer and training_data: the engine's
dataloader (DistributedSampler over the data-parallel ranks), one epoch."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import TeacherDataset, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

model = tiny_model()
optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
config = {"train_batch_size": 8, "gradient_accumulation_steps": 1, "steps_per_print": 1000}
engine, optimizer, loader, _ = deepspeed.initialize(
    model=model, optimizer=optimizer, config_params=config, training_data=TeacherDataset(32)
)
losses = []
for x, y in loader:
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
report(args.out, "config_params", losses=losses, global_steps=engine.global_steps, lr=engine.get_lr())
