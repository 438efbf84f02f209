"""rankscope C++ extensions: a fused CPU Adam and an async file I/O engine.

    from native import CPUAdam, AsyncIOHandle

Each compiles on first use (see native/build.py; `python -m native.build`
builds both ahead of time) and falls back to pure torch / Python with the same
API when no compiler is available. Importing `native` alone builds nothing.
"""

from __future__ import annotations

import importlib

__all__ = ["AsyncIOHandle", "CPUAdam"]

_HOMES = {"AsyncIOHandle": "native.aio", "CPUAdam": "native.cpu_adam"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'native' has no attribute {name!r}")
