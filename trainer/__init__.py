"""rankscope's bundled DeepSpeed-style training engine, importable in DeepSpeed's place:

    import trainer as deepspeed
    engine, optimizer, dataloader, lr_scheduler = deepspeed.initialize(model=..., config=...)

``initialize``, ``add_config_arguments``, ``init_distributed`` (trainer.api), ``Engine``
(trainer.engine), ``comm`` (trainer.comm, for ``deepspeed.comm``), ``pipe`` (trainer.pipe, for
``deepspeed.pipe``) and ``checkpointing`` (trainer.checkpointing, for ``deepspeed.checkpointing``)."""

from __future__ import annotations

import importlib

__all__ = ["Engine", "add_config_arguments", "checkpointing", "comm", "init_distributed", "initialize", "pipe"]

_HOMES = {
    "Engine": "trainer.engine",
    "initialize": "trainer.api",
    "add_config_arguments": "trainer.api",
    "init_distributed": "trainer.api",
}


def __getattr__(name: str):
    # Lazy, so importing a light submodule (trainer.lr_schedules, trainer.comm) does not build the engine.
    if name in ("comm", "pipe", "checkpointing"):
        return importlib.import_module(f"trainer.{name}")
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
