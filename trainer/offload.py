"""Where the fp32 master partitions and the optimizer that steps them live.

:class:`OffloadedOptimizer` is the seam between ZeRO and the optimizer: ZeRO
hands it this rank's parameter shards (views or owned tensors in the model's
dtype) and, each step, their fp32 gradient shards; it keeps fp32 master copies
on the device a :class:`StateStorage` chooses, runs the optimizer there and
writes the result back into the parameter shards.

Two parts are pluggable:
- ``optimizer_factory(param_groups) -> torch.optim.Optimizer``: torch's AdamW/Adam/SGD,
  or native.CPUAdam for Adam/AdamW when masters live in host memory (offload cpu/nvme);
  with CPUAdam, half-precision parameter shards on the CPU are refreshed by its fused
  copy-out (``step(copy_to=...)``) instead of a separate copy.
- ``storage``: :class:`DeviceStorage` keeps masters beside the parameters (no
  offload; an fp32 shard is then its own master, no copy); :class:`CPUStorage`
  keeps them in host memory (pinned when CUDA exists); :class:`NVMeStorage` keeps
  masters in host memory too and parks the optimizer state (exp_avg, exp_avg_sq, ...)
  in files between steps (native.swap.TensorSwapper over native.AsyncIOHandle),
  paging it in (``before_step``) and out (``after_step``) around the step. Each
  swap phase is one telemetry ``timers`` row, name ``nvme.swap_in`` / ``nvme.swap_out``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import torch

from collector.rank.clock import CLOCK


class StateStorage:
    """Allocates master weights; hooks around the optimizer step for swapping backends."""

    device: torch.device

    def allocate_like(self, shard: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def shares(self, shard: torch.Tensor) -> bool:
        """True when ``shard`` itself can serve as the fp32 master (no copy)."""
        return False

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called before ``optimizer.step()``: bring swapped-out state in."""

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Called after ``optimizer.step()``: write state back out."""

    def close(self) -> None:
        """Release whatever the storage holds outside the process (swap files)."""


class DeviceStorage(StateStorage):
    """Masters on the parameters' own device: no offload."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)

    def allocate_like(self, shard: torch.Tensor) -> torch.Tensor:
        return shard.detach().to(self.device, torch.float32, copy=True)

    def shares(self, shard: torch.Tensor) -> bool:
        return shard.dtype == torch.float32 and shard.device == self.device


class CPUStorage(StateStorage):
    """Masters and optimizer state in host memory, pinned when CUDA exists so copies can overlap."""

    def __init__(self, pin_memory: bool = True) -> None:
        self.device = torch.device("cpu")
        self.pin = pin_memory and torch.cuda.is_available()

    def allocate_like(self, shard: torch.Tensor) -> torch.Tensor:
        out = torch.empty(shard.shape, dtype=torch.float32, pin_memory=self.pin)
        return out.copy_(shard.detach())


def _cleanup_swap(swapper, directory: str) -> None:
    try:
        swapper.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def open_swapper(nvme_path: str, *, rank: int, aio: dict | None, key: str, owner, kind: str = ""):
    """A TensorSwapper in a fresh ``rankscope-rank<R>-*`` directory under ``nvme_path``, plus a
    finalizer (call it to close; it also runs when ``owner`` is collected or at exit) that
    removes the directory. Bad paths raise ConfigError naming ``key``."""
    from native.aio import AsyncIOHandle
    from native.swap import TensorSwapper
    from trainer.config import ConfigError

    if os.path.exists(nvme_path) and not os.path.isdir(nvme_path):
        raise ConfigError(f"{key}: {nvme_path!r} is not a directory")
    try:
        os.makedirs(nvme_path, exist_ok=True)
        directory = tempfile.mkdtemp(prefix=f"rankscope-rank{rank}-{kind}", dir=nvme_path)
    except OSError as e:
        raise ConfigError(f"{key}: cannot create swap files under {nvme_path!r} ({e.strerror or e})") from None
    try:
        swapper = TensorSwapper(directory, AsyncIOHandle(**(aio or {})))
    except (OSError, ValueError) as e:
        shutil.rmtree(directory, ignore_errors=True)
        raise ConfigError(f"{key}: cannot swap to {nvme_path!r} ({e})") from None
    return swapper, directory, weakref.finalize(owner, _cleanup_swap, swapper, directory)


