"""Per-expert telemetry: one ``moe`` row per (step, layer, expert) for every
training forward of an MoE layer on this rank -- tokens this rank routed to the
expert, how many of those were dropped, the capacity and the layer's aux loss.
Expert indices are global, so rows from all ranks add up per expert.

Reading the counts needs them on the host. CPU tensors are read at once; CUDA
ones are copied asynchronously and emitted on a later call once their event
has completed, so recording never waits for the device.
"""

from __future__ import annotations

import torch

from collector.rank import session

_pending: list = []  # (step, layer, counts, dropped, capacity, aux_loss, event) awaiting a CUDA copy


def record(layer: int, routing) -> None:
    if session.active() is None:
        return
    step = session.get_step()
    stats = torch.cat([routing.expert_counts.detach(), routing.dropped.detach()])  # [2E]
    aux = routing.aux_loss.detach().double().reshape(1)
    if stats.is_cuda:
        stats, aux = stats.to("cpu", non_blocking=True), aux.to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        _pending.append((step, layer, stats, aux, routing.capacity, event))
        flush(wait=False)
    else:
        _emit(step, layer, stats, aux, routing.capacity)


def flush(wait: bool = True) -> None:
    """Emit the recorded rows whose copies are done (all of them when ``wait``)."""
    while _pending and (wait or _pending[0][-1].query()):
        step, layer, stats, aux, capacity, event = _pending.pop(0)
        event.synchronize()
        _emit(step, layer, stats, aux, capacity)


def _emit(step: int, layer: int, stats: torch.Tensor, aux: torch.Tensor, capacity: int) -> None:
    values = stats.tolist()
    E = len(values) // 2
    loss = float(aux.item())
    session.emit_rows(
        "moe",
        (
            {
                "step": step,
                "layer": layer,
                "expert": e,
                "tokens": values[e],
                "dropped": values[E + e],
                "capacity": capacity,
                "aux_loss": loss,
            }
            for e in range(E)
        ),
    )
