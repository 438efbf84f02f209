"""ZeRO stage 0: plain data parallelism, everything replicated on every rank.

Gradients accumulate in place into one flat buffer per bucket (``param.grad``
are views into it); at the accumulation boundary each bucket is averaged:

    flat_grad: [P]   local sum of the micro-batches' gradients
    all_reduce(flat_grad) ; flat_grad /= N      # [P] mean over ranks
    master.step(flat_grad)                      # full fp32 optimizer on every rank

Buckets have a single shard (num_shards = 1), so there is nothing to gather
after the step. MoE expert buckets are summed over their expert-data-parallel
group only (``b.group``) and still divided by N. With overlap_comm a bucket's all_reduce starts (async) during
the boundary backward as soon as all its gradients are produced.
"""

from __future__ import annotations

from trainer import comm
from trainer.zero.partition import FlatBucket
from trainer.zero.stage1 import Stage1Optimizer


class Stage0Optimizer(Stage1Optimizer):
    stage = 0

    def reduce(self, b: FlatBucket):
        if b.solo:  # an expert no other rank holds: nothing to sum
            return None
        return comm.all_reduce(b.flat_grad, group=b.group, async_op=True, log_name="zero0.all_reduce_grads")

    def finish_reduction(self, pending) -> None:
        b, work = pending
        if work is not None:
            work.wait()
        b.flat_grad.div_(self.world_size)  # the full data-parallel size, also for experts

    def after_step(self) -> None:
        """Every rank stepped the full parameters itself."""