class NVMeParamSwap:
    """ZeRO-3 parameter partitions (offload_param.device nvme) parked in files.

    A partition is written after each optimizer step (:meth:`write`); otherwise it is read
    back only while needed (:meth:`load` before its all-gather, :meth:`evict` after), so host
    memory holds just the partitions in use. ``prefetch`` starts reads of partitions about to
    be gathered and returns; ``ready`` says whether one's read is done; ``load`` waits for its
    partitions' own reads only. Telemetry: ``timers`` rows ``nvme.param_swap_in`` (the time
    ``load`` waited) / ``nvme.param_swap_out``."""

    def __init__(
        self,
        nvme_path: str,
        *,
        rank: int = 0,
        aio: dict | None = None,
        key: str = "zero_optimization.offload_param.nvme_path",
    ) -> None:
        self.swapper, self.directory, self._finalizer = open_swapper(
            nvme_path, rank=rank, aio=aio, key=key, owner=self, kind="param-"
        )
        self._keys: dict[int, str] = {}  # id(shard tensor) -> swap key
        self._shapes: dict[int, tuple] = {}

    def _key(self, t: torch.Tensor) -> str:
        return self._keys.setdefault(id(t), f"param{len(self._keys)}")

    def resident(self, t: torch.Tensor) -> bool:
        return id(t) not in self._shapes

    def write(self, shards: list[torch.Tensor]) -> None:
        """Write the (resident) partitions to their files and drop them from memory."""
        start, nbytes = CLOCK.now_ns(), 0
        for t in shards:
            self.swapper.swap_out(self._key(t), t.data)
            nbytes += t.numel() * t.element_size()
        self.swapper.synchronize()
        for t in shards:
            self.evict(t)
        if shards:
            _emit("nvme.param_swap_out", start, nbytes)

    def evict(self, t: torch.Tensor) -> None:
        if self.resident(t) and id(t) in self._keys:
            self._shapes[id(t)] = (t.shape, t.dtype)
            t.data = torch.empty(0, dtype=t.dtype)

    def prefetch(self, shards: list[torch.Tensor]) -> None:
        for t in shards:
            if not self.resident(t):
                self.swapper.prefetch(self._key(t))

    def ready(self, t: torch.Tensor) -> bool:
        """In memory, or its read finished: load() would not wait."""
        return self.resident(t) or self.swapper.ready(self._key(t))

    def load(self, shards: list[torch.Tensor]) -> None:
        """Bring the partitions back into memory (reads already prefetched are not repeated)."""
        missing = [t for t in shards if not self.resident(t)]
        if not missing:
            return
        start = CLOCK.now_ns()
        self.prefetch(missing)
        for t in missing:
            t.data = self.swapper.swap_in(self._key(t))
            del self._shapes[id(t)]
        _emit("nvme.param_swap_in", start, 0)

    def close(self) -> None:
        self._finalizer()


class NVMeStorage(CPUStorage):
    """Masters in host memory; optimizer state swapped to files under ``nvme_path`` between steps.

    Files live in a private ``rankscope-rank<R>-*`` directory under ``nvme_path`` (one per engine
    and rank), removed by :meth:`close` (the engine's close) or at interpreter exit. Swap-in
    issues every read first (prefetch) so they run together on the aio handle's workers, then
    takes the tensors in order; swap-out writes from staging buffers and waits for the writes,
    so host memory holds the state only around the step."""

    def __init__(
        self,
        nvme_path: str,
        *,
        rank: int = 0,
        aio: dict | None = None,
        pin_memory: bool = True,
        key: str = "zero_optimization.offload_optimizer.nvme_path",
    ) -> None:
        super().__init__(pin_memory=pin_memory)
        self.swapper, self.directory, self._finalizer = open_swapper(nvme_path, rank=rank, aio=aio, key=key, owner=self)
        self._index: dict[int, int] = {}  # id(param) -> stable index for swap keys
        self._swapped: dict[int, list[str]] = {}  # id(param) -> state names parked in files

    def _key(self, p: torch.Tensor, name: str) -> str:
        return f"p{self._index.setdefault(id(p), len(self._index))}.{name}"

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"]]

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        params = [p for p in self._params(optimizer) if id(p) in self._swapped]
        if not params:
            return
        start = CLOCK.now_ns()
        nbytes = 0
        for p in params:  # every read in flight before the first wait
            for name in self._swapped[id(p)]:
                self.swapper.prefetch(self._key(p, name))
        for p in params:
            state = optimizer.state[p]
            for name in self._swapped.pop(id(p)):
                state[name] = self.swapper.swap_in(self._key(p, name))
                nbytes += state[name].numel() * state[name].element_size()
        _emit("nvme.swap_in", start, nbytes)

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        start = CLOCK.now_ns()
        nbytes = 0
        for p in self._params(optimizer):
            state = optimizer.state.get(p)
            if not state:
                continue
            names = [k for k, v in state.items() if torch.is_tensor(v) and v.dim() > 0 and v.numel() > 0]
            for name in names:
                t = state[name]
                self.swapper.swap_out(self._key(p, name), t)
                nbytes += t.numel() * t.element_size()
                state[name] = torch.empty(0, dtype=t.dtype)  # placeholder until swap-in
            if names:
                self._swapped[id(p)] = names
        if nbytes:
            self.swapper.synchronize()
            _emit("nvme.swap_out", start, nbytes)

    def close(self) -> None:
        self._finalizer()


