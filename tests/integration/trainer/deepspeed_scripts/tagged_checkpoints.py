"""Tagged checkpoints with client_state, resumed by a second engine (by tag, then through
``latest``); a client scheduler's state comes back with them; save_16bit_model loads into the plain
model; train()/eval(). ZeRO stage 1."""

import argparse
import os

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import batch, report, tiny_model

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
ckpt = os.path.join(args.out, "tagged_checkpoints")
config = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}, "steps_per_print": 1000}


def build(seed):
    model = tiny_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config)
    return engine


def train(engine, steps):
    losses = []
    for _ in range(steps):
        x, y = batch(engine.global_steps, engine.global_rank, 4)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


engine = build(seed=0)
first = train(engine, 3)
saved1 = {"epoch": 1, "best_loss": first[-1], "note": "after 3"}
engine.save_checkpoint(ckpt, tag="epoch1", client_state=saved1)
after_epoch1 = train(engine, 2)
saved2 = {"epoch": 2, "history": [1, 2, 3]}
engine.save_checkpoint(ckpt, tag="epoch2", client_state=saved2)
after_epoch2 = train(engine, 1)

engine.eval()
with torch.no_grad():
    x, y = batch(99, 0, 8)
    eval_loss = F.mse_loss(engine(x), y).item()
engine.train()
engine.save_16bit_model(args.out, "tagged_checkpoints_model.bin")
deepspeed.comm.barrier()
plain = tiny_model(seed=3)
plain.load_state_dict(torch.load(os.path.join(args.out, "tagged_checkpoints_model.bin")))
with torch.no_grad():
    plain_eval_loss = F.mse_loss(plain(x), y).item()

resumed = build(seed=1)  # other initial weights: everything must come from the checkpoint
_, state1 = resumed.load_checkpoint(ckpt, tag="epoch1")
steps1, lr1 = resumed.global_steps, resumed.get_lr()
resumed_losses = train(resumed, 2)
_, state2 = resumed.load_checkpoint(ckpt)  # latest: epoch2
steps2 = resumed.global_steps
resumed_losses2 = train(resumed, 1)
report(
    args.out,
    "tagged_checkpoints",
    losses=first + after_epoch1 + after_epoch2,
    resumed_from_epoch1=resumed_losses,
    resumed_from_latest=resumed_losses2,
    expected_from_epoch1=after_epoch1,
    expected_from_latest=after_epoch2,
    # DeepSpeed hands back its own bookkeeping keys too (ds_config, buffer_names, ...): the script's keys are compared
    client_state_epoch1={k: state1.get(k) for k in saved1},
    client_state_latest={k: state2.get(k) for k in saved2},
    global_steps=[steps1, steps2, resumed.global_steps],
    lr_after_load=lr1,
    eval_loss=[eval_loss, plain_eval_loss],
    training=[engine.training, engine.module.training],
)
