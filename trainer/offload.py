"""Where the fp32 master partitions and the optimizer that steps them live.

:class:`OffloadedOptimizer` is the seam between ZeRO and the optimizer: ZeRO
hands it this rank's parameter shards (views or owned tensors in the model's
dtype) and, each step, their fp32 gradient shards; it keeps fp32 master copies
on the device a :class:`StateStorage` chooses, runs the optimizer there and
writes the result back into the parameter shards.

Two parts are pluggable:
- ``optimizer_factory(param_groups) -> torch.optim.Optimizer``: torch's AdamW/Adam/SGD
  today; a native CPU Adam drops in here.
- ``storage``: :class:`DeviceStorage` keeps masters beside the parameters (no
  offload; an fp32 shard is then its own master, no copy); :class:`CPUStorage`
  keeps them in host memory (pinned when CUDA exists). A swapping backend (NVMe)
  implements ``allocate`` and the ``before_step`` / ``after_step`` hooks to page
  optimizer state in and out around the step.
"""
from __future__ import annotations

from typing import Callable

import torch


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


class OffloadedOptimizer:
    """fp32 master partitions + their optimizer, held where ``storage`` puts them.

    ``shards[g]`` lists this rank's parameter shards of param group ``g``;
    ``group_options[g]`` holds that group's optimizer options (lr, weight_decay...).
    """

    def __init__(self, shards: list[list[torch.Tensor]], group_options: list[dict], *,
                 optimizer_factory: Callable[[list[dict]], torch.optim.Optimizer], storage: StateStorage) -> None:
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
        self.optimizer.step()
        self.storage.after_step(self.optimizer)
        for master, shard in zip(self.masters, self.param_shards):
            master.grad = None
            if master is not shard:
                shard.copy_(master, non_blocking=True)

    def state_tensors(self) -> list[torch.Tensor]:
        """Masters that are not the parameter shards themselves, plus every optimizer state tensor."""
        out = [m for m, s in zip(self.masters, self.param_shards) if m is not s]
        for state in self.optimizer.state.values():
            out += [v for v in state.values() if torch.is_tensor(v) and v.dim() > 0]
        return out

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "masters": [m.detach().cpu() for m in self.masters]}

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["masters"]) != len(self.masters):
            raise ValueError(f"checkpoint holds {len(sd['masters'])} master partitions, this engine has "
                             f"{len(self.masters)} (different model or ZeRO layout)")
        for master, saved, shard in zip(self.masters, sd["masters"], self.param_shards):
            if master.shape != saved.shape:
                raise ValueError(f"checkpoint master partition has shape {tuple(saved.shape)}, expected "
                                 f"{tuple(master.shape)} (different world size or bucket sizes)")
            master.data.copy_(saved)
            if master is not shard:
                shard.copy_(master)
        self.optimizer.load_state_dict(sd["optimizer"])
