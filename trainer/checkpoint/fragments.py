"""Fragments: the runs of parameters a rank writes, and parameters put back together from them.

ZeRO keeps a bucket's parameters flattened back to back in one padded buffer
(trainer.zero.partition); a rank's fp32 master and optimizer moments cover its
shard of that buffer. Saving cuts the shard at parameter boundaries, so each
piece is a *fragment*: elements ``[offset, offset + numel)`` of one flattened
parameter, with its master values and every per-element optimizer state::

    bucket flat:  | p0 ........ | p1 .... | p2 ...... |pad|
    rank shards:  |  rank 0   |  rank 1   |  rank 2   |
    fragments:    p0[0:11] (rank 0)  p0[11:13] p1[0:8] p2[0:1] (rank 1)  p2[1:10] (rank 2)

Who writes which elements -- every element of every trainable parameter exactly
once, with no collective:
- a partitioned bucket (ZeRO 1-3): each rank its own shard;
- a replicated bucket (ZeRO 0; MoE experts under ZeRO 0): the ranks that hold
  copies split it into equal pieces and rank k of the group writes piece k, so a
  ZeRO-0 save writes in parallel too.

Loading is the reverse for any layout: a rank that needs elements ``[lo, hi)`` of
a parameter copies them from whichever fragments overlap that range
(:class:`FragmentSource`), whoever wrote them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

from trainer.checkpoint.layout import CheckpointError, load_torch

# A slice is saved without a copy when its storage is at most this much larger (the bucket padding).
_SLACK_BYTES = 1 << 16


def writer_span(bucket, group_rank: int) -> tuple[int, int]:
    """The flat elements ``[lo, hi)`` of ``bucket`` this rank writes (rank ``group_rank`` of the
    bucket's group); empty when ``lo == hi``. Padding is never written."""
    if bucket.num_shards > 1:
        lo = min(bucket.shard_start, bucket.numel)
        return lo, min(bucket.shard_start + bucket.shard_numel, bucket.numel)
    piece = -(-bucket.numel // bucket.group_size)
    lo = min(group_rank * piece, bucket.numel)
    return lo, min(lo + piece, bucket.numel)


def runs(slots, lo: int, hi: int) -> Iterator[tuple[object, int, int]]:
    """(slot, param_lo, param_hi) for the part of each parameter inside flat ``[lo, hi)``."""
    for s in slots:
        a, b = max(lo, s.offset), min(hi, s.offset + s.numel)
        if a < b:
            yield s, a - s.offset, b - s.offset


def _saveable(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU in (nearly) its own storage: torch.save writes a view's whole storage,
    and a master can be a view into the full flat parameter buffer."""
    t = t.detach()
    if t.device.type != "cpu":
        return t.cpu()
    if t.untyped_storage().nbytes() > t.numel() * t.element_size() + _SLACK_BYTES or not t.is_contiguous():
        return t.clone()
    return t


def bucket_fragments(
    bucket, master: torch.Tensor, state: dict[str, torch.Tensor], step, names: dict[int, str], group_rank: int
) -> dict[str, dict]:
    """This rank's fragments of ``bucket``: ``{name: {"offset", "fp32", <state>..., "step"}}``.

    ``master`` is this rank's fp32 master over the bucket's shard (``[shard_numel]``, the whole
    bucket when replicated), ``state`` its per-element optimizer state tensors of the same shape,
    ``step`` the optimizer's step count for it (None before the first step)."""
    lo, hi = writer_span(bucket, group_rank)
    if lo >= hi:
        return {}
    base = bucket.shard_start if bucket.num_shards > 1 else 0  # flat index of master[0]
    tensors = {"fp32": _saveable(master[lo - base : hi - base])}
    tensors.update({key: _saveable(t.reshape(-1)[lo - base : hi - base]) for key, t in state.items()})
    out = {}
    for s, a, b in runs(bucket.slots, lo, hi):
        start = s.offset + a - lo  # index into the saved span
        frag = {key: t[start : start + b - a] for key, t in tensors.items()}
        frag["offset"] = a
        frag["step"] = None if step is None else float(step)
        out[names[id(s.param)]] = frag
    return out


class FragmentSource:
    """Reads parameter elements from the shard files a checkpoint index names.

    ``parameters``: the index's ``{name: {"shape", "fragments": [[file, offset, numel], ...]}}``.
    Files are memory-mapped on first use, so a rank reads only the pages it copies."""

    def __init__(self, tag_dir: str, parameters: dict[str, dict]) -> None:
        self.tag_dir = tag_dir
        self.parameters = parameters
        self._files: dict[str, dict] = {}

    def shard(self, rel: str) -> dict:
        if rel not in self._files:
            data = load_torch(os.path.join(self.tag_dir, rel), mmap=True)
            if not isinstance(data, dict) or not isinstance(data.get("fragments"), dict):
                raise CheckpointError(f"{os.path.join(self.tag_dir, rel)}: not a rankscope shard file")
            self._files[rel] = data
        return self._files[rel]

    def copy_into(self, name: str, lo: int, hi: int, out: dict[str, torch.Tensor]) -> set:
        """Copy elements ``[lo, hi)`` of parameter ``name`` into ``out[key]`` (1-D, ``hi - lo`` long)
        for each key ("fp32" or an optimizer state name). Returns the optimizer steps of the
        fragments read (one value when the checkpoint is consistent)."""
        steps, covered = set(), 0
        for rel, offset, numel in self.parameters[name]["fragments"]:
            a, b = max(lo, offset), min(hi, offset + numel)
            if a >= b:
                continue
            frag = self.shard(rel)["fragments"].get(name)
            if frag is None:
                raise CheckpointError(
                    f"{os.path.join(self.tag_dir, rel)} has no fragment of parameter {name} "
                    f"although checkpoint.json says so"
                )
            for key, dst in out.items():
                src = frag.get(key)
                if src is None or src.numel() != numel:
                    raise CheckpointError(
                        f"{os.path.join(self.tag_dir, rel)}: parameter {name} has no {key!r} values of {numel} elements"
                    )
                dst[a - lo : b - lo].copy_(src[a - offset : b - offset])
            steps.add(frag.get("step"))
            covered += b - a
        if covered != hi - lo:
            raise CheckpointError(
                f"checkpoint {self.tag_dir} covers {covered} of elements [{lo}, {hi}) of parameter "
                f"{name}: its fragments are incomplete (a shard file from another save?)"
            )
        return steps

    def close(self) -> None:
        self._files.clear()
