"""The ``pipe`` table: what each stage did in a step and when. One row per forward, backward,
activation / gradient receive (the wait for the neighbour stage), the wait for this step's sends
to complete, and the tied / data-parallel gradient reduction, with unix-ns start and end on rank
0's clock (collector.rank.clock), so the stages of one pipeline line up on one time axis.
collector.data.pipeline turns these into bubble time per stage and step.

Two writers: the bundled engine's PipelineEngine (trainer.pipe.engine) and, in a hook run, DeepSpeed's
PipelineEngine through its instruction schedule (collector.rank.deepspeed)."""

from __future__ import annotations

from collector.rank import session
from collector.rank.clock import CLOCK, perf_ns


class StageTimeline:
    """Collects one step's events on this stage; ``emit`` sends them as ``pipe`` rows."""

    def __init__(self, *, stage: int, stages: int, data_rank: int, layers: int, virtual_stages: int = 1) -> None:
        self.stage, self.stages, self.data_rank, self.layers = stage, stages, data_rank, layers
        self.virtual_stages = virtual_stages
        self.events: list[tuple[str, int, int, int]] = []  # (kind, micro_batch, start perf ns, end perf ns)

    def record(self, kind: str, micro_batch: int, start: int) -> None:
        self.events.append((kind, micro_batch, start, perf_ns()))

    def emit(self, step: int, micro_batches: int) -> dict[str, list]:
        """Send this step's events as ``pipe`` rows (one column chunk: a lock and an append per
        step, not per row); returns the columns."""
        n = len(self.events)
        kinds, mbs, starts, ends = (list(c) for c in zip(*self.events)) if n else ([], [], [], [])
        offset = CLOCK.wall_ns(0)  # perf ns -> rank 0's unix ns is one constant shift
        columns = {
            "step": [step] * n,
            "stage": [self.stage] * n,
            "stages": [self.stages] * n,
            "data_rank": [self.data_rank] * n,
            "micro_batches": [micro_batches] * n,
            "virtual_stages": [self.virtual_stages] * n,
            "layers": [self.layers] * n,
            "kind": kinds,
            "micro_batch": mbs,
            "start_ns": [t + offset for t in starts],
            "end_ns": [t + offset for t in ends],
        }
        self.events = []
        session.emit_columns("pipe", columns, n)
        return columns
