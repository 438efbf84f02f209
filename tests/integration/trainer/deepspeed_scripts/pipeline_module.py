"""Pipeline parallelism as DeepSpeed scripts write it: a PipelineModule of LayerSpecs with a
loss_fn (``deepspeed.pipe``), 2 stages on the 2 ranks, driven by train_batch over an iterator of (inputs, labels)
micro-batches; then eval_batch. Both engines build the layers from the same seed."""

import argparse

import deepspeed
import torch
import torch.nn.functional as F
from _corpus import D_HID, D_IN, D_OUT, batch, report
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
LayerSpec, PipelineModule = deepspeed.pipe.LayerSpec, deepspeed.pipe.PipelineModule
torch.manual_seed(0)
layers = [
    LayerSpec(nn.Linear, D_IN, D_HID),
    LayerSpec(nn.Tanh),
    LayerSpec(nn.Linear, D_HID, D_HID),
    LayerSpec(nn.Tanh),
    LayerSpec(nn.Linear, D_HID, D_OUT),
]
net = PipelineModule(layers=layers, num_stages=2, loss_fn=F.mse_loss, partition_method="parameters")
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
    "gradient_clipping": 0.0,
    "steps_per_print": 1000,
}
engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)


def micro_batches(step):
    return iter([batch(step, 0, 4, micro) for micro in range(engine.gradient_accumulation_steps())])


losses = [float(engine.train_batch(micro_batches(step))) for step in range(4)]
report(
    args.out,
    "pipeline_module",
    parts=[int(p) for p in net.parts],
    losses=losses,
    eval_loss=float(engine.eval_batch(micro_batches(100))),
    global_steps=engine.global_steps,
    micro_batches=engine.gradient_accumulation_steps(),
    train_batch_size=engine.train_batch_size(),
)
