"""Where a rank sits in a pipeline x data x tensor-parallel job, and its process groups.

Ranks are laid out with tensor parallelism innermost (Megatron's order, and DeepSpeed's
PipeModelDataParallelTopology with axes pipe, data, model)::

    rank = stage * (dp * tp) + data_rank * tp + tp_rank

so a tensor-parallel group is tp consecutive ranks (one host, where tp fits in it), the replicas of
a stage are its dp * tp consecutive ranks, and a pipeline is one rank per stage with the same
(data_rank, tp_rank). Two stages x dp 2 x tp 2 on 8 ranks::

    tensor-parallel  [0,1] [2,3] [4,5] [6,7]    per (stage, data_rank): activations all_reduce every layer
    data-parallel    [0,2] [1,3] [4,6] [5,7]    per (stage, tp_rank): gradients all_reduce once a step
    pipeline         [0,4] [1,5] [2,6] [3,7]    per (data_rank, tp_rank): activations go point-to-point

With tp 1 this is DeepSpeed's PipeDataParallelTopology, rank = stage * dp + data_rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer import comm
from trainer.tensor_parallel.groups import ParallelGroups, TensorParallelConfig, own_group

__all__ = ["PipeGroups", "PipeTopology", "PipelineError", "pipe_groups", "stage_groups"]


class PipelineError(Exception):
    """A pipeline description that cannot be built (DeepSpeed's name)."""


@dataclass(frozen=True)
class PipeTopology:
    """This rank's stage, data-parallel index and tensor-parallel index (the module docstring's layout)."""

    num_stages: int
    data_parallel: int
    rank: int
    tensor_parallel: int = 1

    @classmethod
    def of(cls, num_stages: int, tp_size: int, world_size: int, rank: int) -> PipeTopology:
        """The layout of ``world_size`` ranks into ``num_stages`` stages of ``tp_size``-way tensor
        parallelism, the rest data parallelism; a clear error for one that cannot be."""
        if not isinstance(num_stages, int) or num_stages < 1:
            raise PipelineError("PipelineModule: num_stages must be a positive integer")
        if world_size % num_stages:
            raise PipelineError(f"num_stages ({num_stages}) must divide distributed world size ({world_size})")
        per_stage = world_size // num_stages
        tp = TensorParallelConfig(tp_size=tp_size)
        if per_stage % tp.tp_size:
            tp.fail(
                "tp_size",
                f"must divide the ranks of a stage (world size {world_size} / num_stages {num_stages} = {per_stage})",
                tp_size,
            )
        return cls(num_stages, per_stage // tp.tp_size, rank, tp.tp_size)

    @property
    def stage(self) -> int:
        return self.rank // (self.data_parallel * self.tensor_parallel)

    @property
    def data_rank(self) -> int:
        return self.rank // self.tensor_parallel % self.data_parallel

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor_parallel

    def rank_of(self, stage: int, data_rank: int | None = None, tp_rank: int | None = None) -> int:
        """The rank at (stage, data_rank, tp_rank); this rank's data_rank and tp_rank where not given."""
        d = self.data_rank if data_rank is None else data_rank
        t = self.tp_rank if tp_rank is None else tp_rank
        return (stage * self.data_parallel + d) * self.tensor_parallel + t

    def pipelines(self, stages=None) -> list[list[int]]:
        """Per pipeline, (data_rank, tp_rank) in order: its ranks on ``stages`` (default all)."""
        stages = range(self.num_stages) if stages is None else stages
        lines = [(d, t) for d in range(self.data_parallel) for t in range(self.tensor_parallel)]
        return [[self.rank_of(s, d, t) for s in stages] for d, t in lines]

    def data_parallel_groups(self) -> list[list[int]]:
        """Per (stage, tp_rank) in order: the replicas of one shard of one stage."""
        return [
            [self.rank_of(s, d, t) for d in range(self.data_parallel)]
            for s in range(self.num_stages)
            for t in range(self.tensor_parallel)
        ]

    def tensor_parallel_groups(self) -> list[list[int]]:
        """Per (stage, data_rank) in order: the ranks sharing one replica of one stage's layers."""
        return [
            [self.rank_of(s, d, t) for t in range(self.tensor_parallel)]
            for s in range(self.num_stages)
            for d in range(self.data_parallel)
        ]


@dataclass(frozen=True)
class PipeGroups:
    """This rank's process groups: ``layers`` is what a stage's tensor-parallel layers take
    (trainer.tensor_parallel's ParallelGroups: the tensor-parallel group of its (stage, data_rank),
    the data-parallel group of its (stage, tp_rank)); ``pipe`` is its pipeline's group (None for one stage)."""

    topology: PipeTopology
    layers: ParallelGroups
    pipe: object | None


_LAYOUTS: dict[tuple[int, int], PipeGroups] = {}


def pipe_groups(num_stages: int, tp_size: int = 1) -> PipeGroups:
    """This rank's groups for ``num_stages`` stages of ``tp_size``-way tensor parallelism; collective
    the first time for a layout (every rank makes every group, in the same order), cached after."""
    from trainer.engine import init_distributed

    if (num_stages, tp_size) in _LAYOUTS:
        return _LAYOUTS[(num_stages, tp_size)]
    init_distributed()
    top = PipeTopology.of(num_stages, tp_size, comm.get_world_size(), comm.get_rank())

    tp_group = own_group(top.tensor_parallel_groups(), top.rank, "tp")
    # The engine's data-parallel group is a real communicator even for one replica (None would mean the world).
    dp_group = own_group(top.data_parallel_groups(), top.rank, "dp", one_rank=True)
    pipe = own_group(top.pipelines(), top.rank, "pp")
    layers = ParallelGroups(top.tensor_parallel, top.tp_rank, tp_group, top.data_parallel, dp_group)
    groups = _LAYOUTS[(num_stages, tp_size)] = PipeGroups(top, layers, pipe)
    return groups


def stage_groups(num_stages: int, tp_size: int = 1) -> ParallelGroups:
    """What this rank's tensor-parallel layers take in a pipeline of ``num_stages`` stages with
    ``tp_size``-way tensor parallelism inside each (collective the first time, like PipelineModule)::

        groups = trainer.pipe.stage_groups(num_stages=2, tp_size=2)
        layers = [LayerSpec(ParallelTransformerBlock, 64, 4, groups=groups), ...]
        net = PipelineModule(layers=layers, num_stages=2, tp_size=2, loss_fn=...)
    """
    return pipe_groups(num_stages, tp_size).layers
