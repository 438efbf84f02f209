"""The engine's flops profiler: the ``flops_profiler`` config block, one
profiled step, the report on rank 0 and the module tree on every rank.

The engine calls ``begin(step)`` before every forward and ``end(step, ...)``
after every ``engine.step()``; both are no-ops except at ``profile_step``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from collector.rank import session
from collector.rank.config import ConfigBlock, setting
from trainer import reporting
from trainer.profiling.profiler import FlopsProfiler, ModuleProfile
from trainer.profiling.report import Summary


@dataclass(kw_only=True)
class FlopsProfilerConfig(ConfigBlock):
    """The ``flops_profiler`` block, with DeepSpeed's keys and defaults."""

    SECTION: ClassVar[str] = "flops_profiler"
    enabled: bool = False
    profile_step: int = setting(1, ge=0)
    module_depth: int = setting(-1, ge=-1)  # -1: every depth
    top_modules: int = setting(1, ge=1)
    detailed: bool = True
    output_file: str | None = None  # None: print to stdout

    def validate(self) -> None:
        if self.output_file == "":
            self.fail("output_file", "must be a path or null", self.output_file)


def module_rows(root: ModuleProfile, step: int) -> list[dict]:
    """One ``flops`` table row per module. ``module`` is the dotted path ('' for
    the root); ``parent`` is the parent's path, '' both for depth-1 modules and
    for the root itself (tell them apart by ``depth``). ``latency_ns`` and
    ``bwd_latency_ns`` are summed over the module's calls; a row leaves
    ``bwd_latency_ns`` out (stored as null) when no backward went through it."""
    rows = []
    for p in root.walk():
        row = {
            "step": step,
            "module": p.name,
            "parent": p.parent,
            "depth": p.depth,
            "module_type": p.module_type,
            "params": p.params,
            "macs": p.macs,
            "flops": p.flops,
            "latency_ns": p.fwd_ns,
        }
        if p.bwd_ns is not None:
            row["bwd_latency_ns"] = p.bwd_ns
        rows.append(row)
    return rows


def _emit_to_collector(table: str, rows: list[dict]) -> None:
    session.emit_rows(table, rows)  # a no-op without a telemetry session


class StepProfiler:
    """Profiles one training step of ``model`` as the ``flops_profiler`` block says.

    ``tp_size``: tensor-parallel degree; each rank counts its own shard and the
    report's model totals are per rank x tp_size. ``sink(table, rows)`` receives
    the module tree (default: the collector's telemetry, a no-op without a session).
    """

    def __init__(
        self, flops_profiler_cfg: FlopsProfilerConfig | dict | None, model: nn.Module, tp_size: int = 1, sink=None
    ):
        self.config = FlopsProfilerConfig.from_dict(flops_profiler_cfg)
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tp_size must be an int >= 1, got {tp_size!r}")
        self.tp_size = tp_size
        self.model = model
        self.sink = sink or _emit_to_collector
        self.profiler: FlopsProfiler | None = None
        self.report: str | None = None  # the last printed report (rank 0)
        self.rows: list[dict] = []  # the last rows sent

    def begin(self, step: int) -> None:
        if not self.config.enabled or step != self.config.profile_step or self.profiler is not None:
            return
        self.profiler = FlopsProfiler(self.model)
        self.profiler.start_profile()

    def end(self, step: int, *, fwd_ns=None, bwd_ns=None, step_ns=None, samples=None) -> None:
        prof = self.profiler
        if prof is None or step != self.config.profile_step:
            return
        self.profiler = None
        try:
            prof.stop_profile()
            summary = Summary(
                step=step,
                fwd_ns=fwd_ns if fwd_ns is not None else prof.root.fwd_ns,
                bwd_ns=bwd_ns if bwd_ns is not None else prof.root.bwd_ns,
                step_ns=step_ns,
                samples=samples,
                tp_size=self.tp_size,
            )
            if reporting.is_reporting_rank():
                cfg = self.config
                self.report = prof.print_model_profile(
                    profile_step=step,
                    module_depth=cfg.module_depth,
                    top_modules=cfg.top_modules,
                    detailed=cfg.detailed,
                    output_file=cfg.output_file,
                    summary=summary,
                )
            self.rows = module_rows(prof.root, step)
            self.sink("flops", self.rows)
        except Exception as e:  # the report is telemetry: it never fails training
            warnings.warn(f"flops profiler: step {step} report failed: {e}", stacklevel=2)
        finally:
            prof.end_profile()
