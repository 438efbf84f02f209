"""The typical DeepSpeed script: add_config_arguments, --deepspeed_config from the command line,
init_distributed(), initialize(args=...), --local_rank; the config's optimizer and WarmupLR scheduler."""

import argparse

import deepspeed
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser(description="tiny regression")
parser.add_argument("--out", required=True)
parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
assert args.deepspeed and args.deepspeed_config

deepspeed.init_distributed()
model = tiny_model()
engine, optimizer, _, scheduler = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())

losses, lrs, steps = [], [], []
engine.train()
for step in range(6):
    x, y = batch(step, engine.global_rank, 4)
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    lrs.append(engine.get_lr())
    steps.append(engine.global_steps)
report(
    args.out,
    "args_config",
    losses=losses,
    lr=lrs,
    global_steps=steps,
    local_rank=engine.local_rank,
    world=[engine.world_size, deepspeed.comm.get_world_size(), deepspeed.comm.get_rank() == engine.global_rank],
    scheduler=type(scheduler).__name__,
)
