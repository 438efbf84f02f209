"""rankscope C++ extensions: a fused CPU Adam and an async file I/O engine.

Both compile on first use (see native/build.py) and fall back to pure torch /
Python with the same API when no compiler is available.
"""
from native.aio import AsyncIOHandle
from native.cpu_adam import CPUAdam

__all__ = ["AsyncIOHandle", "CPUAdam"]
