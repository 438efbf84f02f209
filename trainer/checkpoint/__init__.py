"""Universal checkpoints: save on any layout, resume on any other.

A checkpoint is keyed by parameter name, not by rank or flat-buffer offset:
each rank writes the pieces ("fragments") of the parameters it holds -- fp32
master values and optimizer moments -- named by parameter and element range,
and an index (checkpoint.json) lists them. Loading looks every parameter up by
name, so a run saved on 8 ranks with ZeRO-2 resumes on 4 ranks with ZeRO-3, on
1 rank with ZeRO-0, with or without CPU / NVMe offload, and with any MoE
``ep_size`` that divides the expert count (experts are named by global id).

    engine.save_checkpoint("ckpt")                      # collective; ckpt/global_step<N>/ + ckpt/latest
    engine.load_checkpoint("ckpt")                      # any world size / stage / offload / ep_size
    python -m trainer.checkpoint.zero_to_fp32 ckpt out  # one fp32 state dict for the plain model

What a checkpoint holds: fp32 master weights; optimizer per-element state and
step; param-group options; lr scheduler; fp16 loss scaler; step and sample
counters; the engine dataloader's sampler position; buffers and frozen
parameters; RNG states (restored on the same world size only); client_state.

Modules: layout (files, index, tags), names (checkpoint names of a model's
tensors), fragments (buckets <-> name-keyed fragments), optimizer_state (what
of an optimizer is kept and how it is restored), save, load, zero_to_fp32.

What cannot be resumed, with the error (CheckpointError) naming it: a model
whose parameters or buffers differ in name or shape (the first one in module
order is named), a different optimizer type (AdamW state into SGD), a different
number of param groups, a different tensor_parallel.tp_size.
"""

from trainer.checkpoint.layout import CheckpointError
from trainer.checkpoint.load import load_checkpoint
from trainer.checkpoint.save import save_checkpoint

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]
