"""Seed 002's "getting started" call, made runnable on CPU with a tiny model: the seed passes
model, optimizer, config_params and a train_dataloader (not an argument of deepspeed.initialize,
so it is dropped here: the loop uses the script's own loader). Its config block is kept, with
what a 2-rank CPU job needs: fp16 -> fp32 (half precision optimizers are GPU-only in DeepSpeed),
offload_param dropped (it needs ZeRO-3), tensor parallelism off and spelled as DeepSpeed 0.19.8 takes
it (``autotp_size``: it refuses the seed's ``enabled`` / ``tp_size`` keys, which rankscope's engine
accepts), a client optimizer allowed with optimizer offload (zero_force_ds_cpu_optimizer), the
tensorboard block kept but off (DeepSpeed needs the tensorboard package for it)."""

import argparse
import os

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import TeacherDataset, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

model = tiny_model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TeacherDataset(64)
rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
train_dataloader = torch.utils.data.DataLoader(
    torch.utils.data.Subset(data, range(rank, len(data), world)), batch_size=16, shuffle=False
)

config = {
    "train_batch_size": 32,
    "gradient_accumulation_steps": 1,
    "fp16": {
        "enabled": False,
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    },
    "zero_force_ds_cpu_optimizer": False,
    "tensorboard": {"enabled": False, "output_path": os.path.join(args.out, "tensorboard_logs"), "job_name": "my_job"},
    "tensor_parallel": {"autotp_size": 0},
}

model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config_params=config)

losses = []
for x, y in train_dataloader:
    loss = F.mse_loss(model(x), y)
    model.backward(loss)
    model.step()
    losses.append(loss.item())
report(args.out, "seed002_getting_started", losses=losses, global_steps=model.global_steps, lr=model.get_lr())
