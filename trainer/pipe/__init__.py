"""DeepSpeed's ``deepspeed.pipe``: ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec`` (trainer.pipe.module);
``trainer.initialize`` returns a ``PipelineEngine`` (trainer.pipe.engine) for a PipelineModule."""

from trainer.pipe.module import LayerSpec, PipelineError, PipelineModule, TiedLayerSpec

__all__ = ["LayerSpec", "PipelineError", "PipelineModule", "TiedLayerSpec"]
