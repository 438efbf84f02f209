"""DeepSpeed's ``deepspeed.checkpointing``: activation checkpointing. ``checkpoint(function, *args)``
runs ``function`` without keeping its activations and recomputes them in backward (torch's
non-reentrant checkpoint: inputs need not require grad, and the random state is replayed, so the
gradients equal a run without it). The config's ``activation_checkpointing`` section is accepted;
its partitioning / CPU-offload knobs are GPU memory tools this engine does not act on."""

from __future__ import annotations

from torch.utils.checkpoint import checkpoint as _torch_checkpoint

__all__ = ["checkpoint"]


def checkpoint(function, *args):
    return _torch_checkpoint(function, *args, use_reentrant=False, preserve_rng_state=True)
