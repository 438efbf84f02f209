"""DeepSpeed's ``deepspeed.pipe``: ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec`` (trainer.pipe.module);
``trainer.initialize`` returns a ``PipelineEngine`` (trainer.pipe.engine) for a PipelineModule;
``stage_groups`` gives a stage's tensor-parallel layers their groups (trainer.pipe.topology)."""

from trainer.pipe.module import LayerSpec, PipelineError, PipelineModule, TiedLayerSpec
from trainer.pipe.topology import stage_groups

__all__ = ["LayerSpec", "PipelineError", "PipelineModule", "TiedLayerSpec", "stage_groups"]
