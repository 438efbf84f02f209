"""The ``pipe`` table: what each stage did in a step and when. One row per forward, backward,
activation / gradient receive (the wait for the neighbour stage), the wait for this step's sends
to complete, and the tied / data-parallel gradient reduction, with unix-ns start and end on rank
0's clock (collector.rank.clock), so the stages of one pipeline line up on one time axis.
collector.data.pipeline turns these into bubble time per stage and step."""

from __future__ import annotations

from collector.rank import session
from collector.rank.clock import CLOCK, perf_ns


class StageTimeline:
    """Collects one step's events on this stage; ``emit`` sends them as ``pipe`` rows."""

    def __init__(self, *, stage: int, stages: int, data_rank: int, layers: int) -> None:
        self.stage, self.stages, self.data_rank, self.layers = stage, stages, data_rank, layers
        self.events: list[tuple[str, int, int, int]] = []  # (kind, micro_batch, start perf ns, end perf ns)

    def record(self, kind: str, micro_batch: int, start: int) -> None:
        self.events.append((kind, micro_batch, start, perf_ns()))

    def emit(self, step: int, micro_batches: int) -> list[dict]:
        rows = [
            {
                "step": step,
                "stage": self.stage,
                "stages": self.stages,
                "data_rank": self.data_rank,
                "micro_batches": micro_batches,
                "layers": self.layers,
                "kind": kind,
                "micro_batch": mb,
                "start_ns": CLOCK.wall_ns(start),
                "end_ns": CLOCK.wall_ns(end),
            }
            for kind, mb, start, end in self.events
        ]
        self.events = []
        session.emit_rows("pipe", rows)
        return rows
