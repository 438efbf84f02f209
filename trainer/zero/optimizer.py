"""What every ZeRO stage shares: the boundary step.

At a gradient-accumulation boundary each stage leaves, per bucket, this rank's
reduced gradient shard (averaged over data-parallel ranks, still multiplied by
the fp16 loss scale). The step is then the same for all stages:

    overflow = all_reduce(MAX, any inf/nan seen locally)        # fp16 only, over the world
    if overflow: skip, lower the scale, report bad params + first rank
    norm^2   = all_reduce(SUM, sum(g^2 for counted shards))     # only when clipping, over the world
    masters.step(grads * (1/scale) * clip_coef)                 # OffloadedOptimizer
    stage-specific: all_gather updated shards into the full parameters

The norm counts every gradient element of the model exactly once across the
world: a bucket is counted on every rank of its group when it is partitioned
(stages 1-3: each rank owns a different shard), else only on its group's first
rank (stage 0, or MoE experts' replicas); within a bucket a tensor-parallel
shard (``param.tensor_model_parallel``) counts on every tensor-parallel rank, a
parameter replicated over the tensor-parallel group only on tp_rank 0; a
pipeline's tied weight (``param.ds_pipe_replicated`` on every stage but the
first holding it) only on that first stage. Expert buckets of different
expert-parallel ranks hold different experts, so they all count. The overflow
vote is over the world too, so every rank (tensor-parallel peers included)
skips the same steps.

Subclasses (one module per stage) decide how gradients get reduced into the
shards and how parameters are laid out; see their docstrings.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from trainer import comm
from trainer.offload import OffloadedOptimizer
from trainer.zero.partition import FlatBucket, storage_bytes


@dataclass
class StepOutcome:
    """What happened at one optimizer step (the engine turns it into records)."""

    skipped: bool = False
    overflow: bool = False
    scale_before: float = 1.0
    scale_after: float = 1.0
    hysteresis_left: int | None = None  # None: the scaler has no hysteresis (static scale)
    bad_params: list[str] = field(default_factory=list)
    first_rank: int = -1
    grad_norm: float | None = None


class ZeroOptimizer:
    """Base of the stage optimizers: owns the buckets, gradient shards, master optimizer and step."""

    stage = -1

    def __init__(
        self,
        buckets: list[FlatBucket],
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        group=None,
        loss_scaler=None,
        gradient_clipping: float = 0.0,
        overlap_comm: bool = False,
        reduce_scatter: bool = True,
        tp_rank: int = 0,
    ) -> None:
        self.buckets = buckets
        self.tp_rank = tp_rank
        # rank / world_size / group: the data-parallel group (the world without tensor parallelism)
        self.rank, self.world_size, self.group, self.device = rank, world_size, group, device
        self.loss_scaler = loss_scaler
        self.gradient_clipping = gradient_clipping
        self.overlap_comm = overlap_comm
        self.reduce_scatter = reduce_scatter  # False: all_reduce whole buckets, keep this rank's shard
        self.master: OffloadedOptimizer | None = None  # set by attach_master once shards exist
        self._local_bad: list[str] = []  # params with inf/nan seen in local (pre-reduction) grads
        self._bucket_of: dict[nn.Parameter, FlatBucket] = {}
        for b in buckets:
            for s in b.slots:
                self._bucket_of[s.param] = b
        self._ready: dict[int, int] = {}  # id(bucket) -> grads ready in this backward
        self._launched: set[int] = set()  # id(bucket) reduced in this backward
        self._pending: list = []  # (bucket, output, work) reductions in flight
        self._reduce_now = False  # whether this backward's hooks may reduce

    # ---------------------------------------------------------------- set-up helpers

    def param_shards(self) -> list[torch.Tensor]:
        """This rank's parameter shard of every bucket, in bucket order."""
        raise NotImplementedError

    def grad_shards(self) -> list[torch.Tensor]:
        """This rank's reduced fp32 gradient shard of every bucket (valid after the boundary backward)."""
        raise NotImplementedError

    @property
    def partitioned(self) -> bool:
        """Whether each rank holds a different shard (the norm then needs an all_reduce)."""
        return self.buckets[0].num_shards > 1 if self.buckets else False

    def attach_master(self, group_options: list[dict], optimizer_factory, storage) -> None:
        # Masters are grouped by param group; keep buckets (and so gradient shards) in the same order.
        self.buckets.sort(key=lambda b: b.group_index)
        shards: list[list[torch.Tensor]] = [[] for _ in group_options]
        for b, shard in zip(self.buckets, self.param_shards()):
            shards[b.group_index].append(shard)
        self.master = OffloadedOptimizer(shards, group_options, optimizer_factory=optimizer_factory, storage=storage)

    def close(self) -> None:
        """Remove swap files (nvme offload); the optimizer is unusable afterwards."""
        if self.master is not None:
            self.master.close()

    def register_hooks(self) -> None:
        for p in self._bucket_of:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    @property
    def param_groups(self) -> list[dict]:
        return self.master.param_groups

    # ---------------------------------------------------------------- backward

    def begin_backward(self, boundary: bool) -> None:
        """Called before each backward; ``boundary`` is True on the last micro-step of a step."""
        self._ready.clear()
        self._launched.clear()
        self._reduce_now = self.reduces_every_micro_step() or boundary

    def reduces_every_micro_step(self) -> bool:
        return False

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        b = self._bucket_of[p]
        n = self._ready.get(id(b), 0) + 1
        self._ready[id(b)] = n
        if n == len(b.slots):
            self.on_bucket_ready(b)

    def on_bucket_ready(self, b: FlatBucket) -> None:
        """All of ``b``'s gradients for this backward exist: with overlap_comm, reduce now."""
        if self._reduce_now and self.overlap_comm:
            self._launch(b)

    def _launch(self, b: FlatBucket) -> None:
        if id(b) not in self._launched:
            self._launched.add(id(b))
            self._pending.append(self.launch_reduction(b))

    def launch_reduction(self, b: FlatBucket):
        """Start the async reduction of ``b``'s local gradients; returns what finish_reduction needs."""
        raise NotImplementedError

    def finish_reduction(self, pending) -> None:
        raise NotImplementedError

    def after_backward(self) -> None:
        """Reduce every bucket not yet launched during backward, then wait for all of them."""
        if self._reduce_now:
            for b in self.buckets:
                self._launch(b)
        for pending in self._pending:
            self.finish_reduction(pending)
        self._pending.clear()

    def note_local_overflow(self, b: FlatBucket, flat: torch.Tensor) -> None:
        """fp16: remember which params had inf/nan in this rank's own gradients, before reduction."""
        if self.loss_scaler is not None and not torch.isfinite(flat).all():
            self._local_bad += b.nonfinite_param_names(flat, shard=False)

    # ---------------------------------------------------------------- step

    def step(self) -> StepOutcome:
        grads = self.grad_shards()
        out = StepOutcome()
        scale = 1.0
        if self.loss_scaler is not None:
            scale = float(self.loss_scaler.loss_scale)
            self._check_overflow(grads, out)
            decision = self.loss_scaler.update(out.overflow)
            out.scale_before, out.scale_after = float(decision.scale_before), float(decision.scale_after)
            out.hysteresis_left = decision.hysteresis_left
            out.skipped = bool(decision.skipped)
            if out.skipped:
                self.zero_grad()
                return out
        coef = 1.0 / scale
        if self.gradient_clipping > 0:
            sumsq = self._counted_sumsq(grads)
            if comm.get_world_size() > 1:
                comm.all_reduce(sumsq, log_name="zero.grad_norm")
            out.grad_norm = math.sqrt(float(sumsq)) / scale
            clip = self.gradient_clipping / (out.grad_norm + 1e-6)
            if clip < 1.0:
                coef *= clip
        self.master.step(grads, coef)
        self.after_step()
        self.zero_grad()
        return out

    def _counted_sumsq(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """This rank's share of the squared global gradient norm (see the module docstring)."""
        sumsq = torch.zeros((), dtype=torch.float32, device=self.device)
        for b, g in zip(self.buckets, grads):
            if b.num_shards == 1 and b.group_size > 1 and comm.get_rank(b.group) != 0:
                continue  # a replica: its group's first rank counts it
            g = g.float()
            if self.tp_rank == 0 and not any(_pipe_replicated(s.param) for s in b.slots):
                sumsq += g.pow(2).sum().to(self.device)
                continue
            for s, lo, hi in b.owned_slots():
                if _pipe_replicated(s.param):
                    continue  # a pipeline's tied weight: its first stage counts it
                if self.tp_rank == 0 or getattr(s.param, "tensor_model_parallel", False):
                    sumsq += g[lo:hi].pow(2).sum().to(self.device)
        return sumsq

    def _check_overflow(self, grads: list[torch.Tensor], out: StepOutcome) -> None:
        post_bad: list[str] = []
        for b, g in zip(self.buckets, grads):
            if not torch.isfinite(g).all():
                post_bad += b.nonfinite_param_names(g, shard=True)
        flag = torch.tensor([1.0 if (self._local_bad or post_bad) else 0.0], device=self.device)
        # Over the world: data-parallel groups of different tensor-parallel ranks, and experts'
        # groups, must all agree on skipping the step.
        comm.all_reduce(flag, op=comm.ReduceOp.MAX, log_name="zero.overflow")
        out.overflow = bool(flag.item() > 0)
        if out.overflow:
            # The rank that produced the inf (pre-reduction) wins over ranks that only received it.
            w, rank = comm.get_world_size(), comm.get_rank()
            code = rank if self._local_bad else (w + rank if post_bad else 2 * w)
            first = torch.tensor([float(code)], device=self.device)
            comm.all_reduce(first, op=comm.ReduceOp.MIN, log_name="zero.overflow_rank")
            out.first_rank = int(first.item()) % w  # a global rank
            names: list = [None] * w
            comm.all_gather_object(names, self._local_bad + post_bad)
            out.bad_params = list(dict.fromkeys(n for rank_names in names for n in rank_names))
        self._local_bad = []

    def after_step(self) -> None:
        """Stage-specific: make the updated shards visible in the full parameters."""

    def gather_params(self, buckets, log_name: str) -> None:
        """all_gather each bucket's updated shard into its full flat parameter (all async, then wait)."""
        works = [
            comm.gather_flat(b.flat_param, b.shard_of(b.flat_param), group=b.group, async_op=True, log_name=log_name)
            for b in buckets
            if not b.solo
        ]
        for w in works:
            w.wait()

    def zero_grad(self) -> None:
        raise NotImplementedError

    # ---------------------------------------------------------------- introspection

    def memory_bytes(self, module: nn.Module) -> dict[str, int]:
        """Bytes this rank holds, by kind; shared storages are counted once (params first)."""
        seen: set[int] = set()
        params = storage_bytes([p.data for p in module.parameters()] + self.param_tensors(), seen)
        grads = storage_bytes([p.grad for p in module.parameters()] + self.grad_tensors(), seen)
        optim = storage_bytes(self.master.state_tensors(), seen)
        return {"params": params, "grads": grads, "optimizer": optim}

    def param_tensors(self) -> list[torch.Tensor]:
        return self.param_shards()

    def grad_tensors(self) -> list[torch.Tensor]:
        raise NotImplementedError

    @contextmanager
    def materialized(self, *, modified: bool):
        """``[(bucket, fp32 master)]`` with every master and its optimizer state in memory inside
        the block, for a checkpoint to read (``modified=False``) or replace (``modified=True``:
        on the way out the parameters are rebuilt from the masters, a collective)."""
        with self.master.resident_state():
            yield list(zip(self.buckets, self.master.masters))
            if modified:
                self.master.refresh_shards()
        if modified:
            self.after_step()


def _pipe_replicated(p: nn.Parameter) -> bool:
    """DeepSpeed's mark on a tied weight held by a later pipeline stage too (trainer.pipe.module)."""
    return getattr(p, "ds_pipe_replicated", False)
