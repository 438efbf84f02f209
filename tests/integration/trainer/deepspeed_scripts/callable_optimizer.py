"""A callable optimizer (params -> torch.optim.SGD with momentum) over model_parameters, ZeRO stage 0."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


model = tiny_model()
config = {"train_batch_size": 8, "gradient_clipping": 1.0, "steps_per_print": 1000}
engine, optimizer, _, _ = deepspeed.initialize(
    model=model, optimizer=make_optimizer, model_parameters=model.parameters(), config=config
)

losses, lrs = [], []
for step in range(5):
    x, y = batch(step, engine.global_rank, 4)
    loss = F.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
    lrs.append(engine.get_lr())
report(
    args.out,
    "callable_optimizer",
    losses=losses,
    lr=lrs,
    global_steps=engine.global_steps,
    step_applied=engine.was_step_applied(),
)
