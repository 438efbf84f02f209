"""ZeRO stage 2: optimizer state and gradients partitioned; full parameters on every rank.

Each micro-batch's gradients are reduce-scattered bucket by bucket (buckets of
``reduce_bucket_size`` elements) and only this rank's shard is kept, accumulated
in fp32 across micro-batches; the full local gradients are dropped right after:

    staging:    [N * S]  flatten(param.grad for params in bucket)   # then param.grad = None
    reduce_scatter_tensor(out [S], staging)                          # sum over ranks
    grad_shard [S] += out / N                                        # fp32, over micro-batches
    ... at the boundary:
    master_shard.step(grad_shard)                                    # [S] fp32, state [2, S]
    all_gather_into_tensor(flat_param [N * S], flat_param[r*S:(r+1)*S])

This is DeepSpeed's schedule: one reduction per micro-batch, because holding
the full gradients until the boundary would undo the stage's memory saving.
With ``reduce_scatter: false`` buckets are all_reduced and only the shard is kept.
With overlap_comm a bucket's reduction starts (async) inside backward as
soon as its last gradient is produced; otherwise all start right after backward.
"""

from __future__ import annotations

import torch

from trainer import comm
from trainer.zero.optimizer import ZeroOptimizer
from trainer.zero.partition import FlatBucket


class Stage2Optimizer(ZeroOptimizer):
    stage = 2

    def __init__(self, buckets: list[FlatBucket], **kw) -> None:
        super().__init__(buckets, **kw)
        for b in buckets:
            b.own_flat_params()
        self.init_grad_shards()
        self.register_hooks()

    def init_grad_shards(self) -> None:
        for b in self.buckets:
            b.grad_shard = torch.zeros(b.shard_numel, dtype=torch.float32, device=self.device)

    def reduces_every_micro_step(self) -> bool:
        return True

    def param_shards(self) -> list[torch.Tensor]:
        return [b.shard_of(b.flat_param) for b in self.buckets]

    def grad_shards(self) -> list[torch.Tensor]:
        return [b.grad_shard for b in self.buckets]

    def grad_tensors(self) -> list[torch.Tensor]:
        return self.grad_shards()

    def launch_reduction(self, b: FlatBucket):
        staging = torch.empty(b.padded_numel, dtype=b.dtype, device=self.device)
        b.flatten_grads(staging)
        for s in b.slots:
            s.param.grad = None
        self.note_local_overflow(b, staging)
        if b.solo:  # an expert no other rank holds: nothing to sum
            return b, staging, staging, None
        if not self.reduce_scatter:
            work = comm.all_reduce(staging, group=b.group, async_op=True, log_name=f"zero{self.stage}.all_reduce_grads")
            return b, b.shard_of(staging), staging, work
        out = torch.empty(b.shard_numel, dtype=b.dtype, device=self.device)
        work = comm.scatter_flat(
            out, staging, group=b.group, async_op=True, log_name=f"zero{self.stage}.reduce_scatter_grads"
        )
        return b, out, staging, work

    def finish_reduction(self, pending) -> None:
        b, out, _staging, work = pending  # staging stays referenced until the op is done
        if work is not None:
            work.wait()
        b.grad_shard.add_(out.float(), alpha=1.0 / self.world_size)  # the full data-parallel size, also for experts

    def after_step(self) -> None:
        self.gather_params(self.buckets, f"zero{self.stage}.all_gather_params")

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.grad_shard.zero_()
            for s in b.slots:
                s.param.grad = None
