"""TensorSwapper: park tensors in files and bring them back (ZeRO-Infinity's NVMe offload).

    swapper = TensorSwapper("/local_nvme/rank0")
    swapper.swap_out("layer3.exp_avg", exp_avg)     # async write; the caller may drop exp_avg
    swapper.prefetch("layer3.exp_avg")              # async read into a page-locked buffer
    exp_avg = swapper.swap_in("layer3.exp_avg")     # waits only if the read isn't done yet
    swapper.close()                                 # waits, deletes its files and directory

One file per key in a private sub-directory of `directory`, written and read
with one AsyncIOHandle. Data is copied into page-aligned, page-locked staging
buffers, so the caller's tensor is free for reuse as soon as swap_out returns
and the handle can use O_DIRECT. Keys swapped out again overwrite their file.

Each key's I/O is waited for on its own (the handle's tickets): swap_in(key)
waits for that key's read only, so with several prefetched reads in flight the
first tensor is handed out as soon as its own read is done. `ready(key)` says,
without waiting, whether swap_in(key) would return at once.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass

import torch

from native.aio import AsyncIOHandle


@dataclass
class _Entry:
    path: str
    shape: torch.Size
    dtype: torch.dtype
    buffer: torch.Tensor | None = None  # staging buffer of a write in flight, or of a read
    keep: bool = False  # buffer holds the data for the next swap_in (read, or written and prefetched)
    ticket: int | None = None  # the handle's ticket of the op in flight on this key


class TensorSwapper:
    """Tensors <-> files through AsyncIOHandle, with prefetch; cleans up on close()."""

    def __init__(self, directory: str, handle: AsyncIOHandle | None = None):
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"TensorSwapper: swap directory {directory} does not exist")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(f"TensorSwapper: swap directory {directory} is not writable")
        self.directory = tempfile.mkdtemp(prefix="rankscope-swap-", dir=directory)
        self.handle = handle or AsyncIOHandle()
        self._entries: dict[str, _Entry] = {}

    def swap_out(self, key: str, tensor: torch.Tensor) -> None:
        """Start writing `tensor` (any dtype/shape, CPU) to the file for `key`."""
        if tensor.device.type != "cpu":
            raise ValueError(f"TensorSwapper.swap_out({key!r}): tensor must be on the CPU, got {tensor.device}")
        old = self._entries.get(key)
        if old is not None:
            self._wait(old)  # an earlier op on this key still uses its file
        staging = self.handle.new_cpu_locked_tensor(tensor.numel(), tensor)
        staging.copy_(tensor.reshape(-1))
        path = old.path if old is not None else os.path.join(self.directory, _file_name(key, len(self._entries)))
        entry = self._entries[key] = _Entry(path, tensor.shape, tensor.dtype, staging)
        entry.ticket = self.handle.submit(staging, path, is_read=False)

    def prefetch(self, key: str) -> None:
        """Start reading `key` back; swap_in(key) then returns without a fresh read."""
        entry = self._entry(key)
        entry.keep = True
        if entry.buffer is not None:
            return  # already prefetched, or the write's staging buffer still holds the data
        entry.buffer = self.handle.new_cpu_locked_tensor(_numel(entry.shape), torch.empty(0, dtype=entry.dtype))
        entry.ticket = self.handle.submit(entry.buffer, entry.path, is_read=True)

    def ready(self, key: str) -> bool:
        """Whether swap_in(key) would return without waiting for I/O."""
        entry = self._entry(key)
        return entry.buffer is not None and entry.keep and (entry.ticket is None or self.handle.is_done(entry.ticket))

    def swap_in(self, key: str) -> torch.Tensor:
        """The tensor for `key`, in its original shape and dtype (a new tensor each time). Waits
        only for this key's own read (or write, whose staging buffer then holds the data)."""
        self.prefetch(key)  # no-op beyond marking the buffer as wanted if one holds the data
        entry = self._entry(key)
        self._wait(entry)
        tensor = entry.buffer.view(entry.shape)
        entry.buffer, entry.keep = None, False
        return tensor

    def synchronize(self) -> None:
        """Wait for every outstanding write and read; drop staging buffers of finished writes."""
        tickets = [e.ticket for e in self._entries.values() if e.ticket is not None]
        for entry in self._entries.values():
            entry.ticket = None
        if tickets:
            self.handle.wait_ops(tickets)
        for entry in self._entries.values():
            if entry.buffer is not None and not entry.keep:
                self.handle.free_cpu_locked_tensor(entry.buffer)
                entry.buffer = None

    def _wait(self, entry: _Entry) -> None:
        """Wait for the op in flight on ``entry`` (if any); a finished write's buffer is dropped
        unless it is kept for the next swap_in."""
        if entry.ticket is not None:
            ticket, entry.ticket = entry.ticket, None
            self.handle.wait_ops([ticket])
        if entry.buffer is not None and not entry.keep:
            self.handle.free_cpu_locked_tensor(entry.buffer)
            entry.buffer = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def close(self) -> None:
        """Finish outstanding I/O, then delete every swap file and the swap directory."""
        try:
            self.handle.wait()
        finally:
            self._entries.clear()
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TensorSwapper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _entry(self, key: str) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"TensorSwapper: nothing swapped out under key {key!r}") from None


def _file_name(key: str, index: int) -> str:
    """A safe, unique file name that still shows the key when listing the directory."""
    return f"{index:06d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)[:100]}.swp"


def _numel(shape: torch.Size) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
