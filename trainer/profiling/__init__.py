"""Flops profiler: per-module params, MACs, flops and forward/backward latency.

- ``get_model_profile(model, input_shape=...)``: one forward, standalone.
- ``FlopsProfiler(model)``: start_profile / stop_profile / print_model_profile /
  end_profile around the steps you choose.
- ``StepProfiler(flops_profiler_cfg, model)``: what the engine runs for the
  ``flops_profiler`` config block; streams the tree to the ``flops`` table.
"""

from trainer.profiling.profiler import FlopsProfiler, get_model_profile
from trainer.profiling.step import FlopsProfilerConfig, StepProfiler
from trainer.profiling.tree import ModuleProfile

__all__ = ["FlopsProfiler", "FlopsProfilerConfig", "ModuleProfile", "StepProfiler", "get_model_profile"]