def _emit(name: str, start_ns: int, nbytes: int) -> None:
    """One telemetry ``timers`` row for a swap phase (the bytes moved are in the log, not the row)."""
    try:
        from collector.rank import session

        session.emit("timers", name=name, start_ns=start_ns, dur_ns=CLOCK.now_ns() - start_ns)
    except Exception:  # telemetry must never fail the step
        pass


class OffloadedOptimizer:
    """fp32 master partitions + their optimizer, held where ``storage`` puts them.

    ``shards[g]`` lists this rank's parameter shards of param group ``g``;
    ``group_options[g]`` holds that group's optimizer options (lr, weight_decay...).
    """

    def __init__(
        self,
        shards: list[list[torch.Tensor]],
        group_options: list[dict],
        *,
        optimizer_factory: Callable[[list[dict]], torch.optim.Optimizer],
        storage: StateStorage,
    ) -> None:
        self.storage = storage
        self.param_shards = [s for group in shards for s in group]
        self.masters: list[torch.Tensor] = []
        groups = []
        for group, options in zip(shards, group_options):
            masters = [s if storage.shares(s) else storage.allocate_like(s) for s in group]
            self.masters += masters
            groups.append(dict(options, params=masters))
        self.optimizer = optimizer_factory(groups)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def step(self, grads: list[torch.Tensor], grad_scale: float = 1.0) -> None:
        """One optimizer step from fp32 gradient shards (aligned with the parameter shards),
        each multiplied by ``grad_scale`` (unscaling and clipping folded into one factor)."""
        for master, grad in zip(self.masters, grads):
            # Blocking device->host copy: the optimizer reads it at once (and it orders the stream,
            # so last step's non-blocking host->device parameter copies are done too).
            g = grad.to(master.device) if grad.device != master.device else grad
            if grad_scale != 1.0:
                g = g * grad_scale
            master.grad = g
        self.storage.before_step(self.optimizer)
        fused = self._fused_copy_targets()
        if fused is not None:
            self.optimizer.step(copy_to=fused)
        else:
            self.optimizer.step()
        self.storage.after_step(self.optimizer)
        for i, (master, shard) in enumerate(zip(self.masters, self.param_shards)):
            master.grad = None
            if master is not shard and (fused is None or fused[i] is None):
                shard.copy_(master, non_blocking=True)

    def _fused_copy_targets(self) -> list | None:
        """With native.CPUAdam: the half-precision CPU parameter shards it can write in its own
        pass (one entry per master, None where a separate copy is still needed); None otherwise."""
        if not getattr(self.optimizer, "rankscope_fused_copy", False):
            return None
        targets = [
            s
            if (
                s is not m
                and s.device.type == "cpu"
                and s.dtype in (torch.float16, torch.bfloat16)
                and s.is_contiguous()
                and s.numel() == m.numel()
            )
            else None
            for m, s in zip(self.masters, self.param_shards)
        ]
        return targets if any(t is not None for t in targets) else None

    def close(self) -> None:
        self.storage.close()

    def state_tensors(self) -> list[torch.Tensor]:
        """Masters that are not the parameter shards themselves, plus every optimizer state tensor."""
        out = [m for m, s in zip(self.masters, self.param_shards) if m is not s]
        for state in self.optimizer.state.values():
            out += [v for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
        return out

    @contextmanager
    def resident_state(self):
        """Every optimizer state tensor in memory inside the block (swapped-out state is read back
        first and written out again after), for a checkpoint to read or replace it."""
        self.storage.before_step(self.optimizer)
        try:
            yield
        finally:
            self.storage.after_step(self.optimizer)

    def refresh_shards(self) -> None:
        """Copy the masters into the parameter shards (after the masters were replaced)."""
        for master, shard in zip(self.masters, self.param_shards):
            if master is not shard:
                shard.copy_(master)
