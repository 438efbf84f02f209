"""DeepSpeed's comms summary table (``log_summary``), from the recorder's per-size latencies.

The table groups this rank's records by ``log_name`` (which carries the caller
in debug mode) and message size: count, total / average latency, and DeepSpeed's
tput / busbw columns in Gbps (bits). With ``show_straggler`` it adds the
straggler effect per op and size: the sum over instances of (this rank's latency
- the minimum across ranks), which needs a collective, so every rank must call it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed.distributed_c10d as c10d

from collector.data.bandwidth import convert_size
from collector.rank import recorder
from collector.rank.clock import collective_device
from collector.rank.recorder import REC, get_rank, get_world_size

ReduceOp = c10d.ReduceOp


def trim_mean(values: list[float], proportion: float = 0.1) -> float:
    """Mean without the top and bottom ``proportion`` (DeepSpeed drops outliers the same way)."""
    if not values:
        return 0.0
    cut = int(len(values) * proportion)
    kept = sorted(values)[cut : len(values) - cut] or sorted(values)
    return sum(kept) / len(kept)


def _straggler_min_latencies(keys: list[tuple[str, int]]) -> dict[tuple[str, int], list[float]]:
    """Per (name, size), the MIN over all ranks of each instance's latency.

    Collective over the default group. Ranks may have recorded different ops
    (sub-groups), so the key set is agreed first and missing instances count
    as +inf, which MIN ignores."""
    world = get_world_size()
    if world == 1:
        return {k: list(REC.summary[k[0]][k[1]][0]) for k in keys}
    device = collective_device()
    gathered: list = [None] * world
    c10d.all_gather_object(gathered, keys)
    union = sorted(set(k for ks in gathered for k in ks))
    counts = torch.tensor(
        [len(REC.summary.get(k[0], {}).get(k[1], [[]])[0]) for k in union], dtype=torch.int64, device=device
    )
    c10d.all_reduce(counts, op=ReduceOp.MAX)
    counts_l = counts.tolist()
    flat = torch.full((sum(counts_l),), math.inf, dtype=torch.float64, device=device)
    offsets, at = [], 0
    for k, c in zip(union, counts_l, strict=True):
        own = REC.summary.get(k[0], {}).get(k[1], [[]])[0]
        flat[at : at + len(own)] = torch.tensor(list(own), dtype=torch.float64)
        offsets.append(at)
        at += c
    c10d.all_reduce(flat, op=ReduceOp.MIN)
    mins = flat.tolist()
    return {
        k: mins[o : o + len(REC.summary.get(k[0], {}).get(k[1], [[]])[0])] for k, o in zip(union, offsets, strict=True)
    }


def log_summary(show_straggler: bool = False, return_dict: bool = False):
    """Print (on rank 0) DeepSpeed's comms summary for this rank's records (grouped by
    log_name, which carries the caller in debug mode), by message size.

    show_straggler adds, per op and size, the straggler effect: sum over
    instances of (this rank's latency - the minimum across ranks). That needs a
    collective, so with show_straggler every rank must call log_summary.
    Returns {log_name: {msg_size_bytes: {stats}}} when return_dict."""
    recorder.flush()
    keys = sorted((name, size) for name, sizes in REC.summary.items() for size in sizes)
    mins = _straggler_min_latencies(keys) if show_straggler else {}
    out: dict[str, dict[int, dict]] = {}
    if show_straggler:
        header = (
            "Comm. Op",
            "Message Size",
            "Count",
            "Total comm lat(ms)",
            "Total straggler(ms)",
            "Avg comm lat(ms)",
            "Avg straggler(ms)",
        )
    else:
        header = (
            "Comm. Op",
            "Message Size",
            "Count",
            "Total Latency(ms)",
            "Avg Latency(ms)",
            "tput_avg (Gbps)",
            "busbw_avg (Gbps)",
        )
    lines = ["".join(f"{h:<20}" for h in header)]
    last = None
    for name, size in keys:
        lats, algbws, busbws = REC.summary[name][size]
        stats = {
            "count": len(lats),
            "total_latency_ms": sum(lats),
            "avg_latency_ms": trim_mean(lats),
            "tput_avg_gbps": trim_mean(algbws),
            "busbw_avg_gbps": trim_mean(busbws),
        }
        if show_straggler:
            strag = [max(0.0, own - m) for own, m in zip(lats, mins.get((name, size), lats), strict=True)]
            stats["total_straggler_ms"] = sum(strag)
            stats["avg_straggler_ms"] = trim_mean(strag)
        out.setdefault(name, {})[size] = stats
        if name != last:
            lines.append(name)
            last = name
        if show_straggler:
            row = (
                "",
                convert_size(size),
                stats["count"],
                f"{stats['total_latency_ms']:.2f}",
                f"{stats['total_straggler_ms']:.2f}",
                f"{stats['avg_latency_ms']:.2f}",
                f"{stats['avg_straggler_ms']:.2f}",
            )
        else:
            row = (
                "",
                convert_size(size),
                stats["count"],
                f"{stats['total_latency_ms']:.2f}",
                f"{stats['avg_latency_ms']:.2f}",
                f"{stats['tput_avg_gbps']:.2f}",
                f"{stats['busbw_avg_gbps']:.2f}",
            )
        lines.append("".join(f"{c!s:<20}" for c in row))
    if get_rank() == 0:  # as DeepSpeed: every rank computes, rank 0 prints
        print("\n".join(lines), flush=True)
    return out if return_dict else None


def reset_summary() -> None:
    with REC.lock:
        REC.summary.clear()
