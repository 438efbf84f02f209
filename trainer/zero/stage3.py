"""ZeRO stage 3: optimizer state, gradients and parameters partitioned.

Parameters are grouped into units, one per module (and param group) that owns
them directly -- or, for a leaf module (trainer.zero.leaf), one for its whole
subtree; a unit is a padded flat bucket of which each rank keeps only its shard
``[S]`` (on the CPU with offload_param). Around every use:

    forward pre-hook:   all_gather_into_tensor(full [N * S], shard [S]); params -> views of full
                        (and start async gathers of the next units, up to stage3_prefetch_bucket_size)
    forward post-hook:  params -> empty (full freed)
    output grad hook:   all_gather again before the module's backward needs the weights
    grads all ready:    staging [N * S] = flatten(grads); reduce_scatter_tensor(out [S], staging)
                        grad_shard [S] += out / N ; params -> empty
    boundary:           master_shard.step(grad_shard) ; the shard is the parameter (no all_gather)

Releasing drops the engine's reference; an op that saved a view of the weight
for backward (F.linear saves weight.t()) keeps that buffer alive until its
backward runs, as in DeepSpeed without its custom ZeRO-3 linear. Parameters
must be used inside the forward of the unit that owns them (a module whose
forward reads its children's weights must be a leaf: trainer.zero.leaf).

Parameters below stage3_param_persistence_threshold elements, and parameters
used by more than one module (tied weights), stay resident and are handled
exactly like stage 2 (full copy, gradient reduce_scatter, all_gather after step).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from trainer import comm
from trainer.zero.optimizer import ZeroOptimizer
from trainer.zero.partition import FlatBucket
from trainer.zero.stage2 import Stage2Optimizer


def _tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class Stage3Optimizer(Stage2Optimizer):
    stage = 3

    def __init__(
        self,
        persistent: list[FlatBucket],
        units: dict[nn.Module, list[FlatBucket]],
        *,
        shard_device: torch.device,
        prefetch_numel: int,
        **kw,
    ) -> None:
        unit_list = [u for us in units.values() for u in us]
        ZeroOptimizer.__init__(self, persistent + unit_list, **kw)
        self.units = unit_list
        self.prefetch_numel = prefetch_numel
        self.param_swap = None  # trainer.offload.NVMeParamSwap with offload_param.device nvme
        for b in persistent:
            b.partitioned = False
            b.own_flat_params()
        for u in unit_list:
            u.partitioned = True
            u.param_shard = u.shard_of(u.flatten_params()).to(shard_device, copy=True)
            u.flat_param, u.inflight = None, None
            self._release(u)
        self.init_grad_shards()
        self.register_hooks()
        for module, us in units.items():
            module.register_forward_pre_hook(partial(self._pre_forward, us))
            module.register_forward_hook(partial(self._post_forward, us))
        self._trace: list[FlatBucket] = []  # unit order of the last forward
        self._recording: list[FlatBucket] = []
        self._cursor = 0
        self._backward_seen: set[int] = set()
        # NVMe partitions released in the boundary backward stay in memory for the step, which
        # needs them all (instead of being dropped and read back right away).
        self._keep_for_step = False

    def attach_param_swap(self, swap) -> None:
        """Park the partitioned units' parameter shards in files (after attach_master, which
        copies them into the fp32 masters)."""
        self.param_swap = swap
        swap.write([u.param_shard for u in self.units])

    def _swap_in_units(self, units) -> None:
        if self.param_swap is not None:
            self.param_swap.load([u.param_shard for u in units])

    def step(self):
        self._swap_in_units(self.units)  # the step writes every updated partition
        self._keep_for_step = False
        out = super().step()
        if self.param_swap is not None:
            if out.skipped:
                for u in self.units:
                    self.param_swap.evict(u.param_shard)
            else:
                self.param_swap.write([u.param_shard for u in self.units])
        return out

    @contextmanager
    def materialized(self, *, modified: bool):
        """As ZeroOptimizer's, with NVMe parameter partitions read in for the block and written
        back (or, unchanged, dropped again) after it."""
        self._swap_in_units(self.units)
        try:
            with super().materialized(modified=modified) as pairs:
                yield pairs
        finally:
            if self.param_swap is not None:
                shards = [u.param_shard for u in self.units]
                if modified:
                    self.param_swap.write(shards)
                else:
                    for t in shards:
                        self.param_swap.evict(t)

    def close(self) -> None:
        super().close()
        if self.param_swap is not None:
            self.param_swap.close()

    # ---------------------------------------------------------------- gather / release

    def _fetch(self, u: FlatBucket, wait: bool = True) -> None:
        if u.flat_param is None:
            self._swap_in_units([u])
            u.flat_param = torch.empty(u.padded_numel, dtype=u.dtype, device=self.device)
            src = u.param_shard.to(self.device, non_blocking=True)
            if u.solo:  # an expert no other rank holds: the shard is the whole unit
                u.flat_param.copy_(src)
                u.inflight = None
                u.bind_params(u.flat_param)
                return
            u.inflight = comm.gather_flat(
                u.flat_param, src, group=u.group, async_op=True, log_name="zero3.all_gather_params"
            )
        if wait and u.inflight is not None:
            u.inflight.wait()
            u.inflight = None
            u.bind_params(u.flat_param)

    def _release(self, u: FlatBucket) -> None:
        if u.inflight is not None:
            u.inflight.wait()
            u.inflight = None
        empty = torch.empty(0, dtype=u.dtype, device=self.device)
        for s in u.slots:
            s.param.data = empty
        u.flat_param = None
        if self.param_swap is not None and not self._keep_for_step:
            self.param_swap.evict(u.param_shard)  # unchanged since its last write: no write needed

    def _prefetch(self, order: list[FlatBucket], start: int) -> None:
        """Start the gathers of the units after ``start`` in ``order``, up to prefetch_numel
        elements. With NVMe partitions, first start the file reads of that window (at least the
        next unit: reads run one unit ahead of use), then gather only the units whose reads are
        done; a unit still being read is gathered at its own turn, its read having overlapped
        the compute of the unit before it."""
        window = self._window(order, start)
        self._read_ahead(window)
        for u in window:
            if u.flat_param is None and (self.param_swap is None or self.param_swap.ready(u.param_shard)):
                self._fetch(u, wait=False)

    def _window(self, order: list[FlatBucket], start: int) -> list[FlatBucket]:
        """The units of ``order`` from ``start`` on, up to prefetch_numel elements (at least one)."""
        window, budget = [], self.prefetch_numel
        for u in order[start:]:
            if budget <= 0:
                break
            window.append(u)
            budget -= u.padded_numel
        return window

    def _read_ahead(self, units: list[FlatBucket]) -> None:
        """Start the file reads of NVMe partitions that are neither in memory nor being read."""
        if self.param_swap is not None:
            self.param_swap.prefetch([u.param_shard for u in units if u.flat_param is None])

    # ---------------------------------------------------------------- module hooks

    def begin_forward(self) -> None:
        self._recording, self._cursor = [], 0
        self._keep_for_step = False
        self._read_ahead(self._window(self._trace, 0))  # the forward's first units, along the last trace

    def _pre_forward(self, units: list[FlatBucket], module, args) -> None:
        for u in units:
            self._fetch(u)
        self._recording += units
        # Prefetch along the last forward's order while this forward follows it.
        n = len(units)
        if self._trace[self._cursor : self._cursor + n] == units:
            self._cursor += n
            self._prefetch(self._trace, self._cursor)
        else:
            self._cursor = len(self._trace) + 1

    def _post_forward(self, units: list[FlatBucket], module, args, output) -> None:
        if torch.is_grad_enabled():
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(partial(self._pre_backward, units))
        for u in units:
            self._release(u)

    def _pre_backward(self, units: list[FlatBucket], grad) -> None:
        fresh = [u for u in units if id(u) not in self._backward_seen]
        for u in units:
            self._fetch(u)
        if fresh:
            self._backward_seen.update(id(u) for u in fresh)
            backward_order = self._trace[::-1]
            n = len(fresh)
            if backward_order[self._cursor : self._cursor + n] == fresh:
                self._cursor += n
                self._prefetch(backward_order, self._cursor)
            else:
                self._cursor = len(self._trace) + 1

    # ---------------------------------------------------------------- gradients

    def begin_backward(self, boundary: bool) -> None:
        super().begin_backward(boundary)
        self._trace, self._cursor = self._recording, 0
        self._backward_seen.clear()
        self._keep_for_step = boundary and self.param_swap is not None
        self._read_ahead(self._window(self._trace[::-1], 0))  # the backward's first units

    def on_bucket_ready(self, b: FlatBucket) -> None:
        super().on_bucket_ready(b)
        if b.partitioned:
            self._release(b)

    def after_backward(self) -> None:
        super().after_backward()
        for u in self.units:  # units whose params got no gradient, or prefetched but unused
            if u.flat_param is not None:
                self._release(u)

    # ---------------------------------------------------------------- step

    def param_shards(self) -> list[torch.Tensor]:
        return [b.param_shard if b.partitioned else b.shard_of(b.flat_param) for b in self.buckets]

    def param_tensors(self) -> list[torch.Tensor]:
        return self.param_shards() + [b.flat_param for b in self.buckets if b.flat_param is not None]

    def after_step(self) -> None:
        self.gather_params([b for b in self.buckets if not b.partitioned], "zero3.all_gather_persistent_params")

    def full_state_dict(self, module: nn.Module) -> dict:
        """The module's state_dict with every partitioned parameter gathered (collective)."""
        for u in self.units:
            self._fetch(u)
        sd = {k: v.detach().clone() for k, v in module.state_dict().items()}
        for u in self.units:
            self._release(u)
        return sd
