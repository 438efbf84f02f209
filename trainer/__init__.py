"""rankscope's bundled DeepSpeed-style training engine:
``engine, optimizer, dataloader, lr_scheduler = trainer.initialize(model=..., config=...)``."""

from __future__ import annotations

__all__ = ["Engine", "initialize"]


def __getattr__(name: str):
    # Lazy, so importing a light submodule (trainer.lr_schedules, trainer.comm) does not build the engine.
    if name in __all__:
        from trainer import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
