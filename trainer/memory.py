"""Per-rank memory records: what this rank holds, by kind, once per optimizer step.

``params`` / ``grads`` / ``optimizer`` are the bytes of the distinct storages
the engine keeps (so a ZeRO partition shows up as its real size, and a shared
storage is counted once: an fp32 master that is the parameter shard itself
counts as params); ``rss`` is the process's resident set (psutil);
``device`` / ``device_peak`` are CUDA allocated / peak-allocated bytes when CUDA
is in use. All reads are host-side counters: nothing synchronizes the device.
"""

from __future__ import annotations

import psutil
import torch
from torch import nn

from collector.rank.clock import CLOCK


class MemoryTracker:
    def __init__(self, module: nn.Module, zero_optimizer, device: torch.device) -> None:
        self.module, self.zero, self.device = module, zero_optimizer, device
        self._process = psutil.Process()

    def sample(self, step: int) -> list[dict]:
        now = CLOCK.now_ns()
        sizes = self.zero.memory_bytes(self.module)
        sizes["rss"] = self._process.memory_info().rss
        if self.device.type == "cuda":
            sizes["device"] = torch.cuda.memory_allocated(self.device)
            sizes["device_peak"] = torch.cuda.max_memory_allocated(self.device)
        return [{"step": step, "kind": kind, "bytes": int(b), "time_ns": now} for kind, b in sizes.items()]
