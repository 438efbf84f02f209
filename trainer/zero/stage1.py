"""ZeRO stage 1: optimizer state partitioned; full parameters and gradients on every rank.

Gradients accumulate in place into one full flat buffer per bucket
(``param.grad`` are views into it), so accumulation costs no communication.
Once per step, at the boundary:

    flat_grad:  [N * S]   local sum of the micro-batches' gradients
    reduce_scatter_tensor(flat_grad[r*S:(r+1)*S], flat_grad)   # my shard, summed over ranks
    grad_shard /= N                                            # [S] mean over ranks
    master_shard.step(grad_shard)                              # [S] fp32 Adam, state [2, S]
    all_gather_into_tensor(flat_param, flat_param[r*S:(r+1)*S])  # [N * S] everyone's update

With ``reduce_scatter: false`` the bucket is all_reduced instead (DeepSpeed's switch)
and only the shard is used. Each bucket reduces and gathers over its own group
(``b.group``: the data-parallel group, or an MoE expert-data-parallel group of
S' ranks, where the bucket has S' shards) and divides by the full N. With overlap_comm a bucket's reduction
starts (async) during the boundary backward as soon as all its gradients are produced; otherwise all start after it.
"""

from __future__ import annotations

import torch

from trainer import comm
from trainer.zero.optimizer import ZeroOptimizer
from trainer.zero.partition import FlatBucket


class Stage1Optimizer(ZeroOptimizer):
    stage = 1

    def __init__(self, buckets: list[FlatBucket], **kw) -> None:
        super().__init__(buckets, **kw)
        for b in buckets:
            b.own_flat_params()
            b.flat_grad = torch.zeros_like(b.flat_param)
            b.bind_grads(b.flat_grad)
        self.register_hooks()

    def param_shards(self) -> list[torch.Tensor]:
        return [b.shard_of(b.flat_param) for b in self.buckets]

    def grad_shards(self) -> list[torch.Tensor]:
        return [b.shard_of(b.flat_grad).float() for b in self.buckets]

    def grad_tensors(self) -> list[torch.Tensor]:
        return [b.flat_grad for b in self.buckets]

    def _adopt_grads(self, b: FlatBucket) -> None:
        """Bring back gradients a user detached from the flat buffer (e.g. ``zero_grad(set_to_none=True)``)."""
        for s in b.slots:
            view = b.flat_grad.narrow(0, s.offset, s.numel)
            g = s.param.grad
            if g is None or g.data_ptr() != view.data_ptr():
                if g is None:
                    view.zero_()
                else:
                    view.copy_(g.reshape(-1))
                s.param.grad = view.view(s.shape)

    def launch_reduction(self, b: FlatBucket):
        self._adopt_grads(b)
        self.note_local_overflow(b, b.flat_grad)
        return b, self.reduce(b)

    def reduce(self, b: FlatBucket):
        if b.solo:  # an expert no other rank holds: nothing to sum
            return None
        if not self.reduce_scatter:
            return comm.all_reduce(b.flat_grad, group=b.group, async_op=True, log_name="zero1.all_reduce_grads")
        return comm.scatter_flat(
            b.shard_of(b.flat_grad), b.flat_grad, group=b.group, async_op=True, log_name="zero1.reduce_scatter_grads"
        )

    def finish_reduction(self, pending) -> None:
        b, work = pending
        if work is not None:
            work.wait()
        b.shard_of(b.flat_grad).div_(self.world_size)  # the full data-parallel size, also for experts

    def after_step(self) -> None:
        self.gather_params(self.buckets, f"zero{self.stage}.all_gather_params")

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.flat_grad.zero_()
            b.bind_grads(b.flat_grad)
