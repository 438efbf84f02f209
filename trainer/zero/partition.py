"""Flat, padded parameter buckets split into equal shards, one per data-parallel rank.

Every ZeRO stage works on buckets: a group of parameters laid out back to back
in one flat buffer whose length is padded to a multiple of the shard count, so
that ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` split it evenly.
Rank r owns the slice ``[r * shard_numel, (r + 1) * shard_numel)`` of every
bucket: its optimizer state, master weights and (stage >= 2) gradients cover
exactly that slice.

    flat:   | p0 ........ | p1 .... | p2 ...... |pad|    numel padded to N * shard_numel
    shards: |  rank 0   |  rank 1   |  rank 2   |  rank 3   |
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class ParamSlot:
    """Where one parameter lives inside its bucket's flat buffer."""

    name: str
    param: nn.Parameter
    offset: int
    numel: int
    shape: torch.Size


class FlatBucket:
    """Parameters of one param group flattened into one padded buffer, split in ``num_shards``."""

    def __init__(
        self,
        named_params: list[tuple[str, nn.Parameter]],
        *,
        num_shards: int,
        shard_index: int,
        group_index: int,
        group=None,
        group_size: int | None = None,
    ) -> None:
        self.group_index = group_index
        # The process group the bucket's parameters are replicated over (None: the world, or no
        # one when group_size is 1): the data-parallel group for dense parameters, the
        # expert-data-parallel group for MoE experts (trainer.moe.sync_group).
        self.group = group
        self.group_size = num_shards if group_size is None else group_size
        # solo: replicated nowhere else although the world is larger (an MoE expert whose
        # expert-data-parallel group is this rank alone): no collective at all. In a world of
        # one, collectives still run (the degenerate case of the distributed path).
        self.solo = self.group_size == 1 and group is None and _world_size() > 1
        self.slots: list[ParamSlot] = []
        offset = 0
        for name, p in named_params:
            self.slots.append(ParamSlot(name, p, offset, p.numel(), p.shape))
            offset += p.numel()
        self.numel = offset
        self.num_shards = num_shards
        self.shard_numel = -(-offset // num_shards)  # ceil
        self.padded_numel = self.shard_numel * num_shards
        self.shard_start = shard_index * self.shard_numel
        self.dtype = named_params[0][1].dtype
        self.device = named_params[0][1].device

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a bucket-shaped flat tensor (a view)."""
        return flat.narrow(0, self.shard_start, self.shard_numel)

    def flatten_params(self) -> torch.Tensor:
        """A new padded flat buffer holding the parameters' current values."""
        flat = torch.zeros(self.padded_numel, dtype=self.dtype, device=self.device)
        for s in self.slots:
            flat.narrow(0, s.offset, s.numel).copy_(s.param.data.reshape(-1))
        return flat

    def bind_params(self, flat: torch.Tensor) -> None:
        """Point every parameter's data at its slice of ``flat`` (no copy)."""
        for s in self.slots:
            s.param.data = flat.narrow(0, s.offset, s.numel).view(s.shape)

    def own_flat_params(self) -> None:
        """Copy the parameters into a new flat buffer (``flat_param``) and make them views of it."""
        self.flat_param = self.flatten_params()
        self.bind_params(self.flat_param)

    def bind_grads(self, flat_grad: torch.Tensor) -> None:
        """Make every ``param.grad`` a view into ``flat_grad`` so autograd accumulates in place."""
        for s in self.slots:
            s.param.grad = flat_grad.narrow(0, s.offset, s.numel).view(s.shape)

    def flatten_grads(self, out: torch.Tensor) -> None:
        """Copy each ``param.grad`` into ``out`` (zeros for parameters that got no gradient)."""
        for s in self.slots:
            dst = out.narrow(0, s.offset, s.numel)
            if s.param.grad is None:
                dst.zero_()
            else:
                dst.copy_(s.param.grad.reshape(-1))
        if self.padded_numel > self.numel:
            out.narrow(0, self.numel, self.padded_numel - self.numel).zero_()

    def owned_slots(self) -> list[tuple[ParamSlot, int, int]]:
        """(slot, lo, hi) for every parameter overlapping this rank's shard; lo/hi are shard-local."""
        lo_shard, hi_shard = self.shard_start, self.shard_start + self.shard_numel
        out = []
        for s in self.slots:
            lo, hi = max(s.offset, lo_shard), min(s.offset + s.numel, hi_shard)
            if lo < hi:
                out.append((s, lo - lo_shard, hi - lo_shard))
        return out

    def nonfinite_param_names(self, flat_or_shard: torch.Tensor, *, shard: bool) -> list[str]:
        """Names of parameters whose values in ``flat_or_shard`` hold inf/nan."""
        if shard:
            spans = [(s, lo, hi) for s, lo, hi in self.owned_slots()]
        else:
            spans = [(s, s.offset, s.offset + s.numel) for s in self.slots]
        return [s.name for s, lo, hi in spans if not torch.isfinite(flat_or_shard[lo:hi]).all()]


def build_buckets(
    named_params: list[tuple[str, nn.Parameter]],
    *,
    group_index: int,
    bucket_numel: int,
    num_shards: int,
    shard_index: int,
    group=None,
    group_size: int | None = None,
) -> list[FlatBucket]:
    """Split one param group into buckets of about ``bucket_numel`` elements, in reverse
    registration order (roughly the order backward produces gradients); every bucket is
    synchronised over ``group`` of ``group_size`` ranks."""
    kw = dict(
        num_shards=num_shards, shard_index=shard_index, group_index=group_index, group=group, group_size=group_size
    )
    buckets, current, size = [], [], 0
    for name, p in reversed(named_params):
        if current and size + p.numel() > bucket_numel:
            buckets.append(FlatBucket(current, **kw))
            current, size = [], 0
        current.append((name, p))
        size += p.numel()
    if current:
        buckets.append(FlatBucket(current, **kw))
    return buckets


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def storage_bytes(tensors, seen: set[int]) -> int:
    """Bytes of the distinct storages behind ``tensors``, skipping those already in ``seen``."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in seen or st.nbytes() == 0:
            continue
        seen.add(key)
        total += st.nbytes()
    return total
